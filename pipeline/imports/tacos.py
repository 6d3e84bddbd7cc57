"""Reader of TACOS, Temporally-Aligned Audio CaptiOnS (Primus, Schmid and Widmer, WASPAA 2025).

Input: the Zenodo release (record 15379789) with ``audio.zip`` extracted into ``audio/``, as the
authors' loader (OptimusPrimus/tacos, ``tacos/datasets``) expects it::

    annotations_strong.csv   filename,text,onset,offset   one row per captioned region
    annotations_weak.csv     filename,text                the clip's one-sentence (weak) caption(s)
    metadata.csv             filename,keywords,freesound_id,sound_link,manufacturer,license,...,title,...
    development_split.csv    filename                     -> split train
    test_split.csv           filename                     -> split test
    audio/<freesound id>.mp3                              the clips the times refer to

Columns are found by their header names, so ``filename,onset,offset,caption`` is read too
(``caption`` is taken where ``text`` is absent). ``metadata.csv`` is optional (it gives each
clip's Freesound licence URL, title, uploader and link for the attribution); Freesound
descriptions span lines, so every CSV is parsed as a whole with the csv module.

Options: ``audio_dir`` (default ``audio``); ``valid_fraction`` (default 0: the release has no
validation split; a fraction of the development clips, chosen by a stable hash of the clip id,
goes to ``valid``); ``split`` (the split of every clip when neither split file exists,
default ``train``).

Output: one :class:`~pipeline.schema.ImportedClip` per file named in the annotations (clip id
``tacos-<freesound id>``), its weak captions in ``captions`` and one region per strong caption
with the caption in ``text`` and label and MID ``""`` (TACOS has no class labels: the writer
makes each distinct text a phrase and assigns its cluster by text). Skips: ``malformed-row``,
``empty-caption`` (an empty strong or weak caption), ``bad-region`` (a negative time or onset
>= offset; regions past the clip's end are kept for the writer), ``no-label`` (a clip left with
no strong caption: left out), ``not-in-metadata`` (a clip in neither split file) and
``missing-file`` (no audio: left out); a CSV that a symbolic link leads out of the root is read
as absent and reported as ``outside-root``.
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pipeline.imports.dcase import (
    OUTSIDE_ROOT,
    outside_root,
    parse_seconds,
    plain_relative_name,
    region_problem,
    relative_to_root,
    sort_regions,
)
from pipeline.schema import SPLITS, ImportedClip, ImportedRegion, Skip

STRONG_CSV = "annotations_strong.csv"
WEAK_CSV = "annotations_weak.csv"
METADATA_CSV = "metadata.csv"
SPLIT_CSVS = (("development_split.csv", "train"), ("test_split.csv", "test"))
CAPTIONS_CREDIT = "strong and weak captions: TACOS (Primus, Schmid and Widmer, WASPAA 2025), CC BY 4.0"


@dataclass(frozen=True)
class CsvRow:
    """One data row of a TACOS CSV, keyed by the lower-cased header names."""

    line_no: int
    fields: dict[str, str]


def read(root: Path, options: dict) -> tuple[list[ImportedClip], list[Skip]]:
    """TACOS clips under ``root``; FileNotFoundError naming the file when annotations_strong.csv is absent."""
    root = Path(root)
    if not (root / STRONG_CSV).is_file():
        raise FileNotFoundError(
            f"no {STRONG_CSV} under {root}: point the root at the extracted TACOS release "
            f"({STRONG_CSV}, {WEAK_CSV}, {METADATA_CSV}, development_split.csv, test_split.csv, audio/)"
        )
    audio_dir = relative_to_root(root, str(options.get("audio_dir", "audio")))
    valid_fraction = _fraction(options.get("valid_fraction", 0))
    if problem := outside_root(root, STRONG_CSV):
        return [], [Skip(STRONG_CSV, STRONG_CSV, OUTSIDE_ROOT, problem)]
    skips = [
        Skip(name, name, OUTSIDE_ROOT, problem)
        for name in (WEAK_CSV, METADATA_CSV, *(n for n, _ in SPLIT_CSVS))
        if (root / name).is_file() and (problem := outside_root(root, name))
    ]
    regions, region_skips = _strong_regions(root)
    captions, caption_skips = _weak_captions(root)
    credits, credit_skips = _metadata(root)
    split_of, split_skips = _splits(root, options)
    skips += region_skips + caption_skips + credit_skips + split_skips
    clips: list[ImportedClip] = []
    for filename in sorted(set(regions) | set(captions), key=_clip_id):
        clip_id = _clip_id(filename)
        split = split_of(filename)
        audio_path = filename if audio_dir == "." else f"{audio_dir}/{filename}"
        if not regions.get(filename):
            had_rows = filename in regions
            skips.append(
                Skip(
                    clip_id,
                    STRONG_CSV,
                    "no-label",
                    "every strong-caption row was skipped; left out"
                    if had_rows
                    else f"{WEAK_CSV} lists it but {STRONG_CSV} has no row for it; left out",
                )
            )
        elif split is None:
            skips.append(
                Skip(
                    clip_id,
                    audio_path,
                    "not-in-metadata",
                    f"{filename} is listed in no split file ({', '.join(name for name, _ in SPLIT_CSVS)})",
                )
            )
        elif not (root / audio_path).is_file():
            skips.append(Skip(clip_id, audio_path, "missing-file", f"{audio_path} not found ({STRONG_CSV} captions it)"))
        else:
            if split == "train" and valid_fraction and _unit_hash(clip_id) < valid_fraction:
                split = "valid"
            license_url, credit = credits.get(filename, ("", ""))
            attribution = f"{credit}; {CAPTIONS_CREDIT}" if credit else CAPTIONS_CREDIT
            clips.append(
                ImportedClip(
                    clip_id,
                    audio_path,
                    split,
                    tuple(captions.get(filename, ())),
                    sort_regions(regions[filename]),
                    license_url,
                    attribution,
                )
            )
    return clips, skips


def _clip_id(filename: str) -> str:
    return f"tacos-{PurePosixPath(filename).stem}"


def _fraction(value: object) -> float:
    try:
        fraction = float(str(value))
    except ValueError:
        fraction = -1.0
    if not 0 <= fraction < 1:
        raise ValueError(f"tacos: option valid_fraction={value!r}; a number in [0, 1)")
    return fraction


def _unit_hash(clip_id: str) -> float:
    """A number in [0, 1) fixed by the clip id alone (so a clip's split never depends on the others)."""
    return int.from_bytes(hashlib.sha256(clip_id.encode("utf-8")).digest()[:8], "big") / 2**64


def read_csv_rows(path: Path, rel: str, required: tuple[str, ...]) -> tuple[list[CsvRow], list[Skip]]:
    """Rows of a headed CSV as dicts, and Skips for rows of the wrong width.

    ``text`` in ``required`` is satisfied by a ``caption`` column too. A header lacking a
    required column makes the whole file one Skip. Quoted fields may span lines; a row's line
    number is the line it starts on.
    """
    rows: list[CsvRow] = []
    skips: list[Skip] = []
    with open(path, encoding="utf-8-sig", errors="replace", newline="") as f:
        reader = csv.reader(f)
        header = [h.strip().lower() for h in next(reader, [])]
        if "text" not in header and "caption" in header:
            header[header.index("caption")] = "text"
        missing = [c for c in required if c not in header]
        if missing:
            return [], [
                Skip(rel, rel, "malformed-row", f"header {header} lacks {', '.join(missing)} (expected {','.join(required)})")
            ]
        start = reader.line_num + 1
        for record in reader:
            if any(x.strip() for x in record):
                if len(record) != len(header):
                    skips.append(
                        Skip(
                            f"{rel}#line{start}",
                            rel,
                            "malformed-row",
                            f"line {start}: {len(record)} fields, expected {len(header)} ({','.join(header)})",
                        )
                    )
                else:
                    rows.append(CsvRow(start, dict(zip(header, record))))
            start = reader.line_num + 1
    return rows, skips


def _named_rows(path: Path, rel: str, required: tuple[str, ...]) -> tuple[list[CsvRow], list[Skip]]:
    """``read_csv_rows`` less the rows whose file name is not a plain relative path (each a Skip)."""
    rows, skips = read_csv_rows(path, rel, required)
    kept = []
    for row in rows:
        name = row.fields["filename"].strip()
        if plain_relative_name(name):
            kept.append(CsvRow(row.line_no, {**row.fields, "filename": name}))
        else:
            skips.append(
                Skip(
                    f"{rel}#line{row.line_no}",
                    rel,
                    "malformed-row",
                    f"line {row.line_no}: file name {name!r} is not a plain relative path",
                )
            )
    return kept, skips


def _strong_regions(root: Path) -> tuple[dict[str, list[ImportedRegion]], list[Skip]]:
    """{filename: its usable regions} (a file whose every row failed maps to []) and the row skips."""
    rows, skips = _named_rows(root / STRONG_CSV, STRONG_CSV, ("filename", "text", "onset", "offset"))
    regions: dict[str, list[ImportedRegion]] = {}
    for row in rows:
        filename = row.fields["filename"]
        found = regions.setdefault(filename, [])
        item = f"{_clip_id(filename)}#line{row.line_no}"
        text = " ".join(row.fields["text"].split())
        onset_s, offset_s = parse_seconds(row.fields["onset"]), parse_seconds(row.fields["offset"])
        if onset_s is None or offset_s is None:
            skips.append(
                Skip(
                    item,
                    STRONG_CSV,
                    "malformed-row",
                    f"line {row.line_no}: onset {row.fields['onset']!r} / offset {row.fields['offset']!r} are not numbers",
                )
            )
        elif not text:
            skips.append(
                Skip(item, STRONG_CSV, "empty-caption", f"line {row.line_no}: region {onset_s:g}-{offset_s:g} s has no caption")
            )
        elif problem := region_problem(onset_s, offset_s):
            skips.append(Skip(item, STRONG_CSV, "bad-region", f"line {row.line_no} ({text!r}): {problem}"))
        else:
            found.append(ImportedRegion("", "", text, onset_s, offset_s))
    return regions, skips


def _weak_captions(root: Path) -> tuple[dict[str, list[str]], list[Skip]]:
    """{filename: its distinct weak captions in file order}; the file is optional."""
    if not (root / WEAK_CSV).is_file() or outside_root(root, WEAK_CSV):
        return {}, []
    rows, skips = _named_rows(root / WEAK_CSV, WEAK_CSV, ("filename", "text"))
    captions: dict[str, list[str]] = {}
    for row in rows:
        filename = row.fields["filename"]
        text = " ".join(row.fields["text"].split())
        if not text:
            skips.append(
                Skip(
                    f"{_clip_id(filename)}#weak-line{row.line_no}",
                    WEAK_CSV,
                    "empty-caption",
                    f"line {row.line_no}: the weak caption of {filename} is empty",
                )
            )
        elif text not in captions.setdefault(filename, []):
            captions[filename].append(text)
    return captions, skips


def _metadata(root: Path) -> tuple[dict[str, tuple[str, str]], list[Skip]]:
    """{filename: (licence URL, credit line)} from metadata.csv (optional; unknown columns read as "")."""
    if not (root / METADATA_CSV).is_file() or outside_root(root, METADATA_CSV):
        return {}, []
    rows, skips = _named_rows(root / METADATA_CSV, METADATA_CSV, ("filename",))
    credits = {}
    for row in rows:
        title, uploader, link = (" ".join(row.fields.get(key, "").split()) for key in ("title", "manufacturer", "sound_link"))
        credit = f'"{title or row.fields["filename"]}" by {uploader or "unknown uploader"}' + (f" ({link})" if link else "")
        credits[row.fields["filename"]] = (row.fields.get("license", "").strip(), credit)
    return credits, skips


def _splits(root: Path, options: dict) -> tuple[Callable[[str], str | None], list[Skip]]:
    """A function filename -> split (None for a file in no split file), and the skips of the split files."""
    present = [(name, split) for name, split in SPLIT_CSVS if (root / name).is_file() and not outside_root(root, name)]
    if not present:
        default = str(options.get("split", "train"))
        if default not in SPLITS:
            raise ValueError(f"tacos: option split={default!r}; one of {', '.join(SPLITS)}")
        return (lambda filename: default), []
    split_of: dict[str, str] = {}
    where: dict[str, str] = {}
    skips: list[Skip] = []
    for name, split in present:
        rows, file_skips = _named_rows(root / name, name, ("filename",))
        skips += file_skips
        for row in rows:
            filename = row.fields["filename"]
            if filename in split_of:
                skips.append(
                    Skip(
                        f"{name}#line{row.line_no}",
                        name,
                        "malformed-row",
                        f"line {row.line_no}: {filename} is already listed in {where[filename]}; kept in {split_of[filename]}",
                    )
                )
            else:
                split_of[filename], where[filename] = split, name
    return split_of.get, skips
