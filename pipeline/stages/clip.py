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

Per-clip work (:func:`pipeline.events.clip_one`) is independent, so the result does not depend
on the number of workers.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from pipeline.audio import AudioError, downmix, read_audio, remove_dc
from pipeline.compute import map_ordered
from pipeline.config.params import ClipParams, Params, folders_besides
from pipeline.events import AUDIO_DIR, clip_one, plan_clips
from pipeline.figures import pyplot, save_png
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
from pipeline.segmentation import find_segment

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


# Skip reasons decided on the clip's energy curve: the picture shows one clip of each that occurred.
REFUSAL_REASONS_WITH_CURVE = ("no-segment", "silent", "too-short", "too-long", "clipped")


@dataclass(frozen=True)
class _Panel:
    clip_id: str
    source_path: str
    reason: str  # "kept" or a skip reason
    detail: str
    segment_s: tuple[float, float] | None  # the kept segment; for a refusal, the segment it judged (if any)


def _panels(records: list[EventClip], skips: list[Skip]) -> tuple[list[_Panel], list[str]]:
    """Panels to draw (the kept examples, then the first refused clip of each curve reason) and lines for the rest."""
    panels = [_Panel(r.clip_id, r.source_path, "kept", f"{r.label}, {r.onset_in_source_s:.2f}-{r.offset_in_source_s:.2f} s",
                     (r.onset_in_source_s, r.offset_in_source_s)) for r in records]
    by_reason: dict[str, list[Skip]] = {}
    for s in sorted(skips, key=lambda s: s.item_id):
        by_reason.setdefault(s.reason, []).append(s)
    for reason in REFUSAL_REASONS_WITH_CURVE:
        if reason in by_reason:
            s = by_reason[reason][0]
            panels.append(_Panel(s.item_id, s.path, reason, s.detail, None))
    others = [f"{reason} {len(items)} (e.g. {items[0].item_id})" for reason, items in sorted(by_reason.items())
              if reason not in REFUSAL_REASONS_WITH_CURVE]
    return panels, others


def plot_clipping_examples(records: list[EventClip], skips: list[Skip], fsd50k_dir: Path, p: ClipParams, path: Path) -> list[str]:
    """FineLAP Fig. 6 style: frame and window energy, threshold and the kept segment, for kept and refused clips.

    Input: kept clips to draw, every skip of the run, the corpus root and the clip params.
    Output: ``path`` (PNG) with one panel per kept clip and one for the first refused clip of
    each energy-curve reason that occurred (:data:`REFUSAL_REASONS_WITH_CURVE`); reasons with
    no curve to show (missing file, multi-label, ...) are listed under the panels. Returns
    the panel titles, each holding the clip id and ``kept`` or the skip reason.
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    panels, others = _panels(records, skips)
    drawn: list[tuple[_Panel, np.ndarray, int]] = []
    for panel in panels:
        try:
            decoded = read_audio(Path(fsd50k_dir) / panel.source_path)
        except AudioError as e:  # changed since the run read it: list it instead
            others.append(f"{panel.reason} {panel.clip_id} (not drawn: {e.reason})")
            continue
        drawn.append((panel, remove_dc(downmix(decoded.samples)), decoded.sample_rate_hz))

    cols = 2
    rows = max(1, -(-len(drawn) // cols))
    footer_in = 0.35 + 0.18 * len(others) if others else 0.0
    height_in = 0.7 + 2.6 * rows + footer_in
    fig, axes = pyplot().subplots(rows, cols, figsize=(12, height_in), squeeze=False)
    titles: list[str] = []
    for ax, (panel, x, sr) in zip(axes.flat, drawn):
        seg = find_segment(x, sr, p.segmentation)
        refused = panel.reason != "kept"
        t_frame = (np.arange(seg.frame_energy_db.shape[0]) * seg.hop + seg.frame / 2) / sr
        width = min(p.segmentation.window_frames, seg.frame_energy_db.shape[0])
        t_window = (np.arange(seg.window_energy_db.shape[0]) * p.segmentation.window_step_frames * seg.hop + width * seg.hop / 2) / sr
        wave = ax.twinx()
        step = max(1, x.shape[0] // 4000)  # the picture needs a few thousand points, not every sample
        wave.plot(np.arange(0, x.shape[0], step) / sr, x[::step], color="0.75", lw=0.4)
        peak = float(np.max(np.abs(x))) if x.size else 0.0
        peak = peak or 1.0
        if panel.reason == "clipped":
            for level in (p.clip_level, -p.clip_level):
                wave.axhline(level, color="tab:red", ls=":", lw=0.8)
            peak = max(peak, p.clip_level)
        wave.set_ylim(-peak * 1.05, peak * 1.05)
        wave.set_yticks([])
        ax.set_zorder(wave.get_zorder() + 1)
        ax.patch.set_visible(False)
        floor_db = max(-130.0, float(seg.frame_energy_db.min()) - 5)  # digital silence sits at -120
        ax.plot(t_frame, np.maximum(seg.frame_energy_db, floor_db), color="tab:blue", lw=0.8)
        ax.plot(t_window, np.maximum(seg.window_energy_db, floor_db), color="tab:orange", lw=1.2)
        if np.isfinite(seg.threshold_db):
            ax.axhline(seg.threshold_db, color="tab:red", ls="--", lw=1)
        if panel.reason == "silent":
            ax.axhline(p.silence_dbfs, color="0.3", ls="-.", lw=1)
        span = panel.segment_s
        if refused and seg.found and panel.reason != "silent":
            span = (seg.start / sr, seg.end / sr)  # the segment the rule judged
        if span is not None:
            ax.axvspan(*span, color="tab:red" if refused else "tab:green", alpha=0.2)
        top = max(float(seg.frame_energy_db.max()), p.silence_dbfs if panel.reason == "silent" else -np.inf)
        ax.set_ylim(floor_db, max(top, floor_db + 10) + 10)
        ax.set_xlim(0, max(x.shape[0], 1) / sr)
        title = f"{panel.clip_id}  {panel.reason}: {panel.detail}"
        titles.append(title)
        ax.set_title(title, fontsize=9, color="tab:red" if refused else "black", loc="left")
        ax.set_xlabel("time (s)", fontsize=8)
        ax.set_ylabel("dBFS", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(drawn) :]:
        ax.axis("off")
    reasons = {panel.reason for panel, _, _ in drawn}
    handles = [
        Line2D([], [], color="tab:blue", lw=0.8, label="frame energy"),
        Line2D([], [], color="tab:orange", lw=1.2, label="window mean"),
        Line2D([], [], color="tab:red", ls="--", lw=1, label="threshold"),
        Patch(color="tab:green", alpha=0.2, label="kept segment"),
    ]
    if reasons - {"kept"}:
        handles.append(Patch(color="tab:red", alpha=0.2, label="refused segment"))
    if "silent" in reasons:
        handles.append(Line2D([], [], color="0.3", ls="-.", lw=1, label="silence level"))
    if "clipped" in reasons:
        handles.append(Line2D([], [], color="tab:red", ls=":", lw=0.8, label="clip level"))
    top_frac = 1 - 0.6 / height_in
    fig.suptitle("Event clipping: the first continuous segment above the threshold is kept if it passes the checks "
                 "(waveform in grey; refused clips titled in red)", fontsize=10, y=1 - 0.12 / height_in)
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.38 / height_in), ncol=len(handles), fontsize=8, frameon=False)
    if others:
        fig.text(0.01, 0.1 / height_in, "Also skipped, with no energy curve to show (every skip is in skipped.csv):\n  " + "\n  ".join(others),
                 fontsize=8, va="bottom", ha="left", family="monospace")
    fig.tight_layout(rect=(0, footer_in / height_in, 1, top_frac))
    save_png(fig, path, dpi=90)
    return titles
