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

A row is read by the one row rule of :mod:`pipeline.shards.rows`, the rule ``sedsynth validate``
applies: a row with a null or malformed field, a cluster id the folder's ``clusters/`` lacks, a
label that cannot be a TSV cell (``bad-label``), an id that cannot name a file, an audio cell
without bytes, audio that does not decode (``unreadable``, ``empty``, ``non-finite``) or that
holds more than the row's ``duration_s`` (``too-long``, told from the FLAC header before any
frame is decoded), and a whole file with a column of another type, is left out of every metric
and named on stderr with its reason (:func:`read_split`), not a traceback. The audio is decoded
here once, a block at a time, so a row that does not decode is gone before the ground truth
and the classes are assembled: no class is scored without its ground truth.
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
from pipeline.shards.rows import Fault, audio_fault, column_problem, combined, name_problem, phrase_faults, shown
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
        return {
            i: sorted((s["start_s"], s["end_s"], p["label"]) for p in self.phrases[i] for s in p["segments"]) for i in self.ids
        }

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


def row_faults(row: dict, cluster_ids: frozenset[int] | None = None) -> list[Fault]:
    """Why a metadata row cannot be evaluated, as ``(reason, message)``: an id that cannot name a
    file, a null caption, phrases failing :func:`~pipeline.shards.rows.phrase_faults` (the rule
    ``sedsynth validate`` applies; cluster ids checked against ``cluster_ids`` unless ``None``)."""
    faults: list[Fault] = []
    if (problem := name_problem(row["id"])) is not None:
        faults.append(("malformed-row", problem))
    if not isinstance(row["caption"], str):
        faults.append(("malformed-row", "the caption is null"))
    return faults + phrase_faults(row["phrases"], row["duration_s"], cluster_ids)


def known_clusters(path: str) -> frozenset[int] | None:
    """The cluster ids of the shard folder's ``clusters/`` (the inventory its phrases' ids point
    into), read as the trainer reads them; ``None`` (ids not checked) for a folder without one."""
    from trainer.data.negatives import ClusterTables, NegativeError, default_clusters_folder

    if path.rstrip("/").endswith(".parquet"):
        return None
    try:
        tables = ClusterTables.read(default_clusters_folder(path))
    except NegativeError:
        return None
    return frozenset(int(c["cluster_id"]) for c in tables.clusters)


def _audio_cells(pf: pq.ParquetFile) -> Iterator[bytes | None]:
    """Each row's audio bytes (``None`` for a null cell), :data:`AUDIO_BATCH_ROWS` rows in memory at a time."""
    for batch in pf.iter_batches(batch_size=AUDIO_BATCH_ROWS, columns=["audio"]):
        for a in batch.column("audio").to_pylist():
            yield (a or {}).get("bytes")


def read_split(path: str, split: str, first: int | None = None) -> ShardSplit:
    """A split's metadata (ids, durations, captions, phrases) from its Parquet files; with
    ``first``, only of its first ``first`` usable rows (and the files holding them), every row's
    metadata still checked and its event clips kept (:meth:`ShardSplit.used_clips`): the probes
    train on 1,600 mixtures, and the metadata of a whole FSD50K-size train split is half a GB of
    Python objects.

    Shards are untrusted: a file lacking a column or with one of another type
    (:func:`~pipeline.shards.rows.column_problem`) is left out, and so is a row failing
    :func:`row_faults` (cluster ids against :func:`known_clusters`), with an audio cell without
    bytes, or whose audio fails :func:`~pipeline.shards.rows.audio_fault` (a kept row's audio is
    decoded through here, a block at a time, bounded by its ``duration_s``); each gets one line
    on stderr naming the file (and row) and the reason, and is kept in :attr:`ShardSplit.skips`
    with that reason; a last line counts them.
    """
    files = list_parquet(path, split)
    clusters = known_clusters(path)
    if clusters is None:
        print(f"evaluate: no clusters/ beside the shards under {path}; the rows' cluster ids are not checked", file=sys.stderr)
    kept_files, kept, skips = [], [], []
    ids, durations, captions, phrases = [], {}, {}, {}
    used: set[str] = set()

    def skip(file: str, item: str, reason: str, detail: str, todo: str) -> None:
        skips.append(Skip(item, file, reason, detail))
        print(f"evaluate: skipping {detail}; {todo}", file=sys.stderr)

    for file in files:
        fs, root = _fs(file)
        positions = set()
        with fs.open(root, "rb") as f:
            pf = pq.ParquetFile(f, pre_buffer=False, buffer_size=READ_BUFFER_BYTES)
            schema = pf.schema_arrow
            wrong = [f"no column {c!r}" for c in (*META_COLUMNS, "audio") if c not in schema.names]
            wrong += [p for c in (*META_COLUMNS, "audio") if (p := column_problem(schema, c))]
            if wrong:
                skip(file, file, "malformed-row", f"{file}: {wrong[0]}", "re-create it (sedsynth shards, or download it again)")
                continue
            no_audio = rows_without_audio(pf)
            rows = pf.read(columns=META_COLUMNS).to_pylist()
            cells = _audio_cells(pf)
            for k, row in enumerate(rows):
                wanted = first is None or len(ids) < first  # past ``first`` no audio is read: once reached, it stays so
                cell = next(cells) if wanted else None
                fault = ("malformed-row", "the audio cell has no bytes") if k in no_audio else combined(row_faults(row, clusters))
                if fault is None and wanted:
                    fault = audio_fault(cell, row["duration_s"])
                    fault = fault if fault is None or fault[0] == "malformed-row" else (fault[0], f"{fault[0]} audio: {fault[1]}")
                if fault:
                    i = row["id"]
                    named = str(i) if name_problem(i) is None else shown(i)  # a bad id is quoted, cut, on one line
                    skip(
                        file,
                        named,
                        fault[0],
                        f"row {k} of {file} (id {named}): {fault[1]}",
                        "fix or re-create that shard (`sedsynth validate <folder>` lists every bad row)",
                    )
                    continue
                if first is not None:
                    used |= source_clips_of(row["phrases"])
                    if not wanted:
                        continue
                i = row["id"]
                positions.add(k)
                ids.append(i)
                durations[i], captions[i], phrases[i] = float(row["duration_s"]), row["caption"], row["phrases"]
        if positions or first is None:
            kept_files.append(file)
            kept.append(frozenset(positions))
    if skips:
        print(
            f"evaluate: {len(skips)} rows or files of the {split} split under {path} skipped; every metric leaves them out",
            file=sys.stderr,
        )
    if not ids:
        raise ValueError(f"evaluate: no usable rows in the {split} split under {path}; check it with `sedsynth validate`")
    if len(set(ids)) != len(ids):
        raise ValueError(f"evaluate: the {split} split under {path} repeats clip ids; rebuild it with `sedsynth shards`")
    return ShardSplit(
        tuple(kept_files),
        tuple(ids),
        durations,
        captions,
        phrases,
        tuple(kept),
        tuple(skips),
        frozenset(used) if first is not None else None,
    )


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
        raise FileNotFoundError(
            f"evaluate: no clip manifest at {manifest}; run `sedsynth clip` or set evaluate.event_clips: null"
        )
    used = split.used_clips()
    table = pq.read_table(manifest, columns=["clip_id", "audio_path", "label"]).to_pylist()
    rows = sorted((r for r in table if r["clip_id"] in used), key=lambda r: r["clip_id"])
    return EventClips({r["clip_id"]: str(clip_dir / r["audio_path"]) for r in rows}, {r["clip_id"]: r["label"] for r in rows})
