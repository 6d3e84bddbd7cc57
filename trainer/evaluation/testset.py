"""The held-out split of our own shards, as evaluation sets, and the held-out event clips.

Input: a shard folder (or fsspec URL) in the Hugging Face layout and a split name; the clip
stage's folder for zero-shot classification. Output: :class:`ShardSplit` (metadata in memory,
audio streamed from the Parquet files in row order) from which the stage derives

- a closed-vocabulary SED set: every label of the split is a class, queried by the phrase the
  split's captions use most for it; ground truth is each label's relabelled segments;
- the phrase grounding pairs (each clip's own phrases and their segments) for alignment;
- the caption of each clip for retrieval;

and :func:`event_clips`: the event clips the split's mixtures were built from (held out from
training by construction), for zero-shot classification with "The sound of {phrase}".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from trainer.data.sources import _fs, list_parquet

META_COLUMNS = ["id", "duration_s", "caption", "phrases"]


@dataclass(frozen=True)
class ShardSplit:
    files: tuple[str, ...]
    ids: tuple[str, ...]
    durations_s: dict[str, float]
    captions: dict[str, str]
    phrases: dict[str, list[dict]]  # clip -> [{phrase, label, mid, segments: [{start_s, end_s}], source_clip_ids}]

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(sorted({p["label"] for ps in self.phrases.values() for p in ps}))

    def queries(self) -> dict[str, str]:
        """Label -> the phrase the split uses most for it (ties: alphabetical)."""
        counts: dict[str, Counter] = {}
        for ps in self.phrases.values():
            for p in ps:
                counts.setdefault(p["label"], Counter())[p["phrase"]] += 1
        return {label: min(c.items(), key=lambda kv: (-kv[1], kv[0]))[0] for label, c in sorted(counts.items())}

    def ground_truth(self) -> dict[str, list[tuple[float, float, str]]]:
        """Clip -> ``[(onset_s, offset_s, label)]`` (a label's segments never overlap or touch)."""
        return {i: sorted((s["start_s"], s["end_s"], p["label"]) for p in self.phrases[i] for s in p["segments"]) for i in self.ids}

    def audio(self) -> Iterator[tuple[str, bytes]]:
        """``(id, encoded bytes)`` in :attr:`ids` order, one row group in memory at a time."""
        for path in self.files:
            fs, root = _fs(path)
            with fs.open(root, "rb") as f:
                pf = pq.ParquetFile(f)
                for g in range(pf.num_row_groups):
                    table = pf.read_row_group(g, columns=["id", "audio"])
                    for i, a in zip(table.column("id").to_pylist(), table.column("audio").to_pylist()):
                        yield i, a["bytes"]


def read_split(path: str, split: str) -> ShardSplit:
    """A split's metadata (ids, durations, captions, phrases) from its Parquet files."""
    files = list_parquet(path, split)
    ids, durations, captions, phrases = [], {}, {}, {}
    for file in files:
        fs, root = _fs(file)
        with fs.open(root, "rb") as f:
            table = pq.read_table(f, columns=META_COLUMNS)
        for row in table.to_pylist():
            i = row["id"]
            ids.append(i)
            durations[i], captions[i], phrases[i] = float(row["duration_s"]), row["caption"], row["phrases"]
    if len(set(ids)) != len(ids):
        raise ValueError(f"evaluate: the {split} split under {path} repeats clip ids; rebuild it with `sedsynth shards`")
    return ShardSplit(tuple(files), tuple(ids), durations, captions, phrases)


@dataclass(frozen=True)
class EventClips:
    """Held-out event clips: id -> audio path, id -> label."""

    audio: dict[str, str]
    labels: dict[str, str]


def event_clips(clip_dir: str | Path, split: ShardSplit) -> EventClips:
    """The clip stage's clips that the split's mixtures use (``manifest.parquet`` + ``audio/``)."""
    clip_dir = Path(clip_dir)
    manifest = clip_dir / "manifest.parquet"
    if not manifest.exists():
        raise FileNotFoundError(f"evaluate: no clip manifest at {manifest}; run `sedsynth clip` or set evaluate.event_clips: null")
    used = {c for ps in split.phrases.values() for p in ps for c in p["source_clip_ids"]}
    table = pq.read_table(manifest, columns=["clip_id", "audio_path", "label"]).to_pylist()
    rows = sorted((r for r in table if r["clip_id"] in used), key=lambda r: r["clip_id"])
    return EventClips({r["clip_id"]: str(clip_dir / r["audio_path"]) for r in rows}, {r["clip_id"]: r["label"] for r in rows})
