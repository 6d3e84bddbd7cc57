"""Augmentations a recipe may record: pitch shift and time stretch, reverb, Brownian-noise backgrounds.

Every augmentation is named in the recipe by values alone, so rendering stays a pure function
of the recipe and the sources (:mod:`pipeline.mix.render`):

- pitch shift (semitones) and time stretch (output duration / input duration, Scaper's
  ``time_stretch``) per occurrence, with its ``stretch_method``: ``rubberband`` (Rubber Band
  through pedalboard, its faster engine: pitch and duration independently) or ``varispeed`` (soxr resampling,
  as a tape played faster or slower: one factor sets both, ``pitch = -12 log2(stretch)``);
- reverb per occurrence and per background: the dry signal at ``dry_db`` plus its
  convolution with a room impulse response at ``wet_db``. A room is named by its id: a
  simulated shoebox room (``shoebox:`` then its size, RT60 and the source and microphone
  positions, simulated by pyroomacoustics' image-source method) or an impulse-response file
  (``file:`` then its path). Impulse responses are scaled to unit energy and cut where their
  remaining energy falls 70 dB below the total (FLAM's -70 dB floor: nothing later is audible);
- a Brownian-noise background (URBAN-SED's): ``brownian-<k>``, integrated white noise from a
  generator seeded by ``k`` alone, at -30 dBFS RMS.

Input and output samples are float32 (int16 for generated backgrounds, as stored sources are).
Simulated rooms, impulse-response files (with their spectra) and noise are made once per process and kept.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path

import numpy as np

from pipeline.audio import decode_mono, int16_to_float, quantize_int16
from pipeline.config.mix_spec import STRETCH_METHODS
from pipeline.loudness import integrated_lufs, power_db
from pipeline.schema import BackgroundSegment

BROWNIAN = "brownian-"
SHOEBOX = "shoebox:"
RIR_FILE = "file:"
RIR_EXTENSIONS = (".wav", ".flac", ".ogg", ".aiff", ".aif")
BROWNIAN_RMS_DBFS = -30.0
BROWNIAN_SOURCE, BROWNIAN_AUTHOR, BROWNIAN_LICENSE = "Brownian noise", "generated", "CC0"  # a generated background's record
BROWNIAN_LEAK = 0.999  # the integrator's leak: keeps the walk from drifting (a pole at 2.5 Hz at 16 kHz)
RIR_TAIL_DB = -70.0
KEPT_RESULTS = 32
KEPT_SPECTRA = 16  # FFT sizes per room (about 1 MiB each at 16 kHz for the longest events)
FFT_MANTISSAS = (8, 9, 10, 12, 15)  # FFT sizes m * 2**k: at most 25% above the length needed


class AugmentError(ValueError):
    """An augmentation that cannot be applied (a missing room file, a library not installed)."""


class SilentRoom(AugmentError):
    """An impulse response with no energy (or a non-finite one)."""


def stretched_length(num_samples: int, factor: float) -> int:
    """Samples after a time stretch by ``factor`` (output duration / input duration)."""
    return max(1, int(round(num_samples * factor)))


def varispeed_semitones(factor: float) -> float:
    """The pitch change of playing ``factor`` times longer (a tape slowed down)."""
    return -12.0 * math.log2(factor)


def _kept(fn):
    """Keep ``fn``'s results for the last few inputs, keyed by the samples' digest and the other
    arguments: the level measured when a mixture is drawn and its rendering then stretch the same
    samples once. Callers get a copy."""
    kept: OrderedDict[tuple, np.ndarray] = OrderedDict()

    def wrapper(x: np.ndarray, *args):
        key = (hashlib.blake2b(x.tobytes(), digest_size=16).digest(), x.shape[0], *args)
        if key in kept:
            kept.move_to_end(key)
        else:
            kept[key] = fn(x, *args)
            if len(kept) > KEPT_RESULTS:
                kept.popitem(last=False)
        return kept[key].copy()

    wrapper.kept = kept
    wrapper.__doc__, wrapper.__name__ = fn.__doc__, fn.__name__
    return wrapper


def stretch(x: np.ndarray, sample_rate_hz: int, factor: float, semitones: float, method: str) -> np.ndarray:
    """Float32 ``x`` pitch-shifted by ``semitones`` and stretched to ``stretched_length(len(x), factor)`` samples."""
    return x if factor == 1.0 and semitones == 0.0 else _stretch(x, sample_rate_hz, factor, semitones, method)


@_kept
def _stretch(x: np.ndarray, sample_rate_hz: int, factor: float, semitones: float, method: str) -> np.ndarray:
    n = stretched_length(x.shape[0], factor)
    if method == "varispeed":
        import soxr

        y = soxr.resample(x, sample_rate_hz, sample_rate_hz * factor, quality="HQ")
    elif method == "rubberband":
        try:
            from pedalboard import time_stretch
        except ImportError as err:
            raise AugmentError(
                "stretch_method 'rubberband' needs pedalboard: pip install pedalboard (or use stretch_method: varispeed)"
            ) from err
        y = time_stretch(
            x[None, :],
            float(sample_rate_hz),
            stretch_factor=1.0 / factor,
            pitch_shift_in_semitones=float(semitones),
            high_quality=False,
        )[0]
    else:
        raise AugmentError(f"unknown stretch_method {method!r}; use one of {', '.join(STRETCH_METHODS)}")
    y = np.asarray(y, dtype=np.float32)
    return y[:n] if y.shape[0] >= n else np.concatenate([y, np.zeros(n - y.shape[0], np.float32)])


class Room:
    """An impulse response as convolution uses it: ``samples`` (float64, unit energy, cut at its
    -70 dB tail) and its float32 spectra at the FFT sizes convolutions have needed (the last
    :data:`KEPT_SPECTRA` kept, so a room's spectrum is computed once per size, not per event)."""

    def __init__(self, samples: np.ndarray):
        self.samples = samples
        self._taps = samples.astype(np.float32)
        self._spectra: OrderedDict[int, np.ndarray] = OrderedDict()

    def spectrum(self, size: int) -> np.ndarray:
        """The real FFT of the impulse response zero-padded to ``size`` samples (complex64)."""
        if size in self._spectra:
            self._spectra.move_to_end(size)
        else:
            from scipy.fft import rfft

            self._spectra[size] = rfft(self._taps, size)
            if len(self._spectra) > KEPT_SPECTRA:
                self._spectra.popitem(last=False)
        return self._spectra[size]


def fft_size(n: int) -> int:
    """The smallest ``m * 2**k >= n`` with ``m`` in :data:`FFT_MANTISSAS`: fast sizes (factors 2, 3
    and 5), few enough per octave that a room's spectra are reused across event lengths."""
    k = max(0, (n - 1).bit_length() - 4)
    return min(m << j for m in FFT_MANTISSAS for j in (k, k + 1) if m << j >= n)


def reverberate(x: np.ndarray, room: Room, wet_db: float, dry_db: float) -> np.ndarray:
    """Dry at ``dry_db`` plus wet (``x`` convolved with the room) at ``wet_db``: ``len(x) + len(room) - 1`` float32 samples.

    One float32 FFT convolution at :func:`fft_size`, with the room's kept spectrum.
    """
    from scipy.fft import irfft, rfft

    n = x.shape[0] + room.samples.shape[0] - 1
    size = fft_size(n)
    wet = irfft(rfft(x, size) * room.spectrum(size), size)[:n]
    wet *= np.float32(10.0 ** (wet_db / 20.0))
    wet[: x.shape[0]] += x * np.float32(10.0 ** (dry_db / 20.0))
    return wet


def rir_samples(rir_id: str, sample_rate_hz: int) -> np.ndarray:
    """The impulse response an id names, at ``sample_rate_hz``, unit energy, cut at its -70 dB tail (float64)."""
    return load_room(rir_id, sample_rate_hz).samples


def tail_samples(rir_id: str, sample_rate_hz: int) -> int:
    """How many samples reverb with this room adds after the dry signal ends."""
    return 0 if not rir_id else rir_samples(rir_id, sample_rate_hz).shape[0] - 1


@lru_cache(maxsize=64)
def load_room(rir_id: str, sample_rate_hz: int) -> Room:
    """The :class:`Room` an id names at ``sample_rate_hz`` (simulated or read once per process)."""
    if rir_id.startswith(SHOEBOX):
        h = _simulate(rir_id, sample_rate_hz)
    elif rir_id.startswith(RIR_FILE):
        path = room_file(rir_id)
        try:
            h = decode_mono(path, sample_rate_hz).astype(np.float64)
        except Exception as err:  # noqa: BLE001 - any decoding failure is the same advice
            raise AugmentError(f"room impulse response {path}: {err}; check mix.spec.reverb.rirs") from err
    else:
        raise AugmentError(f"unknown room id {rir_id!r}: rooms are 'shoebox:...' or 'file:<path>'")
    return Room(_trimmed_unit_energy(h, rir_id))


def _trimmed_unit_energy(h: np.ndarray, rir_id: str) -> np.ndarray:
    energy = float(np.dot(h, h))
    if not math.isfinite(energy) or energy <= 0.0:
        raise SilentRoom(f"room impulse response {rir_id} is silent or not finite; remove it from the room folder")
    start = int(np.flatnonzero(np.abs(h) > 0)[0])
    h = h[start:] / math.sqrt(energy)  # onset at sample 0: the direct sound is not delayed
    remaining = np.cumsum((h * h)[::-1])[::-1]  # Schroeder's backward integral, total 1
    keep = int(np.searchsorted(-remaining, -(10.0 ** (RIR_TAIL_DB / 10.0)), side="left"))
    return h[: max(keep, 1)]


def shoebox_id(
    size_m: tuple[float, float, float], rt60_s: float, source_m: tuple[float, float, float], mic_m: tuple[float, float, float]
) -> str:
    """A simulated room's id: every value at centimetre (or millisecond) precision, as it is simulated."""

    def xyz(v):
        return ",".join(f"{c:.2f}" for c in v)

    return f"{SHOEBOX}{xyz(size_m)};rt60={rt60_s:.3f};src={xyz(source_m)};mic={xyz(mic_m)}"


def _parse_shoebox(rir_id: str) -> tuple[list[float], float, list[float], list[float]]:
    try:
        size, rt60, src, mic = rir_id[len(SHOEBOX) :].split(";")
        vec = lambda s: [float(c) for c in s.split("=")[-1].split(",")]  # noqa: E731
        return vec(size), float(rt60.split("=")[1]), vec(src), vec(mic)
    except (ValueError, IndexError) as err:
        raise AugmentError(f"malformed room id {rir_id!r}") from err


def _simulate(rir_id: str, sample_rate_hz: int) -> np.ndarray:
    try:
        import pyroomacoustics as pra
    except ImportError as err:
        raise AugmentError(
            "simulated rooms need pyroomacoustics: pip install pyroomacoustics "
            "(or give a folder of impulse responses as mix.spec.reverb.rirs)"
        ) from err
    size, rt60, src, mic = _parse_shoebox(rir_id)
    absorption, max_order = pra.inverse_sabine(rt60, size)
    room = pra.ShoeBox(size, fs=sample_rate_hz, materials=pra.Material(absorption), max_order=max_order, air_absorption=False)
    room.add_source(src)
    room.add_microphone(mic)
    room.compute_rir()
    return np.asarray(room.rir[0][0], dtype=np.float64)


def draw_room(rng: np.random.Generator, size_m, rt60_s) -> str:
    """A shoebox room's id: size per axis and RT60 from their distributions, source and
    microphone drawn inside it at least 0.5 m from every wall (and 1.2-1.8 m high)."""
    size = tuple(round(float(size_m.sample(rng)), 2) for _ in range(2)) + (round(float(rng.uniform(2.5, 4.0)), 2),)
    rt60 = float(rt60_s.sample(rng))

    def point():
        return (
            round(float(rng.uniform(0.5, size[0] - 0.5)), 2),
            round(float(rng.uniform(0.5, size[1] - 0.5)), 2),
            round(float(rng.uniform(1.2, 1.8)), 2),
        )

    return shoebox_id(size, rt60, point(), point())


def room_files(folder: str) -> list[str]:
    """The ids of a folder's impulse-response files (recursively, sorted); a clear error if there are none."""
    root = Path(folder)
    if not root.is_dir():
        raise AugmentError(
            f"mix.spec.reverb.rirs: {folder} is not a folder; give a folder of impulse-response audio files, "
            "or null for simulated rooms"
        )
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in RIR_EXTENSIONS and p.is_file())
    if not files:
        raise AugmentError(f"mix.spec.reverb.rirs: {folder} holds no {'/'.join(RIR_EXTENSIONS)} files")
    return [f"{RIR_FILE}{p.as_posix()}" for p in files]


def room_file(rir_id: str) -> Path:
    """The impulse-response file a ``file:`` room id names."""
    return Path(rir_id[len(RIR_FILE) :])


def usable_rooms(folder: str, sample_rate_hz: int) -> tuple[list[str], list[tuple[str, str, str]]]:
    """A folder's impulse-response files, checked: ``(room ids that load, [(id, reason, detail)] of those that do not)``.

    A file that does not decode is ``unreadable``; one with no energy (or a non-finite one) is
    ``silent``. Every mixer of a run (the stage's workers, a training source) makes the same
    check, so they draw from the same list of rooms.
    """
    good, bad = [], []
    for rid in room_files(folder):
        try:
            rir_samples(rid, sample_rate_hz)
        except AugmentError as err:
            bad.append((rid, "silent" if isinstance(err, SilentRoom) else "unreadable", str(err)))
        else:
            good.append(rid)
    if not good:
        raise AugmentError(
            f"mix.spec.reverb.rirs: no file of {folder} is a usable impulse response "
            f"({len(bad)} rejected, e.g. {bad[0][2]}); fix or replace them, or set rirs: null for simulated rooms"
        )
    return good, bad


def is_brownian(segment_id: str) -> bool:
    return segment_id.startswith(BROWNIAN)


@lru_cache(maxsize=8)
def brownian_noise(segment_id: str, num_samples: int) -> np.ndarray:
    """``num_samples`` int16 samples of the Brownian noise ``brownian-<k>`` names (read-only)."""
    try:
        k = int(segment_id[len(BROWNIAN) :])
    except ValueError as err:
        raise AugmentError(f"malformed Brownian background id {segment_id!r}") from err
    from scipy.signal import lfilter  # imported when first needed: scipy.signal takes about 2 s to import

    white = np.random.default_rng([k]).standard_normal(num_samples)
    walk = lfilter([1.0], [1.0, -BROWNIAN_LEAK], white)
    walk -= walk.mean()
    walk *= 10.0 ** (BROWNIAN_RMS_DBFS / 20.0) / max(float(np.sqrt(np.mean(walk * walk))), 1e-12)
    q = quantize_int16(walk.astype(np.float32))
    q.setflags(write=False)
    return q


def brownian_segment(k: int, num_samples: int, sample_rate_hz: int) -> BackgroundSegment:
    """The background record of the noise ``brownian-<k>``, ``num_samples`` long: its levels and
    licence. It stores no envelope: relabeling judges generated noise on its samples as heard."""
    segment_id = f"{BROWNIAN}{k}"
    x = int16_to_float(brownian_noise(segment_id, num_samples))
    peak = float(np.max(np.abs(x)))
    return BackgroundSegment(
        audio_path="",
        source_id=BROWNIAN_SOURCE,
        source_path="",
        duration_s=num_samples / sample_rate_hz,
        num_samples=num_samples,
        sample_rate_hz=sample_rate_hz,
        source_sample_rate_hz=sample_rate_hz,
        source_channels=1,
        rms_dbfs=float(power_db(float(np.mean(x.astype(np.float64) ** 2)))),
        peak_dbfs=float(20.0 * math.log10(max(peak, 1e-9))),
        loudness_lufs=float(integrated_lufs(x, sample_rate_hz)),
        envelope_frame_s=0.0,
        envelope_hop_s=0.0,
        envelope_db=(),
        license=BROWNIAN_LICENSE,
        segment_id=segment_id,
        category="noise",
        offset_in_source_s=0.0,
        peak_to_median_db=0.0,
        author=BROWNIAN_AUTHOR,
    )
