"""``sedsynth bench scale``: the data stages at growing corpus sizes, so the growth law is visible.

Input: ``--sizes`` (clips of the generated FSD50K-layout corpus, e.g. ``1000,10000``; ``full`` is
FSD50K's 51,197) and the params. Per size, a folder ``<out>/<size>/`` receives an overrides file
(``overrides.yaml``) and every stage's output, and the stages of :data:`pipeline.config.stages.PIPELINE` run
in that order, each as its own ``sedsynth <stage> --overrides <out>/<size>/overrides.yaml``
process: corpus, clip, ambience, mix, captions, clusters, shards, and with ``--train`` one training
epoch streaming the shards and evaluate (pretrain is left out: its length is a step count, not the
data's size). The mixtures scale with the clips as in the paper's data (100,000 mixtures from
FSD50K's 51,197 clips), split as ``mix.mixtures`` splits them; the ambience recordings scale from
:data:`FULL_AMBIENCE_RECORDINGS` at full size, never below ``corpus.ambience_recordings``.

Output: per size a table printed (wall time, CPU seconds, peak RSS, output bytes, items and time per
item for each stage), then the growth between consecutive sizes (time per item and peak RSS, larger
over smaller: 1.0 is linear time and flat memory); ``<out>/scale.csv`` (one row per size and stage)
and ``<out>/scale.png`` (wall time and peak RSS against clips, log-log).

How each figure is measured, for the stage's process and every process under it (its dask nanny
and workers):

- wall: ``time.perf_counter`` around the process, Python start-up and imports included;
- CPU: user + system seconds from ``os.wait4`` on the stage process, which on Linux adds the
  usage of every descendant it waited for (the nanny waits for its workers, the cluster for its
  nannies), so the workers' seconds are in it;
- peak RSS: the largest sum of the resident memory of the process tree, sampled every 0.1 s with
  psutil (pages shared between processes, such as a memory-mapped bank read by two workers, count
  once per process, so this is an upper bound); ``anon`` is the same sum without the file-backed and
  shared pages (psutil's ``rss - shared``: the heap and the arrays, what the stage cannot hand back
  to the page cache), so a memory-mapped input read by two workers shows in ``peak RSS`` and not
  here (it still counts once per process the pages a forked worker shares with its parent); ``PSS``
  is the sum of the proportional set sizes (each resident page divided by the number of processes
  mapping it, file-backed or not), the memory the tree holds counted once; ``max proc`` is the
  largest single process's peak (``ru_maxrss`` from ``os.wait4``), which
  sampling cannot miss;
- output bytes: the size of every file under the folders the stage writes
  (:data:`pipeline.config.stages.OUTPUT_SETTINGS`), after it ends.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline.config.stages import OUTPUT_SETTINGS, PIPELINE
from trainer.config import Params

FULL_CLIPS = 51_197  # FSD50K's dev + eval clips
FULL_MIXTURES = 100_000  # FineLAP-100k
FULL_AMBIENCE_RECORDINGS = 180  # ~1,800 ten-second segments at full size (FineLAP 4.2: 1,765)
TRAIN_STAGES = ("train", "evaluate")  # run with --train only
LEFT_OUT = ("pretrain",)
COLUMNS = (
    "size",
    "stage",
    "items",
    "wall_s",
    "cpu_s",
    "peak_rss_mib",
    "peak_anon_mib",
    "peak_pss_mib",
    "max_proc_rss_mib",
    "output_bytes",
)
SAMPLE_INTERVAL_S = 0.1

# Targets on two cores (docs/benchmarks.md, "Full scale"): minutes at full size for these stages together
TARGET_MINUTES = {("clip",): 5.0, ("mix",): 6.0, ("captions", "clusters"): 2.0, ("shards",): 5.0}
TARGET_PEAK_RSS_GIB = 2.0
# A stage's output is removed as soon as no later stage reads it (with --keep too: the shards hold the
# mixtures' audio), so a size holds at most two large outputs at once (at full size the 30.6 GiB
# corpus beside the 21.1 GiB of mixtures, then the mixtures beside the 21.1 GiB of shards) rather
# than all of them (about 75 GiB). Keys: the stage whose output goes; values: the stage after which
# it goes. The corpus's last readers are clip and ambience, but it goes only once mix has run: on
# ext4 without a journal, every file created within a minute of a mass removal pays a scan of the
# freed inodes (0.6-0.8 ms here), which would be timed as the mix stage's. Mix's output is read by
# captions and shards (pretrain, its other reader, is left out); train and evaluate read the shards
# and the event clips.
FREED_AFTER = {"corpus": "mix", "mix": "shards"}


def parse_sizes(text: str) -> list[int]:
    """``"1000,10000"`` -> ``[1000, 10000]``; ``full`` is :data:`FULL_CLIPS`. Sizes come back sorted, each once."""
    sizes = set()
    for part in text.split(","):
        part = part.strip().lower().replace("_", "")
        if not part:
            continue
        value = FULL_CLIPS if part == "full" else int(part) if part.isdigit() else 0
        if value < 1:
            raise ValueError(f"bench scale: --sizes {text!r}: each size is a number of clips of 1 or more, or full")
        sizes.add(value)
    if not sizes:
        raise ValueError("bench scale: --sizes names no size; e.g. --sizes 1000,10000 or --sizes full")
    return sorted(sizes)


def mixture_counts(clips: int, shares: dict[str, int]) -> dict[str, int]:
    """Mixtures per split for a corpus of ``clips``: 100,000 at 51,197 clips, in proportion below and
    above, split in the proportions of ``shares`` (``mix.mixtures``); every split keeps at least one."""
    total = max(1, round(FULL_MIXTURES * clips / FULL_CLIPS))
    whole = sum(shares.values())
    counts = {split: max(1, round(total * n / whole)) if n else 0 for split, n in shares.items()}
    counts["train"] += total - sum(counts.values()) if counts.get("train") else 0
    return counts


def stage_items(stage: str, clips: int, mixtures: int, recordings: int) -> int:
    """What a stage's time is divided by: source clips for corpus and clip, recordings for ambience, else mixtures."""
    return {"corpus": clips, "clip": clips, "ambience": recordings}.get(stage, mixtures)


def overrides(folder: Path, clips: int, params: Params) -> dict:
    """Params over the given ones that put every folder under ``folder`` and size the data for ``clips``."""
    mixtures = mixture_counts(
        clips, {"train": params.mix.mixtures.train, "valid": params.mix.mixtures.valid, "test": params.mix.mixtures.test}
    )
    recordings = max(params.corpus.ambience_recordings, round(FULL_AMBIENCE_RECORDINGS * clips / FULL_CLIPS))
    f = lambda name: str(folder / name)  # noqa: E731
    return {
        "corpus": {
            "fsd50k_clips": clips,
            "ambience_recordings": recordings,
            "fsd50k_dir": f("sources/fsd50k"),
            "ambience_dir": f("sources/ambience"),
        },
        "sources": {"fsd50k_dir": f("sources/fsd50k"), "ambience_dir": f("sources/ambience")},
        "clip": {"out_dir": f("events")},
        "ambience": {"out_dir": f("backgrounds")},
        "mix": {"mixtures": mixtures, "out_dir": f("mixtures")},
        "captions": {"out_dir": f("captions")},
        "clusters": {"out_dir": f("clusters")},
        "shards": {"out_dir": f("dataset")},
        "imports": {"out_dir": f("imports/{kind}")},
        "pretrain": {
            "audio": [f("events"), f("backgrounds"), f("mixtures")],
            "heldout_mix": f("mixtures"),
            "out_dir": f("pretrain"),
        },
        "train": {
            "data": {
                "sources": [{"kind": "shards", "path": f("dataset"), "split": "train", "weight": 1.0}],
                "valid": {"kind": "shards", "path": f("dataset"), "split": "valid"},
            },
            "optim": {"epochs": 1, "max_steps": 0},
            "out_dir": f("finelap"),
        },
        "evaluate": {
            "checkpoint": f("finelap/checkpoints/best.pt"),
            "shards": f("dataset"),
            "event_clips": f("events"),
            "out_dir": f("finelap/evaluation"),
        },
        "ablations": {"out_dir": f("ablations")},
    }


@dataclass
class StageRun:
    """One stage process's figures."""

    stage: str
    items: int
    wall_s: float
    cpu_s: float
    peak_rss_mib: float
    peak_anon_mib: float
    peak_pss_mib: float
    max_proc_rss_mib: float
    output_bytes: int


def _tree_memory(proc) -> tuple[int, int, int]:
    """(resident bytes, resident bytes less file-backed and shared pages, proportional set size: each
    resident page divided by the number of processes that map it) summed over ``proc``'s tree."""
    rss = anon = pss = 0
    try:
        tree = [proc, *proc.children(recursive=True)]
    except Exception:  # the process just ended
        return 0, 0, 0
    for p in tree:
        try:
            m = p.memory_full_info()  # Linux: /proc/<pid>/smaps_rollup for pss
        except Exception:  # a worker that just exited
            continue
        rss += m.rss
        anon += m.rss - getattr(m, "shared", 0)
        pss += getattr(m, "pss", m.rss)  # where the system gives no PSS, RSS stands in
    return rss, anon, pss


def run_stage(command: list[str], log_path: Path) -> tuple[float, float, float, float, float, float]:
    """Run ``command`` (its output to ``log_path``) and return (wall s, CPU s of it and its descendants,
    peak summed RSS of its tree in MiB, the same without file-backed and shared pages, peak summed PSS
    in MiB (a page shared by n processes counts 1/n in each), largest single
    process's peak RSS in MiB); raise on failure."""
    import psutil

    with open(log_path, "wb") as log:
        t0 = time.perf_counter()
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        proc = psutil.Process(child.pid)
        peak, peak_anon, peak_pss, done = 0, 0, 0, threading.Event()

        def sample() -> None:
            nonlocal peak, peak_anon, peak_pss
            while not done.is_set():
                rss, anon, pss = _tree_memory(proc)
                peak, peak_anon, peak_pss = max(peak, rss), max(peak_anon, anon), max(peak_pss, pss)
                done.wait(SAMPLE_INTERVAL_S)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            _, status, usage = os.wait4(child.pid, 0)  # the zombie keeps the pid until here: the sampler stays on it
        except BaseException:  # Ctrl-C or SIGTERM (sedsynth raises it as KeyboardInterrupt): the stage stops too
            child.terminate()
            child.wait()
            raise
        finally:
            done.set()
            sampler.join()
        wall = time.perf_counter() - t0
        child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        tail = log_path.read_text(errors="replace")[-2000:]
        raise RuntimeError(
            f"bench scale: `{' '.join(command)}` failed with status {child.returncode}; its log ({log_path}) ends:\n{tail}"
        )
    return wall, usage.ru_utime + usage.ru_stime, peak / 2**20, peak_anon / 2**20, peak_pss / 2**20, usage.ru_maxrss / 1024


def stages_to_run(args: argparse.Namespace) -> list[str]:
    """``--stages`` (default: every stage of the pipeline but pretrain, train and evaluate only with ``--train``), in the pipeline's order."""
    default = [s for s in PIPELINE if s not in LEFT_OUT and (args.train or s not in TRAIN_STAGES)]
    if not getattr(args, "stages", None):
        return default
    named = {s.strip() for s in args.stages.split(",") if s.strip()}
    unknown = named - set(PIPELINE)
    if unknown:
        raise ValueError(
            f"bench scale: --stages {args.stages!r}: no stage {', '.join(sorted(unknown))}; the stages are {', '.join(PIPELINE)}"
        )
    return [s for s in PIPELINE if s in named]


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


def stage_folders(stage: str, config: dict) -> list[Path]:
    """The folders ``stage`` writes, read from the overrides (:data:`OUTPUT_SETTINGS` names them)."""
    folders = []
    for key in OUTPUT_SETTINGS.get(stage, ()):
        value = config
        for part in key.split("."):
            value = value[part]
        folders.append(Path(value))
    return folders


def bench_size(args: argparse.Namespace, params: Params, clips: int, out: Path) -> list[StageRun]:
    """Every stage once, in order, on a fresh ``out/<clips>/`` (with ``--reuse``, on what a ``--keep``
    run left there); each stage's figures as it ends."""
    folder = out / str(clips)
    config = overrides(folder, clips, params)
    overrides_path = folder / "overrides.yaml"
    if not getattr(args, "reuse", False) and folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    overrides_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    (folder / "logs").mkdir(exist_ok=True)
    mixtures = sum(config["mix"]["mixtures"].values())
    runs = []
    for stage in stages_to_run(args):
        command = [sys.executable, "-m", "sedsynth", stage, "--params", args.params, "--overrides", str(overrides_path)]
        for path in args.overrides or []:  # the caller's own overrides go first, ours on top
            command[-2:-2] = ["--overrides", path]
        for text in args.set or []:
            command += ["--set", text]
        wall, cpu, peak, anon, pss, max_proc = run_stage(command, folder / "logs" / f"{stage}.log")
        items = stage_items(stage, clips, mixtures, config["corpus"]["ambience_recordings"])
        run = StageRun(
            stage, items, wall, cpu, peak, anon, pss, max_proc, sum(folder_bytes(f) for f in stage_folders(stage, config))
        )
        print(f"  {clips} clips: {stage} done in {wall:.1f} s", file=sys.stderr, flush=True)
        runs.append(run)
        free_after(stage, config)
    return runs


def free_after(stage: str, config: dict) -> None:
    """Remove the outputs that :data:`FREED_AFTER` frees once ``stage`` has run."""
    for done, after in FREED_AFTER.items():
        if after == stage:
            for path in stage_folders(done, config):
                shutil.rmtree(path, ignore_errors=True)


def bench_scale(args: argparse.Namespace, params: Params) -> dict:
    """Run every size of ``args.sizes`` into ``args.out``; the figures by size, written to scale.csv and scale.png."""
    sizes, _ = parse_sizes(args.sizes), stages_to_run(args)  # a wrong flag fails here, before anything runs
    out = Path(args.out)
    for clips in sizes if getattr(args, "reuse", False) else ():
        if not (out / str(clips) / "overrides.yaml").is_file():
            raise ValueError(f"bench scale: --reuse: {out / str(clips)} holds no kept run; run that size with --keep first")
    out.mkdir(parents=True, exist_ok=True)
    figures: dict = {"sizes": {}, "load_average": os.getloadavg(), "cores": os.cpu_count()}
    for clips in sizes:
        figures["sizes"][clips] = bench_size(args, params, clips, out)
        write_csv(figures, out / "scale.csv")  # after every size: a stopped run keeps what it measured
        if not args.keep:  # the data goes; the overrides and each stage's log stay
            for path in (out / str(clips)).iterdir():
                if path.is_dir() and path.name != "logs":
                    shutil.rmtree(path)
    figures["load_average_after"] = os.getloadavg()
    plot(figures, out / "scale.png")
    return figures


def write_csv(figures: dict, path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for clips, runs in figures["sizes"].items():
            for r in runs:
                writer.writerow(
                    [
                        clips,
                        r.stage,
                        r.items,
                        f"{r.wall_s:.3f}",
                        f"{r.cpu_s:.3f}",
                        f"{r.peak_rss_mib:.1f}",
                        f"{r.peak_anon_mib:.1f}",
                        f"{r.peak_pss_mib:.1f}",
                        f"{r.max_proc_rss_mib:.1f}",
                        r.output_bytes,
                    ]
                )


def plot(figures: dict, path: Path) -> None:
    """Wall time and peak RSS per stage against the corpus size, log-log, with a linear guide."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(figures["sizes"])
    stages = [r.stage for r in figures["sizes"][sizes[0]]]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.5))
    for stage in stages:
        runs = [next(r for r in figures["sizes"][n] if r.stage == stage) for n in sizes]
        ax_t.plot(sizes, [r.wall_s for r in runs], marker="o", label=stage)
        ax_m.plot(sizes, [r.peak_rss_mib for r in runs], marker="o", label=stage)
    if len(sizes) > 1:  # slope 1: time proportional to size
        top = max(r.wall_s for r in figures["sizes"][sizes[0]])
        ax_t.plot(sizes, [top * n / sizes[0] for n in sizes], "k:", linewidth=1, label="linear")
    ax_m.axhline(TARGET_PEAK_RSS_GIB * 1024, color="red", linestyle="--", linewidth=1, label=f"{TARGET_PEAK_RSS_GIB:g} GiB")
    for ax, what in ((ax_t, "wall time (s)"), (ax_m, "peak RSS of the stage's processes (MiB)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("FSD50K-layout clips (mixtures: 100,000 per 51,197 clips)")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=8, ncol=2)
    ax_t.set_title("wall time per stage")
    ax_m.set_title("peak RSS per stage")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def extrapolate(
    runs_small: list[StageRun], runs_large: list[StageRun], clips_small: int, clips_large: int, clips_target: int
) -> dict[str, tuple[float, float, float]]:
    """Per stage: (wall s, peak RSS MiB, peak anon MiB) at ``clips_target``, each the larger of the straight line through the
    two sizes (a fixed start-up cost plus a cost per item) and the power law through them (which a growth
    faster than linear follows); memory is never put below the larger size's."""
    import math

    def grown(a: float, b: float) -> float:
        line = b + (b - a) * (clips_target - clips_large) / (clips_large - clips_small)
        power = b * (clips_target / clips_large) ** (math.log(max(b, 1e-9) / max(a, 1e-9)) / math.log(clips_large / clips_small))
        return max(line, power)

    return {
        b.stage: (
            grown(a.wall_s, b.wall_s),
            max(b.peak_rss_mib, grown(a.peak_rss_mib, b.peak_rss_mib)),
            max(b.peak_anon_mib, grown(a.peak_anon_mib, b.peak_anon_mib)),
        )
        for a, b in zip(runs_small, runs_large)
    }


def print_figures(f: dict) -> None:
    load = ", ".join(f"{v:.2f}" for v in f["load_average"])
    print(f"bench scale: the data stages, each its own process, on {f['cores']} cores (load average {load} at the start)")
    for clips, runs in f["sizes"].items():
        mixtures = next((r.items for r in runs if r.stage == "mix"), 0)
        print(f"\n  {clips} clips, {mixtures} mixtures")
        print(
            f"    {'stage':<10} {'items':>7} {'wall s':>8} {'CPU s':>8} {'CPU/wall':>8} {'ms/item':>8} "
            f"{'peak RSS':>9} {'anon':>9} {'PSS':>9} {'max proc':>9} {'output':>10}"
        )
        for r in runs:
            print(
                f"    {r.stage:<10} {r.items:7d} {r.wall_s:8.1f} {r.cpu_s:8.1f} {r.cpu_s / max(r.wall_s, 1e-9):8.2f} "
                f"{r.wall_s / max(r.items, 1) * 1e3:8.2f} {r.peak_rss_mib:5.0f} MiB {r.peak_anon_mib:5.0f} MiB {r.peak_pss_mib:5.0f} MiB {r.max_proc_rss_mib:5.0f} MiB "
                f"{_bytes(r.output_bytes):>10}"
            )
        print(f"    {'total':<10} {'':7} {sum(r.wall_s for r in runs):8.1f} {sum(r.cpu_s for r in runs):8.1f}")
    sizes = list(f["sizes"])
    for small, large in zip(sizes, sizes[1:]):
        print(
            f"\n  growth {small} -> {large} clips ({large / small:.1f}x the items): larger over smaller, "
            f"1.00 = linear time, flat memory"
        )
        print(f"    {'stage':<10} {'time/item':>10} {'peak RSS':>9} {'anon':>9} {'PSS':>9}")
        for a, b in zip(f["sizes"][small], f["sizes"][large]):
            per_item = (b.wall_s / max(b.items, 1)) / max(a.wall_s / max(a.items, 1), 1e-12)
            print(
                f"    {b.stage:<10} {per_item:10.2f} {b.peak_rss_mib / max(a.peak_rss_mib, 1e-9):9.2f} "
                f"{b.peak_anon_mib / max(a.peak_anon_mib, 1e-9):9.2f} {b.peak_pss_mib / max(a.peak_pss_mib, 1e-9):9.2f}"
            )
    if len(sizes) > 1 and sizes[-1] < FULL_CLIPS:
        small, large = sizes[-2], sizes[-1]
        full = extrapolate(f["sizes"][small], f["sizes"][large], small, large, FULL_CLIPS)
        print(
            f"\n  full size ({FULL_CLIPS} clips, {FULL_MIXTURES} mixtures), the larger of the line and the power law through {small} and {large}:"
        )
        for stage, (wall, peak, anon) in full.items():
            print(f"    {stage:<10} {wall / 60:7.1f} min  peak RSS {peak:6.0f} MiB  anon {anon:6.0f} MiB")
        for group, minutes in TARGET_MINUTES.items():
            if all(s in full for s in group):
                got = sum(full[s][0] for s in group) / 60
                print(
                    f"    target: {' + '.join(group)} <= {minutes:g} min -> {got:.1f} min, {'met' if got <= minutes else 'NOT met'}"
                )
        worst = max(full.items(), key=lambda kv: kv[1][1])
        print(
            f"    target: every stage <= {TARGET_PEAK_RSS_GIB:g} GiB peak RSS -> largest {worst[0]} {worst[1][1]:.0f} MiB, "
            f"{'met' if worst[1][1] <= TARGET_PEAK_RSS_GIB * 1024 else 'NOT met'}"
        )
    after = ", ".join(f"{v:.2f}" for v in f.get("load_average_after", f["load_average"]))
    print(f"\n  load average at the end: {after}")
