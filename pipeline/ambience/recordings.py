"""The ambience stage's input: an ambience library, a folder tree of recordings with or without a metadata CSV.

Input: the library root and :class:`~pipeline.config.params.AmbienceParams`. With a metadata CSV
(``metadata_csv``, path relative to the root), each row names a file (``path_column``,
relative to the root) and a category (``category_column``); optional licence and author
columns are carried along. Without one, every audio file under the root is a candidate and
its category is its top folder. A recording is selected when one of ``keywords`` occurs,
case-insensitively, in its category (without metadata: in its relative path), which is
FLAM's "ambiance" rule; ``keywords: all`` selects every recording. The ``min_recording_s``
length check happens when the file is read.

Output: the selected :class:`AmbienceRecording` list, sorted by relative path, and a
:class:`~pipeline.schema.Skip` for every row or file left out.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline.config.params import AmbienceParams
from pipeline.metadata_csv import plain_text, read_header_and_rows
from pipeline.schema import Skip, readable_id


@dataclass(frozen=True)
class AmbienceRecording:
    rel_path: str
    path: Path
    category: str
    license: str
    author: str

    @property
    def recording_id(self) -> str:
        """A readable, filesystem-safe id, unique through a hash of the relative path."""
        return readable_id(self.rel_path)


def _selected(text: str, keywords: tuple[str, ...] | str) -> bool:
    if keywords == "all":
        return True
    low = text.lower()
    return any(k.lower() in low for k in keywords)


def _relative(cell: str, root: Path) -> str:
    """A metadata path cell -> a POSIX path relative to the library root."""
    text = cell.strip().replace("\\", "/")
    if Path(text).is_absolute():
        try:
            return Path(text).relative_to(root.resolve()).as_posix()
        except ValueError:
            return text
    return text.removeprefix("./")


def _audio_files(root: Path, extensions: tuple[str, ...]) -> list[str]:
    exts = {"." + e.lower().lstrip(".") for e in extensions}
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.suffix.lower() in exts)


def read_ambience_library(root: Path, p: AmbienceParams) -> tuple[list[AmbienceRecording], list[Skip], str]:
    """Selected recordings, skips, and the selection mode used (``metadata: NAME`` or ``folder``).

    A configured metadata CSV that does not exist falls back to folder mode with a warning
    on stderr, so a library without metadata works with the default params.
    """
    root = Path(root)
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise FileNotFoundError(f"ambience library {root} {what}: point sources.ambience_dir at a folder of recordings")
    files = _audio_files(root, p.extensions)
    csv_path = root / p.metadata_csv if p.metadata_csv else None
    if csv_path is not None and csv_path.exists():
        recordings, skips = _read_with_metadata(root, csv_path, files, p)
        return recordings, skips, f"metadata: {p.metadata_csv}"
    if csv_path is not None:
        print(
            f"ambience: {csv_path} not found; selecting by path instead (set ambience.metadata_csv: null to silence this)",
            file=sys.stderr,
        )
    recordings, skips = [], []
    for rel in files:
        category = rel.split("/", 1)[0] if "/" in rel else ""
        if _selected(rel, p.keywords):
            recordings.append(AmbienceRecording(rel, root / rel, category, "", ""))
        else:
            skips.append(Skip(rel, rel, "filtered-category", f"path matches none of {list(p.keywords)}"))
    return recordings, skips, "folder"


def _read_with_metadata(
    root: Path, csv_path: Path, files: list[str], p: AmbienceParams
) -> tuple[list[AmbienceRecording], list[Skip]]:
    recordings: list[AmbienceRecording] = []
    skips: list[Skip] = []
    listed: set[str] = set()
    by_basename: dict[str, list[str]] = {}
    for rel in files:
        by_basename.setdefault(rel.rsplit("/", 1)[-1], []).append(rel)
    header, rows = read_header_and_rows(csv_path)
    missing = [c for c in (p.path_column, p.category_column) if c.lower() not in header]
    if missing:
        raise ValueError(
            f"{csv_path}: no column {', '.join(repr(m) for m in missing)} (columns: {', '.join(header)}); "
            f"set ambience.path_column / ambience.category_column to the names this CSV uses"
        )
    col = {name: header.index(name) for name in header}
    path_at = col[p.path_column.lower()]
    for line_no, row in rows:
        where = f"{csv_path.name} line {line_no}"
        if len(row) != len(header):
            skips.append(
                Skip(f"line{line_no}", csv_path.name, "malformed-row", f"{where}: {len(row)} fields, expected {len(header)}")
            )
            continue
        rel = _relative(row[path_at], root)
        if not rel:
            skips.append(Skip(f"line{line_no}", csv_path.name, "malformed-row", f"{where}: the {p.path_column} cell is empty"))
            continue
        candidates = by_basename.get(rel.rsplit("/", 1)[-1], [])
        if not (root / rel).is_file() and len(candidates) == 1:
            rel = candidates[0]  # metadata that names files without their folder
        if rel in listed:
            skips.append(Skip(f"line{line_no}", csv_path.name, "malformed-row", f"{where}: {rel} is listed twice"))
            continue
        listed.add(rel)

        def cell(name: str) -> str:
            return plain_text(row[col[name.lower()]].strip()) if name.lower() in col else ""

        category = cell(p.category_column)
        if not _selected(category, p.keywords):
            skips.append(Skip(rel, rel, "filtered-category", f"category {category!r} matches none of {list(p.keywords)}"))
            continue
        if not (root / rel).is_file():
            found = f"; {len(candidates)} files have that name: {', '.join(candidates)}" if len(candidates) > 1 else ""
            skips.append(Skip(rel, rel, "missing-file", f"{where} names {rel}, which does not exist{found}"))
            continue
        recordings.append(AmbienceRecording(rel, root / rel, category, cell(p.license_column), cell(p.author_column)))
    for rel in files:
        if rel not in listed:
            skips.append(Skip(rel, rel, "not-in-metadata", f"{csv_path.name} has no row for this file"))
    recordings.sort(key=lambda r: r.rel_path)
    return recordings, skips
