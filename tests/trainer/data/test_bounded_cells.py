"""A training row's audio costs its crop, not its length: a shard row whose FLAC header states more
than its ``duration_s`` is skipped as ``too-long`` before a frame is decoded, and a row without a
``duration_s`` (a caption corpus) has only its crop decoded, the same samples a whole decode gives
there. A label holding a tab or line break is a ``bad-label`` row, as ``sedsynth validate`` says."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from pipeline.audio import AudioError, decode_mono, encode_flac
from trainer.data.stream import ItemBuilder, ItemParams, RowError
from trainer.encoders import SmallEncoder

SR = 16000
CROP = 4 * SR


@pytest.fixture
def frames_read(monkeypatch) -> list[int]:
    counts, real = [], sf.SoundFile.read

    def counting(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        counts.append(len(out))
        return out

    monkeypatch.setattr(sf.SoundFile, "read", counting)
    return counts


@pytest.fixture(scope="module")
def builder() -> ItemBuilder:
    return ItemBuilder(ItemParams(input_samples=CROP), SmallEncoder(width=16).frame_spans_s(), None, seed=3)


def ramp(seconds: float, rate: int = SR) -> bytes:
    return encode_flac((np.arange(int(seconds * rate)) % 20000 - 10000).astype(np.int16), rate)


def test_a_shard_cell_longer_than_its_mixture_is_too_long_before_decoding(builder, frames_read):
    row = {"id": "m", "audio": {"bytes": encode_flac(np.zeros(240 * SR, np.int16), SR)}, "caption": "quiet", "duration_s": 10.0}
    assert len(row["audio"]["bytes"]) < 100_000  # four minutes of silence
    with pytest.raises(AudioError) as caught:
        builder(row, source=0, epoch=0, frame_level=False)
    assert caught.value.reason == "too-long" and "240.0 s" in caught.value.detail
    assert sum(frames_read) == 0


def test_a_long_caption_clip_has_only_its_crop_decoded(builder, frames_read):
    row = {"id": "long.flac", "audio": {"bytes": ramp(180)}, "captions": ["a long recording"]}
    item = builder(row, source=0, epoch=0, frame_level=False)
    assert item.wave.shape == (CROP,) and sum(frames_read) <= CROP
    whole = decode_mono(row["audio"]["bytes"], SR)
    start = int(np.flatnonzero(whole == item.wave[0])[0])  # the ramp's values place the crop
    assert item.wave.tobytes() == whole[start:start + CROP].tobytes()
    # the same draw as a crop of the whole decode: one generator, one call
    rng_a, rng_b = np.random.default_rng(9), np.random.default_rng(9)
    wave, offset_s = builder.load(row, rng_a)
    cropped, offset_b = builder.crop(whole, rng_b)
    assert wave.tobytes() == cropped.tobytes() and offset_s == offset_b


def test_a_resampled_crop_is_the_whole_decodes_crop(frames_read):
    b = ItemBuilder(ItemParams(input_samples=CROP), SmallEncoder(width=16).frame_spans_s(), None, seed=3)
    row = {"id": "long.wav", "audio": {"bytes": ramp(120, 44100)}, "captions": ["a long recording"]}
    wave, offset_s = b.load(row, np.random.default_rng(4))
    assert sum(frames_read) < 5 * 44100
    cropped, offset_b = b.crop(decode_mono(row["audio"]["bytes"], SR), np.random.default_rng(4))
    assert offset_s == offset_b > 0
    np.testing.assert_allclose(wave, cropped, atol=1e-6)


@pytest.mark.parametrize("label", ["Dog\tbark", "Dog\nbark", "Dog\u2028bark", "Dog\x85bark"])
def test_a_label_that_would_forge_tsv_rows_is_a_bad_label_row(builder, label):
    row = {"id": "m", "audio": {"bytes": b"x"}, "caption": "c", "duration_s": 10.0,
           "phrases": [{"phrase": "a dog", "label": label, "cluster_id": 0, "segments": [{"start_s": 1.0, "end_s": 2.0}]}]}
    with pytest.raises(RowError) as caught:
        builder.check(row)
    assert caught.value.reason == "bad-label" and "label" in caught.value.detail
