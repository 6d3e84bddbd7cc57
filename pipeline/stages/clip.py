"""Stage ``clip``: cut clean single-event clips out of FSD50K-layout corpora.

Input: ``sources.fsd50k_dir`` (real FSD50K or the embedded corpus) and ``params.clip``.
Output folder ``clip.out_dir``:
- ``audio/<clip_id>.flac``: the first continuous high-energy segment of every single-label
  clip whose segment lasts ``min_duration_s``..``max_duration_s``, mono, 16-bit, at
  ``sample_rate_hz``;
- ``manifest.parquet``: one :class:`~pipeline.schema.EventClip` per file (source, label, MID,
  onset/offset in the source, licence, uploader, RMS, LUFS and the A-weighted envelope);
- ``skipped.csv``: every row or file not used, with the reason; ``summary.json``: counts;
- ``clipping_examples.png``: envelope, threshold and chosen segment for a few kept clips and
  for one refused clip of each energy reason that occurred (too short, too long, silent, ...).

A run that keeps no clip at all fails (:class:`~pipeline.outputs.NoOutputError`) and leaves
the previous output folder as it was; its skip report goes to ``<out_dir>.skipped.csv``.

Per-clip work (:func:`pipeline.clip.cutting.clip_one`) is independent, so the result does not depend
on the number of workers.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

from pipeline.clip.cutting import AUDIO_DIR, clip_one, plan_clips
from pipeline.clip.plots import plot_clipping_examples
from pipeline.compute import map_ordered
from pipeline.config.params import Params, folders_besides
from pipeline.outputs import (
    MANIFEST,
    SKIPPED,
    SUMMARY,
    check_out_dir,
    format_summary,
    refuse_empty,
    rejected_report_path,
    staged_dir,
    summarize,
    write_json,
    write_manifest,
    write_skips,
)
from pipeline.schema import EventClip, Skip

EXAMPLES_PNG = "clipping_examples.png"


def run(params: Params, fsd50k_dir: Path | None = None, out_dir: Path | None = None) -> dict:
    """Run the stage; returns the summary written to ``summary.json``.

    A run that keeps no clip raises :class:`~pipeline.outputs.NoOutputError` (CLI exit
    status 2) with the count per skip reason, leaves ``out_dir`` as it was and writes its
    skip report to ``<out_dir>.skipped.csv``.
    """
    fsd50k_dir = Path(fsd50k_dir or params.sources.fsd50k_dir)
    out_dir = Path(out_dir or params.clip.out_dir)
    check_out_dir(out_dir, "clip.out_dir", {**folders_besides(params, "clip.out_dir"), "sources.fsd50k_dir": fsd50k_dir})
    tasks, skips = plan_clips(fsd50k_dir, params.clip)
    num_rows = len(tasks) + len(skips)
    with staged_dir(out_dir) as stage:
        work = partial(clip_one, p=params.clip, sample_rate_hz=params.sample_rate_hz, audio_dir=stage / AUDIO_DIR)
        results = map_ordered(work, tasks, params.compute, desc="clip")
        records = [r for r in results if isinstance(r, EventClip)]
        skips += [r for r in results if isinstance(r, Skip)]
        summary = summarize(
            num_inputs=num_rows,
            num_outputs=len(records),
            skips=skips,
            event_seconds=round(sum(r.duration_s for r in records), 3),
        )
        if not records:
            refuse_empty(out_dir, summary, skips, "event clips", "rows")
        (stage / AUDIO_DIR).mkdir(exist_ok=True)
        write_manifest(stage / MANIFEST, records, EventClip)
        write_skips(stage / SKIPPED, skips)
        if params.clip.plot_examples:
            plot_clipping_examples(records[: params.clip.plot_examples], skips, fsd50k_dir, params.clip, stage / EXAMPLES_PNG)
        write_json(stage / SUMMARY, summary)
    rejected_report_path(out_dir).unlink(missing_ok=True)  # a report of an earlier empty run no longer applies
    print(format_summary("clip", summary, "event clips", "rows"), file=sys.stderr)
    return summary
