"""The text tower bounds what it tokenises: a caption or phrase of megabytes (a shard is untrusted
input) reaches the tokenizer cut to a length set by ``max_tokens``, and gives the features its
first tokens give."""

from __future__ import annotations

import pytest
import torch

from trainer import text
from trainer.text import MAX_CHARS_PER_TOKEN, OFFLINE_MODEL, TextEncoder


class Recording:
    """A tokenizer that notes the length of every string it is given."""

    def __init__(self, tokenizer):
        self.tokenizer, self.lengths = tokenizer, []

    def __call__(self, texts, **kwargs):
        self.lengths += [len(t) for t in texts]
        return self.tokenizer(texts, **kwargs)


@pytest.mark.parametrize("frozen", [True, False])
def test_a_huge_caption_reaches_the_tokenizer_bounded(frozen, one_torch_thread):
    encoder = TextEncoder(OFFLINE_MODEL, max_tokens=30, frozen=frozen).eval()
    encoder.tokenizer = recording = Recording(encoder.tokenizer)
    huge = "a dog barks near a busy road " * 150_000  # 4.35 MB
    with torch.no_grad():
        features = encoder([huge, "rain"])
    assert max(recording.lengths) <= 30 * MAX_CHARS_PER_TOKEN
    assert features.shape == (2, encoder.width)
    with torch.no_grad():
        head = encoder([huge[:400]])  # about 90 tokens: more than the 30 kept
    torch.testing.assert_close(features[:1], head)
    if frozen:  # the cache holds the cut string, not the megabytes
        assert max(len(t) for t in encoder.cache) <= 30 * MAX_CHARS_PER_TOKEN


def test_the_frozen_towers_cache_keeps_the_strings_used_last_and_no_more(one_torch_thread, monkeypatch):
    monkeypatch.setattr(text, "CACHE_ENTRIES", 3)
    encoder = TextEncoder(OFFLINE_MODEL, max_tokens=30, frozen=True).eval()
    first = encoder(["rain", "a dog barks", "thunder"])
    encoder(["rain", "speech"])  # "a dog barks" was used least recently: it goes
    assert list(encoder.cache) == ["thunder", "rain", "speech"]
    again = encoder(["a dog barks", "rain"])  # encoded anew, beside a cached string
    assert list(encoder.cache) == ["speech", "a dog barks", "rain"]
    torch.testing.assert_close(again, first[[1, 0]])
    assert all(e.untyped_storage().nbytes() == e.numel() * e.element_size() for e in encoder.cache.values())


def test_padded_texts_give_the_unpadded_features_in_whole_blocks_of_rows_and_tokens(one_torch_thread):
    torch.manual_seed(0)
    plain = TextEncoder("random:bert-base", max_tokens=30, frozen=False).eval()
    padded = TextEncoder("random:bert-base", max_tokens=30, frozen=False, pad_rows=8).eval()
    padded.load_state_dict(plain.state_dict())
    shapes = []
    padded.model.register_forward_pre_hook(
        lambda m, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    texts = ["a dog barks", "rain on a tin roof while a car passes by slowly", "speech", "x", "a door slams twice"]
    with torch.no_grad():
        want, got = plain(texts), padded(texts)
    assert shapes == [(8, 30)] and got.shape == want.shape == (5, plain.width)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert TextEncoder(OFFLINE_MODEL, frozen=True, pad_rows=8).pad_rows == 0  # a frozen tower encodes through its cache
