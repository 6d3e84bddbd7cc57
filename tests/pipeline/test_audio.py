"""Audio helpers shared by every stage."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.audio import FULL_SCALE_INT16, downmix, quantize_int16


@pytest.mark.parametrize("channels", [1, 2, 3])
def test_downmix_is_the_float32_channel_mean_bit_for_bit(channels):
    rng = np.random.default_rng(channels)
    x = (rng.standard_normal((48_001, channels)) * rng.choice([1e-6, 0.3, 0.99], (48_001, channels))).astype(np.float32)
    x[:4] = [[1.0 - 2**-15] * channels, [-1.0] * channels, [0.0] * channels, [2**-149] * channels]
    y = downmix(x)
    assert y.dtype == np.float32 and y.shape == (48_001,)
    assert y.tobytes() == x.mean(axis=1, dtype=np.float32).tobytes()


@pytest.mark.parametrize("gain", [1.0, 0.5011872336272722, 3.1622776601683795, 1e-30])
@pytest.mark.parametrize("peak", [0.2, 0.999, 4.0])
def test_quantize_with_gain_and_ends_is_the_gain_then_quantize(gain, peak):
    """One pass with the gain, and no saturating pass where the ends say none saturates: the same int16."""
    rng = np.random.default_rng(7)
    x = (rng.uniform(-peak, peak, 20_000) * rng.choice([1e-40, 1e-6, 1.0], 20_000)).astype(np.float32)
    x[:3] = [peak, -peak, 0.5 / FULL_SCALE_INT16]
    expected = quantize_int16(np.multiply(x, np.float32(gain), dtype=np.float32))
    ends = np.array([x.max(), x.min()], dtype=np.float32)
    for e in (None, ends):
        y = x.copy()
        q = quantize_int16(y, overwrite=True, gain=gain, ends=e)
        assert q.tobytes() == expected.tobytes()
    assert quantize_int16(x, gain=gain, ends=ends).tobytes() == expected.tobytes()
