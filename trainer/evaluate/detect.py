"""``sedsynth detect``: when does each text query happen in these audio files?

Input: audio files of any length, sample rate and channel count (anything libsndfile reads),
one or more text queries and a checkpoint. Output: one row per detected event (file, query,
onset_s, offset_s, score), printed as an aligned table or as TSV, and optionally a picture per
file (spectrogram, each query's frame probabilities, detected events as bars).

Events are runs of frames whose median-filtered probability reaches the threshold; an event's
score is its highest frame probability. A file that cannot be decoded is reported with the
reason, the others are still processed, and the command exits with status 2.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.audio import AudioError
from trainer.evaluate.detector import Detector, read_audio
from trainer.evaluate.metrics import smooth


@dataclass(frozen=True)
class Detection:
    file: str
    query: str
    onset_s: float
    offset_s: float
    score: float


def events(timestamps_s: np.ndarray, probs: np.ndarray, threshold: float) -> list[tuple[float, float, float]]:
    """One query's probabilities ``(L,)`` -> ``[(onset_s, offset_s, peak)]`` for runs at or above ``threshold``."""
    active = np.concatenate([[False], probs >= threshold, [False]])
    edges = np.flatnonzero(np.diff(active.astype(np.int8)))
    return [(float(timestamps_s[a]), float(timestamps_s[b]), float(probs[a:b].max())) for a, b in zip(edges[::2], edges[1::2])]


def detect(detector: Detector, files: list[str], queries: list[str], threshold: float = 0.5, median_frames: int = 3,
           picture_dir: Path | None = None) -> tuple[list[Detection], dict[str, str]]:
    """Detections for every readable file, and ``{file: reason}`` for the unreadable ones."""
    from trainer.evaluate.plots import detection_figure

    vocab = detector.vocabulary(queries)
    found: list[Detection] = []
    failed: dict[str, str] = {}
    for file in files:
        try:
            wave = read_audio(file, detector.sample_rate_hz)
        except AudioError as e:
            failed[file] = f"{e.reason}: {e.detail}"
            continue
        (scores,) = detector.score([wave], [vocab])
        probs = smooth(scores.probs[0], median_frames)
        per_query = {q: events(scores.timestamps_s, probs[:, k], threshold) for k, q in enumerate(queries)}
        found += [Detection(file, q, on, off, s) for q, evs in per_query.items() for on, off, s in evs]
        if picture_dir is not None:
            detection_figure(Path(picture_dir) / f"{Path(file).stem}.png", wave, detector.sample_rate_hz, scores.timestamps_s,
                             probs, queries, events=per_query, title=Path(file).name, threshold=threshold)
    return found, failed


def format_rows(rows: list[Detection], tsv: bool) -> str:
    header = ["file", "query", "onset_s", "offset_s", "score"]
    body = [[r.file, r.query, f"{r.onset_s:.3f}", f"{r.offset_s:.3f}", f"{r.score:.3f}"] for r in rows]
    if tsv:
        return "\n".join("\t".join(x) for x in [header, *body])
    widths = [max(len(x[k]) for x in [header, *body]) for k in range(len(header))]
    return "\n".join("  ".join(x[k].ljust(widths[k]) if k < 2 else x[k].rjust(widths[k]) for k in range(len(header))) for x in [header, *body])


def main(args, params) -> int:
    checkpoint = args.checkpoint or params.evaluate.checkpoint
    detector = Detector.from_checkpoint(checkpoint, device=args.device or params.evaluate.device,
                                        overlap=params.evaluate.window_overlap, batch_size=params.evaluate.batch_size)
    missing = [f for f in args.audio if not Path(f).is_file()]
    for f in missing:
        print(f"sedsynth detect: error: {f} does not exist or is not a file", file=sys.stderr)
    rows, failed = detect(detector, [f for f in args.audio if f not in missing], args.query, args.threshold,
                          params.evaluate.median_filter_frames, Path(args.pictures) if args.pictures else None)
    for f, why in failed.items():
        print(f"sedsynth detect: error: cannot read {f} ({why})", file=sys.stderr)
    print(format_rows(rows, args.format == "tsv"))
    return 2 if missing or failed else 0
