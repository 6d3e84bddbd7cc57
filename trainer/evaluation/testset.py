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

A row with a null or malformed field (the rule ``sedsynth validate`` applies), an audio cell
without bytes, or a whole file with a column of another type is left out of every metric and
named on stderr (:func:`read_split`), not a traceback.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from pipeline.schema import Skip
from pipeline.shards.rows import column_problem, phrase_problems
from trainer.data.sources import READ_BUFFER_BYTES, _fs, list_parquet

META_COLUMNS = ["id", "duration_s", "caption", "phrases"]


AUDIO_BATCH_ROWS = 32  # rows :meth:`ShardSplit.audio` converts to Python at a time


def source_clips_of(phrases: list[dict]) -> set[str]:
    """The event clips a mixture's phrases were made from."""
    return {c for p in phrases for c in p.get("source_clip_ids") or []}


@dataclass(frozen=True)
class ShardSplit:
    files: tuple[str, ...]
    ids: tuple[str, ...]
    durations_s: dict[str, float]
    captions: dict[str, str]
    phrases: dict[str, list[dict]]  # clip -> [{phrase, label, mid, segments: [{start_s, end_s}], source_clip_ids}]
    kept: tuple[frozenset[int], ...] = ()  # per file: the positions of the rows in ``ids`` (the others were skipped)
    skips: tuple[Skip, ...] = ()  # the rows and files left out, each with its reason
    source_clips: frozenset[str] | None = None  # read with ``first``: the event clips every usable row uses

    def used_clips(self) -> set[str]:
        """The event clips the split's mixtures were built from (every usable row's, also those
        past ``first`` when the split was read so)."""
        if self.source_clips is not None:
            return set(self.source_clips)
        return {c for ps in self.phrases.values() for c in source_clips_of(ps)}

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
        """``(id, encoded bytes)`` in :attr:`ids` order, :data:`AUDIO_BATCH_ROWS` rows in memory at a
        time (a row group of the hub's size holds 100-300 MB of audio). Column chunks are not
        pre-buffered but read a page at a time through a buffer: Arrow would otherwise hold the
        row group's audio as read beside the batch decoded from it."""
        for path, kept in zip(self.files, self.kept or [None] * len(self.files)):
            fs, root = _fs(path)
            with fs.open(root, "rb") as f:
                pf = pq.ParquetFile(f, pre_buffer=False, buffer_size=READ_BUFFER_BYTES)
                k = 0
                for batch in pf.iter_batches(batch_size=AUDIO_BATCH_ROWS, columns=["id", "audio"]):
                    for i, a in zip(batch.column("id").to_pylist(), batch.column("audio").to_pylist()):
                        if kept is None or k in kept:
                            yield i, a["bytes"]
                        k += 1


def rows_without_audio(pf: pq.ParquetFile) -> set[int]:
    """Positions of the rows whose ``audio`` cell, or its ``bytes``, is null.

    A row group whose footer counts no null bytes is not read (every shard ``sedsynth shards``
    writes); the others' audio column is read one row group at a time.
    """
    meta = pf.metadata
    leaf = next((i for i in range(meta.num_columns) if meta.schema.column(i).path == "audio.bytes"), None)
    out, first = set(), 0
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(leaf).statistics if leaf is not None else None
        if stats is None or not stats.has_null_count or stats.null_count > 0:
            audio = pf.read_row_group(g, columns=["audio"]).column("audio").combine_chunks()
            missing = np.asarray(audio.is_null()) | np.asarray(audio.field("bytes").is_null())
            out |= {first + int(k) for k in np.flatnonzero(missing)}
        first += meta.row_group(g).num_rows
    return out


def row_problem(row: dict) -> str | None:
    """Why a metadata row cannot be evaluated (a null, or phrases failing
    :func:`~pipeline.shards.rows.phrase_problems`, the rule ``sedsynth validate`` applies), else ``None``."""
    problems = []
    if not isinstance(row["id"], str) or not row["id"]:
        problems.append("the id is null")
    if not isinstance(row["caption"], str):
        problems.append("the caption is null")
    problems += phrase_problems(row["phrases"], row["duration_s"])
    return "; ".join(problems) or None


def read_split(path: str, split: str, first: int | None = None) -> ShardSplit:
    """A split's metadata (ids, durations, captions, phrases) from its Parquet files; with
    ``first``, only of its first ``first`` usable rows (and the files holding them), every row
    still checked and its event clips kept (:meth:`ShardSplit.used_clips`): the probes train on
    1,600 mixtures, and the metadata of a whole FSD50K-size train split is half a GB of Python
    objects.

    Shards are untrusted: a file lacking a column or with one of another type
    (:func:`~pipeline.shards.rows.column_problem`) is left out, and so is a row with a null or
    malformed field or an audio cell without bytes; each gets one line on stderr naming the
    file (and row) and is kept in :attr:`ShardSplit.skips`, and a last line counts them.
    """
    files = list_parquet(path, split)
    kept_files, kept, skips = [], [], []
    ids, durations, captions, phrases = [], {}, {}, {}
    used: set[str] = set()

    def skip(file: str, item: str, detail: str, todo: str) -> None:
        skips.append(Skip(item, file, "malformed-row", detail))
        print(f"evaluate: skipping {detail}; {todo}", file=sys.stderr)

    for file in files:
        fs, root = _fs(file)
        with fs.open(root, "rb") as f:
            pf = pq.ParquetFile(f)
            schema = pf.schema_arrow
            wrong = [f"no column {c!r}" for c in (*META_COLUMNS, "audio") if c not in schema.names]
            wrong += [p for c in (*META_COLUMNS, "audio") if (p := column_problem(schema, c))]
            if wrong:
                skip(file, file, f"{file}: {wrong[0]}", "re-create it (sedsynth shards, or download it again)")
                continue
            no_audio = rows_without_audio(pf)
            rows = pf.read(columns=META_COLUMNS).to_pylist()
        positions = set()
        for k, row in enumerate(rows):
            problem = "the audio cell has no bytes" if k in no_audio else row_problem(row)
            if problem:
                skip(file, str(row["id"]), f"row {k} of {file} (id {row['id']}): {problem}",
                     "fix or re-create that shard (`sedsynth validate <folder>` lists every bad row)")
                continue
            if first is not None:
                used |= source_clips_of(row["phrases"])
                if len(ids) >= first:
                    continue
            i = row["id"]
            positions.add(k)
            ids.append(i)
            durations[i], captions[i], phrases[i] = float(row["duration_s"]), row["caption"], row["phrases"]
        if positions or first is None:
            kept_files.append(file)
            kept.append(frozenset(positions))
    if skips:
        print(f"evaluate: {len(skips)} rows or files of the {split} split under {path} skipped; every metric leaves them out",
              file=sys.stderr)
    if not ids:
        raise ValueError(f"evaluate: no usable rows in the {split} split under {path}; check it with `sedsynth validate`")
    if len(set(ids)) != len(ids):
        raise ValueError(f"evaluate: the {split} split under {path} repeats clip ids; rebuild it with `sedsynth shards`")
    return ShardSplit(tuple(kept_files), tuple(ids), durations, captions, phrases, tuple(kept), tuple(skips),
                      frozenset(used) if first is not None else None)


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
    used = split.used_clips()
    table = pq.read_table(manifest, columns=["clip_id", "audio_path", "label"]).to_pylist()
    rows = sorted((r for r in table if r["clip_id"] in used), key=lambda r: r["clip_id"])
    return EventClips({r["clip_id"]: str(clip_dir / r["audio_path"]) for r in rows}, {r["clip_id"]: r["label"] for r in rows})
