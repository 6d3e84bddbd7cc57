"""Readers of DCASE strong-label TSVs: DESED real (DCASE task 4) and any TSV of that format.

A DCASE strong TSV is tab separated, ``filename onset offset event_label`` (times in seconds
from the clip's start), one row per event, with a header row in the published files. A row
with an empty onset, offset and label (``Y...wav\\t\\t\\t``, or the file name alone) states a
clip without events; a row with a label but no times is a weak label, which a strong TSV
cannot use (``malformed-row``). The durations TSV beside it (``filename duration``) is read by
:func:`read_durations_tsv`.

This module is the one reader of the format: the importers below and the evaluation's
benchmark reader (:func:`trainer.evaluation.readers.read_desed`) both take their rows, regions
and skips from :func:`read_strong_tsv` and :func:`annotated_audio`.

:func:`read_desed` reads DESED as the ``desed`` package and the DCASE task 4 baselines lay it
out (turpaultn/DESED ``download_real``; DESED_task ``confs/*.yaml``; the DESED_public_eval
Zenodo archive, which adds a leading ``dataset/``)::

    metadata/validation/validation.tsv     audio/validation/validation/*.wav  (or audio/validation/*.wav)
    metadata/eval/public.tsv               audio/eval/public/*.wav

The durations TSVs beside them (``validation_durations.tsv``, ``public_durations.tsv``) are not
read: the writer clips regions to the decoded duration. Labels are the ten DESED classes of
``pipeline/data/desed_classes.csv`` (label -> AudioSet MID); any other label is a Skip
``unknown-label``. Options: ``validation_split`` (default ``valid``), ``public_split`` (default
``test``), ``validation_audio_dir``, ``public_audio_dir`` (folders relative to the root).

:func:`read_dcase_tsv` reads one TSV of that format (header optional). Options: ``tsv`` (the
file), ``audio_dir`` (the folder its file names are in), ``split`` (default ``train``),
``class_map`` (optional CSV with ``label,mid`` columns); ``id_prefix`` (default ``dcase``).
Labels the class map lacks get MID ``""`` (the writer assigns their cluster by text).

Both return clips sorted by clip_id (``<prefix>-<file stem>``) with regions sorted by (onset,
offset, label), and a Skip for every unusable row: ``malformed-row`` (wrong field count, times
that are not numbers, an empty label, a file name that is not a plain relative path),
``bad-region`` (a negative time or onset >= offset), ``unknown-label``, ``missing-file`` (the
audio file is absent: the clip is left out) and ``no-label`` (a clip whose every row was
skipped: left out rather than kept as a clip without events). A TSV that a symbolic link leads
out of the root is one Skip ``outside-root``. Regions that run past the clip's
end, and overlapping regions of one label, are kept as they are for the writer.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pipeline.schema import SPLITS, ImportedClip, ImportedRegion, Skip

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
OUTSIDE_ROOT = "outside-root"  # the skip reason of a file that a symbolic link leads out of the corpus root
DESED_CLASSES = DATA_DIR / "desed_classes.csv"
DESED_ATTRIBUTION = (
    "DESED real recordings (Turpault et al., DCASE 2019 workshop; Serizel et al., ICASSP 2020), AudioSet clips from YouTube"
)
TSV_COLUMNS = ("filename", "onset", "offset", "event_label")


@dataclass(frozen=True)
class DesedSet:
    """One DESED strong-label set: its TSV and candidate audio folders, relative to the root."""

    name: str
    tsv: str
    audio_dirs: tuple[str, ...]
    default_split: str


DESED_SETS = (
    DesedSet("validation", "metadata/validation/validation.tsv", ("audio/validation/validation", "audio/validation"), "valid"),
    DesedSet("public", "metadata/eval/public.tsv", ("audio/eval/public",), "test"),
)


@dataclass(frozen=True)
class TsvRow:
    """One data row of a strong TSV; ``onset``/``offset``/``label`` are the raw texts.

    ``problem`` says why a row whose file name reads cannot be read otherwise (too few fields);
    the row still names its file, so the file's clip knows it lost a row.
    """

    line_no: int
    filename: str
    onset: str
    offset: str
    label: str
    problem: str = ""

    @property
    def states_no_event(self) -> bool:
        return not (self.problem or self.onset or self.offset or self.label)


@dataclass(frozen=True)
class AnnotatedAudio:
    """One audio file a strong TSV annotates: its clip id, its path relative to the root, its regions."""

    clip_id: str
    audio_path: str
    regions: tuple[ImportedRegion, ...]


def load_class_map(path: Path) -> dict[str, str]:
    """A class-map CSV (header with ``label`` and ``mid`` columns) -> {label: mid}.

    ValueError naming the file when the header lacks either column or a label repeats.
    """
    with open(path, encoding="utf-8-sig", newline="") as f:
        rows = list(csv.reader(f))
    header = [h.strip().lower() for h in rows[0]] if rows else []
    if "label" not in header or "mid" not in header:
        raise ValueError(f"class map {path}: header {header} lacks label and mid columns (expected label,mid[,...])")
    at_label, at_mid = header.index("label"), header.index("mid")
    mapping: dict[str, str] = {}
    for n, row in enumerate(rows[1:], start=2):
        if not any(x.strip() for x in row):
            continue
        if len(row) <= max(at_label, at_mid):
            raise ValueError(f"class map {path} line {n}: {len(row)} fields, expected {len(header)}")
        label = row[at_label].strip()
        if label in mapping:
            raise ValueError(f"class map {path} line {n}: label {label!r} is listed twice")
        mapping[label] = row[at_mid].strip()
    return mapping


def parse_seconds(text: str) -> float | None:
    """A time in seconds from its text, or None when it is not a finite number."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def region_problem(onset_s: float, offset_s: float) -> str | None:
    """Why ``[onset_s, offset_s)`` is not a usable region (a ``bad-region`` detail), or None."""
    if onset_s < 0 or offset_s < 0:
        return f"negative time (onset {onset_s:g} s, offset {offset_s:g} s)"
    if onset_s >= offset_s:
        return f"onset {onset_s:g} s is not before offset {offset_s:g} s"
    return None


def plain_relative_name(name: str) -> bool:
    """True for a relative POSIX path without ``..`` parts (a file name a TSV may list)."""
    path = PurePosixPath(name)
    return bool(name) and "\\" not in name and not path.is_absolute() and ".." not in path.parts


def outside_root(root: Path, path: Path | str) -> str | None:
    """Why the file ``path`` (absolute, or relative to ``root``) must not be opened, or None when it may be.

    A path under ``root`` by name must resolve under it too: a symbolic link in a downloaded
    corpus that leads out of it (``audio/a.wav -> ~/.ssh/id_ed25519``) would otherwise be read,
    and its bytes could reach the shards or an error message. A path that leaves the root by
    name was put there by an option (an absolute ``audio_dir`` or ``tsv``): the user chose that
    place, and it is read as named.
    """
    base = Path(os.path.abspath(root))
    named = Path(os.path.abspath(base / path))
    if not named.is_relative_to(base) or named.resolve().is_relative_to(base.resolve()):
        return None
    rel = named.relative_to(base).as_posix()
    return f"{rel} is a symbolic link (or lies in a linked folder) that leads outside the corpus root; left out rather than read"


def sort_regions(regions: list[ImportedRegion]) -> tuple[ImportedRegion, ...]:
    """Regions in (onset, offset, label) order; the text breaks ties so the order is total."""
    return tuple(sorted(regions, key=lambda r: (r.onset_s, r.offset_s, r.label, r.text)))


def relative_to_root(root: Path, folder: str) -> str:
    """A folder option (relative to the root, or absolute) as a POSIX path relative to the root."""
    path = Path(folder)
    if not path.is_absolute():
        return PurePosixPath(folder).as_posix().strip("/") or "."
    return Path(os.path.relpath(path, root)).as_posix()


def read_strong_tsv(path: Path, rel: str) -> tuple[list[TsvRow], list[Skip]]:
    """The data rows of a DCASE strong TSV and a Skip for every row that does not parse.

    A first row naming ``filename`` is the header; its ``onset``, ``offset`` and
    ``event_label`` (or ``label``) columns are used wherever they are. Without a header the
    columns are positional. A header lacking a column makes the whole file one Skip.
    """
    lines = path.read_text(encoding="utf-8-sig", errors="replace").splitlines()
    numbered = [(n, line) for n, line in enumerate(lines, start=1) if line.strip()]
    if not numbered:
        return [], [Skip(rel, rel, "malformed-row", f"{rel} is empty")]
    columns = {name: i for i, name in enumerate(TSV_COLUMNS)}
    first = [x.strip().lower() for x in numbered[0][1].split("\t")]
    if "filename" in first:
        header = ["event_label" if x == "label" else x for x in first]
        missing = [c for c in TSV_COLUMNS if c not in header]
        if missing:
            return [], [
                Skip(
                    rel,
                    rel,
                    "malformed-row",
                    f"header {first} lacks {', '.join(missing)} (expected {' '.join(TSV_COLUMNS)}, tab separated)",
                )
            ]
        columns = {name: header.index(name) for name in TSV_COLUMNS}
        numbered = numbered[1:]
    width = max(columns.values()) + 1
    rows: list[TsvRow] = []
    skips: list[Skip] = []
    for line_no, line in numbered:
        fields = [x.strip() for x in line.split("\t")]
        filename = fields[columns["filename"]] if len(fields) > columns["filename"] else ""
        rest = [fields[i] if i < len(fields) else "" for i in (columns["onset"], columns["offset"], columns["event_label"])]
        if not plain_relative_name(filename):
            skips.append(
                Skip(
                    f"{rel}#line{line_no}",
                    rel,
                    "malformed-row",
                    f"line {line_no}: file name {filename!r} is not a plain relative path",
                )
            )
        elif len(fields) < width and any(rest):
            rows.append(
                TsvRow(
                    line_no, filename, *rest, problem=f"line {line_no}: {len(fields)} fields, expected {width} (tab separated)"
                )
            )
        else:
            rows.append(TsvRow(line_no, filename, *rest))
    return rows, skips


def read_durations_tsv(path: Path, rel: str) -> tuple[dict[str, float | None], list[Skip]]:
    """A DCASE durations TSV (``filename duration``, tab separated, header optional) -> {file name: seconds}.

    A row whose duration is not a positive number is a Skip and maps its file to None (the
    duration is then taken from elsewhere, the audio header); a file listed again is a Skip, the
    first row kept; a header lacking either column makes the whole file one Skip.
    """
    lines = path.read_text(encoding="utf-8-sig", errors="replace").splitlines()
    numbered = [(n, line) for n, line in enumerate(lines, start=1) if line.strip()]
    at_name, at_duration = 0, 1
    if numbered and "filename" in (first := [x.strip().lower() for x in numbered[0][1].split("\t")]):
        if "duration" not in first:
            return {}, [
                Skip(rel, rel, "malformed-row", f"header {first} lacks duration (expected filename duration, tab separated)")
            ]
        at_name, at_duration = first.index("filename"), first.index("duration")
        numbered = numbered[1:]
    durations: dict[str, float | None] = {}
    skips: list[Skip] = []
    for line_no, line in numbered:
        fields = [x.strip() for x in line.split("\t")]
        filename = fields[at_name] if len(fields) > at_name else ""
        text = fields[at_duration] if len(fields) > at_duration else ""
        seconds = parse_seconds(text)
        item = f"{rel}#line{line_no}"
        if not plain_relative_name(filename):
            skips.append(Skip(item, rel, "malformed-row", f"line {line_no}: file name {filename!r} is not a plain relative path"))
        elif filename in durations:
            skips.append(Skip(item, rel, "malformed-row", f"line {line_no}: {filename} is listed again; its first row is kept"))
        else:
            durations[filename] = seconds if seconds is not None and seconds > 0 else None
            if durations[filename] is None:
                skips.append(
                    Skip(item, rel, "malformed-row", f"line {line_no}: duration {text!r} of {filename} is not a positive number")
                )
    return durations, skips


def annotated_audio(
    root: Path,
    rows: list[TsvRow],
    rel_tsv: str,
    audio_dir: str,
    clip_id_of: Callable[[str], str],
    mid_of: Callable[[str], str | None],
) -> tuple[list[AnnotatedAudio], list[Skip]]:
    """The audio files that strong-TSV rows annotate, in one audio folder, with their regions.

    ``clip_id_of(filename)`` names a file's clip; ``mid_of(label)`` is None for an unknown label.
    A file whose every row was skipped (``no-label``) or whose audio is absent
    (``missing-file``) is left out, each with its Skip.
    """
    by_file: dict[str, list[TsvRow]] = {}
    for row in rows:
        by_file.setdefault(row.filename, []).append(row)
    found: list[AnnotatedAudio] = []
    skips: list[Skip] = []
    for filename, file_rows in by_file.items():
        clip_id = clip_id_of(filename)
        regions: list[ImportedRegion] = []
        row_skips: list[Skip] = []
        for row in file_rows:
            if row.states_no_event:
                continue
            region, skip = _region_of(row, rel_tsv, clip_id, mid_of)
            regions.extend([region] if region else [])
            row_skips.extend([skip] if skip else [])
        skips.extend(row_skips)
        audio_path = filename if audio_dir in ("", ".") else f"{audio_dir}/{filename}"
        if not regions and row_skips:
            skips.append(
                Skip(
                    clip_id,
                    rel_tsv,
                    "no-label",
                    f"every row of {filename} in {rel_tsv} was skipped; left out rather than kept as a clip without events",
                )
            )
        elif not (root / audio_path).is_file():
            skips.append(Skip(clip_id, audio_path, "missing-file", f"{audio_path} not found ({rel_tsv} lists it)"))
        else:
            found.append(AnnotatedAudio(clip_id, audio_path, sort_regions(regions)))
    return found, skips


def clips_from_rows(
    root: Path,
    rows: list[TsvRow],
    rel_tsv: str,
    audio_dir: str,
    split: str,
    *,
    id_prefix: str,
    mid_of: Callable[[str], str | None],
    attribution: str,
    license_text: str = "",
) -> tuple[list[ImportedClip], list[Skip]]:
    """Clips (``<id_prefix>-<file stem>``) from strong-TSV rows of one audio folder (:func:`annotated_audio`)."""
    found, skips = annotated_audio(root, rows, rel_tsv, audio_dir, lambda name: f"{id_prefix}-{PurePosixPath(name).stem}", mid_of)
    return [ImportedClip(a.clip_id, a.audio_path, split, (), a.regions, license_text, attribution) for a in found], skips


def _region_of(
    row: TsvRow, rel_tsv: str, clip_id: str, mid_of: Callable[[str], str | None]
) -> tuple[ImportedRegion | None, Skip | None]:
    item = f"{clip_id}#line{row.line_no}"
    if row.problem:
        return None, Skip(item, rel_tsv, "malformed-row", row.problem)
    if not (row.onset or row.offset):  # a weak label: the event is there, but not when
        return None, Skip(
            item,
            rel_tsv,
            "malformed-row",
            f"line {row.line_no}: label {row.label!r} without onset and offset "
            "(a weak label); a strong TSV gives every event its times",
        )
    onset_s, offset_s = parse_seconds(row.onset), parse_seconds(row.offset)
    if onset_s is None or offset_s is None:
        return None, Skip(
            item, rel_tsv, "malformed-row", f"line {row.line_no}: onset {row.onset!r} / offset {row.offset!r} are not numbers"
        )
    if not row.label:
        return None, Skip(item, rel_tsv, "malformed-row", f"line {row.line_no}: times without an event label")
    problem = region_problem(onset_s, offset_s)
    if problem:
        return None, Skip(item, rel_tsv, "bad-region", f"line {row.line_no} ({row.label}): {problem}")
    mid = mid_of(row.label)
    if mid is None:
        return None, Skip(
            item, rel_tsv, "unknown-label", f"line {row.line_no}: label {row.label!r} is not a class of this corpus"
        )
    return ImportedRegion(row.label, mid, "", onset_s, offset_s), None


def _split_option(options: dict, key: str, default: str) -> str:
    split = str(options.get(key, default))
    if split not in SPLITS:
        raise ValueError(f"option {key}={split!r}: a split is one of {', '.join(SPLITS)}")
    return split


def _merge(parts: list[tuple[list[ImportedClip], list[Skip]]]) -> tuple[list[ImportedClip], list[Skip]]:
    """Clips of several TSVs sorted by clip_id; a clip id seen before is a Skip, the first kept."""
    seen: dict[str, ImportedClip] = {}
    skips: list[Skip] = []
    for clips, part_skips in parts:
        skips.extend(part_skips)
        for clip in clips:
            if clip.clip_id in seen:
                skips.append(
                    Skip(
                        clip.clip_id,
                        clip.audio_path,
                        "malformed-row",
                        f"clip id {clip.clip_id} is already taken by {seen[clip.clip_id].audio_path}",
                    )
                )
            else:
                seen[clip.clip_id] = clip
    return sorted(seen.values(), key=lambda c: c.clip_id), skips


def read_desed(root: Path, options: dict) -> tuple[list[ImportedClip], list[Skip]]:
    """DESED real strong labels (validation and public eval sets) under ``root``.

    A set whose TSV is absent is a Skip ``missing-file``; FileNotFoundError naming the
    expected files when neither is there.
    """
    root = Path(root)
    classes = load_class_map(DESED_CLASSES)
    parts: list[tuple[list[ImportedClip], list[Skip]]] = []
    missing: list[Skip] = []
    for desed_set in DESED_SETS:
        base = next((b for b in ("", "dataset/") if (root / b / desed_set.tsv).is_file()), None)
        if base is None:
            missing.append(
                Skip(
                    desed_set.tsv,
                    desed_set.tsv,
                    "missing-file",
                    f"{desed_set.tsv} not found; the {desed_set.name} set is left out",
                )
            )
            continue
        rel_tsv = base + desed_set.tsv
        if problem := outside_root(root, rel_tsv):
            missing.append(Skip(rel_tsv, rel_tsv, OUTSIDE_ROOT, f"{problem}; the {desed_set.name} set is left out"))
            continue
        audio_dir = options.get(f"{desed_set.name}_audio_dir")
        if audio_dir is None:
            candidates = [base + d for d in desed_set.audio_dirs]
            audio_dir = next((d for d in candidates if (root / d).is_dir()), candidates[0])
        split = _split_option(options, f"{desed_set.name}_split", desed_set.default_split)
        rows, skips = read_strong_tsv(root / rel_tsv, rel_tsv)
        clips, clip_skips = clips_from_rows(
            root,
            rows,
            rel_tsv,
            relative_to_root(root, str(audio_dir)),
            split,
            id_prefix="desed",
            mid_of=classes.get,
            attribution=DESED_ATTRIBUTION,
        )
        parts.append((clips, skips + clip_skips))
    if not parts and any(s.reason == OUTSIDE_ROOT for s in missing):
        return [], missing
    if not parts:
        expected = " and ".join(f"[dataset/]{s.tsv}" for s in DESED_SETS)
        raise FileNotFoundError(f"no DESED strong-label TSV under {root}: expected {expected} (the DCASE task 4 layout)")
    clips, skips = _merge(parts)
    return clips, missing + skips


def read_dcase_tsv(root: Path, options: dict) -> tuple[list[ImportedClip], list[Skip]]:
    """One DCASE strong TSV (options ``tsv``, ``audio_dir``, ``split``, ``class_map``, ``id_prefix``)."""
    root = Path(root)
    for key in ("tsv", "audio_dir"):
        if not options.get(key):
            raise ValueError(
                f"dcase-tsv needs option {key}=PATH (tsv: the filename/onset/offset/event_label file; "
                "audio_dir: the folder its file names are in), relative to the root or absolute"
            )
    tsv = Path(options["tsv"]) if Path(options["tsv"]).is_absolute() else root / options["tsv"]
    if not tsv.is_file():
        raise FileNotFoundError(f"dcase-tsv: option tsv names {tsv}, which does not exist")
    classes = load_class_map(Path(options["class_map"])) if options.get("class_map") else {}
    split = _split_option(options, "split", "train")
    rel_tsv = relative_to_root(root, str(tsv))
    if problem := outside_root(root, tsv):
        return [], [Skip(rel_tsv, rel_tsv, OUTSIDE_ROOT, problem)]
    rows, skips = read_strong_tsv(tsv, rel_tsv)
    clips, clip_skips = clips_from_rows(
        root,
        rows,
        rel_tsv,
        relative_to_root(root, str(options["audio_dir"])),
        split,
        id_prefix=str(options.get("id_prefix", "dcase")),
        mid_of=lambda label: classes.get(label, ""),
        attribution=f"DCASE strong labels from {tsv.name}",
    )
    clips, merge_skips = _merge([(clips, clip_skips)])
    return clips, skips + merge_skips
