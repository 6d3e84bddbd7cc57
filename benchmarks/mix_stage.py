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

The floor, measured in the same run beside the stage: the least work that stores these
mixtures. The recipes of the first 1-worker pass are rendered again (:func:`~pipeline.mix.render.render`:
the mixing arithmetic alone, sources already decoded) and encoded to FLAC with the stage's own
encoder call (:func:`~pipeline.mix.partitions.encode_mixture`: soundfile/libsndfile, 16-bit, the
same compression level), in memory, one core; the encoded bytes are first checked against the
stage's stored files. Stage over floor is the share of the floor's rate that the stage reaches.

Storing, measured beside the floor and not part of it: the first pass's stored files (at most
:data:`STORED_TIMED`), read into memory untimed, then each created and written to a fresh file
(no fsync), one core. It is what the file system charges for keeping the bytes (an inode and
new page-cache pages for every file), which can move between runs of one machine
(docs/benchmarks.md, 'Storing the files, beside the floor'). The report splits the stage's time
per mixture into the floor, storing and the rest (drawing, relabeling, tables: ``--profile`` splits it).
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

from pipeline.config.params import MixtureCounts
from pipeline.outputs import MANIFEST
from trainer.config import Params

TARGET_SCALING_2_WORKERS = 1.8  # 2 workers' rate over 1 worker's
TARGET_100K_MIN_2_WORKERS = 6  # minutes for 100k mixtures on 2 workers
TARGET_STAGE_TO_FLOOR = 0.7  # 1 worker's rate over the floor's (render + FLAC encode)
TARGET_SCAPER_RATIO = 12  # 1 worker's rate per core over Scaper's
FLOOR_CHECKED = 50  # mixtures whose floor bytes are compared with the stage's files
STORED_TIMED = 2000  # stored files written again per storing pass (left until the bench ends: removing files slows the next creates, see keep_or_remove)
NO_SCAPER = "Scaper peer: not run (no Scaper environment; see docs/benchmarks.md, 'Mixing')"


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
    from pipeline.corpus import write_ambience_library, write_fsd50k_corpus
    from pipeline.stages import ambience, clip

    print("bench mix: no stage outputs found; generating the embedded corpus, clips and backgrounds", file=sys.stderr)
    write_fsd50k_corpus(tmp / "fsd50k", n_clips=params.corpus.fsd50k_clips, seed=params.corpus.seed)
    write_ambience_library(tmp / "ambience", n_recordings=params.corpus.ambience_recordings, seed=params.corpus.seed)
    clip.run(params, tmp / "fsd50k", tmp / "events")
    ambience.run(params, tmp / "ambience", tmp / "backgrounds")
    return tmp / "events", tmp / "backgrounds"


def find_scaper_python(flag: str | None) -> str | None:
    """The python of Scaper's environment: ``flag`` (``--scaper-python``) when given, else
    ``.venv-scaper/bin/python`` when it exists, else None (no Scaper peer: print :data:`NO_SCAPER`).
    A ``flag`` that names no file raises :class:`FileNotFoundError` saying how to make one."""
    if flag and not Path(flag).is_file():
        raise FileNotFoundError(
            f"--scaper-python {flag}: no such file; make Scaper's environment with "
            "`bash configs/scaper-env.sh` (it writes .venv-scaper/bin/python) or leave the flag out"
        )
    default = Path(".venv-scaper/bin/python")
    return flag or (str(default) if default.exists() else None)


def run_scaper(python: str, events_dir: Path, backgrounds_dir: Path, params: Params, n: int, tmp: Path) -> dict:
    """Scaper (``python``: its environment) making ``n`` soundscapes from every clip of ``events_dir`` and
    background of ``backgrounds_dir`` with the params' mix spec, one process, one core, writing its WAV + JAMS
    + txt under ``tmp``: ``{"mixtures": n, "seconds": the generation loop's time, "mixtures_per_s"}``."""
    import pyarrow.parquet as pq

    from pipeline.config.mix_spec import resolve_spec

    spec = resolve_spec(params.mix.preset, params.mix.spec, sample_rate_hz=params.sample_rate_hz)
    ev = pq.read_table(events_dir / MANIFEST, columns=["label", "audio_path", "duration_s"]).to_pylist()
    bg = pq.read_table(backgrounds_dir / MANIFEST, columns=["audio_path"]).to_pylist()
    config = {
        "events": [[e["label"], str((events_dir / e["audio_path"]).resolve()), e["duration_s"]] for e in ev],
        "backgrounds": [str((backgrounds_dir / b["audio_path"]).resolve()) for b in bg],
        "mixtures": n,
        "seed": params.seed,
        "sample_rate_hz": spec.sample_rate_hz,
        "duration_s": spec.duration_s.bounds()[1],
        "snr_db": list(spec.snr_db.bounds()),
        "events_per_mixture": [int(v) for v in spec.events_per_mixture.values],
        "repeat_below_s": spec.repetition.max_clip_s or 1e9,
        "repeat_counts": [int(v) for v in spec.repetition.count.values],
        "fade_s": spec.fade_in_s.bounds()[1],
        "out_dir": str(tmp / "scaper"),
    }
    (tmp / "scaper.json").write_text(json.dumps(config))
    script = Path(__file__).with_name("scaper_peer.py")
    done = subprocess.run(
        [python, str(script), str(tmp / "scaper.json")],
        capture_output=True,
        text=True,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"Scaper peer failed:\n{done.stderr[-2000:]}")
    peer = json.loads(done.stdout.strip().splitlines()[-1])
    return {**peer, "mixtures_per_s": peer["mixtures"] / peer["seconds"]}


@dataclasses.dataclass
class FloorInputs:
    """The stage's recipes (with their occurrences, in order) and their sources, decoded, for :func:`floor_pass`."""

    mixtures: list  # [(MixtureRecipe, [EventOccurrence, ...]), ...]
    sources: object  # a FileSources with every source the recipes use already decoded
    sample_rate_hz: int


def floor_inputs(out: Path, events_dir: Path, backgrounds_dir: Path) -> FloorInputs:
    """Read a finished mix stage output's recipes, decode their sources, and check that rendering and
    encoding them gives the stage's stored FLAC bytes (the first :data:`FLOOR_CHECKED`)."""
    from pipeline.mix.bank import FileSources
    from pipeline.mix.exports import by_mixture
    from pipeline.mix.layout import MIXTURES, OCCURRENCES
    from pipeline.mix.partitions import encode_mixture
    from pipeline.mix.render import render
    from pipeline.mix.sources import read_parquet, read_sources
    from pipeline.schema import EventOccurrence, MixtureRecipe, from_table

    recipes = from_table(read_parquet(out / MIXTURES), MixtureRecipe)
    occurrences = by_mixture(from_table(read_parquet(out / OCCURRENCES), EventOccurrence))
    events, backgrounds = read_sources(events_dir, backgrounds_dir)
    rate = recipes[0].sample_rate_hz
    sources = FileSources(
        events_dir,
        backgrounds_dir,
        rate,
        {e.clip_id: e.audio_path for e in events},
        {b.segment_id: b.audio_path for b in backgrounds},
    )
    mixtures = [(r, sorted(occurrences.get(r.mixture_id, []), key=lambda o: o.occurrence_index)) for r in recipes]
    for recipe, occ in mixtures:  # decode before timing: the floor's sources are in memory, as the stage's bank is
        sources.background(recipe.background_id)
        for o in occ:
            sources.event(o.clip_id)
    for recipe, occ in mixtures[:FLOOR_CHECKED]:
        if encode_mixture(render(recipe, occ, sources), rate) != (out / recipe.audio_path).read_bytes():
            raise RuntimeError(f"bench mix: the floor's bytes of {recipe.mixture_id} differ from the stage's file")
    return FloorInputs(mixtures, sources, rate)


def floor_pass(inputs: FloorInputs) -> tuple[float, float]:
    """Seconds spent rendering (the mixing arithmetic) and FLAC-encoding every mixture, in memory."""
    from pipeline.mix.partitions import encode_mixture
    from pipeline.mix.render import render

    arithmetic = encode = 0.0
    for recipe, occ in inputs.mixtures:
        t0 = time.perf_counter()
        q = render(recipe, occ, inputs.sources)
        t1 = time.perf_counter()
        encode_mixture(q, inputs.sample_rate_hz)
        encode += time.perf_counter() - t1
        arithmetic += t1 - t0
    return arithmetic, encode


def storing_pass(stored: Path, out: Path, limit: int = STORED_TIMED) -> tuple[float, int]:
    """Seconds spent creating and writing the FLAC files under ``stored`` (the first ``limit``, in name
    order) again as new files under ``out`` (which must not exist), and how many: each is read into
    memory untimed, then opened, written and closed as the stage writes its files."""
    files = sorted(stored.glob("audio/*/*.flac"))[:limit]
    out.mkdir(parents=True)
    seconds = 0.0
    for i, path in enumerate(files):
        data = path.read_bytes()
        t0 = time.perf_counter()
        with open(out / f"{i:06d}.flac", "wb") as f:
            f.write(data)
        seconds += time.perf_counter() - t0
    return seconds, len(files)


# The parts ``--profile`` times: (module, function, part, parent part), each timed around its calls
# during one more 1-worker pass (in process); a part's own share is its time less its children's.
PARTS = (
    ("pipeline.stages.mix", "fill_bank", "source bank (decoding every source once)", "stage"),
    ("pipeline.mix.partitions", "render_partition", "partitions (every mixture's work)", "stage"),
    ("pipeline.mix.instantiate", "draw_mixture", "drawing (RNG, placement, levels, recipe)", "partitions (every mixture's work)"),
    (
        "pipeline.mix.instantiate",
        "_render",
        "rendering (sum, realised SNR, normalisation, int16)",
        "partitions (every mixture's work)",
    ),
    ("pipeline.mix.instantiate", "relabel_mixture", "relabeling", "partitions (every mixture's work)"),
    ("pipeline.mix.partitions", "encode_mixture", "FLAC encode", "partitions (every mixture's work)"),
    ("pipeline.mix.exports", "write_partition_files", "tables and DCASE rows", "partitions (every mixture's work)"),
    ("pipeline.mix.partitions", "write_partition_tables", "tables and DCASE rows", "partitions (every mixture's work)"),
    ("pipeline.stages.mix", "join_partitions", "joining partitions, exports", "stage"),
    ("pipeline.mix.exports", "write_all", "joining partitions, exports", "stage"),
)


class PartTimes:
    """Times each function of :data:`PARTS` around its calls while in use (wrapped in its module, restored after)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    def __enter__(self) -> "PartTimes":
        import importlib

        self._saved = []
        for module_name, name, part, _ in PARTS:
            module = importlib.import_module(module_name)
            self._saved.append((module, name, getattr(module, name)))
            setattr(module, name, self._timed(getattr(module, name), part))
        return self

    def _timed(self, fn, part: str):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[part] = self.seconds.get(part, 0.0) + time.perf_counter() - t0

        return timed

    def __exit__(self, *exc) -> None:
        for module, name, fn in self._saved:
            setattr(module, name, fn)


def profile_pass(
    run, params: Params, events_dir: Path, backgrounds_dir: Path, out: Path, mixtures: int
) -> list[tuple[int, str, float]]:
    """One more 1-worker pass of the stage with :class:`PartTimes`: ``[(depth, part, ms per mixture)]``,
    each parent followed by its parts and ``the rest`` (its time outside them)."""
    with PartTimes() as parts:
        t0 = time.perf_counter()
        run(params, events_dir, backgrounds_dir, out)
        parts.seconds["stage"] = time.perf_counter() - t0
    ms = {k: v / mixtures * 1e3 for k, v in parts.seconds.items()}
    rows: list[tuple[int, str, float]] = []

    def add(parent: str, depth: int) -> None:
        rows.append((depth, parent, ms.get(parent, 0.0)))
        children = list(dict.fromkeys(part for _, _, part, up in PARTS if up == parent))
        for child in children:
            add(child, depth + 1)
        if children:
            rest = "the rest (file create and write, records)" if depth else "the rest (plan, sources, start-up)"
            rows.append((depth + 1, rest, ms.get(parent, 0.0) - sum(ms.get(c, 0.0) for c in children)))

    add("stage", 0)
    return rows


def keep_or_remove(kept: list[Path], tmp: Path) -> bool:
    """Keep the passes' outputs until the bench ends, while the disk holds two more; else remove
    all but the newest (True: something was removed between passes).

    Removing a pass's files right before the next pass slows the next one: ext4 without a
    journal, allocating an inode, skips every inode of the group freed in the last 60 s (6 min
    while the inode table is dirty), looking each up (``recently_deleted`` in a kernel profile),
    so creating a file cost 0.6-0.8 ms of kernel CPU after 2,000 files were removed against
    0.02 ms otherwise. A user's first run deletes nothing; the figures should not pay for the
    bench's own cleaning."""
    size = sum(f.stat().st_size for f in kept[-1].rglob("*") if f.is_file())
    if len(kept) < 2 or shutil.disk_usage(tmp).free > 2 * size + 2**30:
        return False
    for out in kept[:-1]:
        shutil.rmtree(out)
    del kept[:-1]
    return True


def bench_mix(
    params: Params,
    mixtures: int,
    workers: list[int],
    scaper_python: str | None,
    scaper_mixtures: int,
    repeat: int = 1,
    profile: bool = False,
) -> dict:
    """Time the mix stage ``repeat`` times per worker count, the counts interleaved (1, 2, 1, 2, ...),
    and keep each count's fastest pass: this VM's speed drifts within minutes, and interleaving
    exposes both counts to the same drift. The dirty pages of a pass are flushed (``os.sync``)
    before the next is timed, so no pass pays for writing the previous one's files. The floor
    (see the module docstring) is timed after each round of passes, from the first 1-worker
    pass's recipes, and its fastest pass kept too; after it, that pass's files are stored again
    (:func:`storing_pass`) and the cheapest round kept. ``profile``: one more 1-worker pass with each
    part of the stage timed (:func:`profile_pass`), after the timed ones."""
    from pipeline.stages.mix import run

    figures: dict = {"mixtures": mixtures, "preset": params.mix.preset, "runs": {}, "repeat": repeat}
    with tempfile.TemporaryDirectory(prefix="sedsynth-bench-mix-") as tmp_name:
        tmp = Path(tmp_name)
        events_dir, backgrounds_dir = _sources(params, tmp)
        mix = dataclasses.replace(
            params.mix,
            mixtures=MixtureCounts(train=mixtures, valid=0, test=0),
            export=dataclasses.replace(params.mix.export, jams=False, timelines=0),
        )
        configs = {
            w: dataclasses.replace(params, compute=dataclasses.replace(params.compute, workers=w), mix=mix)
            for w in sorted(set(workers) | ({1} if profile else set()))
        }
        passes: dict[int, list[tuple[float, float]]] = {w: [] for w in workers}  # worker count -> [(seconds, peak MiB)]
        floor: FloorInputs | None = None
        floor_passes: list[tuple[float, float]] = []  # (arithmetic s, encode s)
        first: Path | None = None  # the first 1-worker pass's output: the files the storing passes write again
        storing: list[float] = []  # seconds per stored file, each round
        kept: list[Path] = []  # passes' outputs, removed at the end (see keep_or_remove)
        removed = False
        for round_ in range(max(1, repeat)):
            for w in workers:
                p = configs[w]
                out = tmp / f"mix-{w}-{round_}"
                os.sync()
                with PeakMemory() as mem:
                    t0 = time.perf_counter()
                    run(p, events_dir, backgrounds_dir, out)
                    wall = time.perf_counter() - t0
                passes[w].append((wall, mem.peak_bytes / 2**20))
                if floor is None and w == min(workers):
                    floor, first = floor_inputs(out, events_dir, backgrounds_dir), out
                kept.append(out)
                removed = keep_or_remove(kept, tmp) or removed
            if floor is not None:
                floor_passes.append(floor_pass(floor))
            if first is not None and first.exists():
                os.sync()
                seconds, files = storing_pass(first, tmp / f"stored-{round_}")
                storing.append(seconds / max(files, 1))
        figures["removed_between_passes"] = removed
        if profile:  # in process, so each part's wrapper sees its calls: one worker whatever --workers times
            os.sync()
            figures["profile"] = profile_pass(run, configs[1], events_dir, backgrounds_dir, tmp / "mix-profile", mixtures)
        if floor_passes:
            arithmetic, encode = min(floor_passes, key=sum)
            figures["floor"] = {
                "seconds": arithmetic + encode,
                "mixtures_per_s": mixtures / (arithmetic + encode),
                "arithmetic_ms": arithmetic / mixtures * 1e3,
                "encode_ms": encode / mixtures * 1e3,
                "pass_seconds": [sum(f) for f in floor_passes],
            }
        if storing:
            figures["storing_ms"] = min(storing) * 1e3
        for w, timed in passes.items():
            wall = min(s for s, _ in timed)
            figures["runs"][w] = {
                "seconds": wall,
                "mixtures_per_s": mixtures / wall,
                "mixtures_per_s_per_core": mixtures / wall / w,
                "peak_rss_mib": max(m for _, m in timed),
                "pass_seconds": [s for s, _ in timed],
            }
        python = find_scaper_python(scaper_python)
        if python:
            figures["scaper"] = run_scaper(python, events_dir, backgrounds_dir, params, scaper_mixtures, tmp)
    return figures


def print_figures(f: dict) -> None:
    repeat = f.get("repeat", 1)
    best = f" (best of {repeat} interleaved passes)" if repeat > 1 else ""
    print(f"bench mix: {f['mixtures']} mixtures, preset {f['preset']}, whole stage (bank, FLAC, tables, DCASE metadata){best}")
    for w, r in f["runs"].items():
        each = ", ".join(f"{s:.1f}" for s in r.get("pass_seconds", [])) if repeat > 1 else ""
        print(
            f"  {w} worker(s): {r['seconds']:7.1f} s  {r['mixtures_per_s']:7.1f} mixtures/s  "
            f"{r['mixtures_per_s_per_core']:7.1f} per core  peak memory {r['peak_rss_mib']:7.0f} MiB"
            + (f"  (passes: {each} s)" if each else "")
        )
    if f.get("removed_between_passes"):
        print(
            "  note: the disk could not hold every pass, so passes were removed between them; file creation "
            "right after removing files is slower on ext4 (docs/benchmarks.md, 'Against the floor')"
        )
    one_workers = 1 if 1 in f["runs"] else next(iter(f["runs"]))
    one = f["runs"][one_workers]
    print(f"  target: >= 150 mixtures/s per core -> {'met' if one['mixtures_per_s_per_core'] >= 150 else 'NOT met'}")
    if "floor" in f:
        fl = f["floor"]
        each = ", ".join(f"{s:.1f}" for s in fl.get("pass_seconds", [])) if repeat > 1 else ""
        print(
            f"  floor (the same recipes rendered + FLAC-encoded in memory, 1 core): {fl['seconds']:7.1f} s  "
            f"{fl['mixtures_per_s']:7.1f} mixtures/s  (arithmetic {fl['arithmetic_ms']:.2f} ms + FLAC {fl['encode_ms']:.2f} ms "
            f"per mixture; stage {1e3 / one['mixtures_per_s_per_core']:.2f} ms)" + (f"  (passes: {each} s)" if each else "")
        )
        ratio = one["mixtures_per_s_per_core"] / fl["mixtures_per_s"]
        per = "1 worker" if one_workers == 1 else f"{one_workers} workers, per core"
        print(f"  stage / floor ({per}): {ratio:.2f} of the floor's rate (target >= {TARGET_STAGE_TO_FLOOR})")
        if "storing_ms" in f:
            stage_ms, floor_ms = 1e3 / one["mixtures_per_s_per_core"], fl["arithmetic_ms"] + fl["encode_ms"]
            print(
                f"  storing the stage's files again (create + write, no fsync, 1 core): {f['storing_ms']:.2f} ms per mixture; "
                f"the stage's {stage_ms:.2f} ms = floor {floor_ms:.2f} + storing {f['storing_ms']:.2f} + "
                f"the rest {stage_ms - floor_ms - f['storing_ms']:.2f} (drawing, relabeling, tables; --profile splits it)"
            )
    if "profile" in f:
        floor = f.get("floor", {})
        beside = {"rendering (sum, realised SNR, normalisation, int16)": "arithmetic_ms", "FLAC encode": "encode_ms"}
        print("  where a 1-worker pass's time goes (--profile: one more pass, each part timed around its calls), ms per mixture:")
        for depth, part, ms in f["profile"]:
            note = f"   the floor's: {floor[beside[part]]:.2f}" if part in beside and beside[part] in floor else ""
            print(f"    {'  ' * depth}{part:<{56 - 2 * depth}} {ms:6.2f}{note}")
    if 2 in f["runs"]:
        if 1 in f["runs"]:
            ratio = f["runs"][2]["mixtures_per_s"] / f["runs"][1]["mixtures_per_s"]
            print(f"  2 workers / 1 worker: {ratio:.2f}x the rate (target >= {TARGET_SCALING_2_WORKERS}x)")
        eta = 100_000 / f["runs"][2]["mixtures_per_s"] / 60
        print(f"  100k mixtures on 2 workers at this rate: {eta:.1f} min (target <= {TARGET_100K_MIN_2_WORKERS})")
    if "scaper" in f and f["scaper"]["mixtures"] and f["scaper"]["mixtures_per_s"] > 0:
        s = f["scaper"]
        print(
            f"  Scaper 1.6.5 (peer, 1 core, WAV+JAMS+txt): {s['mixtures']} mixtures in {s['seconds']:.1f} s = "
            f"{s['mixtures_per_s']:.1f} mixtures/s"
        )
        print(
            f"  ratio per core: {one['mixtures_per_s_per_core'] / s['mixtures_per_s']:.1f}x Scaper (target >= {TARGET_SCAPER_RATIO}x)"
        )
    elif "scaper" in f:
        print("  Scaper peer: not run (--scaper-mixtures 0)")
    else:
        print(f"  {NO_SCAPER}")
