"""Can a shard be trusted on its own? It loads typed without the card, exactly as a file that
``datasets`` wrote itself; and every audio cell is checked (checksum always, full decode and
length with ``--decode``), each bad row named, none hiding another."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf
import yaml

from pipeline.shards.layout import features
from pipeline.shards.validate import ValidationError, validate
from sedsynth.cli import main


def _shards(folder: Path) -> list[dict]:
    return json.loads((folder / "index.json").read_text())["files"]


def _card_features(folder: Path):
    import datasets

    meta = yaml.safe_load((folder / "README.md").read_text().split("---", 2)[1])
    return datasets.Features._from_yaml_list(meta["dataset_info"]["features"])


# --------------------------------------------------------------------------- typed without the card


def test_a_shard_has_the_schema_and_metadata_datasets_writes(shard_folder, tmp_path: Path) -> None:
    import datasets

    p, folder = shard_folder
    shard = folder / _shards(folder)[0]["path"]
    feats = features(p.sample_rate_hz)
    # the peer: the same rows written by datasets itself; rows go in with audio as a plain
    # struct and are cast to Audio (encoding Audio would need torchcodec)
    raw = feats.copy()
    raw["audio"] = datasets.Features({"bytes": datasets.Value("binary"), "path": datasets.Value("string")})
    rows = pq.read_table(shard).slice(0, 2).to_pylist()
    peer = datasets.Dataset.from_list(rows, features=raw).cast_column("audio", feats["audio"])
    peer.to_parquet(str(tmp_path / "peer.parquet"))

    ours, theirs = pq.read_schema(shard), pq.read_schema(tmp_path / "peer.parquet")
    assert [(f.name, f.type, f.nullable) for f in ours] == [(f.name, f.type, f.nullable) for f in theirs]
    assert ours.equals(theirs, check_metadata=False), "nested field order and nullability too"
    ours_meta, theirs_meta = (json.loads(s.metadata[b"huggingface"]) for s in (ours, theirs))
    assert ours_meta == theirs_meta
    assert list(ours_meta["info"]["features"]) == list(theirs_meta["info"]["features"]) == ours.names, "keys in column order"


def test_a_shard_alone_loads_typed_as_the_card_says(shard_folder, tmp_path: Path) -> None:
    import datasets

    p, folder = shard_folder
    card = _card_features(folder)
    assert isinstance(card["audio"], datasets.Audio) and "audio_sha256" in card
    shard = folder / _shards(folder)[0]["path"]
    alone = tmp_path / "alone"
    shutil.copytree(folder / "data", alone / "data")  # the data folder without card or index

    loaded = {
        "from_parquet": datasets.Dataset.from_parquet(str(shard), cache_dir=str(tmp_path / "c1")),
        "load_dataset parquet": datasets.load_dataset("parquet", data_files=str(shard), cache_dir=str(tmp_path / "c2"))["train"],
        "load_dataset data/": datasets.load_dataset(str(alone / "data"), cache_dir=str(tmp_path / "c3"))["train"],
    }
    for how, ds in loaded.items():
        assert isinstance(ds.features["audio"], datasets.Audio), how
        assert ds.features["audio"].sampling_rate == p.sample_rate_hz, how
        assert ds.features == card, how
        row = ds.cast_column("audio", datasets.Audio(decode=False))[0]
        assert hashlib.sha256(row["audio"]["bytes"]).hexdigest() == row["audio_sha256"], how
        assert sf.info(io.BytesIO(row["audio"]["bytes"])).samplerate == p.sample_rate_hz, how


# --------------------------------------------------------------------------- audio cells


@pytest.fixture
def copy(shard_folder, tmp_path: Path) -> Path:
    shutil.copytree(shard_folder[1], tmp_path / "ds")
    return tmp_path / "ds"


def rewrite_rows(folder: Path, entry: dict, change) -> list[dict]:
    """Apply ``change(rows)`` to one shard's rows, keep its schema, and re-index it (as a
    writer that produced the fault would have); returns the rows as written."""
    path = folder / entry["path"]
    table = pq.read_table(path)
    rows = table.to_pylist()
    change(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    index = json.loads((folder / "index.json").read_text())
    for f in index["files"]:
        if f["path"] == entry["path"]:
            f.update(sha256=hashlib.sha256(path.read_bytes()).hexdigest(), num_row_groups=1)
    (folder / "index.json").write_text(json.dumps(index))
    return rows


def zero_middle(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[: middle - 512] + bytes(1024) + data[middle + 512 :]


def truncate(data: bytes) -> bytes:
    return data[: len(data) * 2 // 3]


def set_audio(row: dict, data: bytes, rehash: bool = True) -> None:
    row["audio"] = {"bytes": data, "path": row["audio"]["path"]}
    if rehash:  # the fault was there before hashing: only decoding finds it
        row["audio_sha256"] = hashlib.sha256(data).hexdigest()


def problems(folder: Path, decode: bool) -> list[str]:
    with pytest.raises(ValidationError) as e:
        validate(folder, decode=decode)
    return e.value.problems


def test_every_bad_cell_is_named_with_its_file_row_mixture_and_fault(copy: Path, capsys) -> None:
    entry = _shards(copy)[0]
    assert entry["num_rows"] >= 4

    def faults(rows: list[dict]) -> None:
        set_audio(rows[0], zero_middle(rows[0]["audio"]["bytes"]))
        set_audio(rows[1], truncate(rows[1]["audio"]["bytes"]))
        rows[2]["audio"], rows[3]["audio"] = rows[3]["audio"], rows[2]["audio"]  # swapped cells: both decode

    rows = rewrite_rows(copy, entry, faults)
    found = problems(copy, decode=True)
    name = entry["path"]
    for k, fault in ((0, "does not decode"), (1, "does not decode"), (2, "audio_sha256"), (3, "audio_sha256")):
        hits = [m for m in found if m.startswith(f"{name}: row {k} (mixture {rows[k]['id']}):")]
        assert len(hits) == 1 and fault in hits[0], (k, found)
    assert len(found) == 4, found
    # without --decode the checksum still finds the swapped cells (and nothing else is claimed)
    assert sorted(m.split(":")[1] for m in problems(copy, decode=False)) == [
        " row 2 (mixture " + rows[2]["id"] + ")",
        " row 3 (mixture " + rows[3]["id"] + ")",
    ]
    # the command exits non-zero and names the rows
    assert main(["validate", str(copy), "--decode"]) != 0
    err = capsys.readouterr().err
    assert f"{name}: row 0 (mixture {rows[0]['id']})" in err and f"{name}: row 3 (mixture {rows[3]['id']})" in err


def test_a_damaged_cell_fails_the_checksum_without_decoding(copy: Path, capsys) -> None:
    entry = _shards(copy)[-1]
    rows = rewrite_rows(copy, entry, lambda rows: set_audio(rows[-1], zero_middle(rows[-1]["audio"]["bytes"]), rehash=False))
    k = len(rows) - 1
    [message] = problems(copy, decode=False)
    assert message.startswith(f"{entry['path']}: row {k} (mixture {rows[k]['id']}):") and "audio_sha256" in message
    assert main(["validate", str(copy)]) != 0
    assert f"row {k} (mixture {rows[k]['id']})" in capsys.readouterr().err


def test_a_cell_that_decodes_to_the_wrong_length_is_named(copy: Path) -> None:
    entry = _shards(copy)[1]

    def shorten(rows: list[dict]) -> None:
        samples, rate = sf.read(io.BytesIO(rows[1]["audio"]["bytes"]), dtype="int16")
        buf = io.BytesIO()
        sf.write(buf, samples[: len(samples) // 2], rate, format="FLAC", subtype="PCM_16")  # a valid FLAC, half as long
        set_audio(rows[1], buf.getvalue())

    rows = rewrite_rows(copy, entry, shorten)
    validate(copy)  # the checksum matches the (short) bytes it was given
    [message] = problems(copy, decode=True)
    expected = round(rows[1]["duration_s"] * rows[1]["sample_rate_hz"])
    assert message.startswith(f"{entry['path']}: row 1 (mixture {rows[1]['id']}):")
    assert f"{expected // 2} frames" in message and f"{expected}" in message


def test_a_good_folder_passes_through_the_command(shard_folder, capsys) -> None:
    _, folder = shard_folder
    assert main(["validate", str(folder), "--decode"]) == 0
    assert "valid, 30 rows" in capsys.readouterr().out
    rows = pq.read_table(folder / _shards(folder)[0]["path"], columns=["audio", "audio_sha256"]).to_pylist()
    assert all(hashlib.sha256(r["audio"]["bytes"]).hexdigest() == r["audio_sha256"] for r in rows)
    assert np.all([len(r["audio_sha256"]) == 64 for r in rows])


def test_a_row_with_nulls_is_reported_and_the_other_rows_still_checked(copy: Path) -> None:
    entry = _shards(copy)[0]

    def faults(rows: list[dict]) -> None:
        rows[0]["phrases"] = None  # the fields are nullable, as datasets writes them
        rows[1]["audio_sha256"] = "0" * 64

    rows = rewrite_rows(copy, entry, faults)
    found = problems(copy, decode=False)
    assert len(found) == 2, found
    assert found[0].startswith(f"{entry['path']}: row 0 (mixture {rows[0]['id']}): malformed row")
    assert found[1].startswith(f"{entry['path']}: row 1 (mixture {rows[1]['id']}): audio bytes do not match audio_sha256")
