"""Level measurements against their references: pyloudnorm, Parseval, naive framing."""

from __future__ import annotations

import numpy as np
import pyloudnorm
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.loudness import a_weighted_envelope, a_weighting_gain, frame_mean_square, integrated_lufs


@pytest.mark.parametrize("sr", [16000, 22050, 44100, 48000])
@pytest.mark.parametrize("seconds", [0.45, 1.0, 3.3, 10.0])
def test_integrated_lufs_equals_pyloudnorm(sr: int, seconds: float) -> None:
    rng = np.random.default_rng(int(sr * seconds))
    x = rng.standard_normal(int(sr * seconds)) * np.linspace(0.001, 0.3, int(sr * seconds))
    x[: int(0.3 * sr)] *= 1e-4  # a quiet start exercises both gates
    expected = pyloudnorm.Meter(sr).integrated_loudness(x)
    assert integrated_lufs(x.astype(np.float32), sr) == pytest.approx(expected, abs=1e-3)


def test_short_and_silent_signals() -> None:
    sr = 16000
    tone = (0.1 * np.sin(2 * np.pi * 1000 * np.arange(int(0.1 * sr)) / sr)).astype(np.float32)
    tiled = np.tile(tone, 6)
    assert integrated_lufs(tone, sr) == pytest.approx(
        pyloudnorm.Meter(sr).integrated_loudness(tiled.astype(np.float64)[: len(tiled)]), abs=0.05
    )
    assert integrated_lufs(np.zeros(sr, dtype=np.float32), sr) == -70.0


def test_a_weighting_is_zero_db_at_1khz_and_low_at_50hz() -> None:
    g = 10 * np.log10(a_weighting_gain(np.array([1000.0, 50.0, 100.0])))
    assert g[0] == pytest.approx(0.0, abs=0.01)
    assert g[1] == pytest.approx(-30.2, abs=0.1)
    assert g[2] == pytest.approx(-19.1, abs=0.1)


def test_envelope_of_a_1khz_tone_is_its_mean_square() -> None:
    sr = 16000
    x = (0.5 * np.sin(2 * np.pi * 1000 * np.arange(sr) / sr)).astype(np.float32)
    env = a_weighted_envelope(x, sr, 0.04, 0.02)
    inner = np.array(env.energy_db[2:-3])
    assert np.allclose(inner, 10 * np.log10(0.125), atol=0.05)
    assert len(env.energy_db) == 50


def test_single_precision_envelope_is_the_double_one_within_its_rounding() -> None:
    sr = 16000
    rng = np.random.default_rng(8)
    x = (rng.standard_normal(3 * sr) * np.exp(-np.arange(3 * sr) / sr) * 0.3).astype(np.float32)  # 26 dB of decay
    double = np.array(a_weighted_envelope(x, sr, 0.04, 0.02).energy_db)
    single = np.array(a_weighted_envelope(x, sr, 0.04, 0.02, single=True).energy_db)
    assert single.shape == double.shape
    assert np.max(np.abs(single - double)) <= 0.0100001  # at most one step of the 0.01 dB rounding
    assert np.mean(single == double) > 0.95


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 3000), hop=st.integers(1, 200), per_frame=st.integers(1, 4))
def test_frame_mean_square_matches_naive_framing(n: int, hop: int, per_frame: int) -> None:
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    frame = hop * per_frame
    got = frame_mean_square(x, frame, hop)
    count = -(-n // hop)
    padded = np.concatenate([x, np.zeros(frame, dtype=np.float32)]).astype(np.float64)
    naive = np.array([np.mean(padded[k * hop : k * hop + frame] ** 2) for k in range(count)])
    assert np.allclose(got, naive, rtol=1e-5, atol=1e-9)
