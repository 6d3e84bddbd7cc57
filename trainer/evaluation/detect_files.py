"""``sedsynth detect``: when does each text query happen in these audio files?

Input: audio files of any length, sample rate and channel count (anything libsndfile reads),
one or more text queries and a checkpoint (its stored config rebuilds the model, so no
``params.yaml`` is needed with ``--checkpoint``). Output: one row per detected event, printed
as an aligned table (file, query, onset_s, offset_s, score) or as a DCASE detection TSV
(``filename onset offset event_label``, the file's base name as ground truth names it), and
optionally a sed_scores_eval score file per file (``--scores DIR``: ``DIR/<name>.tsv``, onset,
offset and one column per query) and a picture per file (spectrogram, each query's frame
probabilities, detected events as bars).

Events are runs of frames whose median-filtered probability reaches the threshold (``--threshold``,
else the one ``sedsynth train`` chose on the valid split and stored in the checkpoint, else 0.5;
a line on stderr says which); an event's score is its highest frame probability; the score
files hold the same median-filtered probabilities, so sed_scores_eval's PSDS and collar F1 score
them as the evaluate stage does.

Files are read, resampled and scored a block at a time, so memory stays bounded for audio of
any length. A file that fails (cannot be decoded, too short to hold one sample at the model's
rate, a name another input already has, a picture or score file that cannot be written) is
reported on stderr with the reason; the other files are still processed and written, and
the command exits with status 2. A file whose name holds a tab, a line break (CR, LF, NEL,
U+2028, U+2029) or another control character is refused when the outputs name files
(``--format tsv``, ``--scores``): in a TSV it would forge rows; every cell the TSV outputs
write passes :func:`~trainer.evaluation.metrics.tsv_cell`, the check of every TSV writer of the
evaluation.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.audio import AudioError, read_blocks
from pipeline.outputs import write_atomic
from trainer.evaluation.calibration import f1_median_filter, threshold_setting
from trainer.evaluation.detector import Detector
from trainer.evaluation.metrics import smooth, tsv_cell
from trainer.evaluation.plots import Spectrogram, detection_figure

DCASE_HEADER = ("filename", "onset", "offset", "event_label")


def fits_tsv(name: str) -> bool:
    """True where ``name`` can be a TSV cell as it is (:func:`~trainer.evaluation.metrics.tsv_cell` takes it)."""
    try:
        tsv_cell(name)
    except ValueError:
        return False
    return True


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


def check_queries(queries: list[str], score_columns: bool = False) -> list[str]:
    """The queries, each once, in order; a query that cannot be a TSV label (or a score column) raises ValueError."""
    for q in queries:
        if not q.strip() or not fits_tsv(q):
            raise ValueError(f"--query {q!r} is empty or holds a tab, line break or other control character; "
                             "pass plain text such as --query \"dog barking\"")
        if score_columns and q in ("onset", "offset"):
            raise ValueError(f"--query {q!r} would clash with the score files' {q} column; reword it (e.g. \"{q} of a sound\")")
    return list(dict.fromkeys(queries))


def write_score_file(path: Path, timestamps_s: np.ndarray, probs: np.ndarray, queries: list[str]) -> None:
    """One file's frame probabilities ``(L, Q)`` -> a sed_scores_eval score TSV (onset, offset, one column per query), atomically.

    sed_scores_eval takes the file's name (less ``.tsv``) as the audio id: a name holding a tab or a
    line break raises ValueError, as would a detections TSV with that id."""
    from sed_scores_eval.base_modules.scores import create_score_dataframe

    tsv_cell(Path(path).name, "score file name")
    table = create_score_dataframe(np.asarray(probs, dtype=np.float64), np.asarray(timestamps_s, dtype=np.float64),
                                   [tsv_cell(q, "query") for q in queries])
    write_atomic(path, table.to_csv(sep="\t", index=False).encode("utf-8"))  # what write_sed_scores writes, never half-written


def _tap(blocks: Iterable[np.ndarray], sketch: Spectrogram | None) -> Iterator[np.ndarray]:
    for block in blocks:
        if sketch is not None:
            sketch.push(block)
        yield block


def detect(detector: Detector, files: list[str], queries: list[str], threshold: float = 0.5, median_frames: int = 3,
           picture_dir: Path | None = None, scores_dir: Path | None = None, unique_names: bool = False) -> tuple[list[Detection], dict[str, str]]:
    """Detections for every file that scores, and ``{file: what went wrong}`` for the others.

    Each file is streamed (:func:`read_blocks`), so only a window's worth of its audio is held.
    ``picture_dir`` / ``scores_dir`` get ``<stem>.png`` / ``<stem>.tsv`` per file; a picture or
    score file that fails is reported for its file while its detections are kept. With
    ``unique_names`` (outputs that name files by their base name), a file whose name (without
    extension, as sed_scores_eval reads ground truth) repeats an earlier input's is not scored;
    with ``unique_names`` or ``scores_dir``, nor is a file whose name holds a tab or line break.
    """
    vocab = detector.vocabulary(queries)
    found: list[Detection] = []
    failed: dict[str, str] = {}
    names: dict[str, str] = {}
    for file in files:
        name = Path(file).stem
        if (unique_names or scores_dir is not None) and not fits_tsv(Path(file).name):
            failed[file] = (f"its name {Path(file).name!r} holds a tab or line break, which would forge rows of the TSV "
                            "outputs; rename the file")
            continue
        if (unique_names or picture_dir is not None or scores_dir is not None) and name in names:
            failed[file] = (f"has the name {name!r} of {names[name]}, and the outputs name files by it: "
                            "rename one or run them separately")
            continue
        names[name] = file
        sketch = Spectrogram(detector.sample_rate_hz) if picture_dir is not None else None
        try:
            scores = detector.score_stream(_tap(read_blocks(file, detector.sample_rate_hz), sketch), [vocab])
        except AudioError as e:
            failed[file] = f"cannot read it ({e.reason}: {e.detail})"
            continue
        probs = smooth(scores.probs[0], median_frames)
        per_query = {q: events(scores.timestamps_s, probs[:, k], threshold) for k, q in enumerate(queries)}
        found += [Detection(file, q, on, off, s) for q, evs in per_query.items() for on, off, s in evs]
        problems = []
        if scores_dir is not None:
            try:
                write_score_file(Path(scores_dir) / f"{name}.tsv", scores.timestamps_s, probs, queries)
            except (OSError, ValueError) as e:
                problems.append(f"score file not written ({type(e).__name__}: {e})")
        if picture_dir is not None:
            try:
                detection_figure(Path(picture_dir) / f"{name}.png", sketch, detector.sample_rate_hz, scores.timestamps_s,
                                 probs, queries, events=per_query, title=Path(file).name, threshold=threshold)
            except Exception as e:  # a picture is a by-product: whatever breaks it, the detections stand
                problems.append(f"picture not drawn ({type(e).__name__}: {e})")
        if problems:
            failed[file] = "; ".join(problems) + " (its detections are listed)"
    return found, failed


def format_rows(rows: list[Detection], tsv: bool) -> str:
    """The table (full paths, scores) or the DCASE detection TSV (base names, as ground truth files name them).

    A base name that cannot be a TSV cell raises ValueError (:func:`detect` refuses such files first)."""
    if tsv:
        bad = sorted({Path(r.file).name for r in rows if not fits_tsv(Path(r.file).name)})
        if bad:
            raise ValueError(f"file name(s) {', '.join(map(repr, bad))} hold a tab or line break or another control "
                             "character: a DCASE TSV cannot name them")
        body = [(Path(r.file).name, f"{r.onset_s:.10g}", f"{r.offset_s:.10g}", tsv_cell(r.query, "query"))  # 10 significant digits: frame edges without float noise
                for r in rows]
        return "\n".join("\t".join(x) for x in [DCASE_HEADER, *body])
    header = ["file", "query", "onset_s", "offset_s", "score"]
    body = [[r.file, r.query, f"{r.onset_s:.3f}", f"{r.offset_s:.3f}", f"{r.score:.3f}"] for r in rows]
    widths = [max(len(x[k]) for x in [header, *body]) for k in range(len(header))]
    return "\n".join("  ".join(x[k].ljust(widths[k]) if k < 2 else x[k].rjust(widths[k]) for k in range(len(header))) for x in [header, *body])


def _shown(path: str) -> str:
    """``path`` for a one-line message: as it is, or quoted with escapes where it holds a control character."""
    return path if path.isprintable() else repr(path)


def main(args, params) -> int:
    """``sedsynth detect`` with its parsed ``args`` and ``params`` (only ``evaluate.*`` is read; the model comes from the checkpoint).

    ``args.threshold`` None (no ``--threshold``) means the checkpoint's stored threshold; stderr says which one is used.
    """
    evaluate = params.evaluate
    checkpoint = args.checkpoint or evaluate.checkpoint
    queries = check_queries(args.query, score_columns=args.scores is not None)
    detector = Detector.from_checkpoint(checkpoint, device=args.device or evaluate.device,
                                        overlap=evaluate.window_overlap, batch_size=evaluate.batch_size)
    threshold, source, stored = threshold_setting(args.threshold, checkpoint, "--threshold",
                                                  warn=lambda line: print(f"sedsynth detect: {line}", file=sys.stderr))
    # the threshold's own filter: the one stored with it, else evaluate's
    frames = f1_median_filter(evaluate.f1_median_filter_frames if args.threshold is None else evaluate.median_filter_frames, stored,
                              evaluate.median_filter_frames)
    print(f"sedsynth detect: threshold {threshold:.6g} after a {frames}-frame median filter ({source})", file=sys.stderr)
    missing = [f for f in args.audio if not Path(f).is_file()]
    for f in missing:
        print(f"sedsynth detect: error: {_shown(f)} does not exist or is not a file", file=sys.stderr)
    tsv = args.format == "tsv"
    rows, failed = detect(detector, [f for f in args.audio if f not in missing], queries, threshold, frames, Path(args.pictures) if args.pictures else None,
                          Path(args.scores) if args.scores else None, unique_names=tsv)
    for f, why in failed.items():
        print(f"sedsynth detect: error: {_shown(f)}: {why}", file=sys.stderr)
    print(format_rows(rows, tsv))
    return 2 if missing or failed else 0
