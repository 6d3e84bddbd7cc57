"""Running a function over many items with dask, in item order, with a progress bar.

Input: a module-level function, a list of items and :class:`ComputeParams`. Output: the
function's results in the order of the items, whatever the number of workers or the order
they finish in. ``workers: 1`` on the local scheduler runs in the calling process (no
cluster start-up); otherwise a ``dask.distributed`` LocalCluster of single-threaded worker
processes runs the chunks, or the cluster behind ``scheduler: tcp://host:port`` does. Workers
of a remote cluster must see the same paths (a shared filesystem) and have this package
installed.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence, TypeVar

import dask
from tqdm import tqdm

from pipeline.config.params import ComputeParams

SINGLE_THREADED_LIBRARIES = {"OMP_NUM_THREADS": 1, "MKL_NUM_THREADS": 1, "OPENBLAS_NUM_THREADS": 1}

T = TypeVar("T")
R = TypeVar("R")


def _run_chunk(fn: Callable[[T], R], chunk: Sequence[T]) -> list[R]:
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
        with dask.config.set({"distributed.nanny.pre-spawn-environ": SINGLE_THREADED_LIBRARIES}):
            cluster = LocalCluster(
                n_workers=compute.workers,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                silence_logs=logging.ERROR,
            )
        try:
            with Client(cluster) as client:
                yield client
        finally:
            cluster.close()
    else:
        with Client(compute.scheduler) as client:
            yield client


def map_ordered(fn: Callable[[T], R], items: Sequence[T], compute: ComputeParams, desc: str) -> list[R]:
    """``[fn(item) for item in items]``, spread over the configured dask workers."""
    items = list(items)
    size = compute.chunk_size
    chunks = [items[i : i + size] for i in range(0, len(items), size)]
    bar = tqdm(total=len(items), desc=desc, unit="item", disable=None, dynamic_ncols=True)
    results: list[list[R] | None] = [None] * len(chunks)
    try:
        if compute.scheduler == "local" and compute.workers <= 1:
            for i, chunk in enumerate(chunks):
                results[i] = _run_chunk(fn, chunk)
                bar.update(len(chunk))
        elif chunks:
            from distributed import as_completed

            with dask_client(compute) as client:
                futures = client.map(_run_chunk, [fn] * len(chunks), chunks, pure=False)
                index = {f.key: i for i, f in enumerate(futures)}
                for future in as_completed(futures):
                    i = index[future.key]
                    results[i] = future.result()
                    bar.update(len(chunks[i]))
    finally:
        bar.close()
    return [r for chunk in results for r in chunk]  # type: ignore[union-attr]
