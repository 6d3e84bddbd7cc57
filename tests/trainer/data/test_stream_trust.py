"""Shards are untrusted input to training. A malformed row (nulls, segments that are not numbers or
not inside the clip, unknown cluster ids, an audio cell without bytes) is skipped and named with its
file and row, the rest trains; a shard whose columns have the wrong types is left out with one line
naming it and the column; a cell's path is never opened; an index that names a file outside its
folder, a FIFO or a device is refused with one line before anything opens it."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf
from torch.utils.data import DataLoader

from pipeline.shards.validate import ValidationError, validate
from tests.conftest import tiny_train_params
from tests.special_files import fifo
from trainer.config import SourceParams
from trainer.data.negatives import ClusterTables, NegativeSampler
from trainer.data.sources import ParquetSource, SourceError
from trainer.data.stream import ItemBuilder, ItemParams, TrainStream, collate
from trainer.encoders import SmallEncoder

SR = 16000


def train_entries(folder: Path) -> list[dict]:
    return [f for f in json.loads((folder / "index.json").read_text())["files"] if f["split"] == "train"]


def rewrite(path: Path, change) -> None:
    """Apply ``change(rows)`` to a shard's rows and write it back in its own schema."""
    table = pq.read_table(path)
    rows = table.to_pylist()
    change(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)


def reindex(folder: Path) -> None:
    """Record the shards' new checksums in ``index.json`` (as a writer that made the faults would)."""
    from pipeline.outputs import file_sha256

    index = json.loads((folder / "index.json").read_text())
    for f in index["files"]:
        meta = pq.ParquetFile(folder / f["path"]).metadata
        f.update(sha256=file_sha256(folder / f["path"]), num_rows=meta.num_rows, num_row_groups=meta.num_row_groups)
    (folder / "index.json").write_text(json.dumps(index))


def epoch(folder: Path, builder: ItemBuilder) -> tuple[list[str], list]:
    """One epoch of the folder's train split: (ids trained on, skips reported)."""
    stream = TrainStream([SourceParams(path=str(folder), split="train")], builder, seed=1, shuffle_buffer=4, piece_rows=2)
    stream.set_epoch(0)
    batches = list(DataLoader(stream, batch_size=1, collate_fn=collate))
    return [i for b in batches for i in b.ids], [s for b in batches for s in b.skips]


def first_phrase(row: dict) -> dict:
    return row["phrases"][0]


def set_segment(**values):
    def change(row: dict) -> None:
        first_phrase(row)["segments"][0].update(values)
    return change


# train row (index order) -> (a word its reason names, how the row is damaged)
FAULTS = {
    0: ("audio cell is null", lambda r: r.update(audio=None)),
    1: ("phrases is null", lambda r: r.update(phrases=None)),
    2: ("segments of", lambda r: first_phrase(r).update(segments=None)),
    3: ("phrase of", lambda r: first_phrase(r).update(phrase=None)),
    4: ("a phrase is null", lambda r: r["phrases"].append(None)),
    5: ("not a number", set_segment(start_s=math.nan)),
    6: ("outside [0", set_segment(start_s=-1.0)),
    7: ("reversed", set_segment(start_s=3.0, end_s=2.0)),
    8: ("outside [0", set_segment(end_s=99.0)),
    9: ("cluster id 999999", lambda r: first_phrase(r).update(cluster_id=999999)),
    10: ("the caption is null", lambda r: r.update(caption=None)),
}


@pytest.fixture(scope="module")
def builder(shard_folder) -> ItemBuilder:
    tables = ClusterTables.read(str(shard_folder[1] / "clusters"))
    return ItemBuilder(ItemParams(input_samples=4 * SR), SmallEncoder(width=16).frame_spans_s(), NegativeSampler(tables), seed=3)


@pytest.fixture
def faulted(shard_folder, tmp_path) -> tuple[Path, dict[str, tuple[str, int, str]]]:
    """A copy of the shards whose train rows in :data:`FAULTS` are damaged; returns the folder and,
    per damaged id, ``(shard file, row in it, reason word)``."""
    folder = tmp_path / "ds"
    shutil.copytree(shard_folder[1], folder)
    bad, k = {}, 0
    for entry in train_entries(folder):
        path = folder / entry["path"]

        def change(rows: list[dict]) -> None:
            nonlocal k
            for position, row in enumerate(rows):
                if k in FAULTS:
                    word, damage = FAULTS[k]
                    damage(row)
                    bad[row["id"]] = (str(path), position, word)
                k += 1

        rewrite(path, change)
    reindex(folder)
    return folder, bad


def test_malformed_rows_are_skipped_named_and_the_rest_trains(faulted, builder, shard_folder, capsys):
    folder, bad = faulted
    all_ids = {r["id"] for f in train_entries(folder) for r in pq.read_table(folder / f["path"], columns=["id"]).to_pylist()}
    capsys.readouterr()
    trained, skips = epoch(folder, builder)
    assert sorted(trained) == sorted(all_ids - set(bad))
    assert sorted(s.item_id for s in skips) == sorted(bad), "each bad row reported once"
    for s in skips:
        file, position, word = bad[s.item_id]
        assert (s.path, s.reason) == (file, "malformed-row")
        assert s.detail.startswith(f"row {position}: ") and word in s.detail, s
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == len(bad), lines
    for file, position, word in bad.values():
        [line] = [x for x in lines if x.startswith(f"train: skipping row {position} of {file} ")]
        assert word in line and "sedsynth validate" in line


def test_the_trainer_skips_exactly_the_rows_validate_flags(faulted, builder):
    """One rule in one place: `sedsynth validate` and the trainer agree on every bad row."""
    folder, bad = faulted
    with pytest.raises(ValidationError) as e:
        validate(folder)
    flagged = {(str(folder / p.split(":")[0]), int(p.split(": row ")[1].split(" ")[0])) for p in e.value.problems}
    _, skips = epoch(folder, builder)
    assert flagged == {(s.path, int(s.detail.split(":")[0].removeprefix("row "))) for s in skips}
    assert flagged == {(file, position) for file, position, _ in bad.values()}


def test_a_training_run_goes_on_past_bad_rows_and_counts_them(faulted, shard_folder, tmp_path, one_torch_thread):
    """The run trains one epoch on the good rows (9 of 20 in batches of 4: 2 full batches) and
    ``skipped.csv`` names every bad row, those after the last full batch too."""
    import csv

    from trainer.stages.train import run

    folder, bad = faulted
    p = tiny_train_params(shard_folder[0], folder, tmp_path / "out")
    summary = run(replace(p, train=replace(p.train, optim=replace(p.train.optim, epochs=1, max_steps=0))))
    assert summary["steps"] == (20 - len(bad)) // 4
    with (tmp_path / "out" / "skipped.csv").open() as f:
        listed = list(csv.DictReader(f))
    assert {r["item_id"] for r in listed} == set(bad) and summary["skipped"] == len(listed)
    assert all(r["reason"] == "malformed-row" and r["path"] == bad[r["item_id"]][0] for r in listed)


def test_a_cell_without_bytes_is_skipped_even_when_its_path_names_a_file(shard_folder, builder, tmp_path, capsys):
    """A cell's path is a name, not a file to open: a test-split FLAC there must not be trained on."""
    folder = tmp_path / "ds"
    shutil.copytree(shard_folder[1], folder)
    elsewhere = tmp_path / "held-out.flac"
    sf.write(elsewhere, (0.1 * np.sin(np.arange(SR) / 10)).astype(np.float32), SR)
    entry = train_entries(folder)[0]
    rows = pq.read_table(folder / entry["path"], columns=["id"]).to_pylist()
    rewrite(folder / entry["path"], lambda rs: rs[0].update(audio={"bytes": None, "path": str(elsewhere)}))
    capsys.readouterr()
    trained, skips = epoch(folder, builder)
    assert rows[0]["id"] not in trained and len(trained) == 19
    [skip] = skips
    assert skip.item_id == rows[0]["id"] and "no bytes" in skip.detail
    assert "no bytes" in capsys.readouterr().err
    with pytest.raises(Exception, match="no bytes"):
        builder.decode({"bytes": None, "path": str(elsewhere)})


def test_a_shard_with_wrong_column_types_is_left_out_with_one_line(shard_folder, builder, tmp_path, capsys):
    folder = tmp_path / "ds"
    shutil.copytree(shard_folder[1], folder)
    entries = train_entries(folder)
    as_text, as_string = folder / entries[0]["path"], folder / entries[1]["path"]
    table = pq.read_table(as_text)  # phrases written as JSON text, as a hand-made exporter might
    i = table.schema.get_field_index("phrases")
    pq.write_table(table.set_column(i, "phrases", pa.array([json.dumps(p) for p in table.column("phrases").to_pylist()])), as_text)
    table = pq.read_table(as_string)
    i = table.schema.get_field_index("duration_s")
    pq.write_table(table.set_column(i, "duration_s", pa.array([str(d) for d in table.column("duration_s").to_pylist()])), as_string)
    capsys.readouterr()
    source = ParquetSource(0, SourceParams(path=str(folder), split="train"))
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2
    assert str(as_text) in lines[0] and "column 'phrases' is string" in lines[0]
    assert str(as_string) in lines[1] and "column 'duration_s' is string" in lines[1]
    assert {s.path for s in source.skips} == {str(as_text), str(as_string)}
    trained, skips = epoch(folder, builder)
    assert len(trained) == 10 and not skips  # the two other shards' rows


@pytest.mark.parametrize("entry, problem", [
    ("../outside.parquet", "leaves the folder"),
    ("/dev/zero", "leaves the folder"),
    ("data/train-fifo.parquet", "not a regular file"),
    ("data/train-zero.parquet", "not a regular file"),  # a symlink to /dev/zero
    ("data", "not a regular file"),
])
def test_an_index_entry_outside_the_folder_or_not_a_file_is_refused(shard_folder, tmp_path, entry, problem):
    folder = tmp_path / "ds"
    shutil.copytree(shard_folder[1], folder)
    shutil.copy(folder / train_entries(folder)[0]["path"], tmp_path / "outside.parquet")
    fifo(folder / "data" / "train-fifo.parquet")
    (folder / "data" / "train-zero.parquet").symlink_to("/dev/zero")
    index = json.loads((folder / "index.json").read_text())
    index["files"].append({**index["files"][0], "path": entry})
    (folder / "index.json").write_text(json.dumps(index))
    with pytest.raises(SourceError, match=problem) as caught:
        ParquetSource(0, SourceParams(path=str(folder), split="train"))
    message = str(caught.value)
    assert entry.split("/")[-1] in message and str(folder) in message and "\n" not in message


def test_a_fifo_among_globbed_shards_or_a_broken_index_is_refused(shard_folder, tmp_path):
    folder = tmp_path / "ds"
    shutil.copytree(shard_folder[1], folder)
    (folder / "index.json").write_text("{not json")
    with pytest.raises(SourceError, match="index.json is malformed"):
        ParquetSource(0, SourceParams(path=str(folder), split="train"))
    (folder / "index.json").unlink()  # no index: the split's files are globbed
    fifo(folder / "data" / "train-99999-of-99999.parquet")
    with pytest.raises(SourceError, match=r"train-99999-of-99999.parquet .*is not a regular file"):
        ParquetSource(0, SourceParams(path=str(folder), split="train"))
