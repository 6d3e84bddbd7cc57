"""Boundary relabeling: when is each placed event audible in its mixture?

Input: a mixture's occurrences (where each clip span sits, at what gain), the background's
placement, and the A-weighted envelopes the clip and ambience stages stored (frame energy in
dB, frame ``k`` covering ``[k * hop, k * hop + frame)``). Output: one list of
:class:`~pipeline.schema.LabelSegment` per mixture, same-label segments merged. A pure
function of the recipe and the sources' envelopes: no audio is read.

Per occurrence, on its own envelope frames:

1. own energy: a frame is active if the event's level in the mixture (envelope + gain) is at
   or above ``absolute_floor_db`` (FLAM: -70 dB) and within ``relative_floor_db`` of the
   occurrence's loudest frame (drops quiet tails and silent gaps);
2. masking: the frame must also stand ``masked_below_snr_db`` or more above everything else
   in the mix at that instant (background plus the other occurrences, energies summed);
3. FLAM's smoothing (appendix C.4): inactive runs shorter than ``fill_gaps_below_s`` between
   active ones become active; then, if the occurrence spans more than
   ``drop_runs_if_longer_than_s``, active runs shorter than ``drop_runs_below_s`` are removed.
   FLAM counts that in frames (2 frames, 40 ms); the drop rule is applied once more to the
   intervals as written, in seconds, because a run of ``k`` frames is written between its edge
   frames' centres, ``k - 1`` hops: a 2-frame run that the frame count keeps would be a 20 ms
   label. So no label segment of an occurrence longer than ``drop_runs_if_longer_than_s`` is
   shorter than ``drop_runs_below_s``.

An active run from frame ``a`` to ``b`` becomes the interval between the two frames' centres
(a step inside a frame lies within one hop of its centre). Where the run ends at a step in the
event's own energy, the edge frame's energy relative to its neighbour's places the step inside
the frame (exact for steady sounds). Edges set by masking keep the frame centres: they are
only as sharp as the 40 ms frames (within about three hops of a masker's edge).

Spans cut from inside a clip (pieces, trimmed events) are judged on their own samples
(:func:`occurrence_envelopes`), never on clip audio that was not placed.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.audio import int16_to_float
from pipeline.config.params import RelabelParams
from pipeline.loudness import a_weighted_envelope
from pipeline.schema import EventOccurrence, LabelSegment


@dataclass(frozen=True)
class Envelope:
    """An envelope as linear power, with its frame geometry in seconds."""

    frame_s: float
    hop_s: float
    power: np.ndarray  # (frames,) float64
    db: np.ndarray  # (frames,) float64, the same in dB
    centres_s: np.ndarray  # (frames,) frame centres in clip time
    origin_s: float = 0.0  # clip time of frame 0's start (a span's envelope starts at its source_in)

    @classmethod
    def from_db(cls, frame_s: float, hop_s: float, energy_db: Sequence[float], origin_s: float = 0.0) -> "Envelope":
        db = np.asarray(energy_db, dtype=np.float64)
        centres = origin_s + np.arange(db.shape[0]) * hop_s + frame_s / 2
        return cls(frame_s, hop_s, np.power(10.0, db / 10.0), db, centres, origin_s)

    def __post_init__(self) -> None:
        # The knots :meth:`at` interpolates on: the frame centres, and the signal's two edges
        # holding the first and last frame's power (so a time between an edge and the nearest
        # centre reads that frame, and a time outside the signal reads zero).
        end = self.centres_s[-1] + self.frame_s / 2
        object.__setattr__(self, "_knots_s", np.concatenate(([self.origin_s], self.centres_s, [end])))
        object.__setattr__(self, "_knots_power", np.concatenate((self.power[:1], self.power, self.power[-1:])))

    def at(self, t_s: np.ndarray) -> np.ndarray:
        """Power at times ``t_s``: linear between frame centres, the edge frame's power between a
        signal edge and its centre, zero outside the signal."""
        return np.interp(t_s, self._knots_s, self._knots_power, left=0.0, right=0.0)


_TRUE_RUN = re.compile(b"\x01+")  # a boolean vector's bytes are 0 and 1


def _runs(active: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) index pairs of the True runs of a boolean vector (a regular expression over its
    bytes: about 1 us for an occurrence's mask of a few runs, against 5 us for the diff of a padded copy)."""
    return [m.span() for m in _TRUE_RUN.finditer(active.tobytes())]


def smoothed_runs(active: np.ndarray, fill_gap_frames: int, drop_run_frames: int, span_frames: int) -> list[list[int]]:
    """FLAM's two smoothing rules on one occurrence's frame activity, as ``[start, end)`` runs."""
    runs: list[list[int]] = []
    for start, end in _runs(active):  # gaps shorter than fill_gap_frames between runs are filled
        if runs and start - runs[-1][1] < fill_gap_frames:
            runs[-1][1] = end
        else:
            runs.append([start, end])
    if active.shape[0] > span_frames:
        runs = [r for r in runs if r[1] - r[0] >= drop_run_frames]
    return runs


def smooth(active: np.ndarray, fill_gap_frames: int, drop_run_frames: int, span_frames: int) -> np.ndarray:
    """FLAM's two smoothing rules on one occurrence's frame activity (:func:`smoothed_runs` as a mask)."""
    out = np.zeros_like(active)
    for start, end in smoothed_runs(active, fill_gap_frames, drop_run_frames, span_frames):
        out[start:end] = True
    return out


def occurrence_activity(
    occ: EventOccurrence,
    envelope: Envelope,
    rest: list[tuple[EventOccurrence, Envelope]],
    background: tuple[float, float, Envelope] | None,
    mixture_gain_db: float,
    p: RelabelParams,
) -> list[tuple[float, float]]:
    """Active intervals (mixture seconds) of one occurrence; see the module docstring."""
    hop = envelope.hop_s
    half = envelope.frame_s / 2
    origin = envelope.origin_s
    first = max(0, math.ceil((occ.source_in_s - origin - half) / hop - 1e-9))
    last = min(envelope.power.shape[0] - 1, math.floor((occ.source_out_s - origin - half) / hop + 1e-9))
    if last < first:  # shorter than one frame: audible iff its level says so
        first = last = min(max(0, int(round((occ.source_in_s - origin - half) / hop))), envelope.power.shape[0] - 1)
    # frame centres in mixture time: origin + frame * hop + half - source_in + onset, term by term in place
    t = np.arange(first, last + 1) * hop
    t += origin
    t += half
    t -= occ.source_in_s
    t += occ.onset_s
    times = t.tolist()  # t rises: bisect finds the frames inside another occurrence's [onset, offset)
    own_db = envelope.db[first : last + 1] + (occ.gain_db + mixture_gain_db)
    if background is not None:  # the background's power is where the others' sum starts (not added to zeros: the same values)
        offset_s, gain_db, bg_env = background
        other = bg_env.at(t + offset_s)
        other *= 10.0 ** ((gain_db + mixture_gain_db) / 10.0)
    else:
        other = np.zeros(own_db.shape[0])
    for o, env in rest:  # the frames inside [onset, offset) of another occurrence are one slice
        i, j = bisect_left(times, o.onset_s), bisect_left(times, o.offset_s)
        if j > i:
            other[i:j] += env.at(t[i:j] - o.onset_s + o.source_in_s) * 10.0 ** ((o.gain_db + mixture_gain_db) / 10.0)
    other_db = 10.0 * np.log10(np.maximum(other, 1e-30))
    floor_db = own_db.max() + p.relative_floor_db  # loud: at or above both floors, one comparison against the higher (NaN: none)
    loud = own_db >= (p.absolute_floor_db if floor_db < p.absolute_floor_db else floor_db)
    active = loud & (own_db - other_db >= p.masked_below_snr_db)
    runs = smoothed_runs(
        active,
        fill_gap_frames=int(round(p.fill_gaps_below_s / hop)),
        drop_run_frames=int(round(p.drop_runs_below_s / hop)),
        span_frames=int(round(p.drop_runs_if_longer_than_s / hop)),
    )
    power = envelope.power[first : last + 1]
    intervals = []
    n = len(times)
    for a, b in runs:
        start, end = times[a], times[b - 1]
        # An edge next to quiet (not masked) frames, or at the span's edge, is a step in the
        # event's own energy: the edge frame's share of its neighbour's energy says where in
        # the frame the step lies (exact for steady sounds; kept within the frame's hop).
        if (a == 0 or not loud[a - 1]) and b - a >= 2:
            share = min(1.0, power[a] / max(power[a + 1], 1e-30))
            start = min(max(times[a] + half - 2 * half * share, times[a] - hop), times[a] + hop / 2)
        if (b == n or not loud[b]) and b - a >= 2:
            share = min(1.0, power[b - 1] / max(power[b - 2], 1e-30))
            end = max(min(times[b - 1] - half + 2 * half * share, times[b - 1] + hop), times[b - 1] - hop / 2)
        if end <= start:  # a single frame: its own hop around the centre
            start, end = times[a] - hop / 2, times[a] + hop / 2
        intervals.append((max(start, occ.onset_s), min(end, occ.offset_s)))
    return intervals


def merge_segments(mixture_id: str, raw: list[tuple[str, str, float, float]], max_gap_s: float = 0.0) -> list[LabelSegment]:
    """Same-label intervals that overlap, touch or lie less than ``max_gap_s`` apart become one;
    sorted by label then onset."""
    out: list[LabelSegment] = []
    for label, mid, onset, offset in sorted(raw):
        if out and out[-1].label == label and onset <= out[-1].offset_s + max_gap_s + 1e-9:
            if offset > out[-1].offset_s:
                out[-1] = LabelSegment(mixture_id, label, mid, out[-1].onset_s, offset)
            continue
        out.append(LabelSegment(mixture_id, label, mid, onset, offset))
    return out


def span_envelope(q: np.ndarray, sample_rate_hz: int, like: Envelope, source_in_s: float) -> Envelope:
    """The envelope of exactly a span's int16 samples, on ``like``'s frame geometry.

    A span cut from inside a clip (a piece, a trimmed event) must not be judged by clip
    frames that reach outside it: audio that is not placed would count as audible.
    """
    env = a_weighted_envelope(int16_to_float(q), sample_rate_hz, like.frame_s, like.hop_s)
    return Envelope.from_db(env.frame_s, env.hop_s, env.energy_db, origin_s=source_in_s)


def occurrence_envelopes(
    occurrences: Sequence[EventOccurrence], clip_envelopes: Mapping[str, Envelope], sources
) -> list[Envelope]:
    """Per occurrence: the stored clip envelope for a whole clip, else its span's own envelope."""
    out = []
    for o in occurrences:
        env = clip_envelopes[o.clip_id]
        q = sources.event(o.clip_id)
        sr = sources.sample_rate_hz
        start, stop = int(round(o.source_in_s * sr)), int(round(o.source_out_s * sr))
        out.append(env if start == 0 and stop >= q.shape[0] else span_envelope(q[start:stop], sr, env, o.source_in_s))
    return out


def relabel(
    mixture_id: str,
    duration_s: float,
    occurrences: Sequence[EventOccurrence],
    envelopes: Mapping[str, Envelope] | Sequence[Envelope],
    background: tuple[float, float, Envelope] | None,
    mixture_gain_db: float,
    p: RelabelParams,
) -> list[LabelSegment]:
    """All occurrences of a mixture -> merged label segments inside ``[0, duration_s]``.

    ``envelopes`` is one envelope per occurrence (see :func:`occurrence_envelopes`), or a
    mapping from clip id to envelope when every occurrence is a whole clip;
    ``background`` is ``(offset_s, gain_db, envelope)`` of the background, or None.
    """
    if isinstance(envelopes, Mapping):
        envelopes = [envelopes[o.clip_id] for o in occurrences]
    placed = list(zip(occurrences, envelopes))
    raw = []
    for i, (occ, env) in enumerate(placed):
        rest = [x for j, x in enumerate(placed) if j != i and x[0].onset_s < occ.offset_s and x[0].offset_s > occ.onset_s]
        # FLAM's drop rule on the written seconds (see the module docstring, step 3)
        shortest = p.drop_runs_below_s - 1e-9 if occ.offset_s - occ.onset_s > p.drop_runs_if_longer_than_s else 0.0
        for start, end in occurrence_activity(occ, env, rest, background, mixture_gain_db, p):
            start, end = max(0.0, start), min(duration_s, end)
            if end > start and end - start >= shortest:
                raw.append((occ.label, occ.mid, float(start), float(end)))
    # gaps under one hop are below the envelope's resolution (two back-to-back placements)
    hop = envelopes[0].hop_s if envelopes else 0.0
    return merge_segments(mixture_id, raw, max_gap_s=hop)
