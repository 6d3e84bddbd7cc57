"""Output files: their mode follows the umask; kills and SIGTERM leave no temporaries and no half output."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipeline.audio import write_flac
from pipeline.outputs import resumable_dir, staged_dir, write_atomic, write_json, write_skips, write_table
from pipeline.schema import Skip
from tests.conftest import ROOT


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_every_output_file_follows_the_umask(tmp_path, umask, expected):
    previous = os.umask(umask)
    try:
        with staged_dir(tmp_path / "out") as stage:
            write_json(stage / "summary.json", {"a": 1})
            write_skips(stage / "skipped.csv", [Skip("x", "x.wav", "empty", "")])
            write_table(stage / "manifest.parquet", pa.table({"a": [1]}))
            write_atomic(stage / "metadata" / "events.tsv", b"filename\tonset\n")
            write_flac(stage / "a.flac", np.zeros(160, np.int16), 16000)
    finally:
        os.umask(previous)
    files = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert len(files) == 5
    assert {p.name: oct(_mode(p)) for p in files} == {p.name: oct(expected) for p in files}


# A child that writes `target` through the CLI's main and stops inside write_atomic, after the
# temporary is written and before the rename, so the test can signal it mid-write.
_WRITER = textwrap.dedent("""
    import dataclasses, os, sys, time
    from pathlib import Path
    from sedsynth import cli
    from pipeline.stages import corpus
    from pipeline.outputs import staged_dir, write_json
    from pipeline.outputs import write_atomic

    target, staged = Path(sys.argv[1]), Path(sys.argv[2])
    rename = os.replace

    def stalled_replace(src, dst):
        print("mid-write", flush=True)
        time.sleep(60)
        rename(src, dst)

    def stage(params):
        with staged_dir(staged) as out:
            write_json(out / "summary.json", {"new": True})
        os.replace = stalled_replace
        write_atomic(target, b"new")
        return 0

    corpus.run = stage
    cli.COMMANDS["corpus"] = dataclasses.replace(cli.COMMANDS["corpus"], params=lambda args: None)  # no params file here
    sys.exit(cli.main(["corpus"]))
""")


def _start_writer(tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    target, staged = tmp_path / "out" / "index.json", tmp_path / "stage_out"
    target.parent.mkdir()
    target.write_bytes(b"old")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(target), str(staged)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline().strip() == "mid-write", child.stderr.read()
    assert list(target.parent.glob(".*.tmp")), "the child is inside write_atomic"
    return child, target, staged


def test_sigterm_mid_write_cleans_up_and_says_so(tmp_path):
    child, target, staged = _start_writer(tmp_path)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=30)
    assert child.returncode == 128 + signal.SIGTERM, err
    assert err.strip() == "sedsynth corpus: interrupted; the previous output, if any, is unchanged"
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in target.parent.iterdir()) == ["index.json"], "no temporary left behind"


def test_a_temporary_left_by_a_killed_writer_goes_at_the_next_run(tmp_path):
    child, target, _ = _start_writer(tmp_path)
    child.kill()  # SIGKILL: no handler runs, the temporary stays
    child.communicate(timeout=30)
    stale = list(target.parent.glob(".*.tmp"))
    assert len(stale) == 1
    live = target.parent / f".other.json.{os.getpid()}.{'0' * 16}.tmp"  # a running writer's: kept
    live.write_bytes(b"")
    write_atomic(target.parent / "summary.json", b"{}")
    assert not stale[0].exists() and live.exists()
    assert target.read_bytes() == b"old"


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_resumed_staging_folder_drops_the_killed_runs_temporaries(tmp_path):
    target = tmp_path / "mixtures"
    with pytest.raises(KeyboardInterrupt):
        with resumable_dir(target, "fp") as (stage, resumed):
            assert not resumed
            write_atomic(stage / "parts" / "train-00000.done.json", b"{}")
            raise KeyboardInterrupt  # the run dies; its staging folder stays for the next one
    stage = tmp_path / ".mixtures.partial"
    stale = stage / "parts" / f".train-00001.done.json.{_dead_pid()}.{'a' * 16}.tmp"
    stale.write_bytes(b"half")
    with resumable_dir(target, "fp") as (stage, resumed):
        assert resumed
        write_atomic(stage / "parts" / "train-00001.done.json", b"{}")
    assert sorted(p.name for p in (target / "parts").iterdir()) == ["train-00000.done.json", "train-00001.done.json"]


def test_kill_between_the_swap_renames_keeps_the_previous_output(tmp_path):
    target = tmp_path / "events"
    with staged_dir(target) as stage:
        write_json(stage / "summary.json", {"run": 1})
    # a run killed after moving the good output aside and before moving its own in
    target.rename(tmp_path / ".events.old")
    with pytest.raises(RuntimeError):
        with staged_dir(target):
            raise RuntimeError("the next run fails")
    assert (target / "summary.json").read_text() == '{\n  "run": 1\n}\n'
    with staged_dir(target) as stage:
        write_json(stage / "summary.json", {"run": 3})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events"]


def test_the_trainers_checkpoint_temporaries_are_swept_too(tmp_path):
    from pipeline.outputs import remove_stale_temporaries

    dead = tmp_path / f".latest.pt.tmp-{_dead_pid()}"  # torch.save of a run that was killed
    live = tmp_path / f".best.pt.tmp-{os.getpid()}"  # a checkpoint being written now
    kept = tmp_path / ".notes.tmp-draft"  # not a temporary of ours
    for path in (dead, live, kept):
        path.write_bytes(b"half")
    assert remove_stale_temporaries(tmp_path) == [dead]
    assert live.exists() and kept.exists() and not dead.exists()


# --- output folders that must not be replaced ---------------------------------------------------

PARAMS = ROOT / "params.yaml"


@pytest.mark.parametrize(
    "command, setting, value, why",
    [
        ("mix", "mix.out_dir", "data/events", "is also clip.out_dir (data/events)"),
        ("mix", "mix.out_dir", "/", "is the filesystem root"),
        ("mix", "mix.out_dir", "data", "holds sources.fsd50k_dir (data/sources/fsd50k)"),
        ("mix", "mix.out_dir", "..", "holds the current folder (where the command runs, the project root)"),
        ("clip", "clip.out_dir", "data/sources/fsd50k/clips", "lies inside sources.fsd50k_dir (data/sources/fsd50k)"),
        ("ambience", "ambience.out_dir", ".", "is the current folder (where the command runs, the project root)"),
        ("captions", "captions.out_dir", "data/mixtures", "is also mix.out_dir (data/mixtures)"),
        ("clusters", "clusters.out_dir", "data/captions/clusters", "lies inside captions.out_dir (data/captions)"),
        ("shards", "shards.out_dir", "data/clusters", "is also clusters.out_dir (data/clusters)"),
        ("corpus", "corpus.fsd50k_dir", "data/events", "is also clip.out_dir (data/events)"),
    ],
)
def test_an_out_dir_that_is_an_input_or_a_root_is_refused_before_anything_is_written(
    tmp_path, monkeypatch, capsys, command, setting, value, why
):
    from sedsynth.cli import main

    work = tmp_path / "project"
    for folder in ("data/events", "data/sources/fsd50k", "data/mixtures", "data/captions", "data/clusters"):
        (work / folder).mkdir(parents=True)
        (work / folder / "keep.txt").write_text("input")
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    monkeypatch.chdir(work)
    code = main([command, "--params", str(PARAMS), "--set", f"{setting}={value}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"sedsynth {command}: error: {setting} is {value}, which {why}; ") and err.count("\n") == 1
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before
    assert not any(Path("/").glob(".*.partial")) and not any(Path("/").glob(".*.lock"))


# A second process that holds `target`'s lock inside staged_dir until it is killed.
_HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from pipeline.outputs import staged_dir

    with staged_dir(Path(sys.argv[1])) as stage:
        (stage / "part.txt").write_text("first run")
        print("writing", flush=True)
        time.sleep(120)
""")


def test_a_second_run_into_the_same_out_dir_is_refused_and_a_killed_ones_lock_does_not_block(tmp_path, capsys):
    from pipeline.outputs import OutputBusyError, lock_path
    from sedsynth.cli import main

    target = tmp_path / "mixtures"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(target)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "writing", child.stderr.read()
        busy = (
            f"{target} is being written by another run (pid {child.pid}); wait for it to finish, or stop it, then run this again"
        )
        with pytest.raises(OutputBusyError) as e:
            with staged_dir(target):
                pass
        assert str(e.value) == busy
        with pytest.raises(OutputBusyError):
            with resumable_dir(target, "fp"):
                pass
        code = main(
            [
                "mix",
                "--params",
                str(PARAMS),
                "--set",
                f"mix.out_dir={target}",
                "--set",
                f"mix.events={tmp_path / 'events'}",
                "--set",
                f"mix.backgrounds={tmp_path / 'backgrounds'}",
            ]
        )
        assert (code, capsys.readouterr().err) == (2, f"sedsynth mix: error: {busy}\n")
        assert (tmp_path / ".mixtures.partial" / "part.txt").read_text() == "first run", "the first run's files are untouched"
    finally:
        child.kill()  # SIGKILL: the kernel lets go of its lock; its lock file stays behind
        child.communicate(timeout=30)
    assert lock_path(target).exists()
    with staged_dir(target) as stage:
        write_json(stage / "summary.json", {"run": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mixtures"], "no lock file or staging folder left"
