"""AudioSet-Strong (Hershey et al., 2021): the released segment TSVs -> imported clips.

Input, under the corpus root (names as Google publishes them, each changeable by an option):

- ``audioset_train_strong.tsv`` and ``audioset_eval_strong.tsv``: tab separated, header
  ``segment_id  start_time_seconds  end_time_seconds  label``, one row per labelled region;
  ``segment_id`` is ``<YouTube id>_<start ms>`` (``-0RWZT-miFs_420000``: YouTube ids may start
  with ``-`` and hold ``_``, so the start is what follows the last ``_``), times in seconds
  from the 10 s segment's start, ``label`` a MID such as ``/m/09x0r``;
- ``mid_to_display_name.tsv`` (optional): ``MID<TAB>name`` lines without a header;
- the audio, which YouTube rot leaves incomplete: ``<audio_dir>/<name>`` with ``name`` the
  first of ``patterns`` that exists.

Output: one :class:`~pipeline.schema.ImportedClip` per segment with at least one known label
(train TSV -> ``train``, or ``valid`` for the ``valid_fraction`` of segments a stable hash of
the segment id picks; eval TSV -> ``test``), regions named by the AudioSet ontology; and a
:class:`~pipeline.schema.Skip` per unusable row (``malformed-row``; ``bad-region``: a negative
time or onset >= offset; ``unknown-label``: a MID neither the AudioSet-Strong class list,
``mid_to_display_name.tsv`` nor the ontology knows) and per segment without audio
(``missing-file``); a TSV that a symbolic link leads out of the root is skipped as
``outside-root`` (``mid_to_display_name.tsv`` then read as absent). Regions past the segment's
end are passed on as written; the writer checks them against the decoded audio.

This module is the one reader of the format: the importer (:func:`read`) and the evaluation's
benchmark reader (:func:`trainer.evaluation.readers.read_audioset_strong`) both take their
regions from :func:`read_segments_tsv` and their audio from :func:`segment_audio`.
"""

from __future__ import annotations

import csv
import hashlib
import os
from collections import defaultdict
from pathlib import Path

from pipeline.imports.dcase import OUTSIDE_ROOT, outside_root, parse_seconds, region_problem
from pipeline.ontology import DATA_DIR, default_ontology
from pipeline.schema import ImportedClip, ImportedRegion, Skip

HEADER = ("segment_id", "start_time_seconds", "end_time_seconds", "label")
CLASS_LIST = DATA_DIR / "audioset_strong_classes.csv"
SEGMENT_S = 10.0  # every AudioSet segment is (at most) 10 s long

DEFAULT_OPTIONS = {
    "train_tsv": "audioset_train_strong.tsv",
    "eval_tsv": "audioset_eval_strong.tsv",
    "names_tsv": "mid_to_display_name.tsv",
    "audio_dir": "audio",  # relative to the root, or absolute
    "train_audio_dir": None,  # None: audio_dir
    "eval_audio_dir": None,  # None: audio_dir
    # fields: segment_id, ytid, start_ms, start_s (30 or 30.5), start_3f / end_3f (30.000 / 40.000)
    "patterns": [
        "{segment_id}.flac",
        "{segment_id}.wav",
        "Y{segment_id}.flac",
        "Y{segment_id}.wav",
        "{ytid}_{start_s}.flac",
        "{ytid}_{start_s}.wav",
        "Y{ytid}_{start_3f}_{end_3f}.wav",
        "Y{ytid}_{start_3f}_{end_3f}.flac",
    ],
    "valid_fraction": 0.1,  # share of train segments moved to the valid split
    "license": "unknown",  # the audio's licence (YouTube uploads state none); the labels are CC BY 4.0
}


class AudioSetStrongError(ValueError):
    """A corpus root or option the reader cannot use; the message says what to do."""


def split_segment_id(segment_id: str) -> tuple[str, int]:
    """``"-0RWZT-miFs_420000"`` -> ``("-0RWZT-miFs", 420000)``: the YouTube id and the start in ms.

    Raises ``ValueError`` when there is no ``_`` or what follows the last one is not a whole number.
    """
    ytid, sep, start = segment_id.rpartition("_")
    if not sep or not ytid or not start.isdigit():
        raise ValueError(f"segment id {segment_id!r} is not <YouTube id>_<start ms>")
    return ytid, int(start)


def name_fields(segment_id: str) -> dict[str, str]:
    """The fields a file-name pattern may use for one segment."""
    ytid, start_ms = split_segment_id(segment_id)
    start_s = start_ms / 1000
    return {
        "segment_id": segment_id,
        "ytid": ytid,
        "start_ms": str(start_ms),
        "start_s": f"{start_s:g}",
        "start_3f": f"{start_s:.3f}",
        "end_3f": f"{start_s + SEGMENT_S:.3f}",
    }


def in_valid(segment_id: str, fraction: float) -> bool:
    """Whether a train segment goes to ``valid``: a stable hash of its id below ``fraction``."""
    digest = hashlib.sha256(segment_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def class_names(names_tsv: Path | None) -> dict[str, str]:
    """MID -> display name: the ontology's, else the class list's, else ``names_tsv``'s."""
    names: dict[str, str] = {}
    if names_tsv is not None and names_tsv.is_file():
        with open(names_tsv, newline="", encoding="utf-8") as f:
            names.update({row[0].strip(): row[1].strip() for row in csv.reader(f, delimiter="\t") if len(row) >= 2})
    with open(CLASS_LIST, newline="", encoding="utf-8") as f:
        names.update({mid: name for mid, name in csv.reader(f)})
    names.update({mid: c.name for mid, c in default_ontology().by_mid.items()})
    return names


class AudioFinder:
    """The first existing file of some patterns, each folder listed once (not one stat per candidate)."""

    def __init__(self, patterns: list[str]):
        self.patterns = patterns
        self.listed: dict[str, set[str]] = {}

    def _names(self, folder: Path) -> set[str]:
        key = str(folder)
        if key not in self.listed:
            self.listed[key] = set(os.listdir(folder)) if folder.is_dir() else set()
        return self.listed[key]

    def find(self, folder: Path, fields: dict[str, str]) -> tuple[Path | None, list[str]]:
        tried = []
        for pattern in self.patterns:
            rel = Path(pattern.format(**fields))
            where = folder / rel.parent
            tried.append(str(folder / rel))
            if rel.name in self._names(where):
                return where / rel.name, tried
        return None, tried


def _options(options: dict) -> dict:
    unknown = sorted(set(options) - set(DEFAULT_OPTIONS))
    if unknown:
        raise AudioSetStrongError(f"audioset-strong: unknown option(s) {unknown}; options are {', '.join(DEFAULT_OPTIONS)}")
    merged = {**DEFAULT_OPTIONS, **options}
    if isinstance(merged["patterns"], str):
        merged["patterns"] = [p.strip() for p in merged["patterns"].split(",") if p.strip()]
    try:
        fraction = float(merged["valid_fraction"])
    except (TypeError, ValueError):
        fraction = -1.0
    if not 0.0 <= fraction < 1.0:
        raise AudioSetStrongError(f"audioset-strong: valid_fraction is {merged['valid_fraction']!r}; use a share in [0, 1)")
    merged["valid_fraction"] = fraction
    for pattern in merged["patterns"]:
        try:
            pattern.format(**name_fields("x_0"))
        except (KeyError, IndexError, ValueError) as e:
            raise AudioSetStrongError(
                f"audioset-strong: file-name pattern {pattern!r} does not format ({e}); use the fields "
                f"{{{'}, {'.join(name_fields('x_0'))}}}"
            ) from None
    return merged


def segment_audio(finder: AudioFinder, folder: Path, segment_id: str, root: Path) -> tuple[Path | None, Skip | None]:
    """The audio file of a segment in ``folder``, or None and a ``missing-file`` Skip naming every name tried (relative to ``root``)."""
    path, tried = finder.find(folder, name_fields(segment_id))
    if path is not None:
        return path, None
    return None, Skip(
        segment_id,
        os.path.relpath(tried[0], root),
        "missing-file",
        f"no audio: tried {', '.join(os.path.relpath(t, root) for t in tried)}",
    )


def read_segments_tsv(
    tsv: Path,
    names: dict[str, str],
    names_from: str = "the AudioSet-Strong class list nor the ontology",
) -> tuple[dict[str, list[ImportedRegion]], list[Skip]]:
    """The regions of one segments TSV by segment id (rows in file order), and a Skip per row that cannot be used.

    Columns are found by their header names, extra ones ignored; AudioSetStrongError when one of
    :data:`HEADER` is absent. A row is ``malformed-row`` (a field count other than the header's,
    a segment id that is not ``<YouTube id>_<start ms>``, times that are not numbers),
    ``bad-region`` (a negative time or onset >= offset) or ``unknown-label`` (a MID ``names``,
    gathered from ``names_from``, lacks).
    """
    with open(tsv, newline="", encoding="utf-8-sig", errors="replace") as f:
        lines = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))  # one line, one row: no quoting in these files
    header = [c.strip() for c in lines[0]] if lines else []
    missing = [c for c in HEADER if c not in header]
    if missing:
        found = lines[0] if lines else "nothing"
        raise AudioSetStrongError(
            f"audioset-strong: {tsv} lacks the column(s) {', '.join(missing)} (its header is {found}); "
            f"a segments TSV starts with the header {'<TAB>'.join(HEADER)}: is it an AudioSet-Strong segments TSV?"
        )
    at = [header.index(c) for c in HEADER]
    regions: dict[str, list[ImportedRegion]] = defaultdict(list)
    skips: list[Skip] = []
    for line, row in enumerate(lines[1:], start=2):
        if not any(c.strip() for c in row):
            continue
        where = f"{tsv.name}:{line}"
        if len(row) != len(header):
            item = row[at[0]].strip() if len(row) > at[0] and row[at[0]].strip() else where
            skips.append(Skip(item, where, "malformed-row", f"{len(row)} fields, {len(header)} expected"))
            continue
        segment_id, onset, offset, mid = (row[i].strip() for i in at)
        onset_s, offset_s = parse_seconds(onset), parse_seconds(offset)
        try:
            split_segment_id(segment_id)
        except ValueError as e:
            skips.append(Skip(segment_id or where, where, "malformed-row", str(e)))
            continue
        if onset_s is None or offset_s is None:
            skips.append(Skip(segment_id, where, "malformed-row", f"start {onset!r} / end {offset!r} are not numbers"))
        elif problem := region_problem(onset_s, offset_s):
            skips.append(Skip(segment_id, where, "bad-region", f"{mid}: {problem}"))
        elif mid not in names:
            skips.append(Skip(segment_id, where, "unknown-label", f"label {mid!r} is in neither {names_from}"))
        else:
            regions[segment_id].append(ImportedRegion(names[mid], mid, "", onset_s, offset_s))
    return dict(regions), skips


def read(root: Path, options: dict) -> tuple[list[ImportedClip], list[Skip]]:
    """Parse the TSVs under ``root`` (see the module docstring); no audio is read, only listed."""
    root = Path(root)
    o = _options(options)
    tsvs = {split: root / o[key] for split, key in (("train", "train_tsv"), ("test", "eval_tsv"))}
    present = {split: path for split, path in tsvs.items() if path.is_file()}
    linked_out = [
        Skip(o[key], o[key], OUTSIDE_ROOT, problem)
        for key in ("train_tsv", "eval_tsv", "names_tsv")
        if (root / o[key]).is_file() and (problem := outside_root(root, o[key]))
    ]
    present = {split: path for split, path in present.items() if not outside_root(root, path)}
    if not present and linked_out:
        return [], linked_out
    if not present:
        raise AudioSetStrongError(
            f"audioset-strong: neither {tsvs['train']} nor {tsvs['test']} exists; pass the folder that holds "
            "audioset_train_strong.tsv / audioset_eval_strong.tsv (or name them with --option train_tsv=... "
            "eval_tsv=...)"
        )
    names = class_names(None if outside_root(root, o["names_tsv"]) else root / o["names_tsv"])
    finder = AudioFinder(list(o["patterns"]))
    skips: list[Skip] = linked_out
    clips: list[ImportedClip] = []
    owner: dict[str, str] = {}  # segment id -> the TSV that listed it first
    for split, tsv in present.items():
        folder = Path(o[f"{'train' if split == 'train' else 'eval'}_audio_dir"] or o["audio_dir"])
        folder = folder if folder.is_absolute() else root / folder
        regions, tsv_skips = read_segments_tsv(tsv, names, f"the AudioSet-Strong class list, {o['names_tsv']} nor the ontology")
        skips += tsv_skips
        for segment_id in sorted(regions):
            if owner.setdefault(segment_id, tsv.name) != tsv.name:
                skips.append(
                    Skip(segment_id, tsv.name, "malformed-row", f"the segment is also in {owner[segment_id]}; kept there")
                )
                continue
            path, missing = segment_audio(finder, folder, segment_id, root)
            if path is None:
                skips.append(missing)
                continue
            fields = name_fields(segment_id)
            clip_split = "valid" if split == "train" and in_valid(segment_id, o["valid_fraction"]) else split
            start_s = int(fields["start_ms"]) / 1000
            attribution = (
                f"YouTube video {fields['ytid']}, {start_s:g}-{start_s + SEGMENT_S:g} s "
                f"(https://www.youtube.com/watch?v={fields['ytid']}&t={int(start_s)}s); labels: AudioSet-Strong, CC BY 4.0"
            )
            ordered = tuple(sorted(regions[segment_id], key=lambda r: (r.onset_s, r.offset_s, r.label)))
            clips.append(
                ImportedClip(segment_id, os.path.relpath(path, root), clip_split, (), ordered, str(o["license"]), attribution)
            )
    clips.sort(key=lambda c: c.clip_id)
    return clips, skips
