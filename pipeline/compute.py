"""Running a function over many items with dask, in item order, with a progress bar.

Input: a module-level function, a list of items and :class:`ComputeParams`. Output: the
function's results in the order of the items, whatever the number of workers or the order
they finish in. ``workers: 1`` on the local scheduler runs in the calling process (no
cluster start-up); otherwise a ``dask.distributed`` LocalCluster of single-threaded worker
processes runs the chunks, or the cluster behind ``scheduler: tcp://host:port`` does. Workers
of a remote cluster must see the same paths (a shared filesystem) and have this package
installed. A scheduler that does not answer as one within :data:`CONNECT_TIMEOUT_S` (nothing
listening, or another kind of server) raises :class:`ComputeError`, as does a worker whose numpy
kernels differ from this process's: checked on every worker when the client connects, and
again by every task, so a worker that joins later cannot make an item either. A cluster that has
had no worker for :data:`NO_WORKER_TIMEOUT_S` (60 s) while a map waits on it (its last worker
died or left, or none ever joined) would wait for ever: the map's tasks are cancelled and
:class:`NoWorkersError` says so in one line naming the scheduler's address.

:class:`Workers` starts that cluster in a background thread, so the caller can do its own
serial work (reading manifests, decoding sources) while the worker processes boot and import
their modules; ``map_ordered(..., workers=w)`` then runs on it, and several calls share it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TypeVar

import dask
from tqdm import tqdm

from pipeline.config.params import ComputeParams
from pipeline.determinism import VARIABLE, baseline_group, numpy_kernels

SINGLE_THREADED_LIBRARIES = {"OMP_NUM_THREADS": 1, "MKL_NUM_THREADS": 1, "OPENBLAS_NUM_THREADS": 1}
# A local worker's statistical profiler takes the GIL every 10 ms to walk the task's stack (for the
# dashboard, which a local cluster here does not start); it cost the mix stage's workers about 15% CPU.
QUIET_WORKERS = {"distributed.worker.profile.enabled": False}
NANNY_ENVIRON = (*SINGLE_THREADED_LIBRARIES, "PYTHONHASHSEED", "MALLOC_TRIM_THRESHOLD_")  # what a nanny may set in this process

CONNECT_TIMEOUT_S = 10  # for the scheduler's handshake too, which distributed itself waits for without limit
# How long a map waits on a cluster with no worker before giving up (dask would wait for ever): long
# enough for a worker to be restarted or to join, short next to a stage's run.
NO_WORKER_TIMEOUT_S = 60.0
NO_WORKER_CHECK_S = 1.0  # how often the scheduler is asked for its workers while a map waits

T = TypeVar("T")
R = TypeVar("R")


class ComputeError(ValueError):
    """The configured dask cluster cannot be used; the message names it and says what to do."""


class NoWorkersError(ComputeError):
    """The cluster had no worker for :data:`NO_WORKER_TIMEOUT_S` while a map waited on it."""


def _run_chunk(fn: Callable[[T], R], chunk: Sequence[T], kernels: str | None = None) -> list[R]:
    """``[fn(item) for item in chunk]``; with ``kernels`` (the caller's :func:`numpy_kernels`), first
    refuse to run on a worker whose numpy kernels differ, whenever that worker joined."""
    if kernels is not None and numpy_kernels() != kernels:
        from distributed import get_worker

        raise ComputeError(_kernels_differ(f"dask worker {get_worker().address} uses", numpy_kernels(), kernels))
    return [fn(item) for item in chunk]


@contextmanager
def dask_client(compute: ComputeParams) -> Iterator["object"]:
    """A ``distributed.Client`` for the configured scheduler, closed on exit."""
    from distributed import Client, LocalCluster

    if compute.scheduler == "local":
        # distributed's default worker environment sets MALLOC_TRIM_THRESHOLD_, which turns
        # off glibc's adaptive mmap threshold: every large numpy temporary is then mapped and
        # unmapped afresh, and page faults tripled the system time of the stages. Keep the
        # one-thread-per-library settings only.
        with (
            dask.config.set({"distributed.nanny.pre-spawn-environ": SINGLE_THREADED_LIBRARIES, **QUIET_WORKERS}),
            _environ_kept(NANNY_ENVIRON),
        ):
            cluster = LocalCluster(
                n_workers=compute.workers,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                # a local worker's failure reaches the stage through its task (its exception, or
                # KilledWorker); what the workers log at ERROR is a heartbeat racing the shutdown
                silence_logs=logging.CRITICAL,
            )
        try:
            with Client(cluster) as client:
                yield client
        finally:
            cluster.close()
    else:
        check_scheduler(compute.scheduler, CONNECT_TIMEOUT_S)
        try:
            client = Client(compute.scheduler, timeout=CONNECT_TIMEOUT_S)
        except OSError as e:  # it went away between the check and the connection
            raise ComputeError(
                f"compute.scheduler {compute.scheduler}: {e}; start the scheduler there, or set compute.scheduler: local"
            ) from None
        with client:
            _check_kernels(client, compute.scheduler)
            _warn_slow_settings(client, compute.scheduler)
            yield client


def check_scheduler(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Raise :class:`ComputeError` unless a dask scheduler answers at ``address`` within ``timeout_s``.

    A closed port fails within the timeout; a server of another kind (HTTP, a bare TCP listener)
    that accepts and never answers distributed's handshake would leave ``Client`` waiting forever.
    """
    from distributed.comm import connect
    from distributed.security import Security

    async def handshake() -> None:
        # connect() gives up on a closed port after timeout_s; the margin lets that error, not this
        # deadline, name a closed port, while the deadline ends a handshake nobody answers
        comm = await asyncio.wait_for(
            connect(address, timeout=timeout_s, **Security().get_connection_args("client")), timeout_s + 2
        )
        await comm.close()

    try:
        with ThreadPoolExecutor(max_workers=1) as pool:  # a loop of its own, even where the caller runs one
            pool.submit(asyncio.run, handshake()).result()
    except (asyncio.TimeoutError, TimeoutError):  # one class from Python 3.11
        raise ComputeError(
            f"compute.scheduler {address}: something accepts connections there but no dask scheduler "
            f"answered within {timeout_s + 2:g} s; point compute.scheduler at the scheduler's address "
            "(tcp://host:8786), or set compute.scheduler: local"
        ) from None
    except (OSError, ValueError, TypeError) as e:  # a closed port, an unknown host, a bad address, a garbled answer
        raise ComputeError(
            f"compute.scheduler {address}: no dask scheduler there ({type(e).__name__}: {e}); start one "
            "(`dask scheduler`), fix the address, or set compute.scheduler: local"
        ) from None


def _kernels_differ(who: str, kernels: str, here: str) -> str:
    """The one line for workers (``who``: "dask worker tcp://... uses") whose numpy kernels differ from this process's."""
    return (
        f"{who} numpy kernels {kernels!r} where this process uses {here!r}, so its outputs would differ in the last "
        f"bits; start the workers with {VARIABLE}={baseline_group() or '<numpy baseline>'} in their environment, as "
        "`sedsynth` sets it for itself"
    )


def _check_kernels(client, scheduler: str) -> None:
    """Refuse a remote cluster whose workers' numpy kernels differ from this process's: the
    bytes of an item would depend on the worker that made it (:mod:`pipeline.determinism`).
    Workers that join later are checked by each task (:func:`_run_chunk`)."""
    here = numpy_kernels()
    off = {worker: kernels for worker, kernels in client.run(numpy_kernels).items() if kernels != here}
    if off:
        worker, kernels = next(iter(off.items()))
        who = f"{len(off)} of its dask workers (e.g. {worker}) use"
        raise ComputeError(f"compute.scheduler {scheduler}: {_kernels_differ(who, kernels, here)}")


WORKER_CONFIG = "configs/dask-worker.yaml"  # the settings below, for `dask worker` (DASK_CONFIG), in the checkout


def worker_settings() -> dict[str, object]:
    """This process's settings that slow a stage's work down (:func:`_warn_slow_settings`)."""
    return {
        "MALLOC_TRIM_THRESHOLD_": os.environ.get("MALLOC_TRIM_THRESHOLD_"),
        "distributed.worker.profile.enabled": dask.config.get("distributed.worker.profile.enabled", True),
    }


def _warn_slow_settings(client, scheduler: str) -> None:
    """One line on stderr where the workers of a remote cluster run as dask starts them by default:
    their nanny sets MALLOC_TRIM_THRESHOLD_ (glibc then maps and unmaps every large temporary
    afresh) and the statistical profiler takes the GIL every 10 ms. The corpus stage ran 1.7x
    slower on such workers (Benchmarks); the bytes are the same."""
    answers = client.run(worker_settings, on_error="return")  # a worker that fails to answer is no reason to stop
    slow = {w: [k for k, v in got.items() if v not in (None, False)] for w, got in answers.items() if isinstance(got, dict)}
    slow = {w: found for w, found in slow.items() if found}
    if slow:
        worker, found = next(iter(slow.items()))
        config = Path(__file__).resolve().parents[1] / WORKER_CONFIG
        print(
            f"compute.scheduler {scheduler}: {len(slow)} of its dask workers (e.g. {worker}) run with {' and '.join(found)} "
            f"set, which made stages up to 1.7x slower; start them with DASK_CONFIG={config if config.is_file() else WORKER_CONFIG}",
            file=sys.stderr,
        )


@contextmanager
def _environ_kept(names: tuple[str, ...]) -> Iterator[None]:
    """Put back these environment variables as they were: a local cluster's nanny runs in this
    process and sets its workers' variables in ``os.environ`` before spawning them, where they
    would stay (one thread each for this process's later libraries, or MALLOC_TRIM_THRESHOLD_
    for the workers of the next cluster)."""
    before = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def runs_in_process(compute: ComputeParams) -> bool:
    """True where ``compute`` runs work in the calling process (``workers: 1`` on the local scheduler)."""
    return compute.scheduler == "local" and compute.workers <= 1


def _import_modules(modules: tuple[str, ...]) -> None:
    for name in modules:
        importlib.import_module(name)


class Workers:
    """The configured dask workers, started in a background thread when this object is made.

    Input: ``compute`` and ``preload``, module names every worker imports as soon as it is up
    (the modules its tasks will need). ``client()`` waits for the cluster and returns its
    ``distributed.Client``, or None where work runs in the calling process. Use as a context
    manager (or call ``close()``): the cluster is shut down on exit.
    """

    def __init__(self, compute: ComputeParams, preload: tuple[str, ...] = ()):
        self.compute = compute
        self._stack = ExitStack()
        self._boot: Future | None = None
        self._closing: Future | None = None
        if not runs_in_process(compute):
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dask-boot")
            self._boot = self._pool.submit(self._start, preload)

    def _start(self, preload: tuple[str, ...]) -> "object":
        client = self._stack.enter_context(dask_client(self.compute))
        if preload:
            client.run(_import_modules, preload)
        return client

    def client(self) -> "object | None":
        return self._boot.result() if self._boot is not None else None

    def begin_close(self) -> None:
        """Start shutting the cluster down in the background (once its work is done); ``close()`` waits for it."""
        if self._boot is not None and self._closing is None:
            self._closing = self._pool.submit(self._stack.close)  # runs after the boot: one thread, in order

    def close(self) -> None:
        if self._boot is None:
            return
        try:
            self.begin_close()
            self._closing.result()
        finally:
            self._pool.shutdown()
            self._boot = None

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _NoWorkerWatch:
    """Cancels ``futures`` once the cluster behind ``client`` has had no worker for
    :data:`NO_WORKER_TIMEOUT_S`, counted from when the watch starts; checked every
    :data:`NO_WORKER_CHECK_S` from a daemon thread, so waiting on the futures costs nothing more.
    ``fired`` says whether it did. A context manager: the watch stops on exit."""

    def __init__(self, client, futures: list) -> None:
        self.fired = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(client, futures), name="dask-no-worker-watch", daemon=True)

    def _has_workers(self, client) -> bool:
        try:
            return bool(client.nthreads())
        except Exception:  # the scheduler does not answer: no worker can be reached through it either
            return False

    def _watch(self, client, futures: list) -> None:
        last_seen = time.monotonic()
        while not self._stop.wait(NO_WORKER_CHECK_S):
            now = time.monotonic()
            if self._has_workers(client):
                last_seen = now
            elif now - last_seen >= NO_WORKER_TIMEOUT_S:
                self.fired = True
                client.cancel(futures)
                return

    def __enter__(self) -> "_NoWorkerWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        # a check under way may wait on a scheduler that went away; the daemon thread then ends by itself
        self._thread.join(timeout=2 * NO_WORKER_CHECK_S)


def _no_workers(compute: ComputeParams, client, pending: int, total: int) -> NoWorkersError:
    """The one line for a map given up on because its cluster had no worker."""
    address = getattr(getattr(client, "scheduler", None), "address", None) or compute.scheduler
    if compute.scheduler == "local":
        return NoWorkersError(
            f"compute.scheduler local: the local dask cluster ({address}) has had no worker for "
            f"{NO_WORKER_TIMEOUT_S:g} s, so {pending} of {total} tasks could not run (its worker processes "
            "died and were not restarted); run again, with fewer compute.workers if memory ran out"
        )
    return NoWorkersError(
        f"compute.scheduler {compute.scheduler}: the dask scheduler at {address} has had no worker for "
        f"{NO_WORKER_TIMEOUT_S:g} s (the last one died or left), so {pending} of {total} tasks could not "
        f"run; start workers for it (`dask worker {address}`) and run again, or set compute.scheduler: local"
    )


def map_ordered(
    fn: Callable[[T], R], items: Sequence[T], compute: ComputeParams, desc: str, workers: Workers | None = None
) -> list[R]:
    """``[fn(item) for item in items]``, spread over the configured dask workers.

    ``workers`` (optional): an already started :class:`Workers` to run on instead of a
    cluster started and shut down for this call. Raises :class:`NoWorkersError` (its tasks
    cancelled) when the cluster has had no worker for :data:`NO_WORKER_TIMEOUT_S`.
    """
    items = list(items)
    size = compute.chunk_size
    chunks = [items[i : i + size] for i in range(0, len(items), size)]
    bar = tqdm(total=len(items), desc=desc, unit="item", disable=None, dynamic_ncols=True)
    results: list[list[R] | None] = [None] * len(chunks)
    try:
        if runs_in_process(compute):
            for i, chunk in enumerate(chunks):
                results[i] = _run_chunk(fn, chunk)
                bar.update(len(chunk))
        elif chunks:
            from distributed import as_completed

            with ExitStack() as stack:
                client = workers.client() if workers is not None else stack.enter_context(dask_client(compute))
                kernels = [numpy_kernels()] * len(chunks)
                futures = client.map(_run_chunk, [fn] * len(chunks), chunks, kernels, pure=False)
                index = {f.key: i for i, f in enumerate(futures)}
                watch = stack.enter_context(_NoWorkerWatch(client, futures))
                try:
                    for future in as_completed(futures):
                        i = index[future.key]
                        results[i] = future.result()
                        bar.update(len(chunks[i]))
                except (asyncio.CancelledError, concurrent.futures.CancelledError):
                    if not watch.fired:  # cancelled by something else: as dask reports it
                        raise
                    raise _no_workers(compute, client, sum(r is None for r in results), len(chunks)) from None
    finally:
        bar.close()
    return [r for chunk in results for r in chunk]  # type: ignore[union-attr]
