"""Benchmarks that print figures next to a peer measured in the same run.

One subcommand per benchmark, each with its own flags (:data:`BENCHMARKS`): ``sedsynth bench mix``: see
:mod:`benchmarks.mix_stage`; ``sedsynth bench mixing``: see :mod:`benchmarks.dynamic_mixing`; ``sedsynth bench shards``: see
:mod:`benchmarks.shards`; ``sedsynth bench import``: see :mod:`benchmarks.imports`; ``sedsynth bench llm-cache``: see
:mod:`benchmarks.llm_cache`; ``sedsynth bench scale``: see :mod:`benchmarks.scale`; ``sedsynth bench train``, ``evaluate`` and ``detection``: see :mod:`benchmarks.train`,
:mod:`benchmarks.evaluate` and :mod:`benchmarks.detection`.

``sedsynth bench clip``: clipping throughput against decoding the same files, all on one
core in this process, in seconds of source audio per second. Passes over every
single-label candidate file:

- ``decode``: ``soundfile.read(path, dtype="float32")``, the plain decode (the peer);
- ``decode + resample``: the same, downmixed and resampled to the pipeline rate with
  libsoxr, which is what loading audio for a 16 kHz model costs;
- ``output floor``: decode, then resample and write as FLAC only the segments the stage
  keeps, with no analysis: the least work that produces the stage's audio;
- ``clipping stage``: the stage's whole per-file work (decode, downmix, segment, resample,
  measure RMS, loudness and envelope, write FLAC).

Files are read once before timing so every pass sees a warm page cache; the passes run
``--repeat`` times, interleaved, and the best time of each is reported.

``--save PATH`` (every benchmark) also writes the run as a result file, the format of
``benchmarks/results/`` (:func:`save_result`): the figures the benchmark returned, the lines it
printed, the command that reproduces it, the machine and the commit.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import math
import os
import platform
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import soundfile as sf

from trainer.config import Params

RESULTS = Path(__file__).resolve().parent / "results"  # the committed result files


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_clip(params: Params, corpus: Path | None, n_clips: int, repeat: int) -> dict:
    from pipeline.audio import downmix, quantize_int16, resample, write_flac
    from pipeline.clip.cutting import clip_one, plan_clips
    from pipeline.corpus import write_fsd50k_corpus
    from pipeline.schema import EventClip

    with tempfile.TemporaryDirectory(prefix="sedsynth-bench-") as tmp:
        tmp_path = Path(tmp)
        if corpus is None:
            corpus = tmp_path / "fsd50k"
            t0 = time.perf_counter()
            write_fsd50k_corpus(corpus, n_clips=n_clips, seed=params.corpus.seed)
            print(f"generated {n_clips} FSD50K-layout clips in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        tasks, _ = plan_clips(corpus, params.clip)
        paths = [t.clip.audio_path for t in tasks if t.clip.audio_path.exists()]
        source_s = sum(sf.info(str(p)).duration for p in paths)
        for p in paths:  # warm the page cache for both passes
            p.read_bytes()
        audio_dir = tmp_path / "audio"
        floor_dir = tmp_path / "floor"
        target_hz = params.sample_rate_hz

        def decode() -> None:
            for p in paths:
                sf.read(str(p), dtype="float32")

        def decode_resample() -> None:
            for p in paths:
                x, sr = sf.read(str(p), dtype="float32", always_2d=True)
                resample(downmix(x), sr, target_hz)

        results: list = []

        def clipping() -> None:
            results.clear()
            results.extend(clip_one(t, params.clip, target_hz, audio_dir) for t in tasks)

        clipping()
        kept = {r.clip_id: r for r in results if isinstance(r, EventClip)}

        def output_floor() -> None:
            for t in tasks:
                x, sr = sf.read(str(t.clip.audio_path), dtype="float32", always_2d=True)
                r = kept.get(t.clip.clip_id)
                if r is not None:
                    a, b = round(r.onset_in_source_s * sr), round(r.offset_in_source_s * sr)
                    write_flac(
                        floor_dir / f"{r.clip_id}.flac", quantize_int16(resample(downmix(x[a:b]), sr, target_hz)), target_hz
                    )

        passes = {"decode": decode, "decode_resample": decode_resample, "output_floor": output_floor, "clip": clipping}
        best = {name: float("inf") for name in passes}
        for _ in range(repeat):
            for name, fn in passes.items():
                best[name] = min(best[name], _timed(fn))
        figures = {
            "files": len(paths),
            "source_hours": source_s / 3600,
            "kept_clips": len(kept),
            **{f"{name}_source_s_per_s": source_s / t for name, t in best.items()},
            "clip_files_per_s": len(paths) / best["clip"],
            "ratio_clip_to_decode": best["decode"] / best["clip"],
            "ratio_floor_to_decode": best["decode"] / best["output_floor"],
            "ratio_clip_to_decode_resample": best["decode_resample"] / best["clip"],
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
    return figures


def _clip(args: argparse.Namespace, params: Params) -> dict:
    f = bench_clip(params, Path(args.corpus) if args.corpus else None, args.clips, args.repeat)
    print(f"bench clip: {f['files']} single-label files, {f['source_hours'] * 60:.1f} min of source audio, one core")
    print("  seconds of source audio per second:")
    print(f"    decode (soundfile.read, float32)        {f['decode_source_s_per_s']:8.0f}   <- peer")
    print(f"    decode + resample to {params.sample_rate_hz} Hz           {f['decode_resample_source_s_per_s']:8.0f}")
    print(f"    output floor (decode, resample + FLAC)  {f['output_floor_source_s_per_s']:8.0f}")
    print(
        f"    clipping stage                          {f['clip_source_s_per_s']:8.0f}   ({f['clip_files_per_s']:.0f} files/s, {f['kept_clips']} kept)"
    )
    print(f"  clipping / decode              {f['ratio_clip_to_decode']:6.2f}   (target >= 0.70)")
    print(f"  output floor / decode          {f['ratio_floor_to_decode']:6.2f}")
    print(f"  clipping / (decode + resample) {f['ratio_clip_to_decode_resample']:6.2f}")
    print(f"  peak RSS                       {f['peak_rss_mib']:6.0f} MiB")
    return f


def _mix(args: argparse.Namespace, params: Params) -> dict | list:
    from benchmarks.mix_stage import bench_mix, print_figures

    workers = [int(w) for w in args.workers.split(",")]
    figures = bench_mix(params, args.mixtures, workers, args.scaper_python, args.scaper_mixtures, args.repeat, args.profile)
    print_figures(figures)
    return figures


def _shards(args: argparse.Namespace, params: Params) -> dict | list:
    from benchmarks.shards import bench_shards, print_figures

    figures = bench_shards(params, args.repeat)
    print_figures(figures)
    return figures


def _import(args: argparse.Namespace, params: Params) -> dict | list:
    from benchmarks.imports import bench_import, print_figures

    figures = bench_import(params, args.clips)
    print_figures(figures)
    return figures


def _mixing(args: argparse.Namespace, params: Params) -> dict | list:
    from benchmarks.dynamic_mixing import bench_dynamic_mixing, print_figures

    figures = bench_dynamic_mixing(params, args.rows, args.scaper_python, args.repeat)
    print_figures(figures)
    return figures


def _train(args: argparse.Namespace, params: Params) -> dict | list:
    from benchmarks.train import print_figures, run

    figures = run(params, args.rows, args.steps, args.preset, args.peak_tflops, args.profile, args.batch, args.batches)
    print_figures(figures)
    return figures


def _evaluate(args: argparse.Namespace, params: Params) -> dict | list:
    from benchmarks.evaluate import print_figures, run

    figures = run(args.clips)
    print_figures(figures)
    return figures


def _detection(args: argparse.Namespace, params: Params) -> dict | list:
    from benchmarks.detection import print_figures, run

    figures = run(params, Path(args.out), args.epochs, score_only=args.score_only)
    print_figures(figures)
    return figures


def _real_library(args: argparse.Namespace, params: Params) -> dict | list:
    from benchmarks.real_library import NoSoundsError, print_figures, run

    if not args.sounds:
        raise NoSoundsError("bench real-library: pass --sounds DIR, the folder the Debian sound packages were unpacked into")
    figures = run(params, Path(args.sounds), Path(args.out))
    default = RESULTS / "default.json"
    print_figures(figures, json.loads(default.read_text(encoding="utf-8")) if default.is_file() else None)
    return figures


def _llm_cache(args: argparse.Namespace, params: Params) -> dict | list:
    from benchmarks.llm_cache import bench_llm_cache, print_figures

    figures = bench_llm_cache(rewrites=args.repeat)
    print_figures(figures)
    return figures


def _scale(args: argparse.Namespace, params: Params) -> dict | list:
    from benchmarks.scale import bench_scale, print_figures

    figures = bench_scale(args, params)
    print_figures(figures)
    return figures


# ``sedsynth bench NAME`` -> the function that runs it with its flags and prints its figures
BENCHMARKS = {
    "clip": _clip,
    "mix": _mix,
    "shards": _shards,
    "import": _import,
    "mixing": _mixing,
    "train": _train,
    "evaluate": _evaluate,
    "detection": _detection,
    "real-library": _real_library,
    "llm-cache": _llm_cache,
    "scale": _scale,
}


# parsed arguments every ``sedsynth`` command has, or that say which command ran: not a benchmark's flags
_SHARED = ("command", "what", "fn", "params", "overrides", "set", "save")


def command_line(args: argparse.Namespace) -> str:
    """The ``sedsynth bench`` command that reproduces ``args``: every flag of the benchmark with its value."""
    parts = ["sedsynth", "bench", args.what]
    if getattr(args, "params", "params.yaml") != "params.yaml":
        parts += ["--params", args.params]
    for flag in ("overrides", "set"):
        for value in getattr(args, flag, None) or []:
            parts += [f"--{flag}", value]
    for key, value in vars(args).items():
        if key in _SHARED or value is None or value is False:
            continue
        parts += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return shlex.join(parts)


def machine() -> str:
    """The CPU (model name, cores) and, where torch is loaded and sees one, the GPU."""
    model = platform.machine()
    try:
        found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
        model = found.group(1).strip() if found else model
    except OSError:
        pass
    text = f"{model}, {os.cpu_count()} CPU cores"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        text += f", {torch.cuda.get_device_name(0)}"
    return text


def commit() -> str | None:
    """The checkout's commit, ``+modified`` when its tracked files differ from it; None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode:
        return None
    return head.stdout.strip() + ("+modified" if dirty.stdout.strip() else "")


def jsonable(value):
    """``value`` as JSON holds it: mappings with string keys, lists, finite numbers (else None), strings."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, (list, tuple, set)):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy scalars and arrays
        return jsonable(value.tolist())
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return str(value)


class _Tee(io.TextIOBase):
    """Writes to the terminal and keeps a copy."""

    def __init__(self, out) -> None:
        self.out, self.kept = out, io.StringIO()

    def write(self, text: str) -> int:
        self.kept.write(text)
        return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()


def save_result(path: Path, args: argparse.Namespace, figures, printed: str) -> None:
    """Write one run as a result file (the format of ``benchmarks/results/``): the benchmark, the
    command, the commit, the machine, its figures as the benchmark returned them and the lines it printed."""
    result = {
        "benchmark": args.what,
        "command": command_line(args),
        "commit": commit(),
        "machine": machine(),
        "figures": jsonable(figures),
        "printed": printed.splitlines(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def main(args: argparse.Namespace, params: Params) -> int:
    """Run the benchmark ``args.what`` names (a ``sedsynth bench`` subcommand, its flags in ``args``) with
    ``params`` and print its figures; with ``--save PATH`` also write them as a result file
    (:func:`save_result`). Returns the exit status."""
    save = getattr(args, "save", None)
    if save is None:
        BENCHMARKS[args.what](args, params)
        return 0
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        figures = BENCHMARKS[args.what](args, params)
    save_result(Path(save), args, figures, tee.kept.getvalue())
    print(f"bench {args.what}: figures saved to {save}", file=sys.stderr)
    return 0
