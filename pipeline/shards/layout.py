"""The shard folder's layout and row schema, shared by writing, validation and publishing.

A dataset folder holds ``data/<split>-00000-of-000NN.parquet`` (rows of
:class:`~pipeline.schema.ShardRow`), ``index.json`` (per shard: split, rows, bytes, sha256),
``README.md`` (the dataset card), ``clusters/`` (the phrase database and cluster relations the
trainer samples negatives from), ``licenses.json``, ``attribution.csv`` and ``images/``.

The Parquet schema carries the ``huggingface`` metadata key, so ``datasets.load_dataset``
types the ``audio`` column (``struct<bytes, path>``, FLAC bytes) as ``Audio``.
"""

from __future__ import annotations

import json

import pyarrow as pa

from pipeline.schema import ShardRow, arrow_schema

INDEX = "index.json"
CARD = "README.md"
DATA = "data"
INDEX_VERSION = 1


def shard_name(split: str, i: int, n: int) -> str:
    return f"{DATA}/{split}-{i:05d}-of-{n:05d}.parquet"


def features(sample_rate_hz: int):
    """The ``datasets.Features`` of a shard row: Arrow types, with ``audio`` as ``Audio``."""
    import datasets

    feats = datasets.Features.from_arrow_schema(arrow_schema(ShardRow))
    feats["audio"] = datasets.Audio(sampling_rate=sample_rate_hz)
    return feats


def shard_schema(sample_rate_hz: int) -> pa.Schema:
    """The Parquet schema of every shard, with the ``huggingface`` metadata ``datasets`` reads."""
    meta = {"info": {"features": features(sample_rate_hz).to_dict()}}
    return arrow_schema(ShardRow).with_metadata({"huggingface": json.dumps(meta, sort_keys=True)})
