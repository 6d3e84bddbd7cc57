"""A dask cluster that loses its last worker while a map waits on it (pipeline/compute.py): dask
would wait for a worker for ever; the map gives up after ``NO_WORKER_TIMEOUT_S`` (shortened here),
cancels its tasks and raises one line naming the scheduler's address.

The cluster is a real ``distributed.LocalCluster`` on 127.0.0.1 with one in-process worker, which
the test closes once the first task runs. The map runs in a thread joined with a time limit, so a
map that waits for ever fails the test instead of hanging it."""

from __future__ import annotations

import threading
import time

import pipeline.compute as compute_module
from pipeline.compute import ComputeError, map_ordered
from pipeline.config.params import ComputeParams

STARTED = threading.Event()  # set by the first task (the worker runs in this process)


def _slow_square(x: int) -> int:
    STARTED.set()
    time.sleep(0.2)
    return x * x


def test_a_cluster_whose_last_worker_dies_is_given_up_on_in_one_line(monkeypatch) -> None:
    from distributed import LocalCluster

    monkeypatch.setattr(compute_module, "NO_WORKER_TIMEOUT_S", 1.0, raising=False)
    monkeypatch.setattr(compute_module, "NO_WORKER_CHECK_S", 0.1, raising=False)
    STARTED.clear()
    outcome: dict = {}
    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, protocol="tcp://", host="127.0.0.1", dashboard_address=None
    ) as cluster:
        address = cluster.scheduler_address
        compute = ComputeParams(scheduler=address, workers=1, chunk_size=1)

        def close_the_worker() -> None:
            if STARTED.wait(20):
                worker = next(iter(cluster.workers.values()))
                cluster.sync(worker.close)

        def run() -> None:
            try:
                outcome["results"] = map_ordered(_slow_square, range(30), compute, "test")
            except BaseException as e:  # noqa: BLE001  (handed to the test's thread)
                outcome["error"] = e

        threading.Thread(target=close_the_worker, daemon=True).start()
        mapping = threading.Thread(target=run, daemon=True)
        start = time.monotonic()
        mapping.start()
        mapping.join(timeout=20)
        took = time.monotonic() - start
        assert not mapping.is_alive(), "the map waited for a worker that never came"
        assert "results" not in outcome, "the worker was closed after the map had finished"
        error = outcome["error"]
        assert isinstance(error, ComputeError), repr(error)
        message = str(error)
        assert "\n" not in message
        assert f"compute.scheduler {address}: the dask scheduler at {address} has had no worker for 1 s" in message
        assert f"`dask worker {address}`" in message and "compute.scheduler: local" in message
        assert took < 10
        assert not cluster.scheduler.tasks or all(
            ts.state in ("released", "forgotten") for ts in cluster.scheduler.tasks.values()
        )


def test_a_map_on_a_cluster_that_keeps_its_worker_is_not_cut_short(monkeypatch) -> None:
    """The watch only counts time without any worker: a map longer than the limit runs to its end."""
    from distributed import LocalCluster

    monkeypatch.setattr(compute_module, "NO_WORKER_TIMEOUT_S", 0.3)
    monkeypatch.setattr(compute_module, "NO_WORKER_CHECK_S", 0.05)
    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, protocol="tcp://", host="127.0.0.1", dashboard_address=None
    ) as cluster:
        compute = ComputeParams(scheduler=cluster.scheduler_address, workers=1, chunk_size=1)
        assert map_ordered(_slow_square, range(5), compute, "test") == [x * x for x in range(5)]  # about 1 s
