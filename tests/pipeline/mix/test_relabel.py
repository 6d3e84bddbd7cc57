"""Relabeling against known truth: tone bursts, gaps, quiet tails and masking bursts.

Every clip here is built sample by sample, so where each event is audible is known exactly;
the relabeled boundaries must land within one envelope hop (0.02 s) of it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pipeline.audio import FULL_SCALE_INT16, quantize_int16
from pipeline.config.params import RelabelParams
from pipeline.loudness import a_weighted_envelope
from pipeline.mix.relabel import Envelope, merge_segments, occurrence_envelopes, relabel, smooth
from pipeline.schema import EventOccurrence, LabelSegment

SR = 16000
FRAME_S = 0.04
HOP_S = 0.02
TOL = HOP_S + 1e-6  # one hop (plus float slack)


def tone(seconds: float, level_dbfs: float, freq_hz: float = 1000.0) -> np.ndarray:
    """A sine of RMS ``level_dbfs`` starting at phase 0 (float64, full scale 1.0)."""
    n = int(round(seconds * SR))
    return np.sqrt(2) * 10 ** (level_dbfs / 20) * np.sin(2 * np.pi * freq_hz * np.arange(n) / SR)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(round(seconds * SR)))


def noise(seconds: float, level_dbfs: float, seed: int = 0, uniform: bool = False) -> np.ndarray:
    """White noise of RMS ``level_dbfs`` (uniform noise keeps loud bursts clear of clipping)."""
    rng = np.random.default_rng(seed)
    n = int(round(seconds * SR))
    x = rng.uniform(-np.sqrt(3), np.sqrt(3), n) if uniform else rng.standard_normal(n)
    return x * 10 ** (level_dbfs / 20)


def stored(x: np.ndarray) -> np.ndarray:
    """What a stage stores: int16 samples."""
    assert np.max(np.abs(x)) < 1.0, "test signal would clip"
    return quantize_int16(x.astype(np.float32))


def envelope_of(q: np.ndarray) -> Envelope:
    """The envelope the clip / ambience stages store for int16 audio ``q``."""
    e = a_weighted_envelope(q.astype(np.float32) / np.float32(FULL_SCALE_INT16), SR, FRAME_S, HOP_S)
    return Envelope.from_db(e.frame_s, e.hop_s, e.energy_db)


def occurrence(
    clip_id: str,
    q: np.ndarray,
    onset_s: float,
    source_in_s: float = 0.0,
    source_out_s: float | None = None,
    gain_db: float = 0.0,
    label: str = "Bark",
    mid: str = "/m/05tny_",
    index: int = 0,
) -> EventOccurrence:
    if source_out_s is None:
        source_out_s = q.shape[0] / SR
    return EventOccurrence(
        mixture_id="m",
        occurrence_index=index,
        event_index=index,
        role="whole",
        clip_id=clip_id,
        label=label,
        mid=mid,
        source_in_s=source_in_s,
        source_out_s=source_out_s,
        onset_s=onset_s,
        offset_s=onset_s + source_out_s - source_in_s,
        fade_in_s=0.0,
        fade_out_s=0.0,
        gain_db=gain_db,
        snr_db=0.0,
        realised_snr_db=0.0,
        license="CC0",
    )


class MemorySources:
    """The bank's interface over in-memory int16 clips."""

    sample_rate_hz = SR

    def __init__(self, **clips: np.ndarray):
        self.clips = clips

    def event(self, clip_id: str) -> np.ndarray:
        return self.clips[clip_id]


def span_envelopes(occ: EventOccurrence, q: np.ndarray) -> list[Envelope]:
    """What the mix stage passes to relabel: the span's own envelope for a partial span."""
    return occurrence_envelopes([occ], {occ.clip_id: envelope_of(q)}, MemorySources(**{occ.clip_id: q}))


def quiet_background(seconds: float = 10.0, level_dbfs: float = -60.0) -> tuple[float, float, Envelope]:
    return (0.0, 0.0, envelope_of(stored(noise(seconds, level_dbfs, seed=7))))


def bounds(segments: list[LabelSegment]) -> list[tuple[float, float]]:
    return [(s.onset_s, s.offset_s) for s in segments]


def assert_segments(segments: list[LabelSegment], expected: list[tuple[float, float]]) -> None:
    got = bounds(segments)
    assert len(got) == len(expected), f"got {got}, expected {expected}"
    for (a, b), (ea, eb) in zip(got, expected):
        assert abs(a - ea) <= TOL and abs(b - eb) <= TOL, f"got {got}, expected {expected}"


# --- A1: a long silent gap splits the event --------------------------------------------------


@pytest.mark.parametrize("onset_s", [3.0, 3.0137])
def test_tone_gap_tone_gives_two_segments(onset_s: float) -> None:
    q = stored(np.concatenate([tone(0.8, -20.0), silence(0.5), tone(0.7, -20.0)]))
    segs = relabel("m", 10.0, [occurrence("ev", q, onset_s)], {"ev": envelope_of(q)}, quiet_background(), 0.0, RelabelParams())
    assert_segments(segs, [(onset_s, onset_s + 0.8), (onset_s + 1.3, onset_s + 2.0)])
    assert all(s.label == "Bark" and s.mid == "/m/05tny_" and s.mixture_id == "m" for s in segs)


def test_tone_gap_tone_exact_at_hop_aligned_onset() -> None:
    """Onset on the hop grid: the run ends/starts sit on frame centres that are the truth."""
    q = stored(np.concatenate([tone(0.8, -20.0), silence(0.5), tone(0.7, -20.0)]))
    segs = relabel("m", 10.0, [occurrence("ev", q, 3.0)], {"ev": envelope_of(q)}, quiet_background(), 0.0, RelabelParams())
    assert bounds(segs) == [pytest.approx((3.0, 3.8), abs=TOL), pytest.approx((4.3, 5.0), abs=TOL)]


# --- A2: a short gap is filled ---------------------------------------------------------------


@pytest.mark.parametrize("gap_s", [0.05, 0.1, 0.15])
def test_short_gap_is_filled(gap_s: float) -> None:
    q = stored(np.concatenate([tone(0.9, -20.0), silence(gap_s), tone(2.0 - 0.9 - gap_s, -20.0)]))
    segs = relabel("m", 10.0, [occurrence("ev", q, 1.0)], {"ev": envelope_of(q)}, quiet_background(), 0.0, RelabelParams())
    assert_segments(segs, [(1.0, 3.0)])


def test_gap_fill_threshold_is_a_parameter() -> None:
    """The same 0.1 s gap stays open when fill_gaps_below_s is lowered below it."""
    q = stored(np.concatenate([tone(0.9, -20.0), silence(0.1), tone(1.0, -20.0)]))
    p = RelabelParams(fill_gaps_below_s=0.02)
    segs = relabel("m", 10.0, [occurrence("ev", q, 1.0)], {"ev": envelope_of(q)}, quiet_background(), 0.0, p)
    assert_segments(segs, [(1.0, 1.9), (2.0, 3.0)])


# --- A3: a quiet tail is below the relative floor ---------------------------------------------


@pytest.mark.parametrize("tail_db", [-35.0, -45.0])
def test_quiet_tail_is_dropped(tail_db: float) -> None:
    """A -10 dBFS tone for 1 s, then the same tone ``tail_db`` lower: below peak - 30 dB."""
    q = stored(np.concatenate([tone(1.0, -10.0), tone(1.0, -10.0 + tail_db)]))
    # the tail (-45 / -55 dBFS) is above the absolute floor and 5+ dB above a -60 dBFS
    # background, so only the relative floor can drop it
    segs = relabel("m", 10.0, [occurrence("ev", q, 2.0)], {"ev": envelope_of(q)}, quiet_background(), 0.0, RelabelParams())
    assert_segments(segs, [(2.0, 3.0)])


def test_tail_within_relative_floor_is_kept() -> None:
    q = stored(np.concatenate([tone(1.0, -10.0), tone(1.0, -30.0)]))  # 20 dB down: inside the 30 dB floor
    segs = relabel("m", 10.0, [occurrence("ev", q, 2.0)], {"ev": envelope_of(q)}, quiet_background(), 0.0, RelabelParams())
    assert_segments(segs, [(2.0, 4.0)])


def test_absolute_floor_follows_gain() -> None:
    """The same clip placed 60 dB down (-80 dBFS in the mix) is below the -70 dB absolute floor."""
    q = stored(tone(1.0, -20.0))
    bg = quiet_background(level_dbfs=-100.0)  # int16 zeros: nothing masks
    env = {"ev": envelope_of(q)}
    assert_segments(relabel("m", 10.0, [occurrence("ev", q, 2.0, gain_db=-40.0)], env, bg, 0.0, RelabelParams()), [(2.0, 3.0)])
    assert relabel("m", 10.0, [occurrence("ev", q, 2.0, gain_db=-60.0)], env, bg, 0.0, RelabelParams()) == []
    # the mixture gain counts too
    assert relabel("m", 10.0, [occurrence("ev", q, 2.0, gain_db=-40.0)], env, bg, -20.0, RelabelParams()) == []


# --- A4: a loud background burst masks the event ----------------------------------------------


def _burst_segments(onset_s: float, bg_offset_s: float, burst_s: tuple[float, float]) -> list[LabelSegment]:
    """Event tone at -50 dBFS over 2 s from ``onset_s``; the background (-80 dBFS noise) has a
    -10 dBFS broadband burst at ``burst_s`` (mixture time), 40 dB above the event."""
    bg = noise(10.0, -80.0, seed=3)
    a, b = int(round((burst_s[0] + bg_offset_s) * SR)), int(round((burst_s[1] + bg_offset_s) * SR))
    bg[a:b] = noise((b - a) / SR, -10.0, seed=4, uniform=True)
    background = (bg_offset_s, 0.0, envelope_of(stored(bg)))
    q = stored(tone(2.0, -50.0))
    return relabel("m", 10.0, [occurrence("ev", q, onset_s)], {"ev": envelope_of(q)}, background, 0.0, RelabelParams())


@pytest.mark.parametrize("onset_s", [0.5, 0.62])
@pytest.mark.parametrize("bg_offset_s", [0.0, 2.0, 3.34])
def test_background_burst_masks_event(onset_s: float, bg_offset_s: float) -> None:
    """Burst at 1.0-1.6 s, event and burst on the hop grid: two segments, each edge within a hop."""
    assert_segments(_burst_segments(onset_s, bg_offset_s, (1.0, 1.6)), [(onset_s, 1.0), (1.6, onset_s + 2.0)])


@settings(max_examples=30, deadline=None)
@given(
    onset=st.integers(int(0.2 * SR), int(0.8 * SR)),
    start=st.integers(int(1.0 * SR), int(1.3 * SR)),
    length=st.integers(int(0.3 * SR), int(0.6 * SR)),
)
def test_background_burst_event_inactive_during_burst(onset: int, start: int, length: int) -> None:
    """Anywhere off the grid: never active during the burst, and the two edges next to it
    within three hops (what frame-centred masking can promise; see the xfail below)."""
    onset_s, b0, b1 = onset / SR, start / SR, (start + length) / SR
    segs = _burst_segments(onset_s, 0.0, (b0, b1))
    assert len(segs) == 2
    (s0, e0), (s1, e1) = bounds(segs)
    assert s0 == pytest.approx(onset_s, abs=TOL) and e1 == pytest.approx(onset_s + 2.0, abs=TOL)
    assert e0 <= b0 and s1 >= b1  # not active during the burst
    assert b0 - e0 <= 3 * HOP_S + 1e-6 and s1 - b1 <= 3 * HOP_S + 1e-6


@pytest.mark.xfail(
    strict=True,
    reason=(
        "documented limitation: edges set by masking keep frame centres, so off the hop grid they are within about "
        "three hops of the masker's edge (the event is never active during the burst: see the test above)"
    ),
)
def test_background_burst_edges_within_one_hop_off_grid() -> None:
    assert_segments(_burst_segments(0.513, 0.0, (1.0, 1.6)), [(0.513, 1.0), (1.6, 2.513)])


def test_background_gain_decides_masking() -> None:
    """The background's gain (not only its stored level) enters the masking test."""
    bg = (0.0, 0.0, envelope_of(stored(noise(10.0, -40.0, seed=5))))
    loud_bg = (bg[0], 30.0, bg[2])
    q = stored(tone(2.0, -30.0))
    env = {"ev": envelope_of(q)}
    assert_segments(relabel("m", 10.0, [occurrence("ev", q, 1.0)], env, bg, 0.0, RelabelParams()), [(1.0, 3.0)])
    assert relabel("m", 10.0, [occurrence("ev", q, 1.0)], env, loud_bg, 0.0, RelabelParams()) == []


def test_other_event_masks_quiet_event() -> None:
    """A loud second event masks a quiet one where they overlap; the loud one stays whole."""
    quiet = stored(tone(3.0, -50.0))
    loud = stored(noise(1.0, -10.0, seed=9, uniform=True))
    envs = {"quiet": envelope_of(quiet), "loud": envelope_of(loud)}
    occs = [
        occurrence("quiet", quiet, 1.0, label="Meow", mid="/m/07qrkrw", index=0),
        occurrence("loud", loud, 2.0, label="Knock", mid="/m/07r4wb8", index=1),
    ]
    segs = relabel("m", 10.0, occs, envs, quiet_background(level_dbfs=-100.0), 0.0, RelabelParams())
    by_label = {}
    for s in segs:
        by_label.setdefault(s.label, []).append(s)
    assert_segments(by_label["Knock"], [(2.0, 3.0)])
    assert_segments(by_label["Meow"], [(1.0, 2.0), (3.0, 4.0)])


# --- A5: onset exactness with a randomised placement ------------------------------------------


def _first_onset(onset_samples: int, start_samples: int, clip_s: float = 1.5) -> tuple[float, float]:
    n = int(round(clip_s * SR))
    x = np.zeros(n)
    x[start_samples:] = tone((n - start_samples) / SR, -20.0)
    q = stored(x)
    onset_s = onset_samples / SR
    segs = relabel("m", 8.0, [occurrence("ev", q, onset_s)], {"ev": envelope_of(q)}, quiet_background(), 0.0, RelabelParams())
    assert segs, "the tone is audible"
    return segs[0].onset_s, onset_s + start_samples / SR


@settings(max_examples=40, deadline=None)
@given(onset=st.integers(0, 5 * SR), start=st.one_of(st.just(0), st.integers(int(FRAME_S * SR), int(0.8 * SR))))
def test_onset_within_one_hop_of_truth(onset: int, start: int) -> None:
    """Tone starting at clip start or at least one frame into the clip."""
    got, truth = _first_onset(onset, start)
    assert abs(got - truth) <= TOL, (got, truth)


@settings(max_examples=20, deadline=None)
@given(onset=st.integers(0, 5 * SR), start=st.integers(int(0.03 * SR), int(0.039 * SR)))
def test_onset_within_one_hop_when_tone_starts_inside_first_frame(onset: int, start: int) -> None:
    got, truth = _first_onset(onset, start)
    assert abs(got - truth) <= TOL, (got, truth)


def test_offset_within_one_hop_when_tone_stops_inside_last_frame() -> None:
    q = stored(np.concatenate([tone(1.485, -20.0), silence(0.025)]))  # a 1.51 s clip, silent for its last 25 ms
    segs = relabel("m", 8.0, [occurrence("ev", q, 2.0)], {"ev": envelope_of(q)}, quiet_background(), 0.0, RelabelParams())
    assert_segments(segs, [(2.0, 3.485)])


@settings(max_examples=25, deadline=None)
@given(onset=st.integers(0, 5 * SR), source_in=st.integers(0, int(0.5 * SR)), start=st.integers(int(0.6 * SR), int(1.0 * SR)))
def test_onset_with_source_offset(onset: int, source_in: int, start: int) -> None:
    """A span taken from inside the clip (source_in > 0): the boundary maps to mixture time."""
    n = int(round(1.5 * SR))
    x = np.zeros(n)
    x[start:] = tone((n - start) / SR, -20.0)
    q = stored(x)
    occ = occurrence("ev", q, onset / SR, source_in_s=source_in / SR)
    segs = relabel("m", 8.0, [occ], span_envelopes(occ, q), quiet_background(), 0.0, RelabelParams())
    truth = (onset + start - source_in) / SR
    assert len(segs) == 1
    assert abs(segs[0].onset_s - truth) <= TOL
    assert segs[0].offset_s == pytest.approx(occ.offset_s, abs=TOL)


# --- spans cut from inside a clip (pieces, event_duration_s): only the placed samples count -----


def _piece(q: np.ndarray, source_in_s: float, source_out_s: float) -> list[tuple[float, float]]:
    occ = replace(occurrence("ev", q, 3.0, source_in_s=source_in_s, source_out_s=source_out_s), role="piece")
    return bounds(relabel("m", 8.0, [occ], span_envelopes(occ, q), quiet_background(), 0.0, RelabelParams()))


@pytest.mark.parametrize("gap_s", [0.05, 0.1, 0.15])
def test_piece_starting_with_silence_when_clip_is_silent_before_it(gap_s: float) -> None:
    """Control: the clip is silent before source_in too, so the piece's leading silence is found."""
    q = stored(np.concatenate([silence(1.0 + gap_s), tone(1.0 - gap_s, -20.0)]))
    got = _piece(q, 1.0, 2.0)
    assert len(got) == 1 and abs(got[0][0] - (3.0 + gap_s)) <= TOL and got[0][1] == pytest.approx(4.0, abs=TOL)


def test_quiet_piece_after_silence_is_labelled() -> None:
    """Control: a -45 dBFS piece (15 dB over the background) is audible over its whole span."""
    q = stored(np.concatenate([silence(1.0), tone(1.0, -45.0)]))
    assert _piece(q, 1.0, 2.0) == [pytest.approx((3.0, 4.0), abs=TOL)]


@pytest.mark.parametrize("gap_s", [0.05, 0.1, 0.15])
def test_piece_starting_with_silence_after_loud_unplaced_audio(gap_s: float) -> None:
    q = stored(np.concatenate([tone(1.0, -20.0), silence(gap_s), tone(1.0 - gap_s, -20.0)]))
    got = _piece(q, 1.0, 2.0)
    assert len(got) == 1 and abs(got[0][0] - (3.0 + gap_s)) <= TOL


@pytest.mark.parametrize("gap_s", [0.05, 0.1, 0.15])
def test_span_ending_in_silence_before_loud_unplaced_audio(gap_s: float) -> None:
    q = stored(np.concatenate([tone(1.0 - gap_s, -20.0), silence(gap_s), tone(1.0, -20.0)]))
    got = _piece(q, 0.0, 1.0)
    assert len(got) == 1 and abs(got[0][1] - (4.0 - gap_s)) <= TOL


def test_quiet_piece_after_loud_unplaced_audio_is_labelled() -> None:
    q = stored(np.concatenate([tone(1.0, -10.0), tone(1.0, -45.0)]))
    got = _piece(q, 1.0, 2.0)
    assert len(got) == 1 and abs(got[0][0] - 3.0) <= TOL and abs(got[0][1] - 4.0) <= TOL


# --- A6: merging and clipping to the mixture ---------------------------------------------------


def test_merge_segments_overlapping_touching_and_distinct() -> None:
    raw = [
        ("Bark", "/m/05tny_", 1.0, 2.0),
        ("Meow", "/m/07qrkrw", 1.5, 2.5),
        ("Bark", "/m/05tny_", 1.5, 3.0),  # overlaps the first Bark
        ("Bark", "/m/05tny_", 3.0, 3.5),  # touches it
        ("Bark", "/m/05tny_", 5.0, 6.0),  # apart
        ("Bark", "/m/05tny_", 5.2, 5.4),  # inside the previous one
        ("Meow", "/m/07qrkrw", 2.6, 3.0),  # apart from the first Meow
    ]
    out = merge_segments("mx", raw)
    assert out == [
        LabelSegment("mx", "Bark", "/m/05tny_", 1.0, 3.5),
        LabelSegment("mx", "Bark", "/m/05tny_", 5.0, 6.0),
        LabelSegment("mx", "Meow", "/m/07qrkrw", 1.5, 2.5),
        LabelSegment("mx", "Meow", "/m/07qrkrw", 2.6, 3.0),
    ]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["A", "B", "C"]), st.floats(0, 10, allow_nan=False), st.floats(0.001, 3)), max_size=12))
def test_merge_segments_properties(items: list[tuple[str, float, float]]) -> None:
    raw = [(label, "/m/" + label, onset, onset + length) for label, onset, length in items]
    out = merge_segments("mx", raw)
    for label in {"A", "B", "C"}:
        mine = [s for s in out if s.label == label]
        assert mine == sorted(mine, key=lambda s: s.onset_s)
        for a, b in zip(mine, mine[1:]):
            assert a.offset_s < b.onset_s  # neither overlap nor touch
        # the union of the inputs is preserved: every raw interval is inside one output segment
        for lab, _, onset, offset in raw:
            if lab == label:
                assert any(s.onset_s <= onset and offset <= s.offset_s for s in mine)
        # and every output segment starts and ends at some input's bounds
        for s in mine:
            assert any(r[2] == s.onset_s for r in raw if r[0] == label)
            assert any(r[3] == s.offset_s for r in raw if r[0] == label)


def test_relabel_segments_inside_mixture_and_merged() -> None:
    """An occurrence running past the mixture's end is cut at it; two same-label occurrences
    that touch become one segment, a different label stays apart."""
    q = stored(tone(2.0, -20.0))
    envs = {"ev": envelope_of(q)}
    occs = [
        occurrence("ev", q, 0.0, index=0),
        occurrence("ev", q, 2.0, index=1),  # touches the first: merged
        occurrence("ev", q, 5.0, label="Meow", mid="/m/07qrkrw", index=2),  # runs to 7.0, past the end
    ]
    segs = relabel("m", 6.0, occs, envs, quiet_background(level_dbfs=-100.0), 0.0, RelabelParams())
    assert [(s.label, s.onset_s, s.offset_s) for s in segs] == [
        ("Bark", pytest.approx(0.0, abs=TOL), pytest.approx(4.0, abs=TOL)),
        ("Meow", pytest.approx(5.0, abs=TOL), pytest.approx(6.0, abs=TOL)),
    ]
    for s in segs:
        assert 0.0 <= s.onset_s < s.offset_s <= 6.0


# --- A7: FLAM C.4 smoothing on hand-made arrays ------------------------------------------------


def _bool(s: str) -> np.ndarray:
    return np.array([c == "1" for c in s], dtype=bool)


def _str(a: np.ndarray) -> str:
    return "".join("1" if v else "0" for v in a)


@pytest.mark.parametrize(
    ("active", "fill", "drop", "span", "expected"),
    [
        # gaps shorter than `fill` frames between active runs are filled; a gap of `fill` stays
        ("1110011", 3, 0, 0, "1111111"),
        ("11100011", 3, 0, 0, "11100011"),
        ("1101000101", 2, 0, 0, "1111000111"),
        # leading and trailing inactive frames are never filled
        ("0011100", 10, 0, 0, "0011100"),
        # runs shorter than `drop` frames are removed when the span is longer than `span` frames
        ("0100011100", 0, 2, 5, "0000011100"),
        ("0100011100", 0, 2, 10, "0100011100"),  # span of 10 frames is not longer than 10: kept
        ("1011100001", 0, 2, 5, "0011100000"),
        # filling happens first: a short run joined to a long one by a filled gap survives
        ("10111000001", 2, 2, 5, "11111000000"),
        # nothing active, everything active
        ("0000000", 3, 2, 2, "0000000"),
        ("1111111", 3, 2, 2, "1111111"),
    ],
)
def test_smooth_rules(active: str, fill: int, drop: int, span: int, expected: str) -> None:
    a = _bool(active)
    out = smooth(a, fill_gap_frames=fill, drop_run_frames=drop, span_frames=span)
    assert _str(out) == expected
    assert _str(a) == active  # the input is not modified


def test_smooth_defaults_in_frames() -> None:
    """RelabelParams defaults at a 20 ms hop: fill gaps < 10 frames, drop runs < 2 frames in spans > 10."""
    p = RelabelParams()
    fill, drop, span = (int(round(v / HOP_S)) for v in (p.fill_gaps_below_s, p.drop_runs_below_s, p.drop_runs_if_longer_than_s))
    assert (fill, drop, span) == (10, 2, 10)
    a = _bool("1" * 5 + "0" * 9 + "1" * 5 + "0" * 10 + "1" * 5 + "0" * 20 + "1")
    assert _str(smooth(a, fill, drop, span)) == "1" * 19 + "0" * 10 + "1" * 5 + "0" * 21


@settings(max_examples=40, deadline=None)
@given(
    bits=st.lists(st.booleans(), min_size=1, max_size=60), fill=st.integers(0, 6), drop=st.integers(0, 4), span=st.integers(0, 40)
)
def test_smooth_properties(bits: list[bool], fill: int, drop: int, span: int) -> None:
    a = np.array(bits, dtype=bool)
    out = smooth(a, fill, drop, span)
    filled = smooth(a, fill, 0, span)
    assert (filled | ~a).all()  # filling only adds frames
    assert (out <= filled).all()  # dropping only removes frames
    # after smoothing: no interior gap shorter than `fill` was left between runs of the filled array
    idx = np.flatnonzero(np.diff(np.concatenate(([0], filled.view(np.int8), [0]))))
    runs = idx.reshape(-1, 2)
    for (_, end), (start, _) in zip(runs[:-1], runs[1:]):
        assert start - end >= fill
    if len(a) > span:
        idx = np.flatnonzero(np.diff(np.concatenate(([0], out.view(np.int8), [0]))))
        assert all(e - s >= drop for s, e in idx.reshape(-1, 2))
    else:
        assert (out == filled).all()


# --- FLAM's drop rule holds for the segments as written (seconds, not frame counts) -------------


@settings(max_examples=40, deadline=None)
@given(
    blips=st.lists(st.tuples(st.integers(int(0.005 * SR), int(0.08 * SR)), st.floats(-40.0, -10.0)), min_size=1, max_size=6),
    onset=st.integers(0, 2 * SR),
    masker=st.one_of(st.none(), st.tuples(st.integers(0, 3 * SR), st.integers(int(0.25 * SR), int(0.6 * SR)))),
)
@example(blips=[(782, -19.75)], onset=5613, masker=(10907, 6031))  # a masker leaves a 2-frame run: 20 ms between its centres
def test_no_segment_shorter_than_drop_runs_below_s(
    blips: list[tuple[int, float]], onset: int, masker: tuple[int, int] | None
) -> None:
    """Short blips 0.3 s apart (too far for gap filling) in a long occurrence, sometimes under a
    loud masker: every written segment of an occurrence longer than drop_runs_if_longer_than_s
    lasts at least drop_runs_below_s (a 2-frame run, which FLAM's frame count keeps, spans only
    one hop between its frame centres and must not come out as a 20 ms label)."""
    p = RelabelParams()
    parts = [silence(0.3)]
    for n, level in blips:
        parts += [tone(n / SR, level), silence(0.3)]
    q = stored(np.concatenate(parts))
    occs, envs = [occurrence("ev", q, onset / SR)], {"ev": envelope_of(q)}
    if masker is not None:
        loud = stored(noise(masker[1] / SR, -10.0, seed=masker[0], uniform=True))
        occs.append(occurrence("mask", loud, masker[0] / SR, label="Knock", mid="/m/07r4wb8", index=1))
        envs["mask"] = envelope_of(loud)
    assert all(o.offset_s - o.onset_s > p.drop_runs_if_longer_than_s for o in occs)
    segs = relabel("m", 10.0, occs, envs, quiet_background(level_dbfs=-100.0), 0.0, p)
    assert all(s.offset_s - s.onset_s >= p.drop_runs_below_s - 1e-9 for s in segs), bounds(segs)
