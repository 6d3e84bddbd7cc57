"""Energy-window segmentation on crafted signals with known boundaries."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config.params import SegmentationParams
from pipeline.segmentation import find_segment
from tests.conftest import tone_burst

P = SegmentationParams()


@pytest.mark.parametrize("sr", [16000, 22050, 44100, 48000])
def test_step_event_recovered_within_one_hop(sr: int) -> None:
    x = tone_burst(sr, 6.0, 1.23, 3.71)
    seg = find_segment(x, sr, P)
    assert seg.found
    assert abs(seg.start / sr - 1.23) <= P.hop_s
    assert abs(seg.end / sr - 3.71) <= P.hop_s


def test_first_segment_is_taken_not_the_loudest() -> None:
    sr = 16000
    x = tone_burst(sr, 8.0, 0.5, 2.0, level_dbfs=-20) + tone_burst(sr, 8.0, 4.0, 7.0, level_dbfs=-6, seed=1)
    seg = find_segment(x, sr, P)
    assert abs(seg.start / sr - 0.5) <= P.hop_s and abs(seg.end / sr - 2.0) <= P.hop_s
    longest = find_segment(x, sr, replace(P, segment="longest"))
    assert abs(longest.start / sr - 4.0) <= P.hop_s


def test_short_dip_is_bridged_by_merge_gap() -> None:
    sr = 16000
    x = tone_burst(sr, 6.0, 1.0, 2.0) + tone_burst(sr, 6.0, 2.3, 3.5, seed=1)
    plain = find_segment(x, sr, P)
    assert abs(plain.end / sr - 2.0) <= P.hop_s
    merged = find_segment(x, sr, replace(P, merge_gap_s=0.5))
    assert abs(merged.end / sr - 3.5) <= P.hop_s


def test_peak_reference_ignores_recording_level() -> None:
    sr = 16000
    x = tone_burst(sr, 5.0, 1.0, 3.0, level_dbfs=-6, floor_dbfs=-200)
    loud, quiet = find_segment(x, sr, P), find_segment(x * 0.01, sr, P)
    assert (loud.start, loud.end) == (quiet.start, quiet.end)


def test_absolute_threshold_finds_nothing_in_quiet_audio() -> None:
    sr = 16000
    x = tone_burst(sr, 4.0, 1.0, 2.0, level_dbfs=-50)
    assert not find_segment(x, sr, replace(P, threshold_reference="dbfs", threshold_db=-40)).found
    assert find_segment(x, sr, replace(P, threshold_reference="dbfs", threshold_db=-60)).found


def test_without_refinement_the_windows_pad_the_segment() -> None:
    sr = 16000
    x = tone_burst(sr, 5.0, 1.0, 3.0)
    coarse = find_segment(x, sr, replace(P, refine_edges=False))
    fine = find_segment(x, sr, P)
    assert coarse.start <= fine.start and coarse.end >= fine.end


@settings(max_examples=40, deadline=None)
@given(
    on_s=st.floats(0.05, 3.0),
    dur_s=st.floats(0.3, 4.0),
    level_dbfs=st.floats(-45.0, -3.0),
    sr=st.sampled_from([8000, 16000, 32000, 44100]),
)
def test_property_boundaries_within_one_hop_and_inside_signal(on_s: float, dur_s: float, level_dbfs: float, sr: int) -> None:
    total = on_s + dur_s + 1.0
    x = tone_burst(sr, total, on_s, on_s + dur_s, level_dbfs=level_dbfs, floor_dbfs=level_dbfs - 60)
    seg = find_segment(x, sr, P)
    assert seg.found
    assert 0 <= seg.start < seg.end <= x.shape[0]
    tolerance = P.hop_s + 1.0 / sr
    assert abs(seg.start / sr - on_s) <= tolerance
    assert abs(seg.end / sr - (on_s + dur_s)) <= tolerance


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 5000), seed=st.integers(0, 10_000))
def test_property_any_signal_gives_a_segment_inside_it_or_none(n: int, seed: int) -> None:
    x = (np.random.default_rng(seed).standard_normal(n) * 0.1).astype(np.float32)
    seg = find_segment(x, 16000, P)
    if seg.found:
        assert 0 <= seg.start < seg.end <= n
