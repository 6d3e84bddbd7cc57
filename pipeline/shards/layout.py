"""The shard folder's layout and row schema, shared by writing, validation, publishing and the readers.

A dataset folder holds ``data/<split>-00000-of-000NN.parquet`` (rows of
:class:`~pipeline.schema.ShardRow`), ``index.json`` (per shard: split, rows, bytes, sha256),
``README.md`` (the dataset card), ``clusters/`` (the phrase database and cluster relations the
trainer samples negatives from), ``licenses.json``, ``attribution.csv`` and ``images/``.

Every shard has exactly the schema ``datasets`` itself writes for the row's features
(nullable fields, in the dataclass's order) with the ``huggingface`` metadata key, so a shard
alone (``Dataset.from_parquet``, ``load_dataset("parquet", ...)``, the ``data/`` folder
without the card) loads with ``audio`` (``struct<bytes, path>``, FLAC bytes) typed as ``Audio``:
``datasets`` uses that metadata only where it describes the column's Arrow field exactly.

A path read from ``index.json`` is untrusted: :func:`entry_problem` and :func:`special_file_problem`
say why one must not be opened, for every reader of an index (validation, training, evaluation).
"""

from __future__ import annotations

from pathlib import PurePosixPath

import pyarrow as pa

from pipeline.files import special_file_problem  # noqa: F401  (the shard readers' name for it)
from pipeline.schema import ShardRow, arrow_schema

INDEX = "index.json"
CARD = "README.md"
DATA = "data"
INDEX_VERSION = 2  # 2: rows carry audio_sha256; nullable fields as datasets writes them


def shard_name(split: str, i: int, n: int) -> str:
    return f"{DATA}/{split}-{i:05d}-of-{n:05d}.parquet"


def features(sample_rate_hz: int):
    """The ``datasets.Features`` of a shard row: Arrow types, with ``audio`` as ``Audio``."""
    import datasets

    feats = datasets.Features.from_arrow_schema(arrow_schema(ShardRow))
    feats["audio"] = datasets.Audio(sampling_rate=sample_rate_hz)
    return feats


def shard_schema(sample_rate_hz: int) -> pa.Schema:
    """The Parquet schema of every shard: the one ``Dataset.to_parquet`` writes for :func:`features`.

    Taken from ``datasets`` rather than built here, so fields, nullability, order and the
    ``huggingface`` metadata match what its Parquet reader checks the metadata against.
    """
    return features(sample_rate_hz).arrow_schema


def entry_problem(path: object) -> str | None:
    """Why a path read from ``index.json`` cannot name a file inside the folder; ``None`` when it can.

    Only the text is checked (it applies to remote folders too): a relative path without ``..``.
    A symlink inside the folder may still point elsewhere (a hub cache's snapshot links its files
    to blobs beside it), so a local reader also checks the file with :func:`special_file_problem`.
    """
    if not isinstance(path, str) or not path.strip():
        return "is not a path"
    parts = PurePosixPath(path).parts
    if PurePosixPath(path).is_absolute() or ".." in parts or "\\" in path:
        return "leaves the folder (an absolute path, '..' or a backslash)"
    return None
