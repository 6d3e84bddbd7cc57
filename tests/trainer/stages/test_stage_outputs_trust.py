"""The trainer's stages held to the data stages' rules for their outputs, through the command.

- ``pretrain``, ``train`` and ``evaluate`` refuse an ``out_dir`` that is the filesystem root, the
  home folder or the project root, or that is, lies inside or holds a folder they read or another
  stage writes: exit status 2, one line naming both settings, nothing written.
- A second ``train`` or ``pretrain`` run into a folder another run is writing is refused in one line.
- A checkpoint write stopped by a full disk raises the disk's OSError (one line, exit status 2),
  and one stopped by SIGTERM the command's ``Terminated`` (exit status 143), never torch's
  ``RuntimeError``; no temporary is left and the previous checkpoints are unchanged.
- ``sedsynth ablate`` under torchrun is refused in one line.

The inputs of the refused runs need not exist: the folder is checked before anything is read.
"""

from __future__ import annotations

import builtins
import dataclasses
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile as sf
import torch

from sedsynth.cli import Terminated, main
from tests.conftest import ROOT, tone_burst, tree_digest
from tests.sedsynth.test_faults import FullDisk
from trainer import ablations, checkpoint


def run_command(capsys, *argv: str) -> tuple[int, str]:
    """``sedsynth argv`` in this process: ``(exit status, stderr)``."""
    capsys.readouterr()
    code = main(list(argv))
    return code, capsys.readouterr().err


def last_line(err: str) -> str:
    """The last line on stderr (a progress bar may stand before it)."""
    return err.strip().splitlines()[-1].split("\r")[-1]


def params_file(path: Path, sections: dict) -> str:
    path.write_text(json.dumps(sections), encoding="utf-8")
    return str(path)


def pretrain_section(audio: Path, out: Path | str) -> dict:
    return {
        "audio": [str(audio)],
        "heldout_mix": None,
        "crop_s": 1.0,
        "batch_size": 2,
        "steps": 2,
        "warmup_steps": 1,
        "log_every_steps": 1,
        "device": "cpu",
        "threads": 1,
        "out_dir": str(out),
    }


def write_audio(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(3):
        sf.write(folder / f"tone{i}.wav", tone_burst(16000, 1.2, 0.2, 0.9, freq_hz=300 + 100 * i), 16000)
    return folder


# --------------------------------------------------------------------------- folders a stage must not write into


def refusal_cases(tmp: Path) -> list[tuple[str, dict, str, str]]:
    """``(command, params, the setting refused, what the line says of it)``, one per kind of folder."""
    events, shards, run = tmp / "events", tmp / "dataset", tmp / "run"
    return [
        # the clip stage's folder, read as audio (`--set pretrain.out_dir=debug/events` with configs/debug.yaml)
        (
            "pretrain",
            {"clip": {"out_dir": str(events)}, "pretrain": pretrain_section(events, events)},
            "pretrain.out_dir",
            f"is also clip.out_dir ({events})",
        ),
        ("pretrain", {"pretrain": pretrain_section(events, "/")}, "pretrain.out_dir", "is the filesystem root"),
        ("pretrain", {"pretrain": pretrain_section(events, tmp / "home")}, "pretrain.out_dir", "is your home folder"),
        ("pretrain", {"pretrain": pretrain_section(events, tmp)}, "pretrain.out_dir", "holds the current folder"),
        (
            "pretrain",
            {"pretrain": pretrain_section(events, events / "pretrain")},
            "pretrain.out_dir",
            f"lies inside pretrain.audio[0] ({events})",
        ),
        (
            "pretrain",
            {"train": {"out_dir": str(run)}, "pretrain": pretrain_section(events, run)},
            "pretrain.out_dir",
            f"is also train.out_dir ({run})",
        ),
        # a shard folder, which `validate` and `publish` would then take with the checkpoints in it
        (
            "train",
            {"shards": {"out_dir": str(shards)}, "train": {"out_dir": str(shards)}},
            "train.out_dir",
            f"is also shards.out_dir ({shards})",
        ),
        ("train", {"train": {"out_dir": "/"}}, "train.out_dir", "is the filesystem root"),
        ("train", {"train": {"out_dir": str(tmp / "home")}}, "train.out_dir", "is your home folder"),
        ("train", {"train": {"out_dir": str(tmp / "project")}}, "train.out_dir", "is the current folder"),
        (
            "train",
            {"train": {"data": {"sources": [{"path": str(shards / "mine")}], "valid": None}, "out_dir": str(shards)}},
            "train.out_dir",
            f"holds train.data.sources[0].path ({shards / 'mine'})",
        ),
        (
            "train",
            {
                "train": {
                    "model": {"encoder_checkpoint": str(tmp / "pretrain" / "checkpoints" / "encoder.pt")},
                    "out_dir": str(tmp / "pretrain"),
                }
            },
            "train.out_dir",
            "holds train.model.encoder_checkpoint",
        ),
        ("evaluate", {"evaluate": {"out_dir": "/"}}, "evaluate.out_dir", "is the filesystem root"),
        ("evaluate", {"evaluate": {"out_dir": str(tmp / "home")}}, "evaluate.out_dir", "is your home folder"),
        (
            "evaluate",
            {"evaluate": {"shards": str(shards), "out_dir": str(shards / "evaluation")}},
            "evaluate.out_dir",
            f"lies inside evaluate.shards ({shards})",
        ),
        # the train stage's own folder: its metrics.json would be overwritten
        (
            "evaluate",
            {"train": {"out_dir": str(run)}, "evaluate": {"checkpoint": str(tmp / "elsewhere.pt"), "out_dir": str(run)}},
            "evaluate.out_dir",
            f"holds train.out_dir's checkpoints ({run / 'checkpoints'})",
        ),
        (
            "evaluate",
            {"evaluate": {"checkpoint": str(run / "checkpoints" / "best.pt"), "out_dir": str(run / "checkpoints")}},
            "evaluate.out_dir",
            "holds evaluate.checkpoint",
        ),
    ]


@pytest.mark.parametrize("case", range(17))
def test_an_out_dir_the_data_stages_would_refuse_is_refused_in_one_line_before_anything_is_written(
    case, tmp_path, capsys, monkeypatch
):
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "skipped.csv").write_text("item_id,path,reason,detail\n")  # the clip stage's report
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(project)
    cases = refusal_cases(tmp_path)
    assert len(cases) == 17
    command, sections, setting, why = cases[case]
    before = tree_digest(tmp_path)
    listed = sorted(p.name for p in tmp_path.rglob("*"))

    code, err = run_command(capsys, command, "--params", params_file(tmp_path.parent / f"{tmp_path.name}-params.json", sections))

    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"sedsynth {command}: error: {setting} is "), err
    assert f", which {why}" in err, err
    assert tree_digest(tmp_path) == before and sorted(p.name for p in tmp_path.rglob("*")) == listed  # not even a lock file
    assert not Path("/checkpoints").exists() and not Path("/details").exists()


# --------------------------------------------------------------------------- one run at a time


HOLD = """
import sys, time
from pipeline.outputs import output_lock
with output_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


@pytest.mark.parametrize("command", ["pretrain", "train"])
def test_a_second_run_into_a_folder_in_use_is_refused_in_one_line(command, tmp_path, capsys):
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], cwd=ROOT, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"held"
        sections = (
            {"pretrain": pretrain_section(write_audio(tmp_path / "audio"), out)}
            if command == "pretrain"
            else {"train": {"out_dir": str(out)}}
        )
        code, err = run_command(capsys, command, "--params", params_file(tmp_path / "params.json", sections))
    finally:
        holder.kill()
        holder.wait()
    assert code == 2, err
    assert (
        err == f"sedsynth {command}: error: {out} is being written by another run (pid {holder.pid}); wait for it to finish, "
        "or stop it, then run this again\n"
    )
    assert not out.exists()


# --------------------------------------------------------------------------- a checkpoint write that is stopped


def stopping_writes(monkeypatch, folder: Path, stop) -> list[str]:
    """Files opened for writing under ``folder`` call ``stop()`` at their second write (torch writes a
    checkpoint in many); returns the names of the files it stopped."""
    real_open = builtins.open
    stopped: list[str] = []

    class Stopping:
        def __init__(self, f):
            self._f, self._writes = f, 0

        def write(self, data):
            self._writes += 1
            if self._writes == 2:
                stopped.append(Path(self._f.name).name)
                stop()
            return self._f.write(data)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._f.close()

        def __getattr__(self, name):
            return getattr(self._f, name)

    def opening(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if any(c in mode for c in "wxa+") and isinstance(file, (str, os.PathLike)) and Path(file).parent == folder:
            return Stopping(f)
        return f

    monkeypatch.setattr(builtins, "open", opening)
    return stopped


def sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def test_a_full_disk_during_a_save_is_the_disks_error_and_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "latest.pt"
    checkpoint.write_torch_file(path, {"step": 1})
    FullDisk(path.parent, room=100).install(monkeypatch)
    with pytest.raises(OSError) as caught:
        checkpoint.write_torch_file(path, {"step": 2, "weights": torch.zeros(10_000)})
    assert caught.value.errno == errno.ENOSPC
    assert sorted(p.name for p in path.parent.iterdir()) == ["latest.pt"]
    assert torch.load(path, weights_only=True) == {"step": 1}


def test_sigterm_during_a_save_stops_it_as_the_handler_says_once_torch_is_done(tmp_path, monkeypatch):
    def handler(signum, frame):
        raise Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        path = tmp_path / "checkpoints" / "latest.pt"
        checkpoint.write_torch_file(path, {"step": 1})
        stopped = stopping_writes(monkeypatch, path.parent, sigterm)
        with pytest.raises(Terminated):
            checkpoint.write_torch_file(path, {"step": 2, "weights": torch.zeros(10_000)})
        assert stopped and signal.getsignal(signal.SIGTERM) is handler  # the handler is back in place
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert sorted(p.name for p in path.parent.iterdir()) == ["latest.pt"]
    assert torch.load(path, weights_only=True) == {"step": 1}


@pytest.fixture
def audio(tmp_path_factory) -> Path:
    return write_audio(tmp_path_factory.mktemp("pretrain-audio"))


def test_a_full_disk_while_pretrain_writes_the_encoder_is_one_line(audio, tmp_path, capsys, monkeypatch):
    out = tmp_path / "pretrain"
    params = params_file(tmp_path / "params.json", {"seed": 7, "pretrain": pretrain_section(audio, out)})
    disk = FullDisk(out / "checkpoints", room=0)
    disk.install(monkeypatch)
    code, err = run_command(capsys, "pretrain", "--params", params)
    assert disk.refused == 1
    assert code == 2 and "Traceback" not in err, err
    assert (
        last_line(err) == f"sedsynth pretrain: error: no space left on device writing {out}: free space or set pretrain.out_dir"
    )
    assert list((out / "checkpoints").iterdir()) == []


@pytest.fixture
def trained(smoke_run, tmp_path) -> tuple[Path, str, dict]:
    """A copy of the smoke run's folder and the params of a run into it that starts over:
    ``(folder, params file, the checkpoints' bytes)``."""
    p, out, _ = smoke_run
    run = tmp_path / "run"
    shutil.copytree(out, run)
    train = json.loads(json.dumps(dataclasses.asdict(p.train)))  # tuples as lists
    train |= {"out_dir": str(run), "resume": False, "threads": 1}
    params = params_file(tmp_path / "params.json", {"seed": p.seed, "train": train})
    return run, params, {f.name: f.read_bytes() for f in (run / "checkpoints").iterdir()}


def test_sigterm_while_train_writes_a_checkpoint_exits_143_and_keeps_the_previous_ones(trained, capsys, monkeypatch):
    run, params, checkpoints = trained
    stopped = stopping_writes(monkeypatch, run / "checkpoints", sigterm)
    code, err = run_command(capsys, "train", "--params", params)
    assert stopped, "the run got as far as a checkpoint"
    assert code == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and last_line(err) == (
        "sedsynth train: interrupted; every file it wrote is whole (no temporary left); run it again to go on from checkpoints/latest.pt"
    )
    assert {f.name: f.read_bytes() for f in (run / "checkpoints").iterdir()} == checkpoints  # no temporary, none changed


def test_a_full_disk_while_train_writes_a_checkpoint_is_one_line(trained, capsys, monkeypatch):
    run, params, checkpoints = trained
    disk = FullDisk(run / "checkpoints", room=0)
    disk.install(monkeypatch)
    code, err = run_command(capsys, "train", "--params", params)
    assert disk.refused == 1
    assert code == 2 and "Traceback" not in err, err
    assert last_line(err) == f"sedsynth train: error: no space left on device writing {run}: free space or set train.out_dir"
    assert {f.name: f.read_bytes() for f in (run / "checkpoints").iterdir()} == checkpoints


# --------------------------------------------------------------------------- ablate and torchrun


@pytest.mark.parametrize("argv", [["full"], ["--queue"], ["full", "--score-only"]])
def test_ablate_under_torchrun_is_refused_in_one_line(argv, capsys, monkeypatch):
    done = []
    monkeypatch.setattr(ablations, "run_variant", lambda *args, **kwargs: done.append(args))
    monkeypatch.setattr(ablations, "queue_experiments", lambda *args, **kwargs: done.append(args) or {})
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    code, err = run_command(capsys, "ablate", *argv, "--params", str(ROOT / "params.yaml"))
    assert (code, done) == (2, [])
    assert (
        err.count("\n") == 1 and err.startswith("sedsynth ablate: error: ablate trains and evaluates") and "WORLD_SIZE=2" in err
    )
