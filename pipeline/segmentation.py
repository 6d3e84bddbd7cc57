"""Energy-window segmentation: find the first continuous high-energy region of a clip.

FineLAP (section 4.2, appendix B.2): compute an energy envelope, slide a window over it,
compare each window's mean energy with a threshold, merge consecutive windows above it and
keep the first continuous segment.

Input: a mono float32 signal, its rate and :class:`SegmentationParams`. Output: a
:class:`Segmentation` with the chosen ``[start, end)`` in samples (or none) and the
envelope, window energies and threshold used, for reports and pictures.

Threshold reference (``threshold_reference``):
- ``peak``: ``threshold_db`` relative to the loudest window (default; -20 dB as in the paper),
  so the rule does not depend on the recording level;
- ``dbfs``: an absolute level of the window's mean square in dB re full scale;
- ``percentile``: relative to the given percentile of the window energies.

Boundaries: the windows decide where the continuous region is (a window bridges dips
shorter than itself); with ``refine_edges`` the edges then move to the first and last frame
inside that region whose own energy reaches the threshold, which places them within one hop
of a step onset or offset. Without it the segment spans every frame of the run's windows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.config.params import SegmentationParams
from pipeline.loudness import frame_mean_square, power_db


@dataclass(frozen=True)
class Segmentation:
    """``start``/``end`` are sample indices of the chosen segment (None when no window passes)."""

    start: int | None
    end: int | None
    frame: int
    hop: int
    frame_energy_db: np.ndarray  # (num_frames,)
    window_energy_db: np.ndarray  # (num_windows,)
    threshold_db: float

    @property
    def found(self) -> bool:
        return self.start is not None


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """Inclusive [first, last] index pairs of the True runs of a boolean vector."""
    padded = np.concatenate(([False], mask, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return [(int(a), int(b) - 1) for a, b in zip(edges[::2], edges[1::2])]


def find_segment(x: np.ndarray, sample_rate_hz: int, p: SegmentationParams) -> Segmentation:
    hop = max(1, round(p.hop_s * sample_rate_hz))
    frame = max(1, round(p.frame_s / p.hop_s)) * hop  # whole hops, as frame_mean_square uses
    energy = frame_mean_square(x, frame, hop)  # (F,)
    width = min(p.window_frames, energy.shape[0])
    step = p.window_step_frames
    cumulative = np.concatenate(([0.0], np.cumsum(energy)))
    starts = np.arange(0, energy.shape[0] - width + 1, step)
    window_db = power_db((cumulative[starts + width] - cumulative[starts]) / width)  # (W,)
    frame_db = power_db(energy)

    if p.threshold_reference == "peak":
        threshold = float(window_db.max()) + p.threshold_db
    elif p.threshold_reference == "dbfs":
        threshold = p.threshold_db
    else:
        threshold = float(np.percentile(window_db, p.threshold_percentile)) + p.threshold_db

    def result(start: int | None, end: int | None) -> Segmentation:
        return Segmentation(start, end, frame, hop, frame_db, window_db, threshold)

    runs = _runs(window_db >= threshold)
    if not runs:
        return result(None, None)
    # Bridge gaps between window runs shorter than merge_gap_s.
    max_gap = int(round(p.merge_gap_s / (hop * step / sample_rate_hz)))
    merged = [runs[0]]
    for a, b in runs[1:]:
        if a - merged[-1][1] - 1 <= max_gap:
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    if p.segment == "longest":
        first_w, last_w = max(merged, key=lambda r: (r[1] - r[0], -r[0]))
    else:
        first_w, last_w = merged[0]
    first_f = int(starts[first_w])
    last_f = int(starts[last_w]) + width - 1

    if p.refine_edges:
        inside = np.flatnonzero(frame_db[first_f : last_f + 1] >= threshold)
        if inside.size:
            last_f = first_f + int(inside[-1])
            first_f = first_f + int(inside[0])
            # A frame reaches the threshold once its last hop overlaps the onset, and stops
            # once its first hop has passed the offset: credit those hops.
            start = first_f * hop + (frame - hop if first_f > 0 else 0)
            end = min((last_f + 1) * hop, x.shape[0])
            if end > start:
                return result(start, end)
            return result(first_f * hop, min(first_f * hop + frame, x.shape[0]))
    return result(first_f * hop, min(last_f * hop + frame, x.shape[0]))
