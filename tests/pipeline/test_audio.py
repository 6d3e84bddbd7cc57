"""Audio helpers shared by every stage."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.audio import downmix


@pytest.mark.parametrize("channels", [1, 2, 3])
def test_downmix_is_the_float32_channel_mean_bit_for_bit(channels):
    rng = np.random.default_rng(channels)
    x = (rng.standard_normal((48_001, channels)) * rng.choice([1e-6, 0.3, 0.99], (48_001, channels))).astype(np.float32)
    x[:4] = [[1.0 - 2**-15] * channels, [-1.0] * channels, [0.0] * channels, [2**-149] * channels]
    y = downmix(x)
    assert y.dtype == np.float32 and y.shape == (48_001,)
    assert y.tobytes() == x.mean(axis=1, dtype=np.float32).tobytes()
