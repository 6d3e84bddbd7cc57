"""``sedsynth bench mix``: mixing throughput and memory, with Scaper measured in the same run.

Input: event clips and background segments (the configured stage outputs if they exist,
else a generated embedded corpus run through the clip and ambience stages). Output: printed
figures. The whole mix stage runs (bank, partitions, FLAC at sample_rate_hz, tables,
DCASE metadata, txt per mixture; no picture) for ``--mixtures`` train mixtures with 1 and with
2 local workers. Memory is the peak of the summed resident memory of this process and its
workers, sampled every 0.1 s (pages of the memory-mapped bank shared by workers are counted
once per worker, so this over-counts).

The peer: Scaper 1.6.5 in its own environment (``--scaper-python``, default
``.venv-scaper/bin/python`` if present) makes ``--scaper-mixtures`` soundscapes from the
same clips and backgrounds with the same spec (1-5 distinct events, clips under 3 s
repeated 1-3 times, SNR ~ U(12, 20) dB, 10 ms fades, no pitch shift, time stretch or
reverb), writing its WAV + JAMS + txt, one core. The ratio compares mixtures per second per core.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pipeline.outputs import MANIFEST
from pipeline.config.params import MixtureCounts
from trainer.config import Params

TARGET_SCALING_2_WORKERS = 1.8  # 2 workers' rate over 1 worker's
TARGET_100K_MIN_2_WORKERS = 6  # minutes for 100k mixtures on 2 workers


class PeakMemory:
    """Peak of the summed RSS of this process and all its descendants, sampled in a thread."""

    def __init__(self, interval_s: float = 0.1):
        import psutil

        self._proc = psutil.Process()
        self._interval = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        total = 0
        for p in [self._proc, *self._proc.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except Exception:  # a worker that just exited
                pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, self._sample())
            self._stop.wait(self._interval)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_bytes = max(self.peak_bytes, self._sample())


def _sources(params: Params, tmp: Path) -> tuple[Path, Path]:
    events, backgrounds = Path(params.clip.out_dir), Path(params.ambience.out_dir)
    if (events / MANIFEST).exists() and (backgrounds / MANIFEST).exists():
        return events, backgrounds
    from pipeline.stages import ambience, clip
    from pipeline.corpus import write_ambience_library, write_fsd50k_corpus

    print("bench mix: no stage outputs found; generating the embedded corpus, clips and backgrounds", file=sys.stderr)
    write_fsd50k_corpus(tmp / "fsd50k", n_clips=params.corpus.fsd50k_clips, seed=params.corpus.seed)
    write_ambience_library(tmp / "ambience", n_recordings=params.corpus.ambience_recordings, seed=params.corpus.seed)
    clip.run(params, tmp / "fsd50k", tmp / "events")
    ambience.run(params, tmp / "ambience", tmp / "backgrounds")
    return tmp / "events", tmp / "backgrounds"


def _scaper(python: str, events_dir: Path, backgrounds_dir: Path, params: Params, n: int, tmp: Path) -> dict:
    import pyarrow.parquet as pq

    from pipeline.config.mix_spec import resolve_spec

    spec = resolve_spec(params.mix.preset, params.mix.spec, sample_rate_hz=params.sample_rate_hz)
    ev = pq.read_table(events_dir / MANIFEST, columns=["label", "audio_path", "duration_s"]).to_pylist()
    bg = pq.read_table(backgrounds_dir / MANIFEST, columns=["audio_path"]).to_pylist()
    config = {
        "events": [[e["label"], str((events_dir / e["audio_path"]).resolve()), e["duration_s"]] for e in ev],
        "backgrounds": [str((backgrounds_dir / b["audio_path"]).resolve()) for b in bg],
        "mixtures": n, "seed": params.seed, "sample_rate_hz": spec.sample_rate_hz,
        "duration_s": spec.duration_s.bounds()[1], "snr_db": list(spec.snr_db.bounds()),
        "events_per_mixture": [int(v) for v in spec.events_per_mixture.values],
        "repeat_below_s": spec.repetition.max_clip_s or 1e9, "repeat_counts": [int(v) for v in spec.repetition.count.values],
        "fade_s": spec.fade_in_s.bounds()[1], "out_dir": str(tmp / "scaper"),
    }
    (tmp / "scaper.json").write_text(json.dumps(config))
    script = Path(__file__).with_name("scaper_peer.py")
    done = subprocess.run([python, str(script), str(tmp / "scaper.json")], capture_output=True, text=True,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    if done.returncode != 0:
        raise RuntimeError(f"Scaper peer failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_mix(params: Params, mixtures: int, workers: list[int], scaper_python: str | None, scaper_mixtures: int,
              repeat: int = 1) -> dict:
    """Time the mix stage ``repeat`` times per worker count, the counts interleaved (1, 2, 1, 2, ...),
    and keep each count's fastest pass: this VM's speed drifts within minutes, and interleaving
    exposes both counts to the same drift. The dirty pages of a pass are flushed (``os.sync``)
    before the next is timed, so no pass pays for writing the previous one's files."""
    from pipeline.stages.mix import run

    figures: dict = {"mixtures": mixtures, "preset": params.mix.preset, "runs": {}, "repeat": repeat}
    with tempfile.TemporaryDirectory(prefix="sedsynth-bench-mix-") as tmp_name:
        tmp = Path(tmp_name)
        events_dir, backgrounds_dir = _sources(params, tmp)
        mix = dataclasses.replace(params.mix, mixtures=MixtureCounts(train=mixtures, valid=0, test=0),
                                  export=dataclasses.replace(params.mix.export, jams=False, timelines=0))
        configs = {w: dataclasses.replace(params, compute=dataclasses.replace(params.compute, workers=w), mix=mix) for w in workers}
        passes: dict[int, list[tuple[float, float]]] = {w: [] for w in workers}  # worker count -> [(seconds, peak MiB)]
        for _ in range(max(1, repeat)):
            for w, p in configs.items():
                out = tmp / f"mix-{w}"
                os.sync()
                with PeakMemory() as mem:
                    t0 = time.perf_counter()
                    run(p, events_dir, backgrounds_dir, out)
                    wall = time.perf_counter() - t0
                passes[w].append((wall, mem.peak_bytes / 2**20))
                shutil.rmtree(out)
        for w, timed in passes.items():
            wall = min(s for s, _ in timed)
            figures["runs"][w] = {"seconds": wall, "mixtures_per_s": mixtures / wall, "mixtures_per_s_per_core": mixtures / wall / w,
                                  "peak_rss_mib": max(m for _, m in timed), "pass_seconds": [s for s, _ in timed]}
        default = Path(".venv-scaper/bin/python")
        python = scaper_python or (str(default) if default.exists() else None)
        if python:
            peer = _scaper(python, events_dir, backgrounds_dir, params, scaper_mixtures, tmp)
            figures["scaper"] = {**peer, "mixtures_per_s": peer["mixtures"] / peer["seconds"]}
    return figures


def print_figures(f: dict) -> None:
    repeat = f.get("repeat", 1)
    best = f" (best of {repeat} interleaved passes)" if repeat > 1 else ""
    print(f"bench mix: {f['mixtures']} mixtures, preset {f['preset']}, whole stage (bank, FLAC, tables, DCASE metadata){best}")
    for w, r in f["runs"].items():
        each = ", ".join(f"{s:.1f}" for s in r.get("pass_seconds", [])) if repeat > 1 else ""
        print(f"  {w} worker(s): {r['seconds']:7.1f} s  {r['mixtures_per_s']:7.1f} mixtures/s  "
              f"{r['mixtures_per_s_per_core']:7.1f} per core  peak memory {r['peak_rss_mib']:7.0f} MiB"
              + (f"  (passes: {each} s)" if each else ""))
    one = f["runs"].get(1) or next(iter(f["runs"].values()))
    print(f"  target: >= 150 mixtures/s per core -> {'met' if one['mixtures_per_s_per_core'] >= 150 else 'NOT met'}")
    if 2 in f["runs"]:
        if 1 in f["runs"]:
            ratio = f["runs"][2]["mixtures_per_s"] / f["runs"][1]["mixtures_per_s"]
            print(f"  2 workers / 1 worker: {ratio:.2f}x the rate (target >= {TARGET_SCALING_2_WORKERS}x)")
        eta = 100_000 / f["runs"][2]["mixtures_per_s"] / 60
        print(f"  100k mixtures on 2 workers at this rate: {eta:.1f} min (target <= {TARGET_100K_MIN_2_WORKERS})")
    if "scaper" in f and f["scaper"]["mixtures"] and f["scaper"]["mixtures_per_s"] > 0:
        s = f["scaper"]
        print(f"  Scaper 1.6.5 (peer, 1 core, WAV+JAMS+txt): {s['mixtures']} mixtures in {s['seconds']:.1f} s = "
              f"{s['mixtures_per_s']:.1f} mixtures/s")
        print(f"  ratio per core: {one['mixtures_per_s_per_core'] / s['mixtures_per_s']:.1f}x Scaper (target >= 10x)")
    elif "scaper" in f:
        print("  Scaper peer: not run (--scaper-mixtures 0)")
    else:
        print("  Scaper peer: not run (no Scaper environment; see docs/benchmarks.md, 'Mixing')")
