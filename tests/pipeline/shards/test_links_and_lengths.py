"""What ``validate`` and ``publish`` read from a shard folder: regular files inside it only, and
audio cells no longer than their rows say.

A symbolic link anywhere under the folder (``images/x.png -> a secret``, a linked shard, card,
index, cluster file or folder) makes the folder invalid and stops ``publish`` before anything is
sent, with one line naming it; the linked file is never read. A FIFO at ``README.md`` is named,
not opened. A cell whose FLAC header states more audio than the row's ``duration_s`` (a
729 KB cell holds 4 hours of silence) is a named bad row, found without decoding.
"""

from __future__ import annotations

import io
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from pipeline.shards import publish as pub
from pipeline.shards.validate import ValidationError, validate
from sedsynth.cli import main
from tests.pipeline.shards.test_shards_trust import _shards, rewrite_rows, set_audio
from tests.special_files import fifo

SECRET = b"root:$6$not-for-the-hub:19000:0:99999:7:::\n"


@pytest.fixture
def copy(shard_folder, tmp_path: Path) -> Path:
    shutil.copytree(shard_folder[1], tmp_path / "ds")
    return tmp_path / "ds"


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file outside the dataset folder that must never be read."""
    path = tmp_path / "shadow"
    path.write_bytes(SECRET)
    return path


def problems(folder: Path, decode: bool = False) -> list[str]:
    with pytest.raises(ValidationError) as e:
        validate(folder, decode=decode)
    return e.value.problems


class Hub:
    """An HfApi stand-in that records every call."""

    def __init__(self):
        self.calls = []

    def list_repo_tree(self, repo_id, repo_type, recursive):
        self.calls.append("list_repo_tree")
        return []

    def create_repo(self, repo_id, repo_type, private, exist_ok):
        self.calls.append("create_repo")

    def upload_folder(self, repo_id, folder_path, repo_type, allow_patterns, commit_message):
        self.calls.append(list(allow_patterns))


# --------------------------------------------------------------------------- links and special files


def test_a_link_to_a_file_outside_makes_the_folder_invalid_and_publish_refuse(
    copy: Path, secret: Path, capsys, monkeypatch
) -> None:
    (copy / "images" / "x.png").symlink_to(secret)
    [message] = problems(copy)
    assert message.startswith("images/x.png is a symbolic link (validate and publish do not follow links)"), message
    assert main(["validate", str(copy)]) == 2 and "images/x.png is a symbolic link" in capsys.readouterr().err

    hub = Hub()
    with pytest.raises(pub.PublishError) as raised:
        pub.publish(copy, "me/sed", api=hub)
    message = str(raised.value)
    assert message.startswith(f"publish: {copy / 'images' / 'x.png'} is a symbolic link") and "nothing was uploaded" in message
    assert "\n" not in message and hub.calls == []

    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert main(["publish", str(copy), "--repo-id", "me/sed", "--dry-run"]) == 2
    captured = capsys.readouterr()
    assert len(captured.err.strip().splitlines()) == 1 and "images/x.png is a symbolic link" in captured.err, captured.err
    assert "would upload" not in captured.out and SECRET.decode().strip() not in captured.out + captured.err

    # hidden entries are neither checked nor published: a link there stops nothing
    (copy / "images" / "x.png").unlink()
    (copy / ".cache").mkdir()
    (copy / ".cache" / "link").symlink_to(secret)
    validate(copy)
    uploaded = pub.publish(copy, "me/sed", api=hub)
    assert not any(p.startswith(".") for p in uploaded) and "index.json" in uploaded


def test_every_link_is_named_a_linked_shard_card_index_or_folder_too(copy: Path, tmp_path: Path) -> None:
    """Each was read through the link before, and a linked shard's checks all passed."""
    outside = tmp_path / "outside"
    outside.mkdir()
    shard = _shards(copy)[0]["path"]
    for rel in (shard, "README.md", "clusters/clusters.parquet"):
        moved = outside / Path(rel).name
        shutil.move(copy / rel, moved)
        (copy / rel).symlink_to(moved)
    (outside / "more").mkdir()
    (copy / "more").symlink_to(outside / "more")
    found = problems(copy)
    assert any(
        p.startswith(f"index.json entry {shard!r} is a symbolic link (validate and publish do not follow links)") for p in found
    ), found
    for rel in ("README.md", "clusters/clusters.parquet", "more"):
        assert any(p.startswith(f"{rel} is a symbolic link") for p in found), (rel, found)
    assert len(found) == 4, found
    with pytest.raises(
        pub.PublishError, match=r"is a symbolic link \(validate and publish do not follow links\) \(and 3 more such entries\)"
    ):
        pub.publish(copy, "me/sed", api=Hub())

    index = (copy / "index.json").read_bytes()
    (outside / "index.json").write_bytes(index)
    (copy / "index.json").unlink()
    (copy / "index.json").symlink_to(outside / "index.json")
    [message] = problems(copy)
    assert message.startswith("index.json is a symbolic link"), message


def test_a_linked_data_folder_names_every_shard_under_it(copy: Path, tmp_path: Path) -> None:
    shutil.move(copy / "data", tmp_path / "data")
    (copy / "data").symlink_to(tmp_path / "data")
    found = problems(copy)
    assert (
        "data is a symbolic link (validate and publish do not follow links); a shard folder holds regular files only: "
        "put a copy of the file itself there, or remove it" in found
    ), found
    lying = [p for p in found if p.startswith("index.json entry 'data/")]
    assert len(lying) == len(_shards(copy)) and all("lies under data, a symbolic link" in p for p in lying), found


def test_a_fifo_card_or_stray_fifo_is_named_without_opening_it(copy: Path) -> None:
    """A FIFO at README.md held validate until a writer came (the helper lets a blocked reader go)."""
    (copy / "README.md").unlink()
    fifo(copy / "README.md")
    fifo(copy / "images" / "pipe.png")
    start = time.monotonic()
    found = problems(copy)
    assert time.monotonic() - start < 0.5, "a FIFO was opened and waited on"
    assert found == [
        "README.md is not a regular file (a FIFO, socket or device); a shard folder holds regular files only: remove it",
        "images/pipe.png is not a regular file (a FIFO, socket or device); a shard folder holds regular files only: remove it",
    ], found
    with pytest.raises(pub.PublishError, match="README.md is not a regular file"):
        pub.publish(copy, "me/sed", api=Hub())


# --------------------------------------------------------------------------- cells longer than their rows


def _flac(samples: np.ndarray, rate: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="FLAC", subtype="PCM_16")
    return buf.getvalue()


def _with_total_frames(data: bytes, total: int) -> bytes:
    """``data`` (a FLAC file) with STREAMINFO's total-frames field set to ``total`` (36 bits; 0: unknown)."""
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0, "STREAMINFO comes first"
    at = 8 + 13  # the field's low nibble of this byte and the 4 bytes after it
    head = bytearray(data)
    head[at] = (head[at] & 0xF0) | (total >> 32) & 0x0F
    head[at + 1 : at + 5] = (total & 0xFFFFFFFF).to_bytes(4, "big")
    return bytes(head)


def test_a_cell_longer_than_its_row_is_a_bad_row_without_decoding(copy: Path, capsys) -> None:
    entry = _shards(copy)[0]
    rates = {}

    def lengthen(rows: list[dict]) -> None:
        samples, rate = sf.read(io.BytesIO(rows[0]["audio"]["bytes"]), dtype="int16")
        rates["rate"] = rate
        set_audio(rows[0], _flac(np.concatenate([samples] * 3), rate))  # a valid FLAC, three times the row's duration
        set_audio(rows[1], _with_total_frames(rows[1]["audio"]["bytes"], 4 * 3600 * rate))  # a header saying 4 hours
        set_audio(rows[2], _with_total_frames(rows[2]["audio"]["bytes"], 0))  # a header giving no length

    rows = rewrite_rows(copy, entry, lengthen)
    rate = rates["rate"]
    for decode in (False, True):  # with --decode the long cells are named the same way, and not decoded
        found = problems(copy, decode=decode)
        assert len(found) == 3, found
        prefix = [f"{entry['path']}: row {k} (mixture {rows[k]['id']}): audio header " for k in range(3)]
        duration = rows[0]["duration_s"]
        assert found[0].startswith(
            prefix[0] + f"says {3 * round(duration * rate)} frames at {rate} Hz ({3 * duration:.1f} s), "
            f"longer than the row's duration_s {duration} s"
        ), found[0]
        assert found[1].startswith(prefix[1] + f"says {4 * 3600 * rate} frames at {rate} Hz (14400.0 s), longer than"), found[1]
        assert found[2].startswith(prefix[2] + "gives no length"), found[2]
    assert main(["validate", str(copy)]) == 2
    assert f"row 1 (mixture {rows[1]['id']}): audio header says" in capsys.readouterr().err


def test_a_cell_at_another_rate_than_its_row_is_a_bad_row_without_decoding(copy: Path) -> None:
    entry = _shards(copy)[-1]

    def resample(rows: list[dict]) -> None:
        samples, rate = sf.read(io.BytesIO(rows[0]["audio"]["bytes"]), dtype="int16")
        set_audio(rows[0], _flac(samples[::2], rate // 2))  # the same duration at half the rate

    rows = rewrite_rows(copy, entry, resample)
    [message] = problems(copy)
    assert message.startswith(
        f"{entry['path']}: row 0 (mixture {rows[0]['id']}): audio header says "
        f"{rows[0]['sample_rate_hz'] // 2} Hz, the row says {rows[0]['sample_rate_hz']} Hz"
    ), message
