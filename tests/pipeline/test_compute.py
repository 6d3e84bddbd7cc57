"""Workers started ahead of the work: booted in the background, shared by several maps, in item order."""

from __future__ import annotations

import os
import sys

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
        assert map_ordered(_pid_and_square, range(5), compute, "test", workers=workers) == [(os.getpid(), x * x) for x in range(5)]


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

    return dask.config.get("distributed.worker.profile.enabled"), os.environ.get("OMP_NUM_THREADS"), os.environ.get("MALLOC_TRIM_THRESHOLD_")


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
