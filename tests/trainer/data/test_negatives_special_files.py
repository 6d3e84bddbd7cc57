"""A shard folder's cluster tables (``clusters/clusters.parquet`` and ``clusters/phrases.parquet``,
read by trainer/data/negatives.py) are regular files or refused: a FIFO there would block ``train``
for ever and a device never ends, so either is refused with one line naming the file before anything
opens it. The FIFOs come from tests/special_files.py, which lets a reader that opened one go after
half a second, so a reader that waits fails the time check instead of hanging the suite."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.files import NotRegularFileError
from tests.special_files import fifo
from trainer.config import SourceParams, load_params
from trainer.data.negatives import ClusterTables

from tests.conftest import ROOT

CLUSTERS = [{"cluster_id": 0, "mid": "/m/a", "ancestor_ids": [], "descendant_ids": [], "near_synonym_ids": []},
            {"cluster_id": 1, "mid": "/m/b", "ancestor_ids": [], "descendant_ids": [], "near_synonym_ids": []}]
PHRASES = [{"phrase": "dog barking", "cluster_id": 0, "source": "dataset"},
           {"phrase": "car horn", "cluster_id": 1, "source": "dataset"}]


def cluster_folder(root: Path, special: str | None = None, how: str = "fifo") -> Path:
    """``root/clusters`` with both tables, the one named ``special`` replaced by a FIFO (or, with
    ``how="device"``, a link to /dev/zero)."""
    folder = root / "clusters"
    folder.mkdir(parents=True)
    for name, rows in (("clusters.parquet", CLUSTERS), ("phrases.parquet", PHRASES)):
        if name != special:
            pq.write_table(pa.Table.from_pylist(rows), folder / name)
        elif how == "fifo":
            fifo(folder / name)
        else:
            os.symlink("/dev/zero", folder / name)
    return folder


@pytest.mark.parametrize("special", ["clusters.parquet", "phrases.parquet"])
def test_a_fifo_table_is_refused_before_it_is_opened(tmp_path, special) -> None:
    folder = cluster_folder(tmp_path, special)
    start = time.monotonic()
    with pytest.raises(NotRegularFileError) as e:
        ClusterTables.read(str(folder))
    assert time.monotonic() - start < 0.4, "the reader waited on the FIFO"
    assert str(e.value) == (f"negatives: cluster table {folder}/{special} is a FIFO (named pipe), not a regular file; "
                            "point it at a file")


def test_a_link_to_a_device_is_refused_and_regular_tables_are_read(tmp_path) -> None:
    tables = ClusterTables.read(str(cluster_folder(tmp_path / "regular")))
    assert tables.clusters == CLUSTERS and tables.phrases == PHRASES
    folder = cluster_folder(tmp_path / "device", "clusters.parquet", how="device")
    with pytest.raises(NotRegularFileError, match=r"clusters\.parquet is a device, not a regular file"):
        ClusterTables.read(str(folder))


def test_train_data_refuses_a_fifo_in_the_shard_folders_clusters(tmp_path) -> None:
    """As ``train`` reads them: the default clusters folder, ``<first source>/clusters``."""
    from trainer.data.stream import make_stream

    shards = tmp_path / "dataset"
    cluster_folder(shards, "clusters.parquet")
    params = load_params(ROOT / "params.yaml", {})
    data = replace(params.train.data, clusters=None, sources=(SourceParams(path=str(shards), split="train"),))
    params = replace(params, train=replace(params.train, data=data, loss=replace(params.train.loss, caption_weight=0.0)))
    start = time.monotonic()
    with pytest.raises(NotRegularFileError, match=r"negatives: cluster table .*/dataset/clusters/clusters\.parquet is a FIFO"):
        make_stream(params, None, list(data.sources), shuffle=True)  # the tables are read before the encoder is used
    assert time.monotonic() - start < 0.4
