"""The clipping picture (``clipping_examples.png``): how the clip stage cut some clips and refused others.

Input: the kept clips to draw, every skip of the run, the corpus root and the clip params.
Output: the PNG, one panel per clip with its energy curves, threshold and judged segment
(:func:`plot_clipping_examples`), drawn with :mod:`pipeline.figures`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.audio import AudioError, downmix, read_audio, remove_dc
from pipeline.config.params import ClipParams
from pipeline.figures import pyplot, save_png
from pipeline.schema import EventClip, Skip
from pipeline.segmentation import find_segment

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
    panels = [
        _Panel(
            r.clip_id,
            r.source_path,
            "kept",
            f"{r.label}, {r.onset_in_source_s:.2f}-{r.offset_in_source_s:.2f} s",
            (r.onset_in_source_s, r.offset_in_source_s),
        )
        for r in records
    ]
    by_reason: dict[str, list[Skip]] = {}
    for s in sorted(skips, key=lambda s: s.item_id):
        by_reason.setdefault(s.reason, []).append(s)
    for reason in REFUSAL_REASONS_WITH_CURVE:
        if reason in by_reason:
            s = by_reason[reason][0]
            panels.append(_Panel(s.item_id, s.path, reason, s.detail, None))
    others = [
        f"{reason} {len(items)} (e.g. {items[0].item_id})"
        for reason, items in sorted(by_reason.items())
        if reason not in REFUSAL_REASONS_WITH_CURVE
    ]
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
        t_window = (
            np.arange(seg.window_energy_db.shape[0]) * p.segmentation.window_step_frames * seg.hop + width * seg.hop / 2
        ) / sr
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
    fig.suptitle(
        "Event clipping: the first continuous segment above the threshold is kept if it passes the checks "
        "(waveform in grey; refused clips titled in red)",
        fontsize=10,
        y=1 - 0.12 / height_in,
    )
    fig.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, 1 - 0.38 / height_in),
        ncol=len(handles),
        fontsize=8,
        frameon=False,
    )
    if others:
        fig.text(
            0.01,
            0.1 / height_in,
            "Also skipped, with no energy curve to show (every skip is in skipped.csv):\n  " + "\n  ".join(others),
            fontsize=8,
            va="bottom",
            ha="left",
            family="monospace",
        )
    fig.tight_layout(rect=(0, footer_in / height_in, 1, top_frac))
    save_png(fig, path, dpi=90)
    return titles
