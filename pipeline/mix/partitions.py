"""The mix stage's partitions: the plan a run fixes up front, the work of one partition, and joining them.

Work is cut into partitions of ``partition_size`` mixtures. Before any is made, the run's plan
(:func:`make_plan`: the resolved spec, seed, counts, source manifests, split pools, exports and
room files) is written into the staging folder, and its sha256 names the run: a run killed and
started again with the same plan gets the same staging folder back and skips the partitions
marked done, so it ends with the same bytes as an uninterrupted run.

Input of a worker: a :class:`Partition` (or the :class:`Timelines` picture), carrying the
:class:`MixRun` every task shares; the source pools come from the plan, the decoded sources
from the bank (:mod:`pipeline.mix.bank`), both in the staging folder. Output of a partition,
under ``<stage>/parts``: its FLAC (and txt, JAMS) files in place, its rows of the three tables
and of the DCASE files, then ``<key>.done.json``. :func:`join_partitions` concatenates the
rows in partition order; :func:`clear_staging` removes the bookkeeping.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pyarrow as pa

from pipeline.audio import encode_flac
from pipeline.config.mix_spec import MixSpec
from pipeline.config.params import MixParams, Params, RelabelParams
from pipeline.mix import exports
from pipeline.mix.bank import SourceBank, bank_sources, ensure_bank
from pipeline.mix.instantiate import MixContext, instantiate
from pipeline.mix.layout import MIXTURES, OCCURRENCES, RECORDS, SEGMENTS, TIMELINES, audio_path, mixture_id
from pipeline.mix.sources import read_envelopes, read_parquet, read_sources
from pipeline.outputs import MANIFEST, file_sha256, write_json, write_table
from pipeline.schema import SPLITS, BackgroundSegment, EventClip, arrow_schema

PARTS = "parts"
PARTITION_FILES = ("mixtures.parquet", "occurrences.parquet", "segments.parquet", "events.tsv", "durations.tsv", "done.json")
BANK = "bank"
PLAN = "plan.json"
FLAC_COMPRESSION_LEVEL = 0.0  # libFLAC's fastest level: 10% less encoding time, 2-3% larger files


def encode_mixture(q, sample_rate_hz: int) -> bytes:
    """A mixture's int16 samples -> its stored FLAC bytes (16-bit, :data:`FLAC_COMPRESSION_LEVEL`)."""
    return encode_flac(q, sample_rate_hz, compression_level=FLAC_COMPRESSION_LEVEL)


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
    """One unit of work: mixtures ``start`` to ``start + count - 1`` of ``split``, its files under ``parts/<key>``."""

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
    events_dir, backgrounds_dir = Path(plan["events_dir"]), Path(plan["backgrounds_dir"])
    events, backgrounds = read_sources(events_dir, backgrounds_dir, envelopes=False)
    ev = {e.clip_id: e for e in events}
    bg = {b.segment_id: b for b in backgrounds}
    return MixContext(
        spec=run.spec,
        seed=run.seed,
        relabel=run.relabel,
        sources=SourceBank(Path(run.stage_dir) / BANK),
        events={s: [ev[i] for i in ids] for s, ids in plan["event_pools"].items()},
        backgrounds={s: [bg[i] for i in ids] for s, ids in plan["background_pools"].items()},
        stored_envelopes=(read_envelopes(events_dir, "clip_id"), read_envelopes(backgrounds_dir, "segment_id")),
    )


def render_partition(part: Partition) -> dict:
    """Make one partition's mixtures: FLAC (and txt, JAMS) files, its DCASE rows, its three tables, then a done marker."""
    ctx = load_context(part.run)
    stage = Path(part.run.stage_dir)
    rows: dict[str, list] = {MIXTURES: [], OCCURRENCES: [], SEGMENTS: []}
    dropped = 0
    (stage / audio_path(part.split, part.start)).parent.mkdir(parents=True, exist_ok=True)  # once, not once per file
    for index in range(part.start, part.start + part.count):
        rel = audio_path(part.split, index)
        m = instantiate(ctx, part.split, index, mixture_id(part.split, index), rel)
        with open(
            stage / rel, "wb"
        ) as f:  # in place, as pipeline.audio.write_flac writes: the staging folder is swapped in whole
            f.write(encode_mixture(m.audio, m.recipe.sample_rate_hz))
        rows[MIXTURES].append(m.recipe)
        rows[OCCURRENCES].extend(m.occurrences)
        rows[SEGMENTS].extend(m.segments)
        dropped += m.dropped_occurrences
    parts = stage / PARTS
    r = part.run
    exports.write_partition_files(
        stage,
        parts / part.key,
        rows[MIXTURES],
        rows[OCCURRENCES],
        rows[SEGMENTS],
        exports.PartitionExports(
            write_txt=r.export_txt,
            write_jams=r.export_jams,
            spec=r.spec,
            sources=ctx.sources,
            events_dir=Path(r.events_dir),
            backgrounds_dir=Path(r.backgrounds_dir),
            events=ctx.events[part.split],
            backgrounds=ctx.backgrounds[part.split],
        ),
    )
    write_partition_tables(parts, part.key, rows)
    write_json(parts / f"{part.key}.done.json", {"dropped_occurrences": dropped})
    ctx.sources.release()  # the sources this partition read leave the worker's resident pages
    return {"dropped_occurrences": dropped}


def write_partition_tables(parts: Path, key: str, rows: dict[str, list]) -> None:
    """A partition's recipes, occurrences and segments (``rows``, by table name) as its three tables under ``parts``."""
    for name, records in rows.items():
        write_table(parts / f"{key}.{name}", flat_table(records, RECORDS[name]))


@lru_cache(maxsize=None)
def _flat_schema(record_type: type) -> pa.Schema:
    schema = arrow_schema(record_type)
    nested = [
        f.name
        for f in schema
        if pa.types.is_struct(f.type) or (pa.types.is_list(f.type) and not pa.types.is_string(f.type.value_type))
    ]
    if nested:
        raise TypeError(f"{record_type.__name__} has nested fields {nested}: use pipeline.schema.to_table")
    return schema


def flat_table(records: list, record_type: type) -> pa.Table:
    """:func:`~pipeline.schema.to_table` for records whose fields are plain values or tuples of
    strings (a partition's recipes, occurrences and segments): the same table, the values handed
    to Arrow as they are, without converting each one (0.3 ms per mixture)."""
    schema = _flat_schema(record_type)
    return pa.Table.from_pydict({name: [getattr(r, name) for r in records] for name in schema.names}, schema=schema)


def draw_timelines(task: Timelines) -> dict:
    """Make the pictured mixtures again and draw them into the staging folder's parts."""
    ctx = load_context(task.run)
    made = [instantiate(ctx, split, index, mixture_id(split, index), audio_path(split, index)) for split, index in task.mixtures]
    exports.plot_timelines(
        None,
        [m.recipe for m in made],
        {m.recipe.mixture_id: m.occurrences for m in made},
        {m.recipe.mixture_id: m.segments for m in made},
        Path(task.run.stage_dir) / PARTS / TIMELINES_PART,
        audio_of={m.recipe.mixture_id: m.audio for m in made},
    )
    return {}


def run_task(task: Partition | Timelines) -> dict:
    """One unit of the stage's map: a partition, or the picture."""
    return draw_timelines(task) if isinstance(task, Timelines) else render_partition(task)


def make_plan(
    params: Params,
    spec: MixSpec,
    events_dir: Path,
    backgrounds_dir: Path,
    event_pools: dict[str, list[EventClip]],
    bg_pools: dict[str, list[BackgroundSegment]],
    rooms: dict[str, str],
) -> tuple[bytes, str]:
    """The run's plan as JSON bytes (written to the staging folder, where workers read the pools) and its sha256.

    The plan holds everything a partition's bytes depend on, so a resumed run only reuses the
    partitions of the same plan. ``rooms``: impulse-response file -> sha256 (:func:`~pipeline.mix.sources.room_digests`).
    """
    p = params.mix
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
    return plan_bytes, hashlib.sha256(plan_bytes).hexdigest()


def fill_bank(
    stage: Path,
    sample_rate_hz: int,
    event_pools: dict[str, list[EventClip]],
    bg_pools: dict[str, list[BackgroundSegment]],
    events_dir: Path,
    backgrounds_dir: Path,
) -> None:
    """Decode every source the pools use into the staging folder's bank, unless a resumed run's bank is complete."""
    ensure_bank(stage / BANK, sample_rate_hz, *bank_sources(event_pools, bg_pools, events_dir, backgrounds_dir))


def plan_partitions(p: MixParams, run: MixRun) -> list[Partition]:
    """Every partition of the run, split by split in :data:`~pipeline.schema.SPLITS` order, ``partition_size`` mixtures each."""
    out = []
    for split in SPLITS:
        total = getattr(p.mixtures, split)
        for start in range(0, total, p.partition_size):
            key = f"{split}-{start // p.partition_size:05d}"
            out.append(Partition(run, key, split, start, min(p.partition_size, total - start)))
    return out


def pending(stage: Path, partitions: list[Partition]) -> list[Partition]:
    """The partitions still to make: those without a done marker (all of them, unless the run resumes)."""
    return [pt for pt in partitions if not (stage / PARTS / f"{pt.key}.done.json").exists()]


def picture_task(stage: Path, p: MixParams, run: MixRun) -> list[Timelines]:
    """The timelines picture's task, or none: ``mix.export.timelines`` is 0, or a resumed run already drew it."""
    pictured = tuple(exports.timeline_mixtures(dataclasses.asdict(p.mixtures), p.export.timelines))
    return [Timelines(run, pictured)] if pictured and not (stage / PARTS / TIMELINES_PART).exists() else []


def join_partitions(stage: Path, partitions: list[Partition]) -> tuple[dict[str, pa.Table], dict[str, list[Path]], int]:
    """The run's three tables, written into ``stage`` (rows in partition order); each split's partition
    prefixes (its DCASE fragments, for :func:`~pipeline.mix.exports.write_all`); the occurrences dropped by placement."""
    tables = {}
    for name, record_type in RECORDS.items():
        pieces = [read_parquet(stage / PARTS / f"{pt.key}.{name}") for pt in partitions]
        tables[name] = pa.concat_tables(pieces) if pieces else arrow_schema(record_type).empty_table()
        write_table(stage / name, tables[name])
    dropped = sum(json.loads((stage / PARTS / f"{pt.key}.done.json").read_text())["dropped_occurrences"] for pt in partitions)
    fragments = {split: [stage / PARTS / pt.key for pt in partitions if pt.split == split] for split in SPLITS}
    return tables, fragments, dropped


def clear_staging(stage: Path) -> None:
    """Put the picture in place and remove the bookkeeping (parts, bank, plan): the staging folder is then the output."""
    if (stage / PARTS / TIMELINES_PART).exists():
        (stage / PARTS / TIMELINES_PART).replace(stage / TIMELINES)
    shutil.rmtree(stage / PARTS, ignore_errors=True)
    shutil.rmtree(stage / BANK, ignore_errors=True)
    (stage / PLAN).unlink()
