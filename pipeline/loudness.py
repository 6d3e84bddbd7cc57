"""Level measurements: RMS, peak, integrated loudness and frame energy envelopes.

Input: mono float32 signals at a known rate. Output: levels in dB re full scale, loudness in
LUFS (ITU-R BS.1770 via pyloudnorm, with Scaper's conventions: signals shorter than the
400 ms gating block are self-tiled first, and the result is floored at -70 LUFS), and
per-frame energies in dB for segmentation and relabeling.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from pipeline.schema import EnergyEnvelope

ENERGY_FLOOR = 1e-12  # -120 dB: keeps log10 finite on digital silence
LOUDNESS_FLOOR_LUFS = -70.0
_GATING_BLOCK_S = 0.4


def power_db(mean_square: np.ndarray | float) -> np.ndarray | float:
    return 10.0 * np.log10(np.maximum(mean_square, ENERGY_FLOOR))


def rms_dbfs(x: np.ndarray) -> float:
    return float(power_db(np.mean(np.square(x, dtype=np.float64))))


def peak_dbfs(x: np.ndarray) -> float:
    return float(20.0 * np.log10(max(float(np.max(np.abs(x))), 1e-6)))


@lru_cache(maxsize=16)
def _k_weighting(sample_rate_hz: int) -> np.ndarray:
    """pyloudnorm's BS.1770 K-weighting stages as second-order sections (with their gains)."""
    import pyloudnorm  # here, not at the top: it imports scipy.signal (about 2 s), which a mixing worker may never need

    stages = pyloudnorm.Meter(sample_rate_hz)._filters.values()
    sos = []
    for stage in stages:
        b = np.asarray(stage.b, dtype=np.float64) * stage.passband_gain
        a = np.asarray(stage.a, dtype=np.float64)
        sos.append(np.concatenate([b / a[0], a / a[0]]))
    return np.stack(sos)


def integrated_lufs(x: np.ndarray, sample_rate_hz: int, tile_below_s: float = _GATING_BLOCK_S) -> float:
    """BS.1770-4 integrated loudness of a mono signal; short signals self-tiled; floor -70 LUFS.

    Signals shorter than ``tile_below_s`` are repeated until they are not (Scaper tiles
    below 0.5 s; the default tiles only what is shorter than one gating block).

    Same filters, block boundaries and gates as ``pyloudnorm.Meter.integrated_loudness``
    (tested equal), with the per-block loop replaced by prefix sums: the stage measures
    every clip, and the loop was a quarter of its time.
    """
    need = int(np.ceil(max(tile_below_s, _GATING_BLOCK_S) * sample_rate_hz)) + 1
    if x.shape[0] < need:
        x = np.tile(x, int(np.ceil(need / max(x.shape[0], 1))))
    from scipy.signal import sosfilt  # see _k_weighting

    y = sosfilt(_k_weighting(sample_rate_hz), x.astype(np.float64))
    prefix = np.concatenate(([0.0], np.cumsum(y * y)))
    n = y.shape[0]
    num_blocks = int(np.round((n / sample_rate_hz - _GATING_BLOCK_S) / (_GATING_BLOCK_S * 0.25))) + 1
    j = np.arange(num_blocks)
    lower = (_GATING_BLOCK_S * (j * 0.25) * sample_rate_hz).astype(np.int64)
    upper = np.minimum((_GATING_BLOCK_S * (j * 0.25 + 1) * sample_rate_hz).astype(np.int64), n)
    z = (prefix[upper] - prefix[np.minimum(lower, n)]) / (_GATING_BLOCK_S * sample_rate_hz)
    with np.errstate(divide="ignore"):
        block_lufs = -0.691 + 10.0 * np.log10(z)
    gated = z[block_lufs >= LOUDNESS_FLOOR_LUFS]
    if gated.size == 0:
        return LOUDNESS_FLOOR_LUFS
    relative_gate = -0.691 + 10.0 * np.log10(gated.mean()) - 10.0
    gated = z[(block_lufs > relative_gate) & (block_lufs > LOUDNESS_FLOOR_LUFS)]
    if gated.size == 0:
        return LOUDNESS_FLOOR_LUFS
    return float(max(-0.691 + 10.0 * np.log10(gated.mean()), LOUDNESS_FLOOR_LUFS))


def frame_count(num_samples: int, hop: int) -> int:
    """Frames needed so that frame starts ``k * hop`` cover every sample."""
    return max(1, -(-num_samples // hop))


def framed(x: np.ndarray, frame: int, hop: int) -> np.ndarray:
    """(frame_count, frame) view of frames ``[k * hop, k * hop + frame)``, the tail zero-padded."""
    n = frame_count(x.shape[0], hop)
    padded = np.zeros((n - 1) * hop + frame, dtype=np.float32)
    padded[: x.shape[0]] = x
    return np.lib.stride_tricks.sliding_window_view(padded, frame)[::hop]


def frame_mean_square(x: np.ndarray, frame: int, hop: int) -> np.ndarray:
    """Mean square of each frame ``[k * hop, k * hop + frame)``, the tail zero-padded.

    ``frame`` is rounded to a whole number of hops, so each sample is squared once: frame
    energies are sums of consecutive hop-block energies.
    """
    per_frame = max(1, round(frame / hop))
    n = frame_count(x.shape[0], hop)
    full = x.shape[0] // hop
    blocks = np.zeros(n + per_frame - 1, dtype=np.float64)
    head = x[: full * hop].reshape(full, hop)
    blocks[:full] = np.einsum("ij,ij->i", head, head)
    if full < n:
        tail = x[full * hop :]
        blocks[full] = float(np.einsum("i,i->", tail, tail))
    prefix = np.concatenate(([0.0], np.cumsum(blocks)))
    return (prefix[per_frame : per_frame + n] - prefix[:n]) / (per_frame * hop)


def peak_to_median_db(y: np.ndarray, sample_rate_hz: int, frame_s: float) -> float:
    """Loudest frame energy minus the median frame energy, in dB (frames that fit whole)."""
    frame = max(1, round(frame_s * sample_rate_hz))
    usable = (y.shape[0] // frame) * frame or y.shape[0]
    db = power_db(frame_mean_square(y[:usable], frame, frame))
    return float(np.max(db) - np.median(db))


def a_weighting_gain(freqs_hz: np.ndarray) -> np.ndarray:
    """IEC 61672 A-weighting as a power gain (1.0 at 1 kHz)."""
    f2 = np.square(freqs_hz, dtype=np.float64)
    ra = (12194.0**2 * f2**2) / ((f2 + 20.6**2) * np.sqrt((f2 + 107.7**2) * (f2 + 737.9**2)) * (f2 + 12194.0**2))
    gain_db = 20.0 * np.log10(np.maximum(ra, 1e-30)) + 2.0
    return 10.0 ** (gain_db / 10.0)


@lru_cache(maxsize=16)
def _a_weights(frame: int, sample_rate_hz: int) -> np.ndarray:
    w = a_weighting_gain(np.fft.rfftfreq(frame, 1.0 / sample_rate_hz))
    # Parseval for a real FFT: interior bins stand for two (positive and negative) frequencies.
    scale = np.full(w.shape, 2.0)
    scale[0] = 1.0
    if frame % 2 == 0:
        scale[-1] = 1.0
    return (w * scale / (frame * frame)).astype(np.float64)


def a_weighted_envelope(
    x: np.ndarray, sample_rate_hz: int, frame_s: float, hop_s: float, *, single: bool = False
) -> EnergyEnvelope:
    """A-weighted mean-square energy per frame in dB re full scale.

    Weighting is applied per FFT bin of each rectangular frame, so by Parseval a flat
    1 kHz tone reads the same as its plain mean square. ``single`` transforms the frames in
    float32 (several times faster; energies within about 1e-6 of the float64 ones, below the
    0.01 dB they are rounded to but for a rare rounding): for signals judged once and never
    stored, such as augmented events as heard. Stored envelopes use float64.
    """
    frame = max(1, round(frame_s * sample_rate_hz))
    hop = max(1, round(hop_s * sample_rate_hz))
    frames = framed(x, frame, hop)
    if single:
        from scipy.fft import rfft

        spectrum = rfft(frames, axis=1)
    else:
        spectrum = np.fft.rfft(frames, axis=1)
    power = spectrum.real**2 + spectrum.imag**2
    # einsum, not BLAS: BLAS picks its summation order by CPU, and the bytes must not.
    energy = np.einsum("ij,j->i", power, _a_weights(frame, sample_rate_hz))
    db = np.round(power_db(energy), 2).astype(np.float32)
    return EnergyEnvelope(frame_s=frame / sample_rate_hz, hop_s=hop / sample_rate_hz, energy_db=tuple(db.tolist()))
