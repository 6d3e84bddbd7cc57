"""Checkpoint temporaries: flushed to disk before the rename, removed when a save is interrupted,
and removed by the next run when a killed writer left them (they are as large as the checkpoint)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer import checkpoint


def dead_pid() -> int:
    """The id of a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_an_interrupted_save_leaves_no_temporary_and_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "latest.pt"
    checkpoint.write_torch_file(path, {"step": 1})
    real_save = torch.save

    def save_then_stop(state, f, *args, **kwargs):
        real_save(state, f, *args, **kwargs)  # the bytes are written, the rename is not done yet
        raise KeyboardInterrupt  # Ctrl-C, or SIGTERM through sedsynth.cli's handler

    monkeypatch.setattr(torch, "save", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.write_torch_file(path, {"step": 2})
    assert temporaries(path.parent) == []
    assert torch.load(path, weights_only=True) == {"step": 1}


def test_the_file_is_fsynced_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        calls.append(("fsync", Path(os.readlink(f"/proc/self/fd/{fd}")).name))
        real_fsync(fd)

    def replace(src, dst):
        calls.append(("replace", Path(dst).name))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    path = tmp_path / "checkpoints" / "latest.pt"
    checkpoint.write_torch_file(path, {"step": 1})
    (kind, name), rename, folder = calls
    assert kind == "fsync" and name.startswith(".latest.pt.") and name.endswith(".tmp")  # the temporary's bytes
    assert rename == ("replace", "latest.pt")
    assert folder == ("fsync", "checkpoints")  # the rename itself


def test_stale_temporaries_are_removed_and_a_running_writers_kept(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    gone = dead_pid()
    stale = [
        f".latest.pt.{gone}.0123456789abcdef.tmp",
        f".latest.pt.tmp-{gone}",  # as earlier versions named them
        f".best.pt.{os.getpid()}.fedcba9876543210.tmp",
    ]  # this process's id, not being written: a killed run's
    running = f".latest.pt.{os.getppid()}.00112233445566ff.tmp"  # a live writer's
    others = ["latest.pt", ".notes.txt"]
    for name in [*stale, running, *others]:
        (folder / name).write_bytes(b"x")
    removed = checkpoint.remove_stale_temporaries(folder)
    assert sorted(p.name for p in removed) == sorted(stale)
    assert sorted(p.name for p in folder.iterdir()) == sorted([running, *others])


def test_the_pipelines_sweep_matches_checkpoint_temporaries(tmp_path, monkeypatch):
    from pipeline.outputs import remove_stale_temporaries

    name = {}
    real_save = torch.save

    def save_and_note(state, f, *args, **kwargs):
        name["tmp"] = Path(f.name).name
        real_save(state, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_and_note)
    checkpoint.write_torch_file(tmp_path / "latest.pt", {"step": 1})
    left = tmp_path / name["tmp"].replace(f".{os.getpid()}.", f".{dead_pid()}.")  # as a killed writer leaves it
    left.write_bytes(b"x")
    assert remove_stale_temporaries(tmp_path) == [left]
