"""Reading, checking, resampling and writing audio.

Input: any file soundfile (libsndfile) reads: WAV, FLAC, OGG/Vorbis, AIFF, MP3 (libsndfile
>= 1.1), at any rate, bit depth and channel count. Output: float32 arrays in [-1, 1) and 16-bit
FLAC files. Every failure is an :class:`AudioError` with a skip reason, so a
stage can report the file and go on.

Encoded audio (a path, or the bytes of a shard's audio cell) is opened in one place,
:func:`open_encoded`, which can bound its length from the header before a frame is decoded
(``max_s``: more frames than ``max_s`` x the header's rate, or a header without a length, is
``too-long``): a 729 KB FLAC cell can hold 4 hours of silence, about 240 MB a decoded hour at
16 kHz. :func:`decode_mono`, :func:`read_blocks`, :func:`decode_crop` (only the frames of one
crop) and :func:`decoded_frames` (decode through, keep nothing) all open through it.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from pipeline.schema import SkipReason

FULL_SCALE_INT16 = 32768.0


class AudioError(Exception):
    """A file a stage cannot use; ``reason`` is the skip reason written to the report."""

    def __init__(self, reason: SkipReason, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Decoded:
    """Decoded audio: ``samples`` is float32 of shape (num_samples, channels)."""

    samples: np.ndarray
    sample_rate_hz: int

    @property
    def channels(self) -> int:
        return self.samples.shape[1]


@contextmanager
def open_audio(path: Path) -> Iterator[sf.SoundFile]:
    """Open a file for reading, turning every failure into an AudioError."""
    if not os.path.exists(path):
        raise AudioError("missing-file", str(path))
    if os.path.getsize(path) == 0:
        raise AudioError("empty", "the file is 0 bytes")
    try:
        f = sf.SoundFile(str(path))
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as e:
        raise AudioError("unreadable", f"{type(e).__name__}: {e}") from e
    with f:
        if f.samplerate <= 0:
            raise AudioError("unreadable", f"invalid sample rate {f.samplerate}")
        yield f


def read_block(f: sf.SoundFile, start: int, frames: int) -> np.ndarray:
    """Samples ``[start, start + frames)`` as float32 (n, channels), checked for NaN/inf.

    16-bit PCM is read as integers and scaled here (the same values as libsndfile's float
    conversion, several times faster).
    """
    try:
        f.seek(start)
        if f.subtype == "PCM_16":
            samples = f.read(frames, dtype="int16", always_2d=True).astype(np.float32)
            samples *= np.float32(1.0 / FULL_SCALE_INT16)
        else:
            samples = f.read(frames, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as e:
        raise AudioError("unreadable", f"{type(e).__name__}: {e}") from e
    if not np.isfinite(samples).all():
        bad = int(np.count_nonzero(~np.isfinite(samples)))
        raise AudioError("non-finite", f"{bad} NaN or infinite samples")
    return samples


def read_int16(f: sf.SoundFile) -> np.ndarray:
    """A whole 16-bit mono file's samples as int16 (n,), as stored."""
    try:
        f.seek(0)
        return f.read(-1, dtype="int16")
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as e:
        raise AudioError("unreadable", f"{type(e).__name__}: {e}") from e


def read_audio(path: Path) -> Decoded:
    """Decode a whole file to float32 (num_samples, channels), checking it is usable.

    Raises AudioError for missing, unreadable, empty and non-finite files.
    """
    with open_audio(path) as f:
        samples = read_block(f, 0, -1)
        sample_rate_hz = int(f.samplerate)
    if samples.shape[0] == 0:
        raise AudioError("empty", "the file has no samples")
    return Decoded(samples=samples, sample_rate_hz=sample_rate_hz)


def downmix(samples: np.ndarray) -> np.ndarray:
    """(num_samples, channels) -> (num_samples,) float32 by the channel mean.

    Two channels are added and halved in float32, the very values numpy's channel mean gives,
    without its strided reduce (0.25 ms instead of 9 ms for 10 s of 44.1 kHz stereo).
    """
    if samples.shape[1] == 1:
        return samples[:, 0]
    if samples.shape[1] == 2:
        out = np.add(samples[:, 0], samples[:, 1], dtype=np.float32)
        out /= np.float32(2)
        return out
    return samples.mean(axis=1, dtype=np.float32)


DC_FLOOR = 1e-4  # -80 dBFS: smaller offsets change no decision, and subtracting costs a copy


def remove_dc(x: np.ndarray) -> np.ndarray:
    """Subtract the mean when it exceeds -80 dBFS: a constant offset (a common recorder
    fault) would otherwise count as event energy and be stored in the output."""
    mean = np.float32(x.mean())
    return x - mean if abs(mean) > DC_FLOOR else x


def resample(x: np.ndarray, from_hz: int, to_hz: int) -> np.ndarray:
    """Band-limited resampling with libsoxr at its "HQ" quality; mono float32 in and out."""
    if from_hz == to_hz:
        return x.astype(np.float32, copy=False)
    return soxr.resample(x, from_hz, to_hz, quality="HQ").astype(np.float32, copy=False)


def _undecodable(source: str | Path | bytes, e: Exception) -> AudioError:
    where = "the audio bytes" if isinstance(source, bytes) else str(source)
    return AudioError("unreadable", f"cannot decode {where} ({e}); use WAV, FLAC, OGG or another format libsndfile reads")


ENDLESS_FRAMES = 2**62  # libsndfile's count for a stream whose header gives no length


def frame_limit(max_s: float, sample_rate_hz: int) -> int:
    """The most frames ``max_s`` seconds hold at ``sample_rate_hz`` (the count a mixture of ``max_s`` s is written with)."""
    return round(max_s * sample_rate_hz)


@contextmanager
def open_encoded(source: str | Path | bytes, max_s: float | None = None) -> Iterator[sf.SoundFile]:
    """A file path or encoded bytes, opened for reading after its header is checked.

    Only the header is read here. Raises AudioError: ``unreadable`` (libsndfile cannot open it,
    or it states no positive rate), ``too-long`` (with ``max_s``: the header states more frames
    than ``max_s`` x its rate, or no length at all, so nothing is decoded).
    """
    try:
        f = sf.SoundFile(io.BytesIO(source) if isinstance(source, bytes) else str(source))
    except (sf.LibsndfileError, RuntimeError, OSError, TypeError, ValueError) as e:
        raise _undecodable(source, e) from None
    with f:
        if f.samplerate <= 0:
            raise AudioError("unreadable", f"invalid sample rate {f.samplerate}")
        if max_s is not None and f.frames > frame_limit(max_s, f.samplerate):
            stated = "no length" if f.frames >= ENDLESS_FRAMES else f"{f.frames} frames ({f.frames / f.samplerate:.1f} s)"
            raise AudioError(
                "too-long",
                f"the audio header states {stated} at {f.samplerate} Hz, more than the "
                f"{max_s:g} s ({frame_limit(max_s, f.samplerate)} frames) it may hold; nothing was decoded",
            )
        yield f


def _frames(f: sf.SoundFile) -> int:
    """The frames ``f``'s header states; a header that gives no length is ``unreadable``: libsndfile
    can neither size an array for such a stream nor tell its position in it."""
    if f.frames >= ENDLESS_FRAMES:
        raise AudioError(
            "unreadable",
            "the audio header states no length (libsndfile cannot read such a stream); write the file again with its length",
        )
    return f.frames


def _read(f: sf.SoundFile, source: str | Path | bytes, frames: int = -1) -> np.ndarray:
    """``frames`` frames (-1: to the end) from ``f``'s position as float32 (n, channels)."""
    _frames(f)
    try:
        return f.read(frames, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, OSError, TypeError, ValueError) as e:
        raise _undecodable(source, e) from None


def decode_mono(source: str | Path | bytes, sample_rate_hz: int, max_s: float | None = None) -> np.ndarray:
    """A file path or encoded bytes -> mono float32 at ``sample_rate_hz`` (channel mean, soxr).

    ``max_s``: refuse (``too-long``) from the header, before decoding, audio longer than that
    (:func:`open_encoded`). Raises AudioError: ``unreadable`` (libsndfile cannot decode it),
    ``empty``, ``non-finite``, ``too-long``.
    """
    with open_encoded(source, max_s) as f:
        x, rate = _read(f, source), f.samplerate
    return mono_at(x, rate, sample_rate_hz)


def resampled_length(frames: int, from_hz: int, to_hz: int) -> int:
    """The samples :func:`resample` makes of ``frames`` samples (libsoxr's count: rounded half up)."""
    return frames if from_hz == to_hz else int(frames * to_hz / from_hz + 0.5)


CROP_MARGIN_S = 0.1  # decoded on each side of a crop that is resampled: the resampler's filter settles inside it


def decode_crop(
    source: str | Path | bytes, sample_rate_hz: int, samples: int, pick: Callable[[int], int], max_s: float | None = None
) -> tuple[np.ndarray, int]:
    """``samples`` samples of a file path or encoded bytes, decoding only those frames.

    ``pick(total)`` gets the length :func:`decode_mono` would give (from the header) and returns
    the crop's first sample, in ``[0, total - samples]``; it is called only when ``total >
    samples`` (a shorter file comes back whole, from 0). Returns ``(wave, start)``: mono float32
    at ``sample_rate_hz``, ``min(samples, total)`` long, and the start picked. At the file's own
    rate the wave is bit for bit ``decode_mono(...)[start:start + samples]``; resampled, only
    the crop and :data:`CROP_MARGIN_S` on each side are resampled (a difference from resampling
    the whole file far below 16-bit quantisation). Raises AudioError like :func:`decode_mono`
    (``unreadable`` also when the stream holds fewer frames than its header says).
    """
    with open_encoded(source, max_s) as f:
        rate, frames = int(f.samplerate), _frames(f)
        total = resampled_length(frames, rate, sample_rate_hz)
        if total <= samples:
            return mono_at(_read(f, source), rate, sample_rate_hz), 0
        start = int(pick(total))
        if not 0 <= start <= total - samples:
            raise ValueError(f"crop start {start} outside [0, {total - samples}]")
        if rate == sample_rate_hz:
            first, skip, stop = start, 0, start + samples
        else:  # begin on a frame that falls exactly on an output sample, so the crop keeps its place on the grid
            step_in, step_out = rate // math.gcd(rate, sample_rate_hz), sample_rate_hz // math.gcd(rate, sample_rate_hz)
            margin = math.ceil(CROP_MARGIN_S * sample_rate_hz)
            k = max(0, start - margin) // step_out
            first, skip = k * step_in, start - k * step_out
            stop = min(frames, math.ceil((start + samples + margin) * rate / sample_rate_hz) + 1)
        try:
            f.seek(first)
        except (sf.LibsndfileError, RuntimeError, OSError, ValueError) as e:
            raise _undecodable(source, e) from None
        x = _read(f, source, stop - first)
    if len(x) < stop - first:
        raise AudioError("unreadable", f"the stream ends at frame {first + len(x)}, its header says {frames}")
    return mono_at(x, rate, sample_rate_hz)[skip : skip + samples], start


def decoded_frames(source: str | Path | bytes, max_s: float | None = None, block_frames: int = 1 << 16) -> int:
    """Decode a file path or encoded bytes through, ``block_frames`` at a time, keeping nothing:
    the frames it holds. The check that :func:`decode_mono` will decode it (the same faults,
    without resampling): raises AudioError ``unreadable``, ``empty``, ``non-finite``, ``too-long``."""
    read = 0
    with open_encoded(source, max_s) as f:
        while True:
            x = _read(f, source, block_frames)
            if len(x) == 0:
                break
            read += len(x)
            if not np.isfinite(downmix(x)).all():
                raise AudioError("non-finite", "NaN or infinite samples")
    if read == 0:
        raise AudioError("empty", "zero samples")
    return read


def mono_at(samples: np.ndarray, from_hz: int, to_hz: int) -> np.ndarray:
    """Decoded samples ``(S,)`` or ``(S, C)`` at ``from_hz`` -> mono float32 at ``to_hz`` (channel mean, soxr).

    Raises AudioError: ``empty``, ``non-finite``.
    """
    x = np.asarray(samples, dtype=np.float32)
    if x.shape[0] == 0:
        raise AudioError("empty", "zero samples")
    x = downmix(x) if x.ndim == 2 else x
    if not np.isfinite(x).all():
        raise AudioError("non-finite", "NaN or infinite samples")
    return resample(x, int(from_hz), to_hz)


BLOCK_FRAMES = 1 << 17  # frames read at a time (about 3 s at 44.1 kHz): large enough that copying stays cheap


def read_blocks(
    source: str | Path | bytes, sample_rate_hz: int, block_frames: int = BLOCK_FRAMES, max_s: float | None = None
) -> Iterator[np.ndarray]:
    """A file path or encoded bytes -> mono float32 blocks at ``sample_rate_hz``, read ``block_frames`` at a time.

    The blocks joined are exactly :func:`decode_mono`'s samples (channel mean, then libsoxr at
    "HQ" run as a stream), but only one block is held at a time. Raises AudioError like
    :func:`decode_mono` (``unreadable``, ``too-long`` with ``max_s``, before any block;
    ``empty``, ``non-finite``, possibly after some blocks were yielded); ``empty`` also when
    the file is shorter than one sample at ``sample_rate_hz``.
    """
    with open_encoded(source, max_s) as f:
        rate = int(f.samplerate)
        stream = None if rate == sample_rate_hz else soxr.ResampleStream(rate, sample_rate_hz, 1, dtype="float32", quality="HQ")
        read = produced = 0
        while True:
            x = _read(f, source, block_frames)
            last = len(x) == 0
            read += len(x)
            if last and read == 0:
                raise AudioError("empty", "zero samples")
            x = downmix(x)
            if not np.isfinite(x).all():
                raise AudioError("non-finite", "NaN or infinite samples")
            y = x if stream is None else stream.resample_chunk(x, last=last)
            produced += len(y)
            if last and produced == 0:
                raise AudioError("empty", f"{read} samples at {rate} Hz are shorter than one sample at {sample_rate_hz} Hz")
            if len(y):
                yield y
            if last:
                return


def clipped_fraction(samples: np.ndarray, level: float) -> float:
    """Share of sample positions where any channel reaches ``level`` (digital clipping)."""
    if samples.size == 0:
        return 0.0
    hit = np.abs(samples) >= level
    if hit.ndim == 2:
        hit = hit.any(axis=1)
    return float(np.count_nonzero(hit)) / hit.shape[0]


def longest_zero_run_s(x: np.ndarray, sample_rate_hz: int) -> float:
    """Length of the longest run of exact zeros (digital silence), in seconds."""
    zero = x == 0
    if not zero.any():
        return 0.0
    padded = np.concatenate(([False], zero, [False]))
    edges = np.flatnonzero(np.diff(padded.astype(np.int8)))
    runs = edges[1::2] - edges[::2]
    return float(runs.max()) / sample_rate_hz


_INT16_MIN, _INT16_MAX = np.float32(-32768), np.float32(32767)


def int16_values(x: np.ndarray, overwrite: bool = False, gain: float = 1.0, ends: np.ndarray | None = None) -> np.ndarray:
    """float32 in [-1, 1) -> the int16 values :func:`quantize_int16` gives, still as float32 (rounded,
    saturated at full scale; ``overwrite``: in ``x``'s own buffer).

    ``gain`` (float32): the values of ``x * gain`` in one pass; scaling by full scale, a power of
    two, is exact, so the product is the same float32. ``ends``: ``x``'s max and min, when known:
    scaling and rounding never decrease, so where they land inside int16 no sample saturates and
    the pass that saturates is left out (the same values).
    """
    scale = np.float32(gain) * np.float32(FULL_SCALE_INT16)
    y = np.multiply(x, scale, out=x if overwrite else None, dtype=np.float32)
    np.rint(y, out=y)
    if ends is None or not _inside_int16(np.rint(np.multiply(ends, scale, dtype=np.float32))):
        np.clip(y, _INT16_MIN, _INT16_MAX, out=y)  # one pass: 7x faster here than np.minimum then np.maximum
    return y


def quantize_int16(x: np.ndarray, overwrite: bool = False, gain: float = 1.0, ends: np.ndarray | None = None) -> np.ndarray:
    """float32 in [-1, 1) -> int16, rounding and saturating at full scale (``overwrite``: in ``x``'s
    own float32 buffer, which is left scaled and rounded; the same int16 either way); ``gain`` and
    ``ends`` as in :func:`int16_values`."""
    return int16_values(x, overwrite, gain, ends).astype(np.int16)


def _inside_int16(ends: np.ndarray) -> bool:
    return bool(ends[0] <= _INT16_MAX and ends[1] >= _INT16_MIN)


def int16_to_float(q: np.ndarray, gain: float = 1.0) -> np.ndarray:
    """int16 samples -> float32 in [-1, 1), times ``gain``: a contiguous cast, then the scale in place.
    The same float32 as one ``np.multiply(q, g, dtype=np.float32)``, which casts through the ufunc's
    buffer: 1.8x slower with numpy's baseline kernels (62 against 34 us for 10 s at 16 kHz)."""
    x = q.astype(np.float32)
    x *= np.float32(gain / FULL_SCALE_INT16)
    return x


def write_flac(path: Path, q: np.ndarray, sample_rate_hz: int, compression_level: float | None = None) -> None:
    """int16 mono samples -> a 16-bit FLAC file (deterministic bytes).

    Written in place: stages write audio only inside their staging folder, which is swapped
    in whole (see :func:`pipeline.outputs.staged_dir`), so a per-file rename would add
    nothing but time.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(encode_flac(q, sample_rate_hz, compression_level))


def encode_flac(q: np.ndarray, sample_rate_hz: int, compression_level: float | None = None) -> bytes:
    """int16 mono samples -> the bytes of a 16-bit FLAC file.

    Encoding in memory and writing the bytes with one call is about 1 ms faster per file
    than letting libsndfile open, seek in and flush the file itself. ``compression_level``
    runs from 0 (fastest, a few per cent larger) to 1 (smallest); None keeps libsndfile's default.
    """
    buf = io.BytesIO()
    extra = {} if compression_level is None else {"compression_level": compression_level}
    sf.write(buf, q, sample_rate_hz, format="FLAC", subtype="PCM_16", **extra)
    return buf.getvalue()
