"""The mix stage: event clips + background segments -> soundscapes with relabeled boundaries.

Input: ``mix.events`` and ``mix.backgrounds`` (null: ``clip.out_dir`` and ``ambience.out_dir``),
each a stage output (manifest and FLAC files) or a Scaper-layout library (label sub-folders of
audio files, read by :mod:`pipeline.mix.scaper_library`), ``params.mix`` and the top-level
``sample_rate_hz`` (the mixtures' rate). Output (``mix.out_dir``, file names in
:mod:`pipeline.mix.layout`):

- ``audio/<split>/<mixture_id>.flac`` (16-bit) and, if enabled, ``.txt`` / ``.jams`` beside it;
- ``mixtures.parquet`` (one recipe per mixture), ``occurrences.parquet`` (one row per placed
  event occurrence), ``segments.parquet`` (relabeled label segments, derived);
- ``metadata/<split>/events.tsv`` and ``durations.tsv`` (DESED / DCASE format);
- ``licenses.json`` and ``attribution.csv``; ``timelines.png``; ``spec.json`` (the effective
  spec); ``skipped.csv`` (sources left out and why); ``summary.json``;
- for a library input, ``sources/events`` and/or ``sources/backgrounds``: its files as analysed
  for this run, in the clip or ambience stage's layout (their ``source_path`` relative to the
  library root), so the recipes re-render from the output alone.

The stage refuses, before any audio is read, to upsample (``sample_rate_hz`` above the clips'
or backgrounds' rate) and to make zero mixtures; a split its sources cannot serve stops it with
the counts (clips available against clips needed, what ``mix.allowed_licenses`` dropped) and
the skip report beside the output (``<out_dir>.skipped.csv``), the previous output untouched.

Splits use disjoint sources: events by FSD50K's own split (dev train -> train, dev val ->
valid, eval -> test) or, with ``event_split: random`` and for a library (which has no split),
by source clip or file; backgrounds by the recording they were cut from, so no recording feeds
two splits.

Work is cut into partitions of ``partition_size`` mixtures; each carries the resolved spec to
its worker (:class:`MixRun`). A worker renders its partition's audio and writes everything that
grows with the number of mixtures (FLAC, txt and JAMS files, its rows of the tables and of the
DCASE files); the main process only joins them. The timelines picture is one more task of
the same map, drawn first from its mixtures made again, so it runs beside the partitions.
With several workers, the workers boot while this process reads the manifests and decodes
the sources into the bank. Each finished
partition is kept in the hidden staging folder; a run that is killed and started again with
the same inputs and params skips finished partitions and ends with the same bytes as an
uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
import sys
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.audio import write_flac
from pipeline.compute import Workers, map_ordered
from pipeline.config.mix_spec import MixSpec, resolve_spec
from pipeline.config.params import MixParams, Params, RelabelParams, folders_besides
from pipeline.licenses import license_name
from pipeline.mix import exports
from pipeline.mix.augment import AugmentError, room_file, usable_rooms
from pipeline.mix.bank import COMPLETE, SourceBank, build_bank
from pipeline.mix.instantiate import MixContext, instantiate
from pipeline.mix.scaper_library import LIBRARY_DATASET, label_folders, write_libraries
from pipeline.mix.layout import MIXTURES, OCCURRENCES, RECORDS, SEGMENTS, SPEC, TIMELINES, audio_path, mixture_id
from pipeline.outputs import (
    MANIFEST,
    SKIPPED,
    SUMMARY,
    check_out_dir,
    file_sha256,
    output_lock,
    rejected_report_path,
    resumable_dir,
    write_json,
    write_manifest,
    write_skips,
    write_table,
)
from pipeline.schema import SPLITS, BackgroundSegment, EventClip, Skip, arrow_schema, from_table

PARTS = "parts"
PARTITION_FILES = ("mixtures.parquet", "occurrences.parquet", "segments.parquet", "events.tsv", "durations.tsv", "done.json")
BANK = "bank"
PLAN = "plan.json"
FSD50K_TO_MIX_SPLIT = {"train": "train", "val": "valid", "eval": "test"}
MIX_TO_FSD50K_SPLIT = {v: k for k, v in FSD50K_TO_MIX_SPLIT.items()}
FLAC_COMPRESSION_LEVEL = 0.0  # libFLAC's fastest level: 10% less encoding time, 2-3% larger files
SOURCES = "sources"  # <out_dir>/sources/{events,backgrounds}: the libraries as analysed for the run


class MixError(ValueError):
    """The sources cannot satisfy the requested mixtures; the message says what to change."""


@dataclass(frozen=True)
class SourceFolders:
    """The manifest folders a run mixes from, and what reading its libraries (if any) gave.

    ``library_dir`` (None: no library) is the hidden folder beside the output that holds the
    analysed libraries during the run; it becomes ``<out_dir>/sources``.
    """

    events_dir: Path
    backgrounds_dir: Path
    library_dir: Path | None
    libraries: dict[str, dict]  # kind (events, backgrounds) -> {root, kept, skipped}: files analysed
    skips: list[Skip]

    def final_dir(self, kind: str, out_dir: Path) -> Path:
        """Where ``kind``'s manifest folder is once the run is done (for paths written into exports)."""
        current = self.events_dir if kind == "events" else self.backgrounds_dir
        return Path(out_dir).resolve() / SOURCES / kind if kind in self.libraries else current


def source_layout(folder: Path, kind: str, extensions: tuple[str, ...]) -> str:
    """``manifest`` (a stage output) or ``library`` (label sub-folders of audio files); else FileNotFoundError naming both."""
    if (folder / MANIFEST).exists():
        return "manifest"
    if label_folders(folder, extensions):
        return "library"
    stage, setting = ("clip", "mix.events") if kind == "events" else ("ambience", "mix.backgrounds")
    what = "does not exist" if not folder.exists() else f"holds neither {MANIFEST} nor label sub-folders of audio files"
    raise FileNotFoundError(
        f"{folder} {what}: run `sedsynth {stage}` (or `dvc repro {stage}`) to make {kind} there, or point {setting} at a "
        f"Scaper-layout library, a folder of label sub-folders of audio files (<folder>/<label>/*.wav, {', '.join(extensions)})"
    )


def prepare_sources(params: Params, spec: MixSpec, events_dir: Path, backgrounds_dir: Path, out_dir: Path) -> SourceFolders:
    """Each input as a manifest folder: a stage output as it is, a library analysed into a hidden folder beside ``out_dir``.

    A library is read afresh every run (deterministic bytes, so a killed run still resumes).
    Library files below ``sample_rate_hz`` stop the run (:class:`MixError`): mixing must not upsample.
    """
    extensions = params.mix.library.extensions
    kinds = {kind: folder for kind, folder in (("events", events_dir), ("backgrounds", backgrounds_dir))
             if source_layout(folder, kind, extensions) == "library"}
    if not kinds:
        return SourceFolders(events_dir, backgrounds_dir, None, {}, [])
    library_dir = out_dir.parent / f".{out_dir.name}.{SOURCES}"
    shutil.rmtree(library_dir, ignore_errors=True)
    skips: list[Skip] = []
    folders = {"events": events_dir, "backgrounds": backgrounds_dir}
    low: list[str] = []
    counts: dict[str, dict] = {}
    analysed = write_libraries(kinds, {kind: library_dir / kind for kind in kinds}, params, float(spec.duration_s.bounds()[1]))
    for kind, (records, kind_skips) in analysed.items():
        folders[kind] = library_dir / kind
        skips += kind_skips
        counts[kind] = {"root": str(kinds[kind]), "kept": len(records), "skipped": len(kind_skips)}
        below = [r.source_path for r in records if r.source_sample_rate_hz < params.sample_rate_hz]
        if below:
            low.append(f"{len(below)} {kind} files of {kinds[kind]} (e.g. {below[0]})")
    if low:
        shutil.rmtree(library_dir, ignore_errors=True)
        raise MixError(f"mix: sample_rate_hz is {params.sample_rate_hz} Hz but {' and '.join(low)} have a lower rate, and mixing must "
                       f"not upsample them; remove those files or mix at their rate (sample_rate_hz in params.yaml)")
    return SourceFolders(folders["events"], folders["backgrounds"], library_dir, counts, skips)


def read_parquet(path: Path) -> pa.Table:
    """One Parquet file as a table (``ParquetFile``: ``pq.read_table`` would import pyarrow.dataset and pandas, 0.5 s)."""
    return pq.ParquetFile(path).read()


def read_sources(events_dir: Path, backgrounds_dir: Path) -> tuple[list[EventClip], list[BackgroundSegment]]:
    """The records of two manifest folders (a clip-stage and an ambience-stage layout)."""
    for d, stage in ((events_dir, "clip"), (backgrounds_dir, "ambience")):
        if not (d / MANIFEST).exists():
            raise FileNotFoundError(f"{d / MANIFEST} not found: run `sedsynth {stage}` (or `dvc repro {stage}`) first")
    events = from_table(read_parquet(events_dir / MANIFEST), EventClip)
    backgrounds = from_table(read_parquet(backgrounds_dir / MANIFEST), BackgroundSegment)
    return events, backgrounds


def check_sample_rates(spec: MixSpec, events: list[EventClip], backgrounds: list[BackgroundSegment],
                       events_dir: Path, backgrounds_dir: Path) -> None:
    """Raise :class:`MixError` if mixing at ``spec.sample_rate_hz`` would upsample a source.

    Upsampled audio has nothing above the source's Nyquist frequency, so a 48 kHz dataset made
    from 16 kHz clips only looks like 48 kHz. The spec's rate is the top-level
    ``sample_rate_hz``, the rate the clip and ambience stages write: a lower source rate means
    their outputs were made at another rate and must be made again.
    """
    rate = spec.sample_rate_hz
    low = [(folder, what, min(x.sample_rate_hz for x in items))
           for folder, what, items in ((events_dir, "clips", events), (backgrounds_dir, "background segments", backgrounds))
           if items and min(x.sample_rate_hz for x in items) < rate]
    if not low:
        return
    held = " and ".join(f"{folder} holds {source_rate} Hz {what}" for folder, what, source_rate in low)
    lowest = min(source_rate for _, _, source_rate in low)
    raise MixError(
        f"mix: sample_rate_hz is {rate} Hz but {held}, and mixing must not upsample them (nothing above {lowest // 2} Hz); "
        f"re-run the clip and ambience stages at {rate} Hz (dvc repro, or sedsynth clip --set sample_rate_hz={rate} and "
        f"sedsynth ambience --set sample_rate_hz={rate}), or mix at the sources' rate with sample_rate_hz: {lowest} in params.yaml"
    )


def filter_licenses(events: list[EventClip], backgrounds: list[BackgroundSegment], allowed: tuple[str, ...]
                    ) -> tuple[list[EventClip], list[BackgroundSegment], list[Skip], dict[str, dict[str, int]]]:
    """Keep the sources whose licence is in ``allowed``: (events, backgrounds, skips, dropped).

    ``dropped`` counts the sources left out per kind (``events``, ``backgrounds``) and licence.
    A background without licence metadata (a library read without a metadata CSV) is ``unknown``.
    """
    allowed_text = ", ".join(allowed)
    kept_events = [e for e in events if e.license in allowed]
    kept_backgrounds = [b for b in backgrounds if license_name(b.license) in allowed]
    skips = [Skip(e.clip_id, e.audio_path, "license-not-allowed", f"licence {e.license} is not in mix.allowed_licenses [{allowed_text}]")
             for e in events if e.license not in allowed]
    for b in backgrounds:
        name = license_name(b.license)
        if name not in allowed:
            stated = f"'{b.license}'" if b.license.strip() else "none in the library's metadata"
            skips.append(Skip(b.segment_id, b.audio_path, "license-not-allowed",
                              f"licence {name} (stated: {stated}) is not in mix.allowed_licenses [{allowed_text}]"))
    dropped = {
        "events": dict(sorted(Counter(e.license for e in events if e.license not in allowed).items())),
        "backgrounds": dict(sorted(Counter(n for n in (license_name(b.license) for b in backgrounds) if n not in allowed).items())),
    }
    return kept_events, kept_backgrounds, skips, dropped


def describe_license_drops(dropped: dict[str, dict[str, int]], allowed: tuple[str, ...]) -> str:
    """One phrase: what ``mix.allowed_licenses`` left out, per kind and licence."""
    def part(counts: dict[str, int], what: str) -> str:
        n = sum(counts.values())
        per = ", ".join(f"{lic} {k}" for lic, k in counts.items())
        return f"{n} {what}" + (f" ({per})" if per else "")

    if not any(dropped.values()):
        return f"mix.allowed_licenses [{', '.join(allowed)}] dropped no source"
    text = (f"mix.allowed_licenses [{', '.join(allowed)}] dropped {part(dropped['events'], 'event clips')} and "
            f"{part(dropped['backgrounds'], 'background segments')}")
    if "unknown" in dropped["events"] or "unknown" in dropped["backgrounds"]:
        text += "; sources without licence metadata are 'unknown': add unknown to mix.allowed_licenses to use them"
    return text


def _rank(seed: int, salt: str, key: str) -> bytes:
    return hashlib.blake2b(f"{seed}:{salt}:{key}".encode(), digest_size=8).digest()


def allocate_groups(groups: list[str], fractions: dict[str, float], needed: list[str], seed: int, salt: str) -> dict[str, str]:
    """Groups -> splits in the given proportions (a hashed order; at least one per needed split)."""
    order = sorted(set(groups), key=lambda g: _rank(seed, salt, g))
    n = len(order)
    counts = {s: int(math.floor(fractions[s] * n)) for s in SPLITS}
    for s in needed:
        if counts[s] == 0 and fractions[s] > 0:
            counts[s] = 1
    while sum(counts.values()) > n:  # take back from the largest share
        biggest = max(SPLITS, key=lambda s: counts[s])
        counts[biggest] -= 1
    counts["train"] += n - sum(counts.values())
    out, i = {}, 0
    for s in SPLITS:
        for g in order[i : i + counts[s]]:
            out[g] = s
        i += counts[s]
    return out


def assign_splits(
    events: list[EventClip], backgrounds: list[BackgroundSegment], p: MixParams, spec: MixSpec, seed: int
) -> tuple[dict[str, list[EventClip]], dict[str, list[BackgroundSegment]]]:
    """Disjoint event and background pools per split; raises :class:`MixError` if one is too small."""
    counts = dataclasses.asdict(p.mixtures)
    fractions = dataclasses.asdict(p.holdout)
    needed = [s for s in SPLITS if counts[s] > 0]
    by_fsd50k = p.event_split == "fsd50k" and not (events and all(e.source_dataset == LIBRARY_DATASET for e in events))
    if by_fsd50k:
        event_split = {e.clip_id: FSD50K_TO_MIX_SPLIT.get(e.source_split, "train") for e in events}
    else:
        by_source = allocate_groups([e.source_id for e in events], fractions, needed, seed, "events")
        event_split = {e.clip_id: by_source[e.source_id] for e in events}
    by_recording = allocate_groups([b.source_id for b in backgrounds], fractions, needed, seed, "backgrounds")
    event_pools = {s: [e for e in events if event_split[e.clip_id] == s] for s in SPLITS}
    bg_pools = {s: [b for b in backgrounds if by_recording[b.source_id] == s] for s in SPLITS}

    most = int(spec.events_per_mixture.bounds()[1])
    if needed and not backgrounds:
        raise MixError("mix: no background segments are left to mix over")
    for s in needed:
        if not bg_pools[s]:
            recordings = len({b.source_id for b in backgrounds})
            raise MixError(
                f"mix: split '{s}' has no background: {len(backgrounds)} segments from {recordings} recordings cannot "
                f"give every split its own recordings; add ambience recordings, set mix.mixtures.{s}: 0, or change mix.holdout"
            )
        have = len(event_pools[s])
        need = (most if spec.distinct_clips else 1) if most > 0 else 0
        if have < need:
            source = (f" (the clips of FSD50K's '{MIX_TO_FSD50K_SPLIT[s]}' split; mix.event_split: random splits by source clip instead)"
                      if by_fsd50k else "")
            wanted = f"a mixture draws up to {most} distinct clips" if spec.distinct_clips else "a mixture needs at least one"
            raise MixError(
                f"mix: split '{s}' has {have} event clips{source} but {wanted}; add source clips, set mix.mixtures.{s}: 0"
                + (", or allow repeats with mix.spec.distinct_clips: false" if spec.distinct_clips else "")
            )
    return event_pools, bg_pools


@dataclass(frozen=True)
class MixRun:
    """What every partition of one run shares: small, and pickled into each task.

    Workers take the resolved spec from here, so no worker resolves the spec or reads the
    params; the source pools are in the staging folder's plan, read once per worker.
    """

    stage_dir: str
    fingerprint: str  # of the plan: a resumed run only reuses partitions of the same plan
    spec: MixSpec
    seed: int
    relabel: RelabelParams
    export_txt: bool = False
    export_jams: bool = False
    events_dir: str = ""  # where the sources are once the run is done (the paths JAMS files name)
    backgrounds_dir: str = ""


@dataclass(frozen=True)
class Partition:
    run: MixRun
    key: str
    split: str
    start: int
    count: int


@dataclass(frozen=True)
class Timelines:
    """The picture of a run (``timelines.png``): drawn by a worker beside the partitions, from
    its mixtures made again (the same bytes as their partitions'), so no one waits for it at the end."""

    run: MixRun
    mixtures: tuple[tuple[str, int], ...]  # (split, index) of each pictured mixture


TIMELINES_PART = "timelines.png"  # the picture in the staging folder's parts, until the run is joined


@lru_cache(maxsize=2)
def load_context(run: MixRun) -> MixContext:
    """The worker's context for one run, built once per process from ``run`` and the staging folder's plan."""
    plan = json.loads((Path(run.stage_dir) / PLAN).read_text(encoding="utf-8"))
    events, backgrounds = read_sources(Path(plan["events_dir"]), Path(plan["backgrounds_dir"]))
    ev = {e.clip_id: e for e in events}
    bg = {b.segment_id: b for b in backgrounds}
    return MixContext(
        spec=run.spec,
        seed=run.seed,
        relabel=run.relabel,
        sources=SourceBank(Path(run.stage_dir) / BANK),
        events={s: [ev[i] for i in ids] for s, ids in plan["event_pools"].items()},
        backgrounds={s: [bg[i] for i in ids] for s, ids in plan["background_pools"].items()},
    )


def render_partition(part: Partition) -> dict:
    """Make one partition's mixtures: FLAC (and txt, JAMS) files, its DCASE rows, its three tables, then a done marker."""
    ctx = load_context(part.run)
    stage = Path(part.run.stage_dir)
    rows: dict[str, list] = {MIXTURES: [], OCCURRENCES: [], SEGMENTS: []}
    dropped = 0
    for index in range(part.start, part.start + part.count):
        rel = audio_path(part.split, index)
        m = instantiate(ctx, part.split, index, mixture_id(part.split, index), rel)
        write_flac(stage / rel, m.audio, m.recipe.sample_rate_hz, compression_level=FLAC_COMPRESSION_LEVEL)
        rows[MIXTURES].append(m.recipe)
        rows[OCCURRENCES].extend(m.occurrences)
        rows[SEGMENTS].extend(m.segments)
        dropped += m.dropped_occurrences
    parts = stage / PARTS
    r = part.run
    exports.write_partition_files(stage, parts / part.key, rows[MIXTURES], rows[OCCURRENCES], rows[SEGMENTS],
                                  txt=r.export_txt, jams=r.export_jams, spec=r.spec, sources=ctx.sources,
                                  events_dir=Path(r.events_dir), backgrounds_dir=Path(r.backgrounds_dir),
                                  events=ctx.events[part.split], backgrounds=ctx.backgrounds[part.split])
    for name, records in rows.items():
        write_manifest(parts / f"{part.key}.{name}", records, RECORDS[name])
    write_json(parts / f"{part.key}.done.json", {"dropped_occurrences": dropped})
    return {"dropped_occurrences": dropped}


def draw_timelines(task: Timelines) -> dict:
    """Make the pictured mixtures again and draw them into the staging folder's parts."""
    ctx = load_context(task.run)
    made = [instantiate(ctx, split, index, mixture_id(split, index), audio_path(split, index)) for split, index in task.mixtures]
    exports.plot_timelines(None, [m.recipe for m in made], {m.recipe.mixture_id: m.occurrences for m in made},
                           {m.recipe.mixture_id: m.segments for m in made}, Path(task.run.stage_dir) / PARTS / TIMELINES_PART,
                           audio_of={m.recipe.mixture_id: m.audio for m in made})
    return {}


def run_task(task: Partition | Timelines) -> dict:
    """One unit of the stage's map: a partition, or the picture."""
    return draw_timelines(task) if isinstance(task, Timelines) else render_partition(task)


def room_digests(spec: MixSpec) -> tuple[dict[str, str], list[Skip]]:
    """The impulse-response files a run may use (``reverb.rirs``, when reverb is on): ``(room id ->
    sha256 of the file, skips)``. A file that does not load is skipped with its reason, as the
    workers skip it; none usable stops the run."""
    rev = spec.reverb
    if not rev.rirs or (rev.probability <= 0 and rev.background_probability <= 0):
        return {}, []
    try:
        good, bad = usable_rooms(rev.rirs, spec.sample_rate_hz)
    except AugmentError as e:
        raise MixError(f"mix: {e}") from None
    skips = []
    for rid, reason, detail in bad:
        path = str(room_file(rid))
        skips.append(Skip(path, path, reason, f"impulse response: {detail}"))
    return {rid: file_sha256(room_file(rid)) for rid in good}, skips


def plan_partitions(p: MixParams, run: MixRun) -> list[Partition]:
    out = []
    for split in SPLITS:
        total = getattr(p.mixtures, split)
        for start in range(0, total, p.partition_size):
            key = f"{split}-{start // p.partition_size:05d}"
            out.append(Partition(run, key, split, start, min(p.partition_size, total - start)))
    return out


def run(params: Params, events_dir: Path | None = None, backgrounds_dir: Path | None = None, out_dir: Path | None = None) -> dict:
    """Make every split's mixtures; returns the summary (also written to ``summary.json``).

    The output folder is checked against the inputs and locked before anything is written: the
    library folder beside it is this run's too.
    """
    p = params.mix
    events_dir = Path(events_dir or p.events or params.clip.out_dir).resolve()
    backgrounds_dir = Path(backgrounds_dir or p.backgrounds or params.ambience.out_dir).resolve()
    out_dir = Path(out_dir or p.out_dir)
    check_out_dir(out_dir, "mix.out_dir", {**folders_besides(params, "mix.out_dir"), "mix.events": events_dir, "mix.backgrounds": backgrounds_dir})
    with output_lock(out_dir):
        return _run(params, events_dir, backgrounds_dir, out_dir)


def _run(params: Params, events_dir: Path, backgrounds_dir: Path, out_dir: Path) -> dict:
    p = params.mix
    spec = resolve_spec(p.preset, p.spec, sample_rate_hz=params.sample_rate_hz)  # the params check's spec, from the cache
    folders = prepare_sources(params, spec, events_dir, backgrounds_dir, out_dir)
    events_dir, backgrounds_dir = folders.events_dir, folders.backgrounds_dir
    events, backgrounds = read_sources(events_dir, backgrounds_dir)
    check_sample_rates(spec, events, backgrounds, events_dir, backgrounds_dir)

    events, backgrounds, skips, license_drops = filter_licenses(events, backgrounds, p.allowed_licenses)
    skips = folders.skips + skips
    try:
        hops = {round(x.envelope_hop_s, 9) for x in [*events, *backgrounds]}
        if len(hops) > 1:
            raise MixError(f"mix: event and background envelopes use different hops {sorted(hops)} s; "
                           "set clip.envelope_hop_s and ambience.envelope_hop_s to the same value and re-run both stages")
        if sum(dataclasses.asdict(p.mixtures).values()) == 0:
            raise MixError("mix: mix.mixtures asks for 0 mixtures in every split; set mix.mixtures.train, valid or test to the number to make")
        event_pools, bg_pools = assign_splits(events, backgrounds, p, spec, params.seed)
        rooms, room_skips = room_digests(spec)
        skips = skips + room_skips
    except MixError as e:
        if folders.library_dir is not None:
            shutil.rmtree(folders.library_dir, ignore_errors=True)
        raise refusal(e, out_dir, skips, license_drops, p.allowed_licenses) from None

    plan = {
        "spec": spec.to_dict(),
        "seed": params.seed,
        "relabel": dataclasses.asdict(p.relabel),
        "mixtures": dataclasses.asdict(p.mixtures),
        "partition_size": p.partition_size,
        "events_dir": str(events_dir),
        "backgrounds_dir": str(backgrounds_dir),
        "event_pools": {s: [e.clip_id for e in event_pools[s]] for s in SPLITS},
        "background_pools": {s: [b.segment_id for b in bg_pools[s]] for s in SPLITS},
        "inputs": {"events": file_sha256(events_dir / MANIFEST), "backgrounds": file_sha256(backgrounds_dir / MANIFEST)},
        "export": {"txt": p.export.txt, "jams": p.export.jams},  # written by the partitions
        "rooms": rooms,  # impulse-response file -> sha256: a resumed run never mixes in partitions of other files
        "partition_files": list(PARTITION_FILES),
    }
    plan_bytes = json.dumps(plan, sort_keys=True).encode("utf-8")
    fingerprint = hashlib.sha256(plan_bytes).hexdigest()

    compute = dataclasses.replace(params.compute, chunk_size=1)
    with Workers(compute, preload=(render_partition.__module__,)) as workers, resumable_dir(out_dir, fingerprint) as (stage, resumed):
        (stage / PLAN).write_bytes(plan_bytes)
        bank = stage / BANK
        if not (bank / COMPLETE).exists():
            shutil.rmtree(bank, ignore_errors=True)
            used_events = sorted({e.clip_id for pool in event_pools.values() for e in pool})
            used_bgs = sorted({b.segment_id for pool in bg_pools.values() for b in pool})
            ev = {e.clip_id: e for e in events}
            bg = {b.segment_id: b for b in backgrounds}
            build_bank(bank, spec.sample_rate_hz,
                       [(i, events_dir / ev[i].audio_path) for i in used_events],
                       [(i, backgrounds_dir / bg[i].audio_path) for i in used_bgs])
        mix_run = MixRun(str(stage), fingerprint, spec, params.seed, p.relabel, p.export.txt, p.export.jams,
                         str(folders.final_dir("events", out_dir)), str(folders.final_dir("backgrounds", out_dir)))
        partitions = plan_partitions(p, mix_run)
        pending = [pt for pt in partitions if not (stage / PARTS / f"{pt.key}.done.json").exists()]
        if resumed:
            print(f"mix: resuming: {len(partitions) - len(pending)} of {len(partitions)} partitions already done", file=sys.stderr)
        pictured = tuple(exports.timeline_mixtures(dataclasses.asdict(p.mixtures), p.export.timelines))
        picture = [Timelines(mix_run, pictured)] if pictured and not (stage / PARTS / TIMELINES_PART).exists() else []
        map_ordered(run_task, picture + pending, compute, desc="mix partitions", workers=workers)  # the picture first: no tail
        workers.begin_close()  # the cluster shuts down while this process joins the partitions

        tables = {}
        for name, record_type in RECORDS.items():
            pieces = [read_parquet(stage / PARTS / f"{pt.key}.{name}") for pt in partitions]
            tables[name] = pa.concat_tables(pieces) if pieces else arrow_schema(record_type).empty_table()
            write_table(stage / name, tables[name])
        dropped = sum(json.loads((stage / PARTS / f"{pt.key}.done.json").read_text())["dropped_occurrences"] for pt in partitions)
        write_skips(stage / SKIPPED, skips)
        write_json(stage / SPEC, spec.to_dict())
        fragments = {split: [stage / PARTS / pt.key for pt in partitions if pt.split == split] for split in SPLITS}
        summary = exports.write_all(stage, tables, fragments, p, spec, events, backgrounds)
        if (stage / PARTS / TIMELINES_PART).exists():
            (stage / PARTS / TIMELINES_PART).replace(stage / TIMELINES)
        if folders.library_dir is not None:
            shutil.rmtree(stage / SOURCES, ignore_errors=True)  # left by a run killed after this move
            folders.library_dir.rename(stage / SOURCES)
            summary["libraries"] = folders.libraries
        summary.update({"skipped": len(skips), "skipped_by_reason": dict(sorted(Counter(x.reason for x in skips).items())),
                        "license_filter": {"allowed": list(p.allowed_licenses), "dropped": license_drops},
                        "dropped_occurrences": dropped, "preset": p.preset, "sample_rate_hz": spec.sample_rate_hz,
                        **({"room_files": rooms} if rooms else {})})
        write_json(stage / SUMMARY, summary)
        shutil.rmtree(stage / PARTS, ignore_errors=True)
        shutil.rmtree(bank, ignore_errors=True)
        (stage / PLAN).unlink()
    rejected_report_path(out_dir).unlink(missing_ok=True)  # a report of an earlier refused run no longer applies
    print(format_mix_summary(summary), file=sys.stderr)
    return summary


def refusal(error: MixError, out_dir: Path, skips: list[Skip], license_drops: dict, allowed: tuple[str, ...]) -> MixError:
    """The error a run that cannot make its mixtures stops with; its skip report is written beside ``out_dir``."""
    report = rejected_report_path(out_dir)
    write_skips(report, skips)
    text = str(error)
    if any(license_drops.values()):
        text += f"; {describe_license_drops(license_drops, allowed)}"
    if skips:
        reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(Counter(x.reason for x in skips).items()))
        text += f"; sources skipped by reason: {reasons} (each listed in {report})"
    return MixError(f"{text}; {out_dir} was left as it was")


def format_mix_summary(summary: dict) -> str:
    lines = [f"mix: {summary['mixtures']} mixtures ({', '.join(f'{k} {v}' for k, v in summary['mixtures_by_split'].items())}), "
             f"{summary['occurrences']} event occurrences, {summary['segments']} label segments"]
    lines.append(f"  realised SNR - drawn SNR: median {summary['snr_error_db']['median']:+.3f} dB, "
                 f"max |.| {summary['snr_error_db']['max_abs']:.3f} dB ({summary['level_mode']} mode)")
    license_filter = summary["license_filter"]
    for kind, lib in summary.get("libraries", {}).items():
        lines.append(f"  library {kind}: {lib['kept']} files kept, {lib['skipped']} skipped (skipped.csv), from {lib['root']}")
    lines.append(f"  dataset licence: {summary['licenses']['dataset_license']}; "
                 f"{describe_license_drops(license_filter['dropped'], tuple(license_filter['allowed']))}; "
                 f"{summary['dropped_occurrences']} occurrences dropped by placement")
    return "\n".join(lines)
