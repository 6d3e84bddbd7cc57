"""Frame labels from event segments, at the encoder's own frame times.

Input: an event's segments in seconds of the source audio, the crop offset in seconds, and
the encoder's frame spans ``(L, 2)`` in seconds of the cropped input (``AudioEncoder.frame_spans_s``).
Output: ``(L,)`` booleans. A frame is active when the event covers at least ``min_overlap`` of
the frame, or at least ``min_overlap`` of the event itself (so an event shorter than a frame
still marks the frame it falls in).
"""

from __future__ import annotations

import numpy as np


def frame_labels(segments_s: list[tuple[float, float]], offset_s: float, spans_s: np.ndarray, min_overlap: float = 0.5) -> np.ndarray:
    """Active frames ``(L,)`` of one event; ``offset_s`` is where the crop starts in the source."""
    active = np.zeros(len(spans_s), dtype=bool)
    if not segments_s:
        return active
    starts, ends = spans_s[:, 0], spans_s[:, 1]
    frame_len = ends - starts
    for start_s, end_s in segments_s:
        a, b = start_s - offset_s, end_s - offset_s
        if b <= a:
            continue
        overlap = np.clip(np.minimum(ends, b) - np.maximum(starts, a), 0.0, None)
        need = min_overlap * np.minimum(frame_len, b - a)
        active |= (overlap > 0) & (overlap >= need - 1e-9)
    return active
