"""``sedsynth bench llm-cache``: the cost of storing one completion in the LLM response cache.

For caches of 5,000 and 100,000 entries (timeline-caption prompts and answers of about
400 bytes a line, as ``captions.timeline`` stores one per mixture), times:

- ``append``: :meth:`ResponseCache.put`, one line appended with one write and an fsync (the
  cache), averaged over ``appends`` new entries;
- ``rewrite``: the peer, measured in the same run on the same entries: the earlier design
  that rewrote the whole cache as one sorted JSON document (temporary file, rename) per new
  entry, averaged over ``rewrites`` new entries;

and the bytes each writes per entry, the time to load the cache once, and what storing every
entry of a run of that many mixtures costs in all (the rewrite cost grows with the cache, so
its total is about half the last rewrite times the count).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from pipeline.outputs import write_atomic
from pipeline.text.llm import CACHE_HEADER, ResponseCache


def _entry(i: int) -> tuple[str, str]:
    prompt = (
        f"Write one caption for a {10.0:.1f} s recording, naming the events in the order they happen.\n"
        f"Events: a dog barking 0.{i % 10}-2.1, 6.3-7.0; rain 0.0-10.0; a car horn {i % 7}.4-{i % 7 + 1}.2 ({i})\n"
        "Answer with: Caption: <one sentence>"
    )
    return prompt, f"Caption: A dog barks twice over steady rain while a car horn sounds ({i})."


def _rewrite_whole_file(path: Path, entries: dict) -> None:
    """The earlier ``ResponseCache.put``: the whole cache, sorted, as one JSON document."""
    data = {"version": 1, "entries": dict(sorted(entries.items()))}
    write_atomic(path, (json.dumps(data, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))


def bench_llm_cache(sizes: tuple[int, ...] = (5_000, 100_000), appends: int = 200, rewrites: int = 3) -> dict:
    """Per-entry cost of the cache at each size against rewriting the whole file; returns the figures."""
    figures: dict = {"sizes": {}}
    with tempfile.TemporaryDirectory(prefix="sedsynth-bench-") as tmp:
        for size in sizes:
            path = Path(tmp) / f"cache-{size}.jsonl"
            lines = []
            for i in range(size):
                prompt, response = _entry(i)
                lines.append(
                    ResponseCache.line(ResponseCache.key("m", prompt), {"model": "m", "prompt": prompt, "response": response})
                )
            path.write_bytes(CACHE_HEADER + b"".join(lines))
            t0 = time.perf_counter()
            cache = ResponseCache(path)
            load_s = time.perf_counter() - t0

            new = [_entry(size + k) for k in range(appends)]
            append_bytes = sum(
                len(ResponseCache.line(ResponseCache.key("m", p), {"model": "m", "prompt": p, "response": r})) for p, r in new
            )
            t0 = time.perf_counter()
            for prompt, response in new:
                cache.put("m", prompt, response)
            append_s = (time.perf_counter() - t0) / appends

            old_path = Path(tmp) / f"cache-{size}.json"
            entries = dict(list(cache.entries.items())[:size])  # the same entries, without the appended ones
            rewrite_times = []
            rewrite_bytes = 0
            for prompt, response in new[:rewrites]:
                entries[ResponseCache.key("m", prompt)] = {"model": "m", "prompt": prompt, "response": response}
                t0 = time.perf_counter()
                _rewrite_whole_file(old_path, entries)
                rewrite_times.append(time.perf_counter() - t0)
                rewrite_bytes += old_path.stat().st_size
            rewrite_s = sum(rewrite_times) / len(rewrite_times)
            figures["sizes"][size] = {
                "append_s_per_entry": append_s,
                "append_bytes_per_entry": append_bytes / appends,
                "rewrite_s_per_entry": rewrite_s,
                "rewrite_bytes_per_entry": rewrite_bytes / len(rewrite_times),
                "load_s": load_s,
                "run_total_append_s": append_s * size,
                "run_total_rewrite_s": rewrite_s * size / 2,
                "speedup": rewrite_s / append_s,
            }
            for p in (path, old_path):
                p.unlink()
    return figures


def print_figures(f: dict) -> None:
    print("bench llm-cache: storing one completion (timeline-caption entries, ~400 bytes a line)")
    print(
        f"  {'entries':>8}  {'append (cache)':>15}  {'rewrite (peer)':>15}  {'speedup':>8}  {'bytes/entry append':>18}  "
        f"{'bytes/entry rewrite':>19}  {'load':>7}  {'run total append / rewrite':>26}"
    )
    for size, s in f["sizes"].items():
        print(
            f"  {size:>8,}  {s['append_s_per_entry'] * 1e3:>12.3f} ms  {s['rewrite_s_per_entry'] * 1e3:>12.1f} ms  "
            f"{s['speedup']:>7.0f}x  {s['append_bytes_per_entry']:>18,.0f}  {s['rewrite_bytes_per_entry']:>19,.0f}  "
            f"{s['load_s']:>5.2f} s  {s['run_total_append_s']:>10.1f} s / {s['run_total_rewrite_s']:>9,.0f} s"
        )
    print("  append: one line, one write and an fsync; rewrite: the whole cache as one JSON document per entry (no fsync)")
