"""Writing shard files: rows of :class:`~pipeline.schema.ShardRow` -> ``data/*.parquet`` and ``index.json``.

Input: per split, the items in row order, each item's audio size in bytes and a function that
makes its row. Output, in a (staging) dataset folder: Parquet shards in the schema ``datasets``
writes (:func:`~pipeline.shards.layout.shard_schema`), a new shard when the audio in one
reaches ``shard_size_mb`` and a new row group at ``row_group_size_mb``, every column
compressed with ``compression`` but the audio bytes (stored as they are: they do not
compress) in pages of about ``PAGE_BYTES`` (:func:`page_rows`), and ``index.json`` (per shard:
split, rows, row groups, bytes, sha256). The
synthetic pipeline's shards stage and the corpus importers both write through here, so one
loader reads everything; both read a row group's audio files with :func:`audio_column`.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from pipeline.outputs import file_sha256, write_json
from pipeline.schema import ShardRow, to_table
from pipeline.shards.layout import DATA, INDEX, INDEX_VERSION, shard_name, shard_schema

MB = 1_000_000
BINARY_DATA_LIMIT_BYTES = 2**31  # Arrow binary arrays have 32-bit offsets
PAGE_BYTES = 2**20  # Parquet's data page size (pyarrow's default), which the audio column's pages keep to too


def page_rows(sizes: Sequence[int]) -> int:
    """Rows of audio that fill about one ``PAGE_BYTES`` data page: the writer's ``write_batch_size``.

    A Parquet writer starts a new page once one reaches ``PAGE_BYTES``, but checks only after each
    write batch (1,024 rows unless told): at that size a row group's audio, 900 rows of 10 s FLAC
    in 190 MB, went into one page, which a reader then had to hold whole to read any of its rows.
    In pages of about 1 MB, a reader streams a row group (:meth:`~trainer.data.sources.ParquetSource.read`).
    """
    mean = sum(sizes) / max(1, len(sizes))
    return max(1, min(1024, -(-PAGE_BYTES // max(1, int(mean)))))


def plan_chunks(sizes: list[int], limit_bytes: float) -> list[tuple[int, int]]:
    """Consecutive ``[start, stop)`` ranges whose sizes reach ``limit_bytes`` (the last may be smaller)."""
    out, start, total = [], 0, 0
    for i, size in enumerate(sizes):
        total += size
        if total >= limit_bytes:
            out.append((start, i + 1))
            start, total = i + 1, 0
    if start < len(sizes) or not out:
        out.append((start, len(sizes)))
    return out


AUDIO_BYTES = "audio.bytes"  # the Parquet column path of the encoded audio


def column_paths(schema) -> list[str]:
    """The Parquet column paths (``audio.bytes``, ``phrases.list.element.phrase``, ...) of an Arrow schema."""
    buf = io.BytesIO()
    pq.write_table(schema.empty_table(), buf)
    meta = pq.read_metadata(io.BytesIO(buf.getvalue())).schema
    return [meta.column(i).path for i in range(len(meta))]


def column_compression(schema, codec: str) -> dict[str, str]:
    """Per-column codecs: ``codec`` for every column but the FLAC bytes, which do not compress."""
    return {path: ("none" if path == AUDIO_BYTES else codec) for path in column_paths(schema)}


def dictionary_columns(schema) -> list[str]:
    """The columns written with a dictionary: every one but the FLAC bytes. Each clip's bytes are
    unique, so a dictionary saves nothing there, and a reader would decode a row group's whole
    dictionary page (its audio) before the first row: ten times slower than plain pages."""
    return [path for path in column_paths(schema) if path != AUDIO_BYTES]


def audio_column(files: Sequence[Path], sizes: Sequence[int], names: Sequence[str], audio_type: pa.StructType) -> pa.Array:
    """The ``audio`` column (``struct<bytes, path>``) of a row group: the bytes of ``files``, each
    ``sizes[i]`` bytes long, with the file names ``names``.

    The files are read straight into one buffer that becomes the Arrow binary data: one copy,
    rather than a bytes object per file that Arrow copies again.
    """
    offsets = np.zeros(len(files) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    paths = pa.array(names, pa.string())
    if offsets[-1] >= BINARY_DATA_LIMIT_BYTES:  # let Arrow split what 32-bit offsets cannot address
        data = [Path(f).read_bytes() for f in files]
        return pa.StructArray.from_arrays([pa.array(data, pa.binary()), paths], fields=list(audio_type))
    data = np.empty(int(offsets[-1]), np.uint8)
    view = memoryview(data)
    for f, start, size in zip(files, offsets[:-1].tolist(), sizes):
        with open(f, "rb") as stream:
            if stream.readinto(view[start : start + size]) != size:
                raise OSError(f"{f} is shorter than the {size} bytes expected")
    binary = pa.BinaryArray.from_buffers(
        pa.binary(), len(files), [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
    )
    return pa.StructArray.from_arrays([binary, paths], fields=list(audio_type))


def write_shards(
    staging: Path,
    sample_rate_hz: int,
    items_by_split: dict[str, Sequence],
    size_of: Callable[[object], int],
    *,
    row_of: Callable[[object], ShardRow] | None,
    shard_size_mb: float,
    row_group_size_mb: float,
    compression: str,
    desc: str = "shards",
    table_of: Callable[[Sequence], pa.Table] | None = None,
) -> dict:
    """Write every split's rows into ``staging/data/`` and ``staging/index.json``; returns the index.

    ``items_by_split`` keeps the output order (splits in dict order, items in list order);
    ``size_of(item)`` is the item's audio size in bytes (it cuts shards and row groups before
    any row is built); ``row_of(item)`` builds the row, reading the audio. ``table_of(items)``,
    where given, builds a whole row group's table in the shard schema instead (faster than
    row by row for many small rows).
    """
    schema = shard_schema(sample_rate_hz)
    if table_of is None:

        def table_of(items: Sequence) -> pa.Table:
            # records are non-nullable; the cast gives the nullable fields datasets writes
            return to_table([row_of(item) for item in items], ShardRow).cast(schema)

    codecs, dictionary = column_compression(schema, compression), dictionary_columns(schema)
    files = []
    (staging / DATA).mkdir(exist_ok=True)
    total = sum(len(items) for items in items_by_split.values())
    with tqdm(total=total, desc=desc, unit="row", disable=None) as bar:
        for split, items in items_by_split.items():
            sizes = [size_of(item) for item in items]
            shards = plan_chunks(sizes, shard_size_mb * MB)
            for i, (a, b) in enumerate(shards):
                name = shard_name(split, i, len(shards))
                groups = [(a + x, a + y) for x, y in plan_chunks(sizes[a:b], row_group_size_mb * MB)]
                with pq.ParquetWriter(
                    staging / name,
                    schema,
                    compression=codecs,
                    use_dictionary=dictionary,
                    data_page_size=PAGE_BYTES,
                    write_batch_size=page_rows(sizes[a:b]),
                ) as writer:
                    for x, y in groups:
                        writer.write_table(table_of(items[x:y]), row_group_size=y - x)
                        bar.update(y - x)
                files.append(
                    {
                        "path": name,
                        "split": split,
                        "num_rows": b - a,
                        "num_row_groups": len(groups),
                        "num_bytes": (staging / name).stat().st_size,
                        "sha256": file_sha256(staging / name),
                    }
                )
    index = {
        "version": INDEX_VERSION,
        "sample_rate_hz": sample_rate_hz,
        "schema": [f.name for f in schema],
        "splits": {
            s: {
                "num_rows": sum(f["num_rows"] for f in files if f["split"] == s),
                "num_bytes": sum(f["num_bytes"] for f in files if f["split"] == s),
            }
            for s in items_by_split
        },
        "files": files,
    }
    write_json(staging / INDEX, index)
    return index
