"""Reader for the FSD50K layout.

Input: a folder with ``FSD50K.ground_truth/{dev,eval}.csv`` (``fname,labels,mids[,split]``,
labels and mids as quoted comma lists that include ancestors), ``FSD50K.dev_audio/``,
``FSD50K.eval_audio/`` and optionally ``FSD50K.metadata/{dev,eval}_clips_info_FSD50K.json``.
Output: one :class:`FSD50KClip` per parseable row of the requested splits, and a
:class:`~pipeline.schema.Skip` for every row that does not parse.

Single-label rule (``one-leaf``, the default): a clip is single-label when exactly one of its
MIDs is not an ancestor (in the AudioSet ontology) of another of its MIDs; that leaf is the
clip's label. FSD50K lists every label's ancestors, so ``Bark,Dog,Domestic_animals_and_pets,
Animal`` is single-label (leaf Bark) while ``Bark,Meow,...`` is not. MIDs unknown to the
ontology count as leaves. ``one-label`` accepts only rows with exactly one label.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipeline.metadata_csv import plain_text, read_header_and_rows
from pipeline.ontology import Ontology
from pipeline.schema import Skip

GROUND_TRUTH = "FSD50K.ground_truth"
METADATA = "FSD50K.metadata"
AUDIO_DIRS = {"dev": "FSD50K.dev_audio", "eval": "FSD50K.eval_audio"}
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # FSD50K fnames are integers; never a path


@dataclass(frozen=True)
class FSD50KClip:
    fname: str
    split: str  # train, val or eval
    labels: tuple[str, ...]
    mids: tuple[str, ...]
    audio_path: Path
    rel_path: str
    license_url: str
    uploader: str
    title: str

    @property
    def clip_id(self) -> str:
        return f"fsd50k-{self.fname}"


def _read_metadata(path: Path) -> tuple[dict[str, dict], Skip | None]:
    """The clips-info JSON, or {} and a Skip saying why it cannot be used."""
    if not path.exists():
        return {}, None
    rel = f"{METADATA}/{path.name}"
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as e:
        return {}, Skip(rel, rel, "malformed-row", f"not valid JSON ({e}); licences and uploaders read as unknown")
    if not isinstance(data, dict):
        return {}, Skip(
            rel, rel, "malformed-row", f"a JSON {type(data).__name__}, not an object keyed by fname; licences read as unknown"
        )
    return data, None


def read_fsd50k(root: Path, splits: tuple[str, ...] = ("train", "val", "eval")) -> tuple[list[FSD50KClip], list[Skip]]:
    """Rows of the requested splits, sorted by fname (numeric where possible), and skips.

    Also reported as skips: a ground-truth CSV that is missing, empty or has no
    ``fname,labels,mids`` header (its split is left out), an unusable metadata JSON, and
    audio files that no CSV row names. Raises FileNotFoundError or ValueError when no
    ground truth at all can be read.
    """
    root = Path(root)
    gt = root / GROUND_TRUTH
    if not root.is_dir():
        raise FileNotFoundError(
            f"FSD50K root {root} does not exist: point sources.fsd50k_dir at the folder holding {GROUND_TRUTH}/"
        )
    if not gt.is_dir():
        raise FileNotFoundError(
            f"no {GROUND_TRUTH}/ under {root}: point sources.fsd50k_dir at the FSD50K root "
            f"(the folder holding {GROUND_TRUTH}/, FSD50K.dev_audio/ and FSD50K.eval_audio/)"
        )
    clips: list[FSD50KClip] = []
    skips: list[Skip] = []
    seen: dict[str, str] = {}  # fname -> where it was first listed, across dev and eval
    usable = 0
    parts = {"dev": bool(set(splits) & {"train", "val"}), "eval": "eval" in splits}
    for part in [p for p, wanted in parts.items() if wanted]:
        csv_path = gt / f"{part}.csv"
        rel = f"{GROUND_TRUTH}/{part}.csv"
        if not csv_path.exists():
            skips.append(Skip(rel, rel, "missing-file", f"{part}.csv not found; its split is left out"))
            continue
        header, rows = read_header_and_rows(csv_path)
        missing = [c for c in ("fname", "labels", "mids") if c not in header]
        if missing:
            skips.append(
                Skip(
                    rel,
                    rel,
                    "malformed-row",
                    f"header {header} lacks {', '.join(missing)} (FSD50K's is fname,labels,mids[,split]); its split is left out",
                )
            )
            continue
        usable += 1
        meta, meta_problem = _read_metadata(root / METADATA / f"{part}_clips_info_FSD50K.json")
        skips.extend([meta_problem] if meta_problem else [])
        c, s = _read_rows(root, rel, part, header, rows, meta, seen)
        clips.extend(x for x in c if x.split in splits)
        skips.extend(s)
        skips.extend(_unlisted_audio(root, part, {x.fname for x in c}))
    if not usable:
        details = "; ".join(f"{s.path}: {s.detail}" for s in skips)
        raise ValueError(f"no usable FSD50K ground truth under {gt} ({details})")
    clips.sort(key=lambda c: (int(c.fname) if c.fname.isdigit() else float("inf"), c.fname))
    return clips, skips


def _unlisted_audio(root: Path, part: str, listed: set[str]) -> list[Skip]:
    folder = root / AUDIO_DIRS[part]
    if not folder.is_dir():
        return []
    return [
        Skip(
            f"{AUDIO_DIRS[part]}/{p.name}",
            f"{AUDIO_DIRS[part]}/{p.name}",
            "not-in-metadata",
            f"no row of {part}.csv names this file",
        )
        for p in sorted(folder.iterdir())
        if p.is_file() and not p.name.startswith(".") and not (p.suffix == ".wav" and p.stem in listed)
    ]


def _read_rows(
    root: Path,
    rel_csv: str,
    part: str,
    header: list[str],
    rows: Iterator[tuple[int, list[str]]],
    meta: dict[str, dict],
    seen: dict[str, str],
) -> tuple[list[FSD50KClip], list[Skip]]:
    clips: list[FSD50KClip] = []
    skips: list[Skip] = []
    col = {name: header.index(name) for name in ("fname", "labels", "mids")}
    split_col = header.index("split") if "split" in header else None
    for line_no, row in rows:
        where = f"{part}.csv line {line_no}"
        line_item = f"fsd50k-{part}-line{line_no}"
        if len(row) != len(header):
            skips.append(Skip(line_item, rel_csv, "malformed-row", f"{where}: {len(row)} fields, expected {len(header)}"))
            continue
        fname = row[col["fname"]].strip()
        labels = tuple(x.strip() for x in row[col["labels"]].split(",") if x.strip())
        mids = tuple(x.strip() for x in row[col["mids"]].split(",") if x.strip())
        split = "eval" if part == "eval" else (row[split_col].strip().lower() if split_col is not None else "train")
        problem = None
        if not _PLAIN_NAME.fullmatch(fname):
            problem = f"fname {fname!r} is not a plain file name"
        elif fname in seen:
            problem = f"fname {fname} is already listed at {seen[fname]}"
        elif len(labels) != len(mids):
            problem = f"{len(labels)} labels but {len(mids)} mids"
        elif split not in ("train", "val", "eval"):
            problem = f"split {split!r} is not train or val"
        if problem:
            skips.append(Skip(line_item, rel_csv, "malformed-row", f"{where}: {problem}"))
            continue
        seen[fname] = where
        rel = f"{AUDIO_DIRS[part]}/{fname}.wav"
        info = meta.get(fname) if isinstance(meta.get(fname), dict) else {}
        clips.append(
            FSD50KClip(
                fname=fname,
                split=split,
                labels=labels,
                mids=mids,
                audio_path=root / rel,
                rel_path=rel,
                license_url=plain_text(info.get("license")),
                uploader=plain_text(info.get("uploader")),
                title=plain_text(info.get("title")),
            )
        )
    return clips, skips


def single_label(clip: FSD50KClip, ontology: Ontology, rule: str) -> tuple[str, str] | Skip:
    """The clip's one (label, mid), or a Skip saying why it is not single-label."""
    if not clip.labels:
        return Skip(clip.clip_id, clip.rel_path, "no-label", "the label list is empty")
    if rule == "one-label":
        if len(clip.labels) != 1:
            return Skip(clip.clip_id, clip.rel_path, "multi-label", f"{len(clip.labels)} labels: {','.join(clip.labels)}")
        return clip.labels[0], clip.mids[0]
    leaves = ontology.leaf_mids(list(clip.mids))
    if len(leaves) != 1:
        names = [clip.labels[clip.mids.index(m)] for m in leaves]
        return Skip(clip.clip_id, clip.rel_path, "multi-label", f"{len(leaves)} leaf labels: {','.join(names)}")
    mid = leaves[0]
    return clip.labels[clip.mids.index(mid)], mid
