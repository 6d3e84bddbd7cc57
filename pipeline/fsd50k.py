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

import csv
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

from pipeline.ontology import Ontology
from pipeline.schema import Skip

GROUND_TRUTH = "FSD50K.ground_truth"
METADATA = "FSD50K.metadata"
AUDIO_DIRS = {"dev": "FSD50K.dev_audio", "eval": "FSD50K.eval_audio"}
LICENSES = {
    "publicdomain/zero": "CC0",
    "licenses/by-nc": "CC-BY-NC",
    "licenses/by/": "CC-BY",
    "sampling+": "CC-Sampling+",
}


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


def license_name(url: str) -> str:
    """Creative Commons URL -> short name (CC0, CC-BY, CC-BY-NC, CC-Sampling+), else 'unknown'."""
    for key, name in LICENSES.items():
        if key in url:
            return name
    return "unknown"


def _read_metadata(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        warnings.warn(f"{path}: not valid JSON ({e}); licences and uploaders read as 'unknown'", stacklevel=2)
        return {}
    return data if isinstance(data, dict) else {}


def read_fsd50k(root: Path, splits: tuple[str, ...] = ("train", "val", "eval")) -> tuple[list[FSD50KClip], list[Skip]]:
    """Rows of the requested splits, sorted by fname (numeric where possible), and skips."""
    root = Path(root)
    gt = root / GROUND_TRUTH
    if not gt.is_dir():
        raise FileNotFoundError(
            f"no {GROUND_TRUTH}/ under {root}: point sources.fsd50k_dir at the FSD50K root "
            f"(the folder holding {GROUND_TRUTH}/, FSD50K.dev_audio/ and FSD50K.eval_audio/)"
        )
    clips: list[FSD50KClip] = []
    skips: list[Skip] = []
    parts = {"dev": bool(set(splits) & {"train", "val"}), "eval": "eval" in splits}
    for part in [p for p, wanted in parts.items() if wanted]:
        csv_path = gt / f"{part}.csv"
        if not csv_path.exists():
            skips.append(Skip(f"fsd50k-{part}.csv", str(csv_path), "missing-file", f"{part}.csv not found; its split is skipped"))
            continue
        meta = _read_metadata(root / METADATA / f"{part}_clips_info_FSD50K.json")
        c, s = _read_rows(root, csv_path, part, meta)
        clips.extend(x for x in c if x.split in splits)
        skips.extend(s)
    clips.sort(key=lambda c: (int(c.fname) if c.fname.isdigit() else float("inf"), c.fname))
    return clips, skips


def _read_rows(root: Path, csv_path: Path, part: str, meta: dict[str, dict]) -> tuple[list[FSD50KClip], list[Skip]]:
    clips: list[FSD50KClip] = []
    skips: list[Skip] = []
    with csv_path.open(newline="", encoding="utf-8-sig", errors="replace") as f:
        reader = csv.reader(f)
        header = [h.strip().lower() for h in next(reader, [])]
        missing = [c for c in ("fname", "labels", "mids") if c not in header]
        if missing:
            raise ValueError(f"{csv_path}: header {header} lacks {', '.join(missing)}; FSD50K's is fname,labels,mids[,split]")
        col = {name: header.index(name) for name in ("fname", "labels", "mids")}
        split_col = header.index("split") if "split" in header else None
        seen: set[str] = set()
        for line_no, row in enumerate(reader, start=2):
            where = f"{csv_path.name} line {line_no}"
            if not row or all(not c.strip() for c in row):
                continue
            fname = row[0].strip()
            item = f"fsd50k-{fname}" if fname else f"fsd50k-{part}-line{line_no}"
            if len(row) != len(header):
                skips.append(Skip(item, str(csv_path), "malformed-row", f"{where}: {len(row)} fields, expected {len(header)}"))
                continue
            fname = row[col["fname"]].strip()
            labels = tuple(x.strip() for x in row[col["labels"]].split(",") if x.strip())
            mids = tuple(x.strip() for x in row[col["mids"]].split(",") if x.strip())
            split = "eval" if part == "eval" else (row[split_col].strip().lower() if split_col is not None else "train")
            problem = None
            if not fname:
                problem = "empty fname"
            elif fname in seen:
                problem = f"duplicate fname {fname}"
            elif len(labels) != len(mids):
                problem = f"{len(labels)} labels but {len(mids)} mids"
            elif split not in ("train", "val", "eval"):
                problem = f"split {split!r} is not train or val"
            if problem:
                skips.append(Skip(item, str(csv_path), "malformed-row", f"{where}: {problem}"))
                continue
            seen.add(fname)
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
                    license_url=str(info.get("license", "")),
                    uploader=str(info.get("uploader", "")),
                    title=str(info.get("title", "")),
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
