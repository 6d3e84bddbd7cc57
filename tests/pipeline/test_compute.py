"""Workers started ahead of the work: booted in the background, shared by several maps, in item order.
A remote scheduler that does not answer is refused in bounded time, and a worker with other numpy
kernels makes nothing, even one that joins after the client connected."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pipeline.compute import Workers, map_ordered, runs_in_process
from pipeline.config.params import ComputeParams


def _pid_and_square(x: int) -> tuple[int, int]:
    return os.getpid(), x * x


def _was_preloaded(_: int) -> bool:
    return "colorsys" in sys.modules  # nothing in the project imports it: only the preload can have


def test_one_worker_runs_in_this_process_and_starts_nothing() -> None:
    compute = ComputeParams(workers=1, chunk_size=2)
    assert runs_in_process(compute)
    with Workers(compute) as workers:
        assert workers.client() is None
        assert map_ordered(_pid_and_square, range(5), compute, "test", workers=workers) == [
            (os.getpid(), x * x) for x in range(5)
        ]


def test_started_workers_preload_and_serve_several_maps_in_order() -> None:
    compute = ComputeParams(workers=2, chunk_size=1)
    with Workers(compute, preload=("colorsys",)) as workers:
        first = map_ordered(_pid_and_square, range(8), compute, "test", workers=workers)
        second = map_ordered(_pid_and_square, range(8, 12), compute, "test", workers=workers)
        assert all(map_ordered(_was_preloaded, range(4), compute, "test", workers=workers))
        client = workers.client()
    assert [sq for _, sq in first + second] == [x * x for x in range(12)]
    pids = {pid for pid, _ in first + second}
    assert os.getpid() not in pids and len(pids) <= 2
    assert client.status == "closed"


def _worker_settings(_: int) -> tuple[object, str | None, str | None]:
    import dask

    return (
        dask.config.get("distributed.worker.profile.enabled"),
        os.environ.get("OMP_NUM_THREADS"),
        os.environ.get("MALLOC_TRIM_THRESHOLD_"),
    )


def test_local_workers_run_without_the_profiler_and_with_one_thread_per_library(monkeypatch) -> None:
    # a cluster started with dask's defaults earlier in this process leaves MALLOC_TRIM_THRESHOLD_ in
    # os.environ (its nanny sets it there); this process's environment, as a fresh run has it:
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    compute = ComputeParams(workers=2, chunk_size=1)
    with Workers(compute) as workers:
        settings = set(map_ordered(_worker_settings, range(2), compute, "test", workers=workers))
    # the profiler would take the GIL every 10 ms; MALLOC_TRIM_THRESHOLD_ would disable glibc's adaptive mmap threshold
    assert settings == {(False, "1", None)}
    # and this process's environment is as it was: the workers' settings stayed in the workers
    assert "OMP_NUM_THREADS" not in os.environ and "MALLOC_TRIM_THRESHOLD_" not in os.environ


# --------------------------------------------------------------------------- remote clusters


def _square(x: int) -> int:
    return x * x


def test_a_scheduler_that_does_not_answer_is_refused_in_bounded_time() -> None:
    import socket
    import time

    from pipeline.compute import ComputeError, check_scheduler

    with socket.socket() as silent:  # listens (the kernel accepts connections) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        start = time.monotonic()
        with pytest.raises(ComputeError, match="something accepts connections there but no dask scheduler answered"):
            check_scheduler(f"tcp://127.0.0.1:{silent.getsockname()[1]}", timeout_s=0.5)
        assert time.monotonic() - start < 10
    with pytest.raises(ComputeError, match="no dask scheduler there .*unknown address scheme"):
        check_scheduler("http://127.0.0.1:8786", timeout_s=0.5)


def test_a_worker_that_joins_after_the_check_with_other_kernels_makes_nothing(monkeypatch) -> None:
    """The kernels are checked when the client connects (no worker yet here) and again by each task:
    a worker that joins later with other numpy kernels fails the run with the fix, instead of making
    items whose bytes differ."""
    from distributed import LocalCluster, get_worker

    import pipeline.compute as compute_module
    from pipeline.compute import ComputeError

    here = compute_module.numpy_kernels()
    other = "X86_V3 X86_V4" if here == "baseline" else "baseline"

    def kernels_per_process() -> str:
        try:
            get_worker()  # in-process workers (processes=False): a task here runs on the joined worker
        except ValueError:
            return here  # the calling process
        return other

    monkeypatch.setattr(compute_module, "numpy_kernels", kernels_per_process)
    with LocalCluster(n_workers=0, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        compute = ComputeParams(scheduler=cluster.scheduler_address, workers=1, chunk_size=2)
        with Workers(compute) as workers:
            assert workers.client() is not None  # connected and checked: no worker has joined yet
            cluster.scale(1)
            with pytest.raises(
                ComputeError, match=f"dask worker [a-z]+://.* uses numpy kernels '{other}' where this process uses '{here}'"
            ):
                map_ordered(_square, range(6), compute, "test", workers=workers)


def test_workers_with_the_same_kernels_run_a_remote_map(monkeypatch) -> None:
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        compute = ComputeParams(scheduler=cluster.scheduler_address, workers=1, chunk_size=2)
        assert map_ordered(_square, range(5), compute, "test") == [0, 1, 4, 9, 16]


@pytest.mark.parametrize(
    "trim, profile, expected",
    [
        ("65536", True, "run with MALLOC_TRIM_THRESHOLD_ and distributed.worker.profile.enabled set"),
        (None, True, "run with distributed.worker.profile.enabled set"),
        (None, False, None),
    ],
)
def test_remote_workers_with_dask_defaults_are_named_once(monkeypatch, capsys, trim, profile, expected) -> None:
    """A cluster you start yourself gets dask's defaults unless told otherwise; the stage says so in
    one line, names the fix, and runs on (the bytes are the same, only slower)."""
    import dask
    from distributed import LocalCluster

    if trim is None:
        monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    else:
        monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", trim)  # in-process workers share this environment
    with (
        dask.config.set({"distributed.worker.profile.enabled": profile}),
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster,
    ):
        compute = ComputeParams(scheduler=cluster.scheduler_address, workers=1, chunk_size=2)
        assert map_ordered(_square, range(3), compute, "test") == [0, 1, 4]
    lines = [line for line in capsys.readouterr().err.splitlines() if "dask workers" in line]
    if expected is None:
        assert lines == []
    else:
        config = Path(__file__).resolve().parents[2] / "configs" / "dask-worker.yaml"
        assert len(lines) == 1 and expected in lines[0] and f"DASK_CONFIG={config}" in lines[0]


def test_the_worker_config_file_unsets_what_slows_workers() -> None:
    """configs/dask-worker.yaml, read as `DASK_CONFIG=configs/dask-worker.yaml dask worker ...` reads
    it, turns both off and keeps the nanny's other settings."""
    import json
    import subprocess

    from pipeline.compute import WORKER_CONFIG

    code = (
        "import dask, json, distributed; from distributed.nanny import _get_env_variables; "
        "print(json.dumps([dask.config.get('distributed.worker.profile.enabled'), "
        "_get_env_variables('distributed.nanny.pre-spawn-environ')]))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_TRIM_THRESHOLD_", "OMP_NUM_THREADS")}
    env["DASK_CONFIG"] = str(Path(__file__).parents[2] / WORKER_CONFIG)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    profile, spawn_env = json.loads(out)
    assert profile is False
    assert "MALLOC_TRIM_THRESHOLD_" not in spawn_env and spawn_env["OMP_NUM_THREADS"] == "1"
