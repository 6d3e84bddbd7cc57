"""The evaluator reads shards as untrusted input: a row with a null or malformed field, or an audio
cell without bytes, is left out of every metric with one line naming its file and row (and a count);
a shard whose columns have the wrong types is left out with one line naming it and the column.
The split's ids, ground truth and audio stay aligned."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainer.evaluation.testset import read_split


def entries(folder: Path, split: str) -> list[dict]:
    return [f for f in json.loads((folder / "index.json").read_text())["files"] if f["split"] == split]


def rewrite(path: Path, change, row_group_size: int | None = None) -> list[dict]:
    table = pq.read_table(path)
    rows = table.to_pylist()
    change(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path, row_group_size=row_group_size)
    return rows


@pytest.fixture
def copy(shard_folder, tmp_path) -> Path:
    shutil.copytree(shard_folder[1], tmp_path / "ds")
    return tmp_path / "ds"


def test_bad_rows_are_left_out_named_and_counted(copy: Path, capsys) -> None:
    [entry] = entries(copy, "test")
    path = copy / entry["path"]
    assert entry["num_rows"] == 5

    def faults(rows: list[dict]) -> None:
        rows[0]["audio"] = None
        rows[1]["duration_s"] = None
        rows[2]["phrases"][0]["segments"][0]["end_s"] = math.nan
        rows[3]["audio"] = {"bytes": None, "path": "/etc/hostname"}  # a path is never opened

    rows = rewrite(path, faults, row_group_size=2)  # bad rows in several row groups
    capsys.readouterr()
    split = read_split(str(copy), "test")
    assert split.ids == (rows[4]["id"],)
    assert [i for i, _ in split.audio()] == [rows[4]["id"]]
    assert [a for _, a in split.audio()] == [rows[4]["audio"]["bytes"]]
    assert set(split.ground_truth()) == {rows[4]["id"]}
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 5 and lines[-1].startswith("evaluate: 4 rows or files of the test split")
    for k, fault in ((0, "no bytes"), (1, "duration_s"), (2, "not a number"), (3, "no bytes")):
        assert lines[k].startswith(f"evaluate: skipping row {k} of {path} (id {rows[k]['id']}):") and fault in lines[k], lines[k]
    assert [(s.item_id, s.path, s.reason) for s in split.skips] == [(rows[k]["id"], str(path), "malformed-row") for k in range(4)]


@pytest.mark.parametrize("batch_rows", [1, 2, 3, 64])
def test_audio_in_small_batches_across_row_groups_stays_aligned(copy: Path, monkeypatch, batch_rows: int) -> None:
    """The audio is read a few rows at a time (a hub-size row group holds 100-300 MB); batches that
    straddle row groups and skipped rows leave every id with its own bytes."""
    import trainer.evaluation.testset as testset

    [entry] = entries(copy, "test")
    rows = rewrite(copy / entry["path"], lambda rows: rows[1].update(audio=None), row_group_size=2)
    monkeypatch.setattr(testset, "AUDIO_BATCH_ROWS", batch_rows)
    split = read_split(str(copy), "test")
    assert list(split.audio()) == [(r["id"], r["audio"]["bytes"]) for k, r in enumerate(rows) if k != 1]


def test_a_shard_with_wrong_column_types_is_left_out_with_one_line(copy: Path, capsys) -> None:
    first, second = entries(copy, "valid")
    path = copy / first["path"]
    table = pq.read_table(path)
    i = table.schema.get_field_index("phrases")
    pq.write_table(table.set_column(i, "phrases", pa.array([json.dumps(p) for p in table.column("phrases").to_pylist()])), path)
    capsys.readouterr()
    split = read_split(str(copy), "valid")
    assert split.files == (str(copy / second["path"]),) and len(split.ids) == second["num_rows"]
    assert [i for i, _ in split.audio()] == list(split.ids)
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith(f"evaluate: skipping {path}: column 'phrases' is string") and len(lines) == 2


def test_nothing_usable_is_one_line(copy: Path) -> None:
    [entry] = entries(copy, "test")
    rewrite(copy / entry["path"], lambda rows: [r.update(caption=None) for r in rows])
    with pytest.raises(ValueError, match="no usable rows in the test split") as caught:
        read_split(str(copy), "test")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("first", [1, 7, 10_000])
def test_the_first_rows_of_a_split_are_the_prefix_of_the_whole_with_every_rows_event_clips(shard_folder, first: int) -> None:
    whole = read_split(str(shard_folder[1]), "train")
    head = read_split(str(shard_folder[1]), "train", first=first)
    n = min(first, len(whole.ids))
    assert head.ids == whole.ids[:n]
    assert all(head.phrases[i] == whole.phrases[i] and head.captions[i] == whole.captions[i] for i in head.ids)
    assert [a for a, _ in head.audio()] == list(head.ids)  # the files and positions kept are those rows'
    assert head.used_clips() == whole.used_clips() and whole.used_clips()
