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
  spec); ``skipped.csv`` (sources left out and why); ``label-coverage.csv`` (event clips per
  label per split); ``summary.json`` (with ``split_rule``: how events and backgrounds were
  split, and what a dataset card must say when backgrounds are not held out);
- for a library input, ``sources/events`` and/or ``sources/backgrounds``: its files as analysed
  for this run, in the clip or ambience stage's layout (their ``source_path`` relative to the
  library root), so the recipes re-render from the output alone.

The stage refuses, before any audio is read, to upsample (``sample_rate_hz`` above the clips'
or backgrounds' rate), to read a library's root as a library (``foreground`` and ``background``
would become labels) and to make zero mixtures; a split its sources cannot serve stops it with
the counts (clips available against clips needed, what ``mix.allowed_licenses`` dropped) and
the run's reports (``skipped.csv``, ``label-coverage.csv``) in its report folder,
``<parent of out_dir>/reports/<name of out_dir>/`` (:func:`report_dir`), the previous output
untouched. A library file is reported by its path in the library, not by the excerpt made of it.

Reading and checking the sources is :mod:`pipeline.mix.sources`; which of them serve which split,
after the licence filter, is :mod:`pipeline.mix.selection` (no source feeds two splits).

Work is cut into partitions of ``partition_size`` mixtures (:mod:`pipeline.mix.partitions`). A
worker renders its partition's audio and writes everything that grows with the number of
mixtures (FLAC, txt and JAMS files, its rows of the tables and of the DCASE files); this
process only joins them. The timelines picture is one more task of the same map, drawn first
from its mixtures made again, so it runs beside the partitions. With several workers, the
workers boot while this process reads the manifests and decodes the sources into the bank.
Each finished partition is kept in the hidden staging folder; a run that is killed and started
again with the same inputs and params skips finished partitions and ends with the same bytes as
an uninterrupted run.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import sys
from collections import Counter
from pathlib import Path

from pipeline.compute import Workers, map_ordered
from pipeline.config.mix_spec import resolve_spec
from pipeline.config.params import MixParams, Params, folders_besides
from pipeline.mix import exports
from pipeline.mix.layout import SPEC
from pipeline.mix.partitions import (
    PLAN,
    MixRun,
    clear_staging,
    fill_bank,
    join_partitions,
    make_plan,
    pending,
    picture_task,
    plan_partitions,
    run_task,
)
from pipeline.mix.scaper_library import LIBRARY_DATASET
from pipeline.mix.selection import (
    capped_splits,
    check_pools,
    describe_license_drops,
    events_by_fsd50k,
    filter_licenses,
    label_coverage,
    needed_splits,
    split_pools,
)
from pipeline.mix.sources import (
    MixError,
    check_envelope_hops,
    check_sample_rates,
    prepare_sources,
    read_sources,
    room_digests,
)
from pipeline.outputs import (
    SKIPPED,
    SUMMARY,
    check_out_dir,
    output_lock,
    rejected_report_path,
    resumable_dir,
    write_atomic,
    write_json,
    write_skips,
)
from pipeline.schema import SPLITS, BackgroundSegment, EventClip, Skip

LABEL_COVERAGE = "label-coverage.csv"
REPORTS = "reports"


def run(params: Params, events_dir: Path | None = None, backgrounds_dir: Path | None = None, out_dir: Path | None = None) -> dict:
    """Make every split's mixtures; returns the summary (also written to ``summary.json``).

    The output folder is checked against the inputs and locked before anything is written: the
    library folder beside it is this run's too.
    """
    p = params.mix
    events_dir = Path(events_dir or p.events or params.clip.out_dir).resolve()
    backgrounds_dir = Path(backgrounds_dir or p.backgrounds or params.ambience.out_dir).resolve()
    out_dir = Path(out_dir or p.out_dir)
    check_out_dir(
        out_dir,
        "mix.out_dir",
        {**folders_besides(params, "mix.out_dir"), "mix.events": events_dir, "mix.backgrounds": backgrounds_dir},
    )
    with output_lock(out_dir):
        return _run(params, events_dir, backgrounds_dir, out_dir)


def _run(params: Params, events_dir: Path, backgrounds_dir: Path, out_dir: Path) -> dict:
    p = params.mix
    spec = resolve_spec(p.preset, p.spec, sample_rate_hz=params.sample_rate_hz)  # the params check's spec, from the cache
    folders = prepare_sources(params, spec, events_dir, backgrounds_dir, out_dir)
    events_dir, backgrounds_dir = folders.events_dir, folders.backgrounds_dir
    events, backgrounds = read_sources(events_dir, backgrounds_dir, envelopes=False)  # the workers read the envelopes
    check_sample_rates(spec, events, backgrounds, events_dir, backgrounds_dir)

    events, backgrounds, skips, license_drops = filter_licenses(
        events, backgrounds, p.allowed_licenses, from_library=tuple(folders.libraries)
    )
    skips = folders.skips + skips
    coverage: dict[str, dict[str, int]] = {}
    try:
        check_envelope_hops(events, backgrounds)
        if sum(dataclasses.asdict(p.mixtures).values()) == 0:
            raise MixError(
                "mix: mix.mixtures asks for 0 mixtures in every split; set mix.mixtures.train, valid or test to the number to make"
            )
        event_pools, bg_pools = split_pools(events, backgrounds, p, params.seed)
        coverage = label_coverage(event_pools)
        check_pools(event_pools, bg_pools, events, backgrounds, p, spec)
        rooms, room_skips = room_digests(spec)
        skips = skips + room_skips
    except MixError as e:
        folders.discard_libraries()
        raise refusal(e, out_dir, skips, license_drops, p.allowed_licenses, coverage, needed_splits(p)) from None

    plan, fingerprint = make_plan(params, spec, events_dir, backgrounds_dir, event_pools, bg_pools, rooms)
    compute = dataclasses.replace(params.compute, chunk_size=1)
    with Workers(compute, preload=(run_task.__module__,)) as workers, resumable_dir(out_dir, fingerprint) as (stage, resumed):
        (stage / PLAN).write_bytes(plan)
        fill_bank(stage, spec.sample_rate_hz, event_pools, bg_pools, events_dir, backgrounds_dir)
        mix_run = MixRun(
            str(stage),
            fingerprint,
            spec,
            params.seed,
            p.relabel,
            export_txt=p.export.txt,
            export_jams=p.export.jams,
            events_dir=str(folders.final_dir("events", out_dir)),
            backgrounds_dir=str(folders.final_dir("backgrounds", out_dir)),
        )
        parts = plan_partitions(p, mix_run)
        todo = pending(stage, parts)
        if resumed:
            print(f"mix: resuming: {len(parts) - len(todo)} of {len(parts)} partitions already done", file=sys.stderr)
        tasks = picture_task(stage, p, mix_run) + todo  # the picture first: no tail
        map_ordered(run_task, tasks, compute, desc="mix partitions", workers=workers)
        workers.begin_close()  # the cluster shuts down while this process joins the partitions

        tables, fragments, dropped = join_partitions(stage, parts)
        write_skips(stage / SKIPPED, skips)
        write_json(stage / SPEC, spec.to_dict())
        write_label_coverage(stage / LABEL_COVERAGE, coverage, needed_splits(p))
        summary = exports.write_all(stage, tables, fragments, p, spec, events, backgrounds)
        folders.keep_libraries(stage)
        if folders.library_dir is not None:
            summary["libraries"] = folders.libraries
        summary.update(
            {
                "skipped": len(skips),
                "skipped_by_reason": dict(sorted(Counter(x.reason for x in skips).items())),
                "license_filter": {"allowed": list(p.allowed_licenses), "dropped": license_drops},
                "dropped_occurrences": dropped,
                "preset": p.preset,
                "sample_rate_hz": spec.sample_rate_hz,
                "split_rule": split_rule(p, events, bg_pools),
                "label_coverage": coverage_summary(coverage, needed_splits(p)),
                **(
                    {"events_per_mixture_capped": capped}
                    if (capped := capped_splits(event_pools, spec, needed_splits(p)))
                    else {}
                ),
                **({"room_files": rooms} if rooms else {}),
            }
        )
        write_json(stage / SUMMARY, summary)
        clear_staging(stage)
    # reports of an earlier refused run no longer apply
    rejected_report_path(out_dir).unlink(missing_ok=True)
    clear_reports(out_dir)
    print(format_mix_summary(summary), file=sys.stderr)
    return summary


def report_dir(out_dir: Path) -> Path:
    """Where a run that makes no mixtures leaves its reports: ``<parent>/reports/<name>/`` of ``out_dir``
    (``data/reports/mixtures/``), apart from the output, which such a run leaves as it was."""
    out_dir = Path(out_dir)
    return out_dir.parent / REPORTS / out_dir.name


def clear_reports(out_dir: Path) -> None:
    """Remove a refused run's reports of ``out_dir`` (and the report folders they leave empty)."""
    folder = report_dir(out_dir)
    for name in (SKIPPED, LABEL_COVERAGE):
        (folder / name).unlink(missing_ok=True)
    for empty in (folder, folder.parent):
        try:
            empty.rmdir()
        except OSError:  # absent, or holding other runs' reports
            break


def refusal(
    error: MixError,
    out_dir: Path,
    skips: list[Skip],
    license_drops: dict,
    allowed: tuple[str, ...],
    coverage: dict[str, dict[str, int]] | None = None,
    needed: list[str] | None = None,
) -> MixError:
    """The error a run that cannot make its mixtures stops with.

    Its skip report (and, once the splits were drawn, its label coverage) go to
    :func:`report_dir`; the message names them.
    """
    folder = report_dir(out_dir)
    report = folder / SKIPPED
    write_skips(report, skips)
    if coverage:
        write_label_coverage(folder / LABEL_COVERAGE, coverage, needed or list(SPLITS))
    else:
        (folder / LABEL_COVERAGE).unlink(missing_ok=True)  # an earlier run's would describe other pools
    text = str(error)
    if any(license_drops.values()):
        text += f"; {describe_license_drops(license_drops, allowed)}"
    if skips:
        reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(Counter(x.reason for x in skips).items()))
        text += f"; sources skipped by reason: {reasons} (each listed in {report})"
    if coverage:
        text += f"; event clips per label and split in {folder / LABEL_COVERAGE}"
    return MixError(f"{text}; {out_dir} was left as it was")


def missing_splits(counts: dict[str, int], needed: list[str]) -> list[str]:
    """The needed splits a label has no clip in."""
    return [s for s in needed if counts[s] == 0]


def write_label_coverage(path: Path, coverage: dict[str, dict[str, int]], needed: list[str]) -> None:
    """``label,train,valid,test,missing_from``: event clips per label and split, and the splits
    making mixtures that the label does not reach (space-separated; empty when it reaches all)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["label", *SPLITS, "missing_from"])
    for label, counts in coverage.items():
        writer.writerow([label, *(counts[s] for s in SPLITS), " ".join(missing_splits(counts, needed))])
    write_atomic(path, buf.getvalue().encode("utf-8"))


def coverage_summary(coverage: dict[str, dict[str, int]], needed: list[str]) -> dict:
    """``summary.json``'s ``label_coverage``: labels in all, labels per split, and each label missing from a split."""
    return {
        "labels": len(coverage),
        "labels_by_split": {s: sum(1 for c in coverage.values() if c[s] > 0) for s in SPLITS},
        "missing": {label: missing_splits(c, needed) for label, c in coverage.items() if missing_splits(c, needed)},
        "report": LABEL_COVERAGE,
    }


BACKGROUND_SPLITS = {
    "recording": "each background recording serves one split",
    "segment": "a recording's segments are split apart: one recording can serve several splits, each with other stretches of it",
    "shared": "every background serves every split: the valid and test mixtures' backgrounds are not held out from train",
}


def split_rule(p: MixParams, events: list[EventClip], bg_pools: dict[str, list[BackgroundSegment]]) -> dict:
    """``summary.json``'s ``split_rule``: how events and backgrounds were split, in words a dataset card can quote.

    ``backgrounds_held_out`` is false when one recording serves more than one split
    (``segment`` or ``shared``); ``shared_backgrounds`` counts the recordings that do.
    """
    if any(e.source_dataset == LIBRARY_DATASET for e in events):
        rule = "a library's files, split within each label in mix.holdout's shares"
    elif events_by_fsd50k(events, p):
        rule = "FSD50K's split: dev train -> train, dev val -> valid, eval -> test"
    else:
        rule = "by source clip in mix.holdout's shares"
    splits_of: dict[str, set[str]] = {}
    for s in SPLITS:
        for b in bg_pools[s]:
            splits_of.setdefault(b.source_id, set()).add(s)
    shared = sum(1 for owners in splits_of.values() if len(owners) > 1)
    return {
        "events": rule,
        "backgrounds": p.background_split,
        "backgrounds_rule": BACKGROUND_SPLITS[p.background_split],
        "backgrounds_held_out": shared == 0,
        "shared_backgrounds": shared,
    }


def format_mix_summary(summary: dict) -> str:
    lines = [
        f"mix: {summary['mixtures']} mixtures ({', '.join(f'{k} {v}' for k, v in summary['mixtures_by_split'].items())}), "
        f"{summary['occurrences']} event occurrences, {summary['segments']} label segments"
    ]
    lines.append(
        f"  realised SNR - drawn SNR: median {summary['snr_error_db']['median']:+.3f} dB, "
        f"max |.| {summary['snr_error_db']['max_abs']:.3f} dB ({summary['level_mode']} mode)"
    )
    license_filter = summary["license_filter"]
    for kind, lib in summary.get("libraries", {}).items():
        cut = f" (cut into {lib['segments']} segments)" if "segments" in lib else ""
        lines.append(
            f"  library {kind}: {lib['kept']} files kept{cut}, {lib['skipped']} skipped (skipped.csv), from {lib['root']}"
        )
    cover = summary.get("label_coverage")
    if cover:
        by_split = ", ".join(
            f"{s} {n}/{cover['labels']}"
            for s, n in cover["labels_by_split"].items()
            if summary["mixtures_by_split"].get(s, 0) > 0
        )
        line = f"  labels per split: {by_split}"
        if cover["missing"]:
            shown = list(cover["missing"].items())[:5]
            line += (
                "; missing: "
                + ", ".join(f"{label} from {' '.join(splits)}" for label, splits in shown)
                + (f" and {len(cover['missing']) - len(shown)} more" if len(cover["missing"]) > len(shown) else "")
                + f" ({cover['report']})"
            )
        lines.append(line)
    for split, n in summary.get("events_per_mixture_capped", {}).items():
        lines.append(
            f"  split {split}: {n} event clips, fewer than a mixture may draw; with distinct_clips its mixtures hold at most {n} events"
        )
    rule = summary.get("split_rule", {})
    if rule and not rule["backgrounds_held_out"]:
        lines.append(
            f"  backgrounds (mix.background_split: {rule['backgrounds']}): {rule['backgrounds_rule']}; "
            f"{rule['shared_backgrounds']} recordings serve more than one split"
        )
    lines.append(
        f"  dataset licence: {summary['licenses']['dataset_license']}; "
        f"{describe_license_drops(license_filter['dropped'], tuple(license_filter['allowed']))}; "
        f"{summary['dropped_occurrences']} occurrences dropped by placement"
    )
    return "\n".join(lines)
