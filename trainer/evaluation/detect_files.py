"""``sedsynth detect``: when does each text query happen in these audio files?

Input: audio files of any length, sample rate and channel count (anything libsndfile reads),
one or more text queries and a checkpoint (its stored config rebuilds the model, so no
``params.yaml`` is needed with ``--checkpoint``). Output: one row per detected event, printed
as an aligned table (file, query, onset_s, offset_s, score) or as a DCASE detection TSV
(``filename onset offset event_label``, the file's base name as ground truth names it), and
optionally a sed_scores_eval score file per file (``--scores DIR``: ``DIR/<name>.tsv``, onset,
offset and one column per query) and a picture per file (spectrogram, each query's frame
probabilities, detected events as bars).

Inputs (:func:`expand_inputs`): files, folders (their audio files, sorted; ``--recursive`` descends),
glob patterns (expanded here when the shell passed them quoted) and ``--files-from LIST`` (one
path per line, ``-`` for stdin). A link inside a folder that leads out of it is skipped with a
line on stderr; a FIFO or device is refused.

Events are runs of frames whose median-filtered probability reaches the threshold (``--threshold``,
else the one ``sedsynth train`` chose on the valid split and stored in the checkpoint, else 0.5;
a line on stderr says which). The median filter is the one stored with the checkpoint's
threshold (else ``evaluate.median_filter_frames``), whether or not ``--threshold`` is given, unless
``--median-filter N`` names another. A file without events gets a ``no events found`` line with
each query's highest frame probability and when it occurs. An event's score is its highest frame probability; the score
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

import glob
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.audio import AudioError, read_blocks
from pipeline.files import special_file_problem
from pipeline.outputs import write_atomic
from pipeline.schema import text_problem
from trainer import checkpoint as checkpoint_file
from trainer.evaluation.calibration import f1_median_filter, threshold_setting
from trainer.evaluation.detector import Detector
from trainer.evaluation.metrics import smooth, tsv_cell
from trainer.evaluation.plots import Spectrogram, detection_figure

DCASE_HEADER = ("filename", "onset", "offset", "event_label")


def fits_tsv(name: str) -> bool:
    """True where ``name`` can be a TSV cell as it is (:func:`~trainer.evaluation.metrics.tsv_cell` takes it)."""
    return text_problem(name) is None


# libsndfile's formats and the file extensions they go by; only the formats the installed library reads count
_FORMAT_EXTENSIONS = {
    "WAV": ("wav",),
    "WAVEX": ("wav",),
    "FLAC": ("flac",),
    "OGG": ("ogg", "oga", "opus"),
    "MP3": ("mp3",),
    "AIFF": ("aif", "aiff", "aifc"),
    "AU": ("au", "snd"),
    "CAF": ("caf",),
    "W64": ("w64",),
    "RF64": ("rf64",),
    "NIST": ("nist", "sph"),
    "IRCAM": ("sf",),
    "VOC": ("voc",),
    "PAF": ("paf",),
    "SVX": ("svx", "8svx"),
    "SD2": ("sd2",),
    "WVE": ("wve",),
    "AVR": ("avr",),
    "HTK": ("htk",),
    "MPC2K": ("mpc2k",),
    "SDS": ("sds",),
    "XI": ("xi",),
}
GLOB_CHARS = frozenset("*?[")


def audio_extensions() -> frozenset[str]:
    """File extensions (lower case, no dot) of the formats the installed libsndfile reads."""
    import soundfile

    formats = soundfile.available_formats()
    return frozenset(ext for name, exts in _FORMAT_EXTENSIONS.items() if name in formats for ext in exts)


def _is_audio(path: str, extensions: frozenset[str]) -> bool:
    return Path(path).suffix[1:].lower() in extensions


def _inside(path: str, root: str) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(root)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def _folder_files(folder: str, recursive: bool, extensions: frozenset[str], note) -> list[str]:
    """The audio files in ``folder`` (sorted; with ``recursive`` its subfolders too, each after its folder's files).

    A link that leads out of ``folder`` is skipped (``note`` says so); a FIFO or device is skipped
    silently unless its name says audio, when ``note`` says why."""
    out: list[str] = []
    seen: set[str] = {os.path.realpath(folder)}

    def walk(current: str) -> None:
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError as e:
            note(f"{current}: cannot list it ({e.strerror or e})")
            return
        subfolders = []
        for entry in entries:
            path = entry.path
            if entry.is_symlink() and not _inside(path, folder):
                if entry.is_dir() and recursive or _is_audio(path, extensions):
                    note(f"{path}: skipped, a link that leads out of {folder} ({os.path.realpath(path)})")
                continue
            if entry.is_dir():
                real = os.path.realpath(path)
                if recursive and real not in seen:  # a link back up the tree is walked once
                    seen.add(real)
                    subfolders.append(path)
                continue
            if not _is_audio(path, extensions):
                continue
            problem = special_file_problem(path)
            if problem is not None:
                note(f"{path}: skipped, it {problem}")
                continue
            out.append(path)
        for sub in subfolders:
            walk(sub)

    walk(folder)
    return out


def read_file_list(source: str, stdin=None) -> list[str]:
    """``--files-from``: one path per line (blank lines skipped) from the file ``source``, or stdin for ``-``."""
    if source == "-":
        text = (stdin or sys.stdin).read()
    else:
        problem = special_file_problem(source)
        if problem is not None:
            raise ValueError(f"--files-from {source} {problem}")
        text = Path(source).read_text(encoding="utf-8")
    return [line.rstrip("\r") for line in text.split("\n") if line.strip()]


def expand_inputs(
    inputs: Iterable[str], recursive: bool = False, note=lambda line: print(f"sedsynth detect: {line}", file=sys.stderr)
) -> tuple[list[str], dict[str, str]]:
    """Paths as a user gives them -> ``(audio files in order, {input: why it gives none})``.

    A file is taken as it is (whatever its extension); a folder gives its audio files (by
    extension, those :func:`audio_extensions` names), sorted, its subfolders' too with
    ``recursive``; a path that does not exist and holds ``*``, ``?`` or ``[`` is a glob pattern
    (``**`` descends), giving the audio files it matches, sorted. A file reached twice is kept
    once. A FIFO or device, a missing path, a folder or pattern with no audio files are problems.
    """
    extensions = audio_extensions()
    files: list[str] = []
    problems: dict[str, str] = {}
    for item in inputs:
        if os.path.isdir(item):
            found = _folder_files(item, recursive, extensions, note)
            if not found:
                hint = "" if recursive else " (--recursive looks in its subfolders)"
                problems[item] = (
                    f"is a folder with no audio files{hint}; audio is found by extension: {', '.join(sorted(extensions))}"
                )
        elif os.path.lexists(item):
            problem = special_file_problem(item)
            if problem is None and not os.path.exists(item):
                problem = "is a link that leads nowhere"
            if problem is not None:
                problems[item] = problem
                continue
            found = [item]
        elif GLOB_CHARS & set(item):
            matches = sorted(glob.glob(item, recursive=True))
            found = [m for m in matches if _is_audio(m, extensions) and os.path.isfile(m) and special_file_problem(m) is None]
            if not found:
                problems[item] = (
                    "matches no audio file"
                    if not matches
                    else f"matches {len(matches)} path(s) but no audio file (by extension: {', '.join(sorted(extensions))})"
                )
        else:
            problems[item] = "does not exist or is not a file"
            continue
        files += found
    return list(dict.fromkeys(files)), problems


def quiet_line(file: str, peaks: dict[str, tuple[float, float]]) -> str:
    """The line for a file without events: each query's highest frame probability and when its frame starts."""
    best = ", ".join(f"{q!r} {p:.3f} at {t:.2f} s" for q, (p, t) in peaks.items())
    return f"{_shown(file)}: no events found (highest: {best})"


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
            raise ValueError(
                f"--query {q!r} is empty or holds a tab, line break or other control character; "
                'pass plain text such as --query "dog barking"'
            )
        if score_columns and q in ("onset", "offset"):
            raise ValueError(f'--query {q!r} would clash with the score files\' {q} column; reword it (e.g. "{q} of a sound")')
    return list(dict.fromkeys(queries))


def write_score_file(path: Path, timestamps_s: np.ndarray, probs: np.ndarray, queries: list[str]) -> None:
    """One file's frame probabilities ``(L, Q)`` -> a sed_scores_eval score TSV (onset, offset, one column per query), atomically.

    sed_scores_eval takes the file's name (less ``.tsv``) as the audio id: a name holding a tab or a
    line break raises ValueError, as would a detections TSV with that id."""
    from sed_scores_eval.base_modules.scores import create_score_dataframe

    tsv_cell(Path(path).name, "score file name")
    table = create_score_dataframe(
        np.asarray(probs, dtype=np.float64), np.asarray(timestamps_s, dtype=np.float64), [tsv_cell(q, "query") for q in queries]
    )
    write_atomic(path, table.to_csv(sep="\t", index=False).encode("utf-8"))  # what write_sed_scores writes, never half-written


def _tap(blocks: Iterable[np.ndarray], sketch: Spectrogram | None) -> Iterator[np.ndarray]:
    for block in blocks:
        if sketch is not None:
            sketch.push(block)
        yield block


def detect(
    detector: Detector,
    files: list[str],
    queries: list[str],
    threshold: float = 0.5,
    median_frames: int = 3,
    *,
    picture_dir: Path | None = None,
    scores_dir: Path | None = None,
    unique_names: bool = False,
    peaks: dict[str, dict[str, tuple[float, float]]] | None = None,
) -> tuple[list[Detection], dict[str, str]]:
    """Detections for every file that scores, and ``{file: what went wrong}`` for the others.

    Each file is streamed (:func:`read_blocks`), so only a window's worth of its audio is held.
    ``picture_dir`` / ``scores_dir`` get ``<stem>.png`` / ``<stem>.tsv`` per file; a picture or
    score file that fails is reported for its file while its detections are kept. With
    ``unique_names`` (outputs that name files by their base name), a file whose name (without
    extension, as sed_scores_eval reads ground truth) repeats an earlier input's is not scored;
    with ``unique_names`` or ``scores_dir``, nor is a file whose name holds a tab or line break.
    ``peaks``, when given, gets ``{file: {query: (highest probability, start of its frame in s)}}``
    for every file scored (after the median filter, as events are cut).
    """
    vocab = detector.vocabulary(queries)
    found: list[Detection] = []
    failed: dict[str, str] = {}
    names: dict[str, str] = {}
    for file in files:
        name = Path(file).stem
        if (unique_names or scores_dir is not None) and not fits_tsv(Path(file).name):
            failed[file] = (
                f"its name {Path(file).name!r} holds a tab or line break, which would forge rows of the TSV "
                "outputs; rename the file"
            )
            continue
        if (unique_names or picture_dir is not None or scores_dir is not None) and name in names:
            failed[file] = (
                f"has the name {name!r} of {names[name]}, and the outputs name files by it: rename one or run them separately"
            )
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
        if peaks is not None:
            top = np.argmax(probs, axis=0) if len(probs) else np.zeros(len(queries), int)
            peaks[file] = {
                q: (float(probs[top[k], k]) if len(probs) else float("nan"), float(scores.timestamps_s[top[k]]))
                for k, q in enumerate(queries)
            }
        problems = []
        if scores_dir is not None:
            try:
                write_score_file(Path(scores_dir) / f"{name}.tsv", scores.timestamps_s, probs, queries)
            except (OSError, ValueError) as e:
                problems.append(f"score file not written ({type(e).__name__}: {e})")
        if picture_dir is not None:
            try:
                detection_figure(
                    Path(picture_dir) / f"{name}.png",
                    sketch,
                    detector.sample_rate_hz,
                    scores.timestamps_s,
                    probs,
                    queries,
                    events=per_query,
                    title=Path(file).name,
                    threshold=threshold,
                )
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
            raise ValueError(
                f"file name(s) {', '.join(map(repr, bad))} hold a tab or line break or another control "
                "character: a DCASE TSV cannot name them"
            )
        body = [
            (
                Path(r.file).name,
                f"{r.onset_s:.10g}",
                f"{r.offset_s:.10g}",
                tsv_cell(r.query, "query"),
            )  # 10 significant digits: frame edges without float noise
            for r in rows
        ]
        return "\n".join("\t".join(x) for x in [DCASE_HEADER, *body])
    header = ["file", "query", "onset_s", "offset_s", "score"]
    body = [[r.file, r.query, f"{r.onset_s:.3f}", f"{r.offset_s:.3f}", f"{r.score:.3f}"] for r in rows]
    widths = [max(len(x[k]) for x in [header, *body]) for k in range(len(header))]
    return "\n".join(
        "  ".join(x[k].ljust(widths[k]) if k < 2 else x[k].rjust(widths[k]) for k in range(len(header))) for x in [header, *body]
    )


def _shown(path: str) -> str:
    """``path`` for a one-line message: as it is, or quoted with escapes where it holds a control character."""
    return path if path.isprintable() else repr(path)


def median_filter_setting(frames: int | None) -> int | None:
    """``--median-filter``: an odd number of frames, at least 1 (1: no filter); None: not given."""
    if frames is not None and (frames < 1 or frames % 2 == 0):
        raise ValueError(f"--median-filter is {frames}; use an odd number of frames, at least 1 (1: no filter)")
    return frames


def main(args, params) -> int:
    """``sedsynth detect`` with its parsed ``args`` and ``params`` (only ``evaluate.*`` is read; the model comes from the checkpoint).

    ``args.threshold`` None (no ``--threshold``) means the checkpoint's stored threshold; stderr says which one is used,
    and which median filter (the one stored with the threshold unless ``--median-filter``).
    """
    evaluate = params.evaluate
    checkpoint = args.checkpoint or evaluate.checkpoint
    queries = check_queries(args.query, score_columns=args.scores is not None)
    median = median_filter_setting(getattr(args, "median_filter", None))
    inputs = list(args.audio)
    files_from = getattr(args, "files_from", None)
    if files_from is not None:
        inputs += read_file_list(files_from)
    if not inputs:
        raise ValueError("no audio given: name files, folders or glob patterns, or pass --files-from LIST")
    detector = Detector.from_checkpoint(
        checkpoint, device=args.device or evaluate.device, overlap=evaluate.window_overlap, batch_size=evaluate.batch_size
    )
    threshold, source, stored = threshold_setting(
        args.threshold, checkpoint, "--threshold", warn=lambda line: print(f"sedsynth detect: {line}", file=sys.stderr)
    )
    if median is not None:
        frames, filter_source = median, "--median-filter"
    else:  # the filter stored with the checkpoint's threshold, with --threshold too: a threshold alone changes no filter
        calibration = stored if args.threshold is None else checkpoint_file.read_entry(checkpoint, "calibration")
        frames = f1_median_filter(evaluate.f1_median_filter_frames, calibration, evaluate.median_filter_frames)
        if evaluate.f1_median_filter_frames not in (None, "checkpoint"):
            filter_source = "evaluate.f1_median_filter_frames"
        elif calibration and "median_filter_frames" in calibration:
            filter_source = "stored with the checkpoint's threshold"
        else:
            filter_source = "evaluate.median_filter_frames"
    print(
        f"sedsynth detect: threshold {threshold:.6g} after a {frames}-frame median filter ({source}); filter: {filter_source}",
        file=sys.stderr,
    )
    audio, missing = expand_inputs(inputs, recursive=getattr(args, "recursive", False))
    for f, why in missing.items():
        print(f"sedsynth detect: error: {_shown(f)} {why}", file=sys.stderr)
    tsv = args.format == "tsv"
    peaks: dict[str, dict[str, tuple[float, float]]] = {}
    rows, failed = detect(
        detector,
        audio,
        queries,
        threshold,
        frames,
        picture_dir=Path(args.pictures) if args.pictures else None,
        scores_dir=Path(args.scores) if args.scores else None,
        unique_names=tsv,
        peaks=peaks,
    )
    for f, why in failed.items():
        print(f"sedsynth detect: error: {_shown(f)}: {why}", file=sys.stderr)
    with_events = {r.file for r in rows}
    quiet = [quiet_line(f, p) for f, p in peaks.items() if f not in with_events]
    if tsv:  # stdout stays a DCASE TSV: the lines go to stderr
        print(format_rows(rows, tsv))
        for line in quiet:
            print(f"sedsynth detect: {line}", file=sys.stderr)
    else:
        if rows or not quiet:
            print(format_rows(rows, tsv))
        for line in quiet:
            print(line)
    return 2 if missing or failed else 0
