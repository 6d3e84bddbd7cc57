"""The text tower bounds what it tokenises: a caption or phrase of megabytes (a shard is untrusted
input) reaches the tokenizer cut to a length set by ``max_tokens``, and gives the features its
first tokens give."""

from __future__ import annotations

import pytest
import torch

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
