"""Giving freed memory back: glibc's heap and Arrow's pool shrink when asked, and a polled
releaser asks at most once per period."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import trainer.memory as memory


def rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def test_release_freed_heap_gives_back_what_glibc_keeps():
    """Blocks under glibc's mmap threshold are carved from its heap; freed below a block still in
    use, they stay resident until ``malloc_trim``."""
    libc = ctypes.CDLL(None)
    if getattr(libc, "malloc_trim", None) is None:
        pytest.skip("no glibc here: nothing to trim")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    memory.release_freed_heap()
    blocks = [libc.malloc(64 << 10) for _ in range(3200)]  # 200 MiB in 64 KiB blocks
    pin = libc.malloc(64 << 10)  # the heap's top stays in use, so freeing cannot just lower the break
    for b in blocks:
        ctypes.memset(b, 1, 64 << 10)  # resident
    for b in blocks:
        libc.free(b)
    kept = rss()
    memory.release_freed_heap()
    released = kept - rss()
    libc.free(pin)
    assert released > 150 << 20


def test_release_freed_heap_gives_back_what_arrow_s_pool_keeps():
    import pyarrow as pa

    pool = pa.default_memory_pool()
    if pool.backend_name == "system":
        pytest.skip("Arrow allocates from the C heap here: malloc_trim is the release")
    memory.release_freed_heap()
    before = rss()
    buffers = [pa.allocate_buffer(64 << 20) for _ in range(3)]
    for b in buffers:
        np.frombuffer(b, np.uint8)[:] = 1  # resident
    del buffers, b
    kept = rss()  # freed, but the pool keeps its pages for its next allocations
    if kept - before < 100 << 20:
        pytest.skip(f"Arrow's {pool.backend_name} pool gave its pages back by itself")
    memory.release_freed_heap()
    assert kept - rss() > 100 << 20


def test_a_releaser_releases_at_most_once_per_period(monkeypatch):
    clock, released = [100.0], []
    monkeypatch.setattr(memory.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(memory, "release_freed_heap", lambda: released.append(clock[0]))
    heap = memory.HeapReleaser(every_s=30)
    for t in (100.0, 110.0, 129.9, 130.0, 131.0, 159.0, 175.0, 500.0):
        clock[0] = t
        heap.poll()
    assert released == [130.0, 175.0, 500.0]  # the first poll starts the clock; each release starts it again
    assert memory.HeapReleaser().every_s == memory.RELEASE_EVERY_S
