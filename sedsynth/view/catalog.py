"""The mixtures ``sedsynth view`` lists: a shard folder or a mix stage folder, read as one table of metadata.

Input: a shard folder (``index.json`` and ``data/*.parquet``, as ``sedsynth shards`` or
``sedsynth import`` write it) or a mixtures folder (the mix stage's ``mixtures.parquet``,
``segments.parquet``, ``occurrences.parquet`` and ``audio/``). Only metadata columns are read
(Parquet column projection: the ``audio`` column is never decoded for the list), once, when the
folder is opened. Output: :class:`Catalog`, which filters and pages the list
(:meth:`Catalog.select`, :meth:`Catalog.rows`), describes one mixture with its phrases, segments,
SNRs and source clips (:meth:`Catalog.mixture`) and returns one mixture's encoded audio
(:meth:`Catalog.audio`), the only time audio is read.

"Events" here are labelled segments, the ground-truth events a detector is scored on (a clip
repeated in a mixture counts each time it sounds). A mixture's SNR range is the lowest and the
highest of its events' drawn SNRs (none for an imported corpus, which has no drawn SNRs).

Files are untrusted: an ``index.json`` entry must name a regular file inside the folder, and an
audio path from ``mixtures.parquet`` must resolve (symbolic links followed) inside the folder,
else it is refused (:class:`OutsideError`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.files import read_regular, special_file_problem
from pipeline.shards.layout import entry_problem

SHARD_COLUMNS = ("id", "split", "duration_s", "sample_rate_hz", "caption", "phrases", "background_id", "license")
REQUIRED_SHARD_COLUMNS = ("id", "split", "duration_s", "phrases")
MIXTURE_COLUMNS = ("mixture_id", "split", "duration_s", "sample_rate_hz", "audio_path", "background_id", "license")
READ_BUFFER_BYTES = (
    1 << 20
)  # Parquet pages are read through a buffer of this size, so a row's audio is found without reading its whole row group


class OutsideError(PermissionError):
    """A file a folder's metadata names outside that folder (``..``, an absolute path, a symbolic link out)."""


class FolderError(ValueError):
    """A folder that is none of the kinds ``sedsynth view`` reads; the message names what was expected."""


def folder_kind(path: str | Path) -> str:
    """``"shards"``, ``"mixtures"`` or ``"evaluation"``: what the folder ``path`` holds; raises :class:`FolderError` otherwise."""
    p = Path(path)
    if not p.is_dir():
        raise FolderError(
            f"{path} is not a folder; expected a shard folder (index.json, data/*.parquet), a mixtures folder "
            "(mixtures.parquet, the mix stage's output) or an evaluation folder (metrics.json, details/)"
        )
    if (p / "metrics.json").is_file() and (p / "details").is_dir():
        return "evaluation"
    if (p / "mixtures.parquet").is_file() and (p / "segments.parquet").is_file():
        return "mixtures"
    if (p / "index.json").is_file() or any((p / "data").glob("*.parquet")):
        return "shards"
    raise FolderError(
        f"{path} holds none of what sedsynth view reads: expected a shard folder (index.json, data/*.parquet), "
        "a mixtures folder (mixtures.parquet, the mix stage's output) or an evaluation folder (metrics.json, details/)"
    )


def inside(folder: Path, relative: str) -> Path:
    """``folder / relative`` resolved (links followed), if it lies inside ``folder``; raises :class:`OutsideError` otherwise."""
    root = folder.resolve()
    if not relative or Path(relative).is_absolute() or "\\" in relative:
        raise OutsideError(f"{relative!r} is not a relative path inside {folder}")
    target = (root / relative).resolve()
    if target != root and root not in target.parents:
        raise OutsideError(f"{relative!r} leads outside {folder}")
    return target


def shard_files(folder: Path) -> list[Path]:
    """The shard folder's Parquet files: ``index.json``'s entries (each checked to lie inside), else ``data/*.parquet``."""
    index = folder / "index.json"
    if index.is_file():
        try:
            entries = [e["path"] for e in json.loads(read_regular(index, "index.json")).get("files", [])]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise FolderError(
                f"{index} is malformed ({type(e).__name__}: {e}); re-create the folder with `sedsynth shards`"
            ) from None
        files = []
        for entry in entries:
            problem = entry_problem(entry)
            if problem:
                raise FolderError(f"{index} entry {entry!r} {problem}; re-create the folder with `sedsynth shards`")
            try:
                files.append(inside(folder, entry))
            except OutsideError:  # a link inside the folder that points out of it
                raise FolderError(
                    f"{index} entry {entry!r} leads outside {folder}; re-create the folder with `sedsynth shards`"
                ) from None
        if files:
            return files
    return sorted((folder / "data").glob("*.parquet"))


@dataclass
class Catalog:
    """Every mixture of a folder: the metadata table (one row per mixture, no audio) and per-row summaries.

    ``table`` holds the columns of :data:`SHARD_COLUMNS` (a mixtures folder's rows are put in the
    same shape); ``labels``/``clusters`` are each row's sets, ``events`` its segment count and
    ``snr_min``/``snr_max`` its events' SNR range (NaN where unknown); ``where`` says how to find
    each row's audio (shards: ``(file, row)``; mixtures: the audio path).
    """

    kind: str
    folder: Path
    table: pa.Table
    labels: list[tuple[str, ...]]
    clusters: list[tuple[int, ...]]
    events: np.ndarray
    snr_min: np.ndarray
    snr_max: np.ndarray
    where: list[tuple]
    cluster_names: dict[int, str] = field(default_factory=dict)
    position: dict[str, int] = field(default_factory=dict)
    searchable: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.ids = self.table.column("id").to_pylist()
        self.splits = np.asarray(self.table.column("split").to_pylist(), dtype=object)
        self.position = {i: k for k, i in enumerate(self.ids)}
        captions = self.table.column("caption").to_pylist()
        # what the text filter searches: the id, the caption and every phrase and label, lower-cased once
        phrases = _phrase_texts(self.table)
        self.searchable = [" ".join([i, c or "", *p]).lower() for i, c, p in zip(self.ids, captions, phrases)]
        self.by_label: dict[str, np.ndarray] = _inverted(self.labels)
        self.by_cluster: dict[int, np.ndarray] = _inverted(self.clusters)

    def __len__(self) -> int:
        return len(self.ids)

    def summary(self) -> dict:
        """What the list's filters can choose from: splits with their counts, labels, clusters, the ranges of events and SNRs."""
        splits, counts = np.unique(self.splits.astype(str), return_counts=True) if len(self) else ([], [])
        finite = self.snr_min[np.isfinite(self.snr_min)]
        return {
            "kind": self.kind,
            "folder": str(self.folder),
            "mixtures": len(self),
            "splits": {str(s): int(n) for s, n in zip(splits, counts)},
            "labels": sorted(self.by_label),
            "clusters": [
                {"id": int(c), "name": self.cluster_names.get(int(c), str(c)), "mixtures": int(len(rows))}
                for c, rows in sorted(self.by_cluster.items())
            ],
            "events": [int(self.events.min()), int(self.events.max())] if len(self) else [0, 0],
            "snr_db": [float(finite.min()), float(np.nanmax(self.snr_max))] if len(finite) else None,
        }

    def select(
        self,
        *,
        split: str = "",
        label: str = "",
        cluster: int | None = None,
        min_events: int | None = None,
        max_events: int | None = None,
        min_snr_db: float | None = None,
        max_snr_db: float | None = None,
        text: str = "",
    ) -> np.ndarray:
        """Row positions matching every filter given, in the folder's order.

        ``label``/``cluster``: the mixture has an event of it; ``min_events``/``max_events``: its
        count of events lies within; ``min_snr_db``/``max_snr_db``: every event's SNR lies within
        (a mixture without SNRs fails an SNR filter); ``text``: every word appears in its id,
        caption or phrases (case-insensitive).
        """
        keep = np.ones(len(self), bool)
        if split:
            keep &= self.splits == split
        if label:
            keep &= _mask(self.by_label.get(label), len(self))
        if cluster is not None:
            keep &= _mask(self.by_cluster.get(cluster), len(self))
        if min_events is not None:
            keep &= self.events >= min_events
        if max_events is not None:
            keep &= self.events <= max_events
        with np.errstate(invalid="ignore"):  # NaN (no SNR) compares False: such a mixture fails the filter
            if min_snr_db is not None:
                keep &= self.snr_min >= min_snr_db
            if max_snr_db is not None:
                keep &= self.snr_max <= max_snr_db
        rows = np.flatnonzero(keep)
        words = text.lower().split()
        if words:
            rows = np.asarray([k for k in rows if all(w in self.searchable[k] for w in words)], dtype=np.int64)
        return rows

    def rows(self, positions: np.ndarray) -> list[dict]:
        """The list's rows at ``positions``: id, split, duration, caption, labels, events and SNR range."""
        positions = [int(k) for k in positions]
        if not positions:
            return []
        part = self.table.take(pa.array(positions, pa.int64())).select(["duration_s", "caption"]).to_pylist()
        return [
            {
                "id": self.ids[k],
                "split": str(self.splits[k]),
                "duration_s": r["duration_s"],
                "caption": r["caption"] or "",
                "labels": list(self.labels[k]),
                "events": int(self.events[k]),
                "snr_db": None if not np.isfinite(self.snr_min[k]) else [float(self.snr_min[k]), float(self.snr_max[k])],
            }
            for k, r in zip(positions, part)
        ]

    def mixture(self, mixture_id: str) -> dict | None:
        """One mixture: id, split, duration, rate, caption, background, licence and its phrases, each with its
        label, cluster, segments ``[[onset_s, offset_s], ...]``, SNRs and source clips; None for an unknown id."""
        k = self.position.get(mixture_id)
        if k is None:
            return None
        row = self.table.slice(k, 1).to_pylist()[0]
        phrases = []
        for p in row.get("phrases") or []:
            cluster = p.get("cluster_id")
            phrases.append(
                {
                    "phrase": p.get("phrase") or p.get("label") or "",
                    "label": p.get("label") or "",
                    "mid": p.get("mid") or "",
                    "cluster_id": cluster,
                    "cluster": self.cluster_names.get(cluster) if cluster is not None else None,
                    "segments": [[s["start_s"], s["end_s"]] for s in p.get("segments") or []],
                    "snr_db": list(p.get("snr_db") or []),
                    "source_clip_ids": list(p.get("source_clip_ids") or []),
                }
            )
        return {
            "id": mixture_id,
            "split": row.get("split"),
            "duration_s": row.get("duration_s"),
            "sample_rate_hz": row.get("sample_rate_hz"),
            "caption": row.get("caption") or "",
            "background_id": row.get("background_id"),
            "license": row.get("license"),
            "phrases": phrases,
        }

    def audio(self, mixture_id: str) -> bytes | None:
        """One mixture's encoded audio bytes as stored (FLAC in the pipeline's folders); None for an unknown id.

        Shards: the row's cell, read through a buffered stream that stops at the row, so at most the
        pages up to it are read. Mixtures: the file its audio path names, which must lie inside the folder.
        """
        k = self.position.get(mixture_id)
        if k is None:
            return None
        if self.kind == "mixtures":
            return read_regular(inside(self.folder, self.where[k][0]), "mixture audio")
        file, row = self.where[k]
        return _audio_cell(file, row)


def _phrase_texts(table: pa.Table) -> list[list[str]]:
    """Each row's phrase and label texts (for the text filter)."""
    phrases = table.column("phrases").combine_chunks()
    flat = pc.list_flatten(phrases)
    parents = pc.list_parent_indices(phrases).to_numpy()
    out: list[list[str]] = [[] for _ in range(len(table))]
    for name in ("phrase", "label"):
        if flat.type.get_field_index(name) >= 0:
            for k, text in zip(parents, pc.struct_field(flat, name).to_pylist()):
                if text:
                    out[k].append(text)
    return out


def _inverted(sets: list[tuple]) -> dict:
    """``[(a, b), (b,), ...]`` -> ``{a: rows, b: rows}`` (row positions as int arrays)."""
    index: dict = {}
    for k, values in enumerate(sets):
        for v in values:
            index.setdefault(v, []).append(k)
    return {v: np.asarray(rows, dtype=np.int64) for v, rows in index.items()}


def _mask(rows: np.ndarray | None, n: int) -> np.ndarray:
    m = np.zeros(n, bool)
    if rows is not None:
        m[rows] = True
    return m


def _per_row(parents: np.ndarray, values: np.ndarray, n: int, reduce) -> np.ndarray:
    """``reduce`` (np.fmin or np.fmax) of ``values`` grouped by row ``parents``; NaN for a row without values."""
    out = np.full(n, np.nan)
    if len(values):
        reduce.at(out, parents, values)
    return out


def _phrase_summaries(phrases: pa.ChunkedArray | pa.Array, n: int) -> tuple[list, list, np.ndarray, np.ndarray, np.ndarray]:
    """Per row from its ``phrases`` cells, without building Python objects per phrase: label sets,
    cluster sets, segment counts, lowest and highest SNR."""
    phrases = phrases.combine_chunks() if isinstance(phrases, pa.ChunkedArray) else phrases
    flat = pc.list_flatten(phrases)
    parents = pc.list_parent_indices(phrases).to_numpy()
    names = {flat.type.field(i).name for i in range(flat.type.num_fields)}
    labels: list[set] = [set() for _ in range(n)]
    clusters: list[set] = [set() for _ in range(n)]
    if "label" in names:
        for k, label in zip(parents, pc.struct_field(flat, "label").to_pylist()):
            if label:
                labels[k].add(label)
    if "cluster_id" in names:
        for k, c in zip(parents, pc.struct_field(flat, "cluster_id").to_pylist()):
            if c is not None:
                clusters[k].add(int(c))
    events = np.zeros(n, np.int64)
    if "segments" in names:
        counts = pc.fill_null(pc.list_value_length(pc.struct_field(flat, "segments")), 0).to_numpy(zero_copy_only=False)
        np.add.at(events, parents, counts)
    low = high = np.full(n, np.nan)
    if "snr_db" in names:
        snr = pc.struct_field(flat, "snr_db")
        values = pc.list_flatten(snr).to_numpy(zero_copy_only=False).astype(float)
        rows = parents[pc.list_parent_indices(snr).to_numpy()]
        ok = np.isfinite(values)
        low, high = _per_row(rows[ok], values[ok], n, np.fmin), _per_row(rows[ok], values[ok], n, np.fmax)
    return [tuple(sorted(s)) for s in labels], [tuple(sorted(s)) for s in clusters], events, low, high


def _cluster_names(folder: Path) -> dict[int, str]:
    """``clusters/clusters.parquet``'s cluster id -> name, where the folder has one."""
    path = folder / "clusters" / "clusters.parquet"
    if not path.is_file() or special_file_problem(path):
        return {}
    try:
        t = pq.read_table(path, columns=["cluster_id", "name"])
    except (pa.ArrowException, OSError, KeyError):
        return {}
    return dict(zip(t.column("cluster_id").to_pylist(), t.column("name").to_pylist()))


def open_shards(folder: str | Path) -> Catalog:
    """A shard folder's catalog: each file's metadata columns (never ``audio``), files lacking a required column skipped with a line on stderr."""
    folder = Path(folder)
    tables, where = [], []
    for file in shard_files(folder):
        problem = special_file_problem(file)
        if problem:
            print(f"sedsynth view: skipping {file}: {problem}", file=sys.stderr)
            continue
        try:
            names = pq.read_schema(file).names
            missing = [c for c in REQUIRED_SHARD_COLUMNS if c not in names]
            if missing:
                print(f"sedsynth view: skipping {file}: no column {missing[0]!r}", file=sys.stderr)
                continue
            t = pq.read_table(file, columns=[c for c in SHARD_COLUMNS if c in names])
        except (pa.ArrowException, OSError) as e:
            print(f"sedsynth view: skipping {file}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        for c in SHARD_COLUMNS:  # a corpus without captions or backgrounds: empty cells, so every file has one shape
            if c not in t.column_names:
                t = t.append_column(c, pa.nulls(len(t), pa.int64() if c == "sample_rate_hz" else pa.string()))
        tables.append(t.select(list(SHARD_COLUMNS)))
        where += [(file, k) for k in range(len(t))]
    if not tables:
        raise FolderError(f"{folder}: no readable shard (data/*.parquet with columns {', '.join(REQUIRED_SHARD_COLUMNS)})")
    table = pa.concat_tables(tables, promote_options="permissive")
    labels, clusters, events, low, high = _phrase_summaries(table.column("phrases"), len(table))
    return Catalog("shards", folder, table, labels, clusters, events, low, high, where, _cluster_names(folder))


def open_mixtures(folder: str | Path) -> Catalog:
    """A mix stage folder's catalog: ``mixtures.parquet``, ``segments.parquet`` and ``occurrences.parquet``
    joined into rows of the shard shape (phrases named by their labels; no captions, no clusters)."""
    folder = Path(folder)
    mixtures = pq.read_table(folder / "mixtures.parquet", columns=list(MIXTURE_COLUMNS)).to_pylist()
    segments = pq.read_table(
        folder / "segments.parquet", columns=["mixture_id", "label", "mid", "onset_s", "offset_s"]
    ).to_pylist()
    occurrences_path = folder / "occurrences.parquet"
    occurrences = (
        pq.read_table(occurrences_path, columns=["mixture_id", "event_index", "label", "clip_id", "snr_db"]).to_pylist()
        if occurrences_path.is_file()
        else []
    )
    phrases: dict[str, dict[str, dict]] = {}
    for s in segments:
        p = phrases.setdefault(s["mixture_id"], {}).setdefault(
            s["label"],
            {
                "phrase": s["label"].replace("_", " "),
                "label": s["label"],
                "mid": s["mid"],
                "cluster_id": None,
                "segments": [],
                "snr_db": {},
                "source_clip_ids": [],
            },
        )
        p["segments"].append({"start_s": s["onset_s"], "end_s": s["offset_s"]})
    for o in occurrences:  # one SNR per event drawn (its repeats share it), the clips in order of first use
        p = phrases.get(o["mixture_id"], {}).get(o["label"])
        if p is not None:
            p["snr_db"][o["event_index"]] = o["snr_db"]
            if o["clip_id"] not in p["source_clip_ids"]:
                p["source_clip_ids"].append(o["clip_id"])
    rows = []
    for m in mixtures:
        ps = [
            {**p, "segments": sorted(p["segments"], key=lambda s: s["start_s"]), "snr_db": list(p["snr_db"].values())}
            for p in phrases.get(m["mixture_id"], {}).values()
        ]
        rows.append(
            {
                "id": m["mixture_id"],
                "split": m["split"],
                "duration_s": m["duration_s"],
                "sample_rate_hz": m["sample_rate_hz"],
                "caption": None,
                "phrases": ps,
                "background_id": m["background_id"],
                "license": m["license"],
            }
        )
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("split", pa.string()),
            ("duration_s", pa.float64()),
            ("sample_rate_hz", pa.int64()),
            ("caption", pa.string()),
            (
                "phrases",
                pa.list_(
                    pa.struct(
                        [
                            ("phrase", pa.string()),
                            ("label", pa.string()),
                            ("mid", pa.string()),
                            ("cluster_id", pa.int64()),
                            ("segments", pa.list_(pa.struct([("start_s", pa.float64()), ("end_s", pa.float64())]))),
                            ("snr_db", pa.list_(pa.float64())),
                            ("source_clip_ids", pa.list_(pa.string())),
                        ]
                    )
                ),
            ),
            ("background_id", pa.string()),
            ("license", pa.string()),
        ]
    )
    table = pa.Table.from_pylist(rows, schema=schema)
    labels, clusters, events, low, high = _phrase_summaries(table.column("phrases"), len(table))
    return Catalog("mixtures", folder, table, labels, clusters, events, low, high, [(m["audio_path"],) for m in mixtures])


def open_catalog(folder: str | Path) -> Catalog:
    """The catalog of a shard or mixtures folder (:func:`folder_kind` says which)."""
    kind = folder_kind(folder)
    if kind == "evaluation":
        raise FolderError(f"{folder} is an evaluation folder, not a dataset: pass the shard folder it scored (--data)")
    return open_shards(folder) if kind == "shards" else open_mixtures(folder)


def _audio_cell(file: Path, row: int) -> bytes:
    """The audio bytes of row ``row`` of Parquet file ``file``, reading its pages only up to that row."""
    pf = pq.ParquetFile(file, buffer_size=READ_BUFFER_BYTES, pre_buffer=False)
    start = 0
    for g in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        if row < start + n:
            seen = start
            for batch in pf.iter_batches(batch_size=8, row_groups=[g], columns=["audio"], use_threads=False):
                if row < seen + batch.num_rows:
                    cell = batch.column(0)[row - seen].as_py()
                    if not cell or not cell.get("bytes"):
                        raise FileNotFoundError(f"row {row} of {file} has no audio bytes")
                    return cell["bytes"]
                seen += batch.num_rows
        start += n
    raise FileNotFoundError(f"{file} has no row {row}")


def audio_type(data: bytes) -> str:
    """The MIME type of encoded audio bytes, from their first bytes (``application/octet-stream`` when unknown)."""
    if data[:4] == b"fLaC":
        return "audio/flac"
    if data[:4] in (b"RIFF", b"RF64") and data[8:12] == b"WAVE":
        return "audio/wav"
    if data[:4] == b"OggS":
        return "audio/ogg"
    if data[:3] == b"ID3" or data[:2] in (b"\xff\xfb", b"\xff\xf3", b"\xff\xf2"):
        return "audio/mpeg"
    if data[:4] == b"FORM":
        return "audio/aiff"
    return "application/octet-stream"
