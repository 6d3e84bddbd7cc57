"""Encoded audio is bounded before it is decoded: a FLAC of minutes of silence is a few kilobytes,
and its header says how long it is. ``max_s`` refuses a longer one as ``too-long`` with no frame
decoded; :func:`decode_crop` decodes only the frames of one crop, the same samples a whole decode
gives there; :func:`decoded_frames` checks that audio decodes without keeping it."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from pipeline import audio as A
from pipeline.audio import AudioError, decode_mono, encode_flac, read_blocks

SR = 16000


@pytest.fixture
def frames_read(monkeypatch) -> list[int]:
    """The frames every ``SoundFile.read`` returns while the test runs."""
    counts, real = [], sf.SoundFile.read

    def counting(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        counts.append(len(out))
        return out

    monkeypatch.setattr(sf.SoundFile, "read", counting)
    return counts


def silence(seconds: float, rate: int = SR) -> bytes:
    return encode_flac(np.zeros(int(seconds * rate), np.int16), rate)


def tone(seconds: float, rate: int) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return encode_flac((8000 * np.sin(2 * np.pi * 440 * t) * (1 + t / seconds)).astype(np.int16), rate)


def test_a_cell_longer_than_max_s_is_refused_from_its_header(frames_read):
    cell = silence(240)  # four minutes: 3.8 M frames in a few kilobytes
    assert len(cell) < 100_000
    for decode in (
        lambda: decode_mono(cell, SR, max_s=10.0),
        lambda: A.decoded_frames(cell, max_s=10.0),
        lambda: list(read_blocks(cell, SR, max_s=10.0)),
        lambda: A.decode_crop(cell, SR, 4 * SR, lambda total: 0, max_s=10.0),
    ):
        with pytest.raises(AudioError) as caught:
            decode()
        assert caught.value.reason == "too-long" and "3840000 frames" in caught.value.detail
    assert sum(frames_read) == 0, "frames were decoded"
    assert len(decode_mono(silence(10), SR, max_s=10.0)) == 10 * SR  # exactly max_s passes


@pytest.mark.parametrize("rate", [SR, 44100, 8000])
def test_a_crop_decodes_only_its_frames_and_equals_the_whole_decode_there(frames_read, rate):
    cell = tone(180, rate)
    whole = decode_mono(cell, SR)
    frames_read.clear()
    n = 5 * SR
    for start in (0, 7, 1_234_567, len(whole) - n):
        wave, picked = A.decode_crop(cell, SR, n, lambda total: start)
        assert picked == start and wave.shape == (n,) and wave.dtype == np.float32
        if rate == SR:
            assert wave.tobytes() == whole[start : start + n].tobytes()
        else:  # only the crop and 0.1 s each side resampled
            np.testing.assert_allclose(wave, whole[start : start + n], atol=1e-6)
    crop_frames = (5 + 2 * 0.1 + 0.01) * rate + 2  # the crop, 0.1 s each side, up to 10 ms to start on the output grid
    assert max(frames_read) <= crop_frames, "more than a crop was decoded at once"
    assert sum(frames_read) <= 4 * crop_frames


def test_a_file_shorter_than_the_crop_comes_back_whole_without_a_pick():
    cell = tone(2, 44100)
    wave, start = A.decode_crop(cell, SR, 5 * SR, lambda total: pytest.fail("no crop to place"))
    assert start == 0 and wave.tobytes() == decode_mono(cell, SR).tobytes()


def test_decoded_frames_finds_what_decode_mono_refuses():
    cell = tone(3, SR)
    assert A.decoded_frames(cell) == 3 * SR
    for bad in (cell[: len(cell) // 2], b"not audio" * 50):
        with pytest.raises(AudioError) as caught:
            A.decoded_frames(bad)
        assert caught.value.reason == "unreadable"
        with pytest.raises(AudioError):
            decode_mono(bad, SR)
