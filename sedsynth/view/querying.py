"""What ``sedsynth view`` computes from audio: the spectrogram picture, text queries through the detector, uploads.

- :func:`spectrogram_png`: encoded audio -> a PNG of its power spectrogram (time left to right
  from 0 to the clip's end, frequency bottom to top from 0 to half the rate), built by the same
  :class:`~trainer.evaluation.plots.Spectrogram` as ``sedsynth detect --pictures``.
- :class:`Querier`: a checkpoint loaded weights-only (:meth:`Detector.from_checkpoint
  <trainer.evaluation.detector.Detector.from_checkpoint>`), scoring encoded audio against text
  queries exactly as ``sedsynth detect`` does: frame probabilities after the median filter stored
  with the threshold, and the events at that threshold
  (:func:`~trainer.evaluation.detect_files.events`).
- :class:`Uploads`: audio files sent from the page, size-limited, written only inside one
  temporary folder that is removed when the server stops, each named by a random token (never by
  the name it was sent with).
"""

from __future__ import annotations

import functools
import io
import secrets
import shutil
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import soundfile as sf

from pipeline.audio import AudioError, read_blocks
from trainer.evaluation.plots import Spectrogram

FLOOR_DB = 80.0  # the picture's range below its loudest column: quieter is black
LEVELS = 64  # colours of the spectrogram picture
MAX_QUERIES = 16
MAX_QUERY_CHARS = 200


def spectrogram_png(audio: bytes, sample_rate_hz: int, max_columns: int = 2048) -> bytes:
    """Encoded ``audio`` (anything libsndfile reads) -> PNG bytes: one column per spectrogram column,
    one row per frequency bin, low frequencies at the bottom, log power over :data:`FLOOR_DB` dB in
    :data:`LEVELS` steps of matplotlib's magma colours. Raises :class:`~pipeline.audio.AudioError`
    for audio that does not decode."""
    from PIL import Image  # matplotlib's own PNG writer (a dependency of matplotlib)

    sketch = Spectrogram(sample_rate_hz, max_columns=max_columns)
    for block in read_blocks(audio, sample_rate_hz):
        sketch.push(block)
    _, _, power = sketch.columns()
    db = 10.0 * np.log10(np.maximum(power, 1e-12))
    top = float(db.max()) if db.size else 0.0
    level = np.clip((db - (top - FLOOR_DB)) / FLOOR_DB, 0.0, 1.0)[::-1]  # row 0 is the picture's top: the highest bin
    # a palette picture of LEVELS colours: a third of the bytes of full colour, and no step the eye can see
    image = Image.fromarray(np.round(level * (LEVELS - 1)).astype(np.uint8))  # greyscale; the palette makes it "P"
    image.putpalette(palette().tobytes())
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=6)
    return buf.getvalue()


@functools.cache
def palette() -> np.ndarray:
    """:data:`LEVELS` magma colours, dark to bright, as ``(LEVELS, 3)`` bytes."""
    import matplotlib

    return (matplotlib.colormaps["magma"](np.linspace(0.0, 1.0, LEVELS))[:, :3] * 255).round().astype(np.uint8)


def audio_facts(audio: bytes) -> dict:
    """Encoded ``audio`` -> ``{"duration_s", "sample_rate_hz", "channels", "format"}`` (libsndfile's header);
    raises :class:`~pipeline.audio.AudioError` for bytes it cannot read."""
    try:
        info = sf.info(io.BytesIO(audio))
    except (sf.LibsndfileError, RuntimeError, OSError, TypeError) as e:
        raise AudioError(
            "unreadable", f"cannot decode the file ({e}); use WAV, FLAC, OGG or another format libsndfile reads"
        ) from None
    if info.frames <= 0:
        raise AudioError("empty", "zero samples")
    return {
        "duration_s": info.frames / info.samplerate,
        "sample_rate_hz": int(info.samplerate),
        "channels": int(info.channels),
        "format": info.format,
    }


def check_query_texts(queries: list) -> list[str]:
    """The queries as ``sedsynth detect`` takes them (each once, in order); raises ValueError for a list that is
    empty or too long, or a query that is not text, is empty, too long, or holds a tab or line break."""
    from trainer.evaluation.detect_files import check_queries

    if not isinstance(queries, list) or not queries:
        raise ValueError("no query: type one or more, e.g. dog barking")
    if len(queries) > MAX_QUERIES:
        raise ValueError(f"{len(queries)} queries; at most {MAX_QUERIES} at a time")
    for q in queries:
        if not isinstance(q, str) or len(q) > MAX_QUERY_CHARS:
            raise ValueError(f"a query must be text of at most {MAX_QUERY_CHARS} characters")
    return check_queries([q.strip() for q in queries])


class Querier:
    """A checkpoint as ``sedsynth detect`` uses it: the detector, its stored threshold and median filter.

    Inputs: the checkpoint path and the ``evaluate`` params (device, window overlap, batch size,
    the median filters). Raises what :meth:`Detector.from_checkpoint` raises for a missing or
    unusable file (``FileNotFoundError``, :class:`~trainer.checkpoint.CheckpointError`).
    """

    def __init__(self, checkpoint: str | Path, evaluate, device: str | None = None):
        from trainer.evaluation.calibration import f1_median_filter, threshold_setting
        from trainer.evaluation.detector import Detector

        self.checkpoint = str(checkpoint)
        self.detector = Detector.from_checkpoint(
            checkpoint, device=device or evaluate.device, overlap=evaluate.window_overlap, batch_size=evaluate.batch_size
        )
        notes: list[str] = []
        self.threshold, self.threshold_source, stored = threshold_setting(None, checkpoint, "the checkpoint", warn=notes.append)
        self.median_filter_frames = f1_median_filter(evaluate.f1_median_filter_frames, stored, evaluate.median_filter_frames)
        self.notes = notes

    def warm_up(self) -> Querier:
        """One query on a second of silence: torch's first call (its kernels, the text encoder) is paid at start, not by the
        first query asked for. Returns itself."""
        det = self.detector
        det.score_stream([np.zeros(det.sample_rate_hz, np.float32)], [det.vocabulary(["warm up"])])
        return self

    def describe(self) -> dict:
        return {
            "checkpoint": self.checkpoint,
            "threshold": self.threshold,
            "threshold_source": self.threshold_source,
            "median_filter_frames": self.median_filter_frames,
            "sample_rate_hz": self.detector.sample_rate_hz,
        }

    def query(self, audio: bytes | str | Path, queries: list[str]) -> dict:
        """Encoded audio (bytes or a file) and checked query texts -> ``{"queries", "timestamps_s" (L+1,),
        "probs" (Q lists of L), "events" (Q lists of [onset_s, offset_s, peak]), "threshold",
        "median_filter_frames", "seconds"}``: the probabilities after the median filter, as ``sedsynth detect`` scores them."""
        from trainer.evaluation.detect_files import events
        from trainer.evaluation.metrics import smooth

        started = time.perf_counter()
        det = self.detector
        scores = det.score_stream(read_blocks(audio, det.sample_rate_hz), [det.vocabulary(queries)])
        probs = smooth(scores.probs[0], self.median_filter_frames)
        found = [[list(e) for e in events(scores.timestamps_s, probs[:, k], self.threshold)] for k in range(len(queries))]
        return {
            "queries": list(queries),
            "timestamps_s": scores.timestamps_s.tolist(),
            "probs": probs.T.tolist(),
            "events": found,
            "threshold": self.threshold,
            "median_filter_frames": self.median_filter_frames,
            "seconds": time.perf_counter() - started,
        }


class Uploads:
    """Uploaded audio in one temporary folder: at most ``keep`` files (the oldest goes first), each at most
    ``max_bytes``; :meth:`close` removes the folder."""

    def __init__(self, max_bytes: int, keep: int = 20):
        self.max_bytes, self.keep = max_bytes, keep
        self.folder = Path(tempfile.mkdtemp(prefix="sedsynth-view-"))
        self.files: OrderedDict[str, dict] = OrderedDict()

    def add(self, data: bytes, name: str) -> dict:
        """Store ``data`` (already within ``max_bytes``) sent as ``name`` -> its record: token, name, duration,
        rate, format. Raises :class:`~pipeline.audio.AudioError` when libsndfile cannot read it; nothing is kept then."""
        facts = audio_facts(data)
        token = secrets.token_hex(16)
        path = self.folder / f"{token}.audio"
        path.write_bytes(data)
        self.files[token] = {"token": token, "name": Path(name or "upload").name[:200], **facts, "path": path}
        while len(self.files) > self.keep:
            _, old = self.files.popitem(last=False)
            old["path"].unlink(missing_ok=True)
        return self.public(token)

    def get(self, token: str) -> dict | None:
        return self.files.get(token) if isinstance(token, str) else None

    def public(self, token: str) -> dict | None:
        """An upload's record without its path on disk."""
        found = self.get(token)
        return None if found is None else {k: v for k, v in found.items() if k != "path"}

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        self.files.clear()
