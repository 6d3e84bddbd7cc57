"""The shards stage: mixtures, captions and clusters -> a Hugging Face dataset folder.

Input: the mix stage's folder (recipes, FLAC audio, licences), the captions stage's folder
(captions and label phrases) and the clusters stage's folder (phrase database). Output, in
``shards.out_dir`` (layout in :mod:`pipeline.shards.layout`): Parquet shards of
:class:`~pipeline.schema.ShardRow`, one row per mixture in (split, index) order with the
sha256 of its FLAC bytes (which ``validate`` checks), in the schema ``datasets`` itself writes;
a new shard when the audio in one reaches ``shards.shard_size_mb`` and a new row group at
``shards.row_group_size_mb``, every column compressed with ``shards.compression`` but the
FLAC bytes (stored as they are: they do not compress); ``index.json``; the dataset card; the phrase database and
cluster relations under ``clusters/``; licences, attribution and pictures.

Every label phrase of a row carries its cluster id, taken from the phrase database by
(phrase, label, MID); its segments are the label's relabeled segments. The folder is built
under a staging name and swapped in whole.

Memory: every row but its audio is read once into Arrow columns (:func:`mixture_index`, under a
kilobyte per mixture), and a row group's rows are cut from them when that row group is written
(:func:`row_group_table`), its audio read then. No mixture is held as a Python record, so
beyond the index the stage holds one row group at a time.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.config.params import folders_besides
from pipeline.mix.layout import ATTRIBUTION, LICENSES, MIXTURES
from pipeline.outputs import check_out_dir, staged_dir
from pipeline.schema import SPLITS, LabelPhrase, ShardPhrase
from pipeline.shards import card
from pipeline.shards.layout import shard_schema
from pipeline.shards.writer import MB, audio_column, plan_chunks, write_shards

__all__ = ["INDEX_FIELDS", "ShardError", "mixture_index", "plan_chunks", "row_group_table", "run", "shard_phrase"]


class ShardError(ValueError):
    """A shards problem the user must fix; the message says how."""


def _need(path: Path, stage: str) -> Path:
    if not path.exists():
        raise ShardError(f"{path} not found: run `sedsynth {stage}` (or `dvc repro {stage}`) first")
    return path


PHRASE_FIELDS = tuple(f.name for f in dataclasses.fields(ShardPhrase))
_KEPT_PHRASE_FIELDS = tuple(name for name in PHRASE_FIELDS if name != "cluster_id")
PHRASE_KEY = ("phrase", "label", "mid")  # what the phrase database assigns a cluster by
RECIPE_FIELDS = (
    "sample_rate_hz",
    "duration_s",
    "background_id",
    "split",
    "license",
    "licenses",
    "attribution",
)  # same name in a row
INDEX_FIELDS = ("id", "audio_path", "caption", "phrases", *RECIPE_FIELDS)


def shard_phrase(ph: LabelPhrase, cluster_id: int) -> ShardPhrase:
    """A caption phrase with its cluster: every field of the :class:`LabelPhrase` a shard row keeps, by name."""
    return ShardPhrase(**{name: getattr(ph, name) for name in _KEPT_PHRASE_FIELDS}, cluster_id=cluster_id)


def _recipes_in_row_order(mix_dir: Path) -> pa.Table:
    """The recipes' columns a row needs, sorted by (split in :data:`SPLITS` order, index); ties keep the file's order."""
    recipes = pq.read_table(_need(mix_dir / MIXTURES, "mix"), columns=["mixture_id", "index", "audio_path", *RECIPE_FIELDS])
    rank = pc.index_in(recipes["split"], value_set=pa.array(SPLITS))
    if rank.null_count:
        unknown = sorted(set(pc.filter(recipes["split"], pc.is_null(rank)).to_pylist()))
        raise ShardError(f"mixtures of splits {unknown}: a dataset's splits are {list(SPLITS)}; re-run `sedsynth mix`")
    return recipes.take(np.lexsort((recipes["index"].to_numpy(), rank.to_numpy())))  # a stable sort, its last key first


def _cluster_ids(phrases: pa.Table, clusters_dir: Path) -> pa.Array:
    """Each row of ``phrases`` -> its cluster id in the phrase database, found by (phrase, label, MID)."""
    database = pq.read_table(_need(clusters_dir / "phrases.parquet", "clusters"), columns=[*PHRASE_KEY, "cluster_id"])
    cluster_of = {
        tuple(a[k] for k in PHRASE_KEY): a["cluster_id"] for a in database.to_pylist()
    }  # a key listed twice: its last row
    keys = pa.Table.from_pylist(
        [dict(zip(PHRASE_KEY, key), cluster_id=c) for key, c in cluster_of.items()], schema=database.schema
    )
    rows = phrases.select(list(PHRASE_KEY)).append_column("row", pa.array(np.arange(len(phrases))))
    found = rows.join(keys, keys=list(PHRASE_KEY), join_type="left outer").sort_by("row")  # a join keeps no order
    missing = found.filter(pc.is_null(found["cluster_id"]))
    if missing.num_rows:
        ph = missing.slice(0, 1).to_pylist()[0]
        raise ShardError(
            f"phrase {ph['phrase']!r} ({ph['label']}) has no cluster: re-run `sedsynth clusters` after `sedsynth captions`"
        )
    return found["cluster_id"].combine_chunks()


def _phrase_lists(ids: pa.Array, captions_dir: Path, clusters_dir: Path) -> pa.Array:
    """Mixture ``ids`` -> one Arrow list per mixture of its :class:`ShardPhrase` structs, in ``phrases.parquet``'s order."""
    phrases = pq.read_table(_need(captions_dir / "phrases.parquet", "captions"), columns=["mixture_id", *_KEPT_PHRASE_FIELDS])
    owner = pc.index_in(phrases["mixture_id"], value_set=ids)  # a phrase of no listed mixture is left out
    phrases, owner = phrases.filter(pc.is_valid(owner)), owner.filter(pc.is_valid(owner)).combine_chunks().to_numpy()
    phrases = phrases.take(np.argsort(owner, kind="stable"))
    cluster_id = _cluster_ids(phrases, clusters_dir)
    structs = pa.StructArray.from_arrays(
        [cluster_id if name == "cluster_id" else phrases[name].combine_chunks() for name in PHRASE_FIELDS],
        names=list(PHRASE_FIELDS),
    )
    offsets = np.zeros(len(ids) + 1, np.int32)
    np.cumsum(np.bincount(owner, minlength=len(ids)), out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), structs)


def mixture_index(mix_dir: Path, captions_dir: Path, clusters_dir: Path) -> pa.Table:
    """Every shard row without its audio, as Arrow columns: one row per mixture, in (split, index) order.

    Columns (:data:`INDEX_FIELDS`): ``id``; ``audio_path``, the FLAC relative to ``mix_dir``;
    ``caption``; ``phrases``, the mixture's label phrases in ``phrases.parquet``'s order, each with
    its cluster id; and the recipe's :data:`RECIPE_FIELDS`. Raises :class:`ShardError` for a
    missing input, a mixture without a caption, a phrase without a cluster or more than one
    sample rate.
    """
    recipes = _recipes_in_row_order(mix_dir)
    rates = pc.unique(recipes["sample_rate_hz"]).to_pylist()
    if len(rates) != 1:
        raise ShardError(f"mixtures have sample rates {sorted(rates)}; one dataset needs one rate (the Audio feature has one)")
    ids = recipes["mixture_id"].combine_chunks()
    captions = pq.read_table(_need(captions_dir / "captions.parquet", "captions"), columns=["mixture_id", "caption"])
    at = pc.index_in(ids, value_set=captions["mixture_id"])
    if at.null_count:
        missing = pc.filter(ids, pc.is_null(at))[0].as_py()
        raise ShardError(f"mixture {missing} has no caption: the captions stage is older than the mix stage; re-run `dvc repro`")
    columns = {
        "id": ids,
        "audio_path": recipes["audio_path"],
        "caption": captions["caption"].take(at),
        "phrases": _phrase_lists(ids, captions_dir, clusters_dir),
        **{name: recipes[name] for name in RECIPE_FIELDS},
    }
    return pa.table({name: columns[name] for name in INDEX_FIELDS}).combine_chunks()


def row_group_table(index: pa.Table, rows: range, mix_dir: Path, schema: pa.Schema, seed: int) -> pa.Table:
    """Rows ``rows`` of the :func:`mixture_index` -> one row group of :class:`~pipeline.schema.ShardRow` rows in ``schema``.

    The rows' FLAC bytes are read from ``mix_dir`` into one buffer (:func:`~pipeline.shards.writer.audio_column`)
    and hashed there; every other column is a slice of the index. The same table as
    ``to_table([ShardRow(...) ...], ShardRow).cast(schema)``.
    """
    part = index.slice(rows.start, len(rows))
    files = [mix_dir / p for p in part["audio_path"].to_pylist()]
    audio = audio_column(files, [f.stat().st_size for f in files], [f.name for f in files], schema.field("audio").type)
    data = audio.field("bytes")
    columns = {
        "audio": audio,
        "audio_sha256": pa.array([hashlib.sha256(data[i].as_buffer()).hexdigest() for i in range(len(data))], pa.string()),
        "seed": pa.array([seed] * len(rows), pa.int64()),
        **{name: part[name] for name in INDEX_FIELDS},
    }
    return pa.table({f.name: columns[f.name] for f in schema}).cast(schema).combine_chunks()


def _split_rows(index: pa.Table) -> dict[str, range]:
    """Split -> its rows of the :func:`mixture_index` (contiguous, in :data:`SPLITS` order), for the splits it has."""
    counts = {c["values"]: c["counts"] for c in pc.value_counts(index["split"]).to_pylist()}
    rows, start = {}, 0
    for split in (s for s in SPLITS if s in counts):
        rows[split] = range(start, start + counts[split])
        start += counts[split]
    return rows


def run(
    params,
    mix_dir: Path | None = None,
    captions_dir: Path | None = None,
    clusters_dir: Path | None = None,
    out_dir: Path | None = None,
) -> dict:
    """Write the dataset folder; returns the index (also written to ``index.json``)."""
    p = params.shards
    mix_dir = Path(mix_dir or params.mix.out_dir)
    captions_dir = Path(captions_dir or params.captions.out_dir)
    clusters_dir = Path(clusters_dir or params.clusters.out_dir)
    out_dir = Path(out_dir or p.out_dir)
    check_out_dir(
        out_dir,
        "shards.out_dir",
        {
            **folders_besides(params, "shards.out_dir"),
            "mix.out_dir": mix_dir,
            "captions.out_dir": captions_dir,
            "clusters.out_dir": clusters_dir,
        },
    )
    mixtures = mixture_index(mix_dir, captions_dir, clusters_dir)
    rate = mixtures["sample_rate_hz"][0].as_py()
    audio_paths = mixtures["audio_path"]
    with staged_dir(out_dir) as staging:
        index = write_shards(
            staging,
            rate,
            _split_rows(mixtures),
            lambda row: (mix_dir / audio_paths[row].as_py()).stat().st_size,
            row_of=None,
            shard_size_mb=p.shard_size_mb,
            row_group_size_mb=p.row_group_size_mb,
            compression=p.compression,
            desc="shards",
            table_of=functools.partial(row_group_table, mixtures, mix_dir=mix_dir, schema=shard_schema(rate), seed=params.seed),
        )
        files = index["files"]
        (staging / "clusters").mkdir()
        for name in ("clusters.parquet", "phrases.parquet", "labels.csv"):
            shutil.copyfile(_need(clusters_dir / name, "clusters"), staging / "clusters" / name)
        for name in (LICENSES, ATTRIBUTION):
            shutil.copyfile(_need(mix_dir / name, "mix"), staging / name)
        card.write(staging, params, mix_dir, index)
    per_split = ", ".join(f"{s} {v['num_rows']}" for s, v in index["splits"].items())
    print(
        f"shards: {mixtures.num_rows} rows in {len(files)} shards ({per_split}), "
        f"{sum(f['num_bytes'] for f in files) / MB:.1f} MB -> {out_dir}",
        file=sys.stderr,
    )
    return index
