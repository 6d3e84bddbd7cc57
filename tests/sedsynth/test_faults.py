"""Faults a user can fix end in one line on stderr and exit status 2, never a traceback.

- A full disk (ENOSPC) during the mix or clip stage: one line naming the folder and its setting
  (``mix.out_dir``), the previous output unchanged, and no ``.partial`` staging folder left behind
  to keep the disk full.
- A forbidden or read-only output folder: one line naming the setting; an OS error that is a bug
  (a bad file descriptor) keeps its traceback.
- ``compute.scheduler`` pointing at a closed port or at a server that is not a dask scheduler:
  one line within a bounded time; its workers using other numpy kernels: one line.
- ``detect --threshold`` outside [0, 1] (or not finite) and ``publish --batch-files`` below 1 are
  refused by the argument parser.

The full disk is simulated: files opened for writing under one folder fail with ENOSPC once a
byte budget is spent, as writes do on a disk that fills up.
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from sedsynth.cli import main
from tests.conftest import ROOT, tree_digest


class FullDisk:
    """Files opened for writing under ``root`` hold ``room`` bytes in all; then every write raises ENOSPC."""

    def __init__(self, root: Path, room: int):
        self.root, self.room, self.used, self.refused = os.path.abspath(root), room, 0, 0

    def install(self, monkeypatch) -> None:
        real_open = builtins.open

        def open_on_disk(file, mode="r", *args, **kwargs):
            f = real_open(file, mode, *args, **kwargs)
            writing = any(c in mode for c in "wxa+")
            if writing and isinstance(file, (str, os.PathLike)) and os.path.abspath(file).startswith(self.root + os.sep):
                return _Filling(f, self)
            return f

        monkeypatch.setattr(builtins, "open", open_on_disk)
        monkeypatch.setattr(io, "open", open_on_disk)  # pathlib's write_bytes and write_text


class _Filling:
    def __init__(self, f, disk: FullDisk):
        self._f, self._disk = f, disk

    def write(self, data) -> int:
        if self._disk.used + len(data) > self._disk.room:
            self._disk.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as write(2) reports it: no file name
        self._disk.used += len(data)
        return self._f.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()

    def __getattr__(self, name):
        return getattr(self._f, name)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _mix_args(events: Path, backgrounds: Path, out: Path) -> list[str]:
    return [
        "mix",
        "--params",
        str(ROOT / "params.yaml"),
        "--set",
        f"clip.out_dir={events}",
        "--set",
        f"ambience.out_dir={backgrounds}",
        "--set",
        f"mix.out_dir={out}",
        "--set",
        "compute.workers=1",
        "--set",
        "mix.mixtures.train=4",
        "--set",
        "mix.mixtures.valid=2",
        "--set",
        "mix.mixtures.test=2",
        "--set",
        "mix.partition_size=2",
        "--set",
        "mix.export.timelines=0",
    ]


def test_a_full_disk_during_mix_is_one_line_and_leaves_the_previous_output_and_no_staging(mixed, tmp_path, capsys, monkeypatch):
    _, mix_dir, events_dir, backgrounds_dir = mixed
    out = tmp_path / "disk" / "mixtures"
    shutil.copytree(mix_dir, out)  # the previous good output
    before = tree_digest(out)
    disk = FullDisk(tmp_path / "disk", room=11_000_000)  # the source bank and some mixtures fit, then the disk is full
    disk.install(monkeypatch)

    code, _, err = _run(capsys, *_mix_args(events_dir, backgrounds_dir, out))

    assert disk.refused > 0, "the disk filled up during the run"
    assert code == 2, err
    lines = err.strip().splitlines()
    assert lines[-1] == f"sedsynth mix: error: no space left on device writing {out}: free space or set mix.out_dir", err
    assert "Traceback" not in err
    assert tree_digest(out) == before, "the previous output is unchanged"
    assert sorted(p.name for p in out.parent.iterdir()) == ["mixtures"], "no staging folder is left filling the disk"


def test_a_full_disk_during_clip_is_one_line_and_leaves_the_previous_output(mixed, tmp_path, capsys, monkeypatch):
    _, _, events_dir, _ = mixed
    out = tmp_path / "disk" / "events"
    shutil.copytree(events_dir, out)
    before = tree_digest(out)
    disk = FullDisk(tmp_path / "disk", room=300_000)  # some clips fit, then the disk is full
    disk.install(monkeypatch)

    code, _, err = _run(
        capsys,
        "clip",
        "--params",
        str(ROOT / "params.yaml"),
        "--set",
        f"sources.fsd50k_dir={events_dir.parent / 'fsd50k'}",
        "--set",
        f"clip.out_dir={out}",
        "--set",
        "compute.workers=1",
        "--set",
        "clip.plot_examples=0",
    )

    assert disk.refused > 0 and disk.used > 0
    assert (
        code == 2
        and err.strip().splitlines()[-1]
        == f"sedsynth clip: error: no space left on device writing {out}: free space or set clip.out_dir"
    ), err
    assert tree_digest(out) == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["events"]


def test_a_full_disk_names_the_file_when_the_error_does(tmp_path, capsys, monkeypatch):
    def full(params):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "events" / "x.flac"))

    monkeypatch.setattr("pipeline.stages.clip.run", full)  # the command imports it when it runs, so it takes this one
    code, _, err = _run(capsys, "clip", "--params", str(ROOT / "params.yaml"), "--set", f"clip.out_dir={tmp_path / 'events'}")
    assert (code, err) == (
        2,
        f"sedsynth clip: error: no space left on device writing {tmp_path / 'events' / 'x.flac'}: "
        "free space or set clip.out_dir\n",
    )


@pytest.mark.parametrize(
    "error, expected",
    [
        (
            PermissionError(errno.EACCES, "Permission denied", "/srv/data/events"),
            "permission denied on /srv/data/events: give this user access to it or set clip.out_dir to a folder it can write",
        ),
        (
            OSError(errno.EROFS, "Read-only file system", "/mnt/ro/events"),
            "read-only file system at /mnt/ro/events: set clip.out_dir to a folder on a writable disk",
        ),
        (
            ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
            "[Errno 111] Connection refused (ConnectionRefusedError): check the address and that its server is up and reachable, then run again",
        ),
    ],
)
def test_user_fixable_os_faults_are_one_line(error, expected, capsys, monkeypatch):
    def fails(params):
        raise error

    monkeypatch.setattr("pipeline.stages.clip.run", fails)
    code, _, err = _run(capsys, "clip", "--params", str(ROOT / "params.yaml"))
    assert (code, err) == (2, f"sedsynth clip: error: {expected}\n")


def test_an_os_error_that_is_a_bug_keeps_its_traceback(monkeypatch):
    def bug(params):
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr("pipeline.stages.clip.run", bug)
    with pytest.raises(OSError, match="Bad file descriptor"):
        main(["clip", "--params", str(ROOT / "params.yaml")])


# --------------------------------------------------------------------------- compute.scheduler


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def silent_server():
    """A TCP server on 127.0.0.1 that accepts connections and never answers; yields its port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    accepted, stop = [], threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    server.close()


@pytest.mark.parametrize("where", ["closed", "silent"])
def test_a_scheduler_that_is_not_there_is_one_line_in_bounded_time(where, silent_server, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("pipeline.compute.CONNECT_TIMEOUT_S", 1)
    address = f"tcp://127.0.0.1:{_closed_port() if where == 'closed' else silent_server}"
    start = time.monotonic()
    code, _, err = _run(
        capsys,
        "corpus",
        "--params",
        str(ROOT / "params.yaml"),
        "--set",
        f"compute.scheduler={address}",
        "--set",
        "corpus.fsd50k_clips=4",
        "--set",
        f"corpus.fsd50k_dir={tmp_path / 'fsd50k'}",
        "--set",
        f"corpus.ambience_dir={tmp_path / 'ambience'}",
    )
    took = time.monotonic() - start
    assert not (tmp_path / "fsd50k").exists(), "nothing was written"
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"compute.scheduler {address}:" in err and "compute.scheduler: local" in err
    assert ("something accepts connections there" if where == "silent" else "no dask scheduler there") in err
    assert took < 15, f"{took:.1f} s"


def test_workers_with_other_numpy_kernels_are_one_line(tmp_path, capsys, monkeypatch):
    import dask
    from distributed import LocalCluster, get_worker

    import pipeline.compute as compute_module

    here = compute_module.numpy_kernels()
    other = "X86_V3 X86_V4" if here == "baseline" else "baseline"

    def kernels_per_process() -> str:
        try:
            get_worker()
        except ValueError:
            return here
        return other  # the in-process worker's kernels

    monkeypatch.setattr(compute_module, "numpy_kernels", kernels_per_process)
    # a cluster started as docs/scaling.md says (configs/dask-worker.yaml), so no advice line joins the fault's
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    with (
        dask.config.set({"distributed.worker.profile.enabled": False}),
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster,
    ):
        code, _, err = _run(
            capsys,
            "corpus",
            "--params",
            str(ROOT / "params.yaml"),
            "--set",
            f"compute.scheduler={cluster.scheduler_address}",
            "--set",
            "corpus.fsd50k_clips=4",
            "--set",
            f"corpus.fsd50k_dir={tmp_path / 'fsd50k'}",
            "--set",
            f"corpus.ambience_dir={tmp_path / 'ambience'}",
        )
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"uses numpy kernels '{other}'" in err and "NPY_ENABLE_CPU_FEATURES=" in err
    assert not (tmp_path / "fsd50k").exists()


# --------------------------------------------------------------------------- arguments


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "2", "-1", "1.0000001", "half"])
def test_detect_refuses_a_threshold_that_is_not_a_probability(value, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["detect", "a.wav", "--query", "dog", f"--threshold={value}"])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.strip().splitlines()[-1] == (
        f"sedsynth detect: error: argument --threshold: {value!r} is not a probability: pass a number from 0 to 1, e.g. 0.5"
    )


@pytest.mark.parametrize("value", ["0", "-1", "1.5"])
def test_publish_refuses_fewer_than_one_file_per_batch(value, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["publish", "data/dataset", "--repo-id", "me/sed", "--batch-files", value])
    assert stop.value.code == 2
    assert "argument --batch-files: " in capsys.readouterr().err
