"""`sedsynth validate` on an untrusted folder: a path read from ``index.json`` must lie inside the
folder and be a regular file before it is hashed or opened (a FIFO would block it, ``/dev/zero``
never end); each bad entry is one problem naming it and the folder, the other shards still
checked. Rows are checked by the rule the trainer and the evaluator share."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from pipeline.shards.layout import entry_problem, special_file_problem
from pipeline.shards.rows import phrase_problems
from pipeline.shards.validate import ValidationError, validate
from sedsynth.cli import main
from tests.pipeline.shards.test_shards_trust import _shards, rewrite_rows
from tests.special_files import fifo


@pytest.fixture
def copy(shard_folder, tmp_path: Path) -> Path:
    shutil.copytree(shard_folder[1], tmp_path / "ds")
    return tmp_path / "ds"


def add_entry(folder: Path, path: str) -> None:
    index = json.loads((folder / "index.json").read_text())
    index["files"].append({**index["files"][0], "path": path})
    (folder / "index.json").write_text(json.dumps(index))


def problems(folder: Path) -> list[str]:
    with pytest.raises(ValidationError) as e:
        validate(folder)
    return e.value.problems


@pytest.mark.parametrize(
    "entry, fault",
    [
        ("../outside.parquet", "leaves the folder"),
        ("data/../../outside.parquet", "leaves the folder"),
        ("data/train-fifo.parquet", "not a regular file"),
        ("data", "not a regular file"),
    ],
)
def test_an_entry_outside_the_folder_or_not_a_file_is_named_and_not_opened(copy: Path, entry: str, fault: str, capsys) -> None:
    shutil.copy(copy / _shards(copy)[0]["path"], copy.parent / "outside.parquet")  # a valid shard, but not this folder's
    fifo(copy / "data" / "train-fifo.parquet")
    add_entry(copy, entry)
    found = problems(copy)
    [line] = [p for p in found if p.startswith(f"index.json entry {entry!r}")]
    assert fault in line and str(copy) in line and "\n" not in line
    assert all(p.startswith("index.json entry") or "not listed in index.json" in p for p in found), found  # the rest is valid
    assert main(["validate", str(copy)]) != 0
    assert f"index.json entry {entry!r}" in capsys.readouterr().err


def test_an_absolute_entry_or_a_link_to_a_device_is_named_not_hashed(copy: Path) -> None:
    """``/dev/zero`` has no end: hashing it would never finish."""
    (copy / "data" / "train-zero.parquet").symlink_to("/dev/zero")
    add_entry(copy, "/dev/zero")
    add_entry(copy, "data/train-zero.parquet")
    found = problems(copy)
    assert any(p.startswith("index.json entry '/dev/zero' leaves the folder") for p in found), found
    assert any(p.startswith("index.json entry 'data/train-zero.parquet' is not a regular file") for p in found), found


def test_an_index_that_is_a_fifo_or_has_broken_entries_is_one_problem(copy: Path) -> None:
    index = (copy / "index.json").read_text()
    (copy / "index.json").unlink()
    fifo(copy / "index.json")
    [message] = problems(copy)
    assert message.startswith("index.json is not a regular file")
    (copy / "index.json").unlink()
    broken = json.loads(index)
    del broken["files"][0]["sha256"]
    (copy / "index.json").write_text(json.dumps(broken))
    [message] = problems(copy)
    assert message.startswith("index.json is malformed") and "sha256" in message


def test_a_cell_with_a_path_but_no_bytes_is_named(copy: Path) -> None:
    entry = _shards(copy)[0]
    rows = rewrite_rows(copy, entry, lambda rows: rows[1].update(audio={"bytes": None, "path": "/etc/hostname"}))
    [message] = problems(copy)
    assert message.startswith(f"{entry['path']}: row 1 (mixture {rows[1]['id']}): malformed row: the audio cell has no bytes")


def test_null_fields_are_named_each_on_its_row(copy: Path) -> None:
    entry = _shards(copy)[0]

    def faults(rows: list[dict]) -> None:
        rows[0]["caption"] = None
        rows[1]["duration_s"] = None
        rows[2]["phrases"][0]["segments"][0]["start_s"] = math.nan

    rows = rewrite_rows(copy, entry, faults)
    found = problems(copy)
    assert len(found) == 3, found
    for k, fault in ((0, "caption is null"), (1, "duration_s is None"), (2, "not a number")):
        assert found[k].startswith(f"{entry['path']}: row {k} (mixture {rows[k]['id']}):") and fault in found[k], found[k]


def test_the_shared_rules_by_hand(tmp_path: Path) -> None:
    ok = {"phrase": "a dog", "label": "Dog", "cluster_id": 3, "segments": [{"start_s": 0.0, "end_s": 10.0}]}
    assert phrase_problems([ok], 10.0, {3}) == [] and phrase_problems([ok], math.inf) == []
    for segment in (
        {"start_s": math.nan, "end_s": 1.0},
        {"start_s": -0.1, "end_s": 1.0},
        {"start_s": 2.0, "end_s": 1.0},
        {"start_s": 1.0, "end_s": 1.0},
        {"start_s": 1.0, "end_s": 10.1},
        {"start_s": 1.0, "end_s": math.inf},
        {"start_s": None, "end_s": 1.0},
        None,
    ):
        assert len(phrase_problems([{**ok, "segments": [segment]}], 10.0)) == 1, segment
    assert "cluster id 4" in phrase_problems([{**ok, "cluster_id": 4}], 10.0, {3})[0]
    assert "duration_s" in phrase_problems([ok], math.nan)[0]
    assert entry_problem("data/train-00000-of-00001.parquet") is None
    for bad in ("/etc/passwd", "../x.parquet", "data/../../x", "data\\..\\x", "", None, 3):
        assert entry_problem(bad), bad
    (tmp_path / "f").write_bytes(b"")
    assert special_file_problem(tmp_path / "f") is None and special_file_problem(tmp_path / "missing") is None
    assert special_file_problem("/dev/null") and special_file_problem(tmp_path)
