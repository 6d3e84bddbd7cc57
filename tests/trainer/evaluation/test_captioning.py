"""Caption scores on hand-checked examples, and a split captioned by a decoder (or skipped without one)."""

from __future__ import annotations

import contextlib
import io
import math
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
import torch

from trainer.evaluation.captioning import NO_DECODER, caption_scores, lcs_length, split_captions, tokens
from trainer.evaluation.detector import Detector


def test_identical_captions_score_the_maximum():
    captions = ["A dog barks twice.", "Rain falls on a tin roof", "an engine idles while birds sing"]
    out = caption_scores(captions, [[c] for c in captions])
    assert all(out[f"bleu_{k}"] == pytest.approx(1.0) for k in range(1, 5))
    assert out["rouge_l"] == pytest.approx(1.0) and out["cider_d"] == pytest.approx(10.0) and out["captions"] == 3


def test_a_short_prediction_by_hand():
    out = caption_scores(["a dog barks"], [["A dog barks loudly."]])
    # every 1-, 2- and 3-gram matches, no 4-gram exists (BLEU-4: 1e-15 / 1e-9 matched);
    # brevity penalty exp(1 - 4/3); ROUGE-L: LCS 3, precision 1, recall 3/4, beta 1.2
    penalty = math.exp(1 - 4 / 3)
    for k in (1, 2, 3):
        assert out[f"bleu_{k}"] == pytest.approx(penalty)
    assert out["bleu_4"] == pytest.approx(penalty * (1e-15 / 1e-9) ** 0.25)
    assert out["rouge_l"] == pytest.approx(2.44 * 0.75 / (0.75 + 1.44))


def test_cider_d_by_hand():
    # two clips: "a" is in both references (idf 0), every other n-gram in one (idf log 2).
    # Clip 1 matches its reference: cosine 1 for orders 1-3, order 4 empty (0) -> 10 * 3/4;
    # clip 2 shares nothing with its reference -> 0. The corpus figure is their mean.
    out = caption_scores(["a dog barks", "rain falls"], [["a dog barks"], ["a cat meows"]])
    assert out["cider_d"] == pytest.approx(3.75)
    # the length penalty: one bigram more than the reference -> exp(-1 / 72) on every order
    longer = caption_scores(["a dog barks now", "rain falls"], [["a dog barks"], ["a cat meows"]])
    assert longer["cider_d"] < out["cider_d"]
    # several references: the clip's score is the mean over them, and BLEU takes the closest length
    multi = caption_scores(["a dog barks"], [["a dog barks", "a dog barks loudly at night"]])
    assert multi["bleu_3"] == pytest.approx(1.0)


def test_tokens_and_lcs():
    assert tokens("A dog's bark, then: RAIN!") == ["a", "dog's", "bark", "then", "rain"]
    assert lcs_length("a b c d e".split(), "b x d e".split()) == 3 and lcs_length([], ["a"]) == 0


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="one per clip"):
        caption_scores(["a"], [["a"], ["b"]])
    with pytest.raises(ValueError, match="at least one reference"):
        caption_scores(["a"], [[]])


class EchoDecoder:
    """A stand-in decoder: the caption of a clip whose frames it is given, looked up by their sum."""

    decoding = "autoregressive"

    def __init__(self, by_sum: dict[int, str]):
        self.by_sum = by_sum

    def captions(self, features: torch.Tensor, feature_mask: torch.Tensor) -> list[str]:
        return [self.by_sum[round(float(f[m].sum()))] for f, m in zip(features, feature_mask)]


class SplitOf:
    """Three one-second mixtures held in memory, with their captions."""

    def __init__(self):
        self.ids, self.captions, self.bytes = ("x", "y", "z"), {"x": "a dog barks", "y": "rain falls", "z": "a bell rings"}, {}
        for k, i in enumerate(self.ids):
            buf = io.BytesIO()
            sf.write(buf, np.full(8000, 0.1 * (k + 1), np.float32), 8000, format="WAV", subtype="FLOAT")
            self.bytes[i] = buf.getvalue()

    def audio(self):
        yield from ((i, self.bytes[i]) for i in self.ids)


class SumEncoder(torch.nn.Module):
    width = 1

    def forward(self, wave):
        cols = wave.reshape(len(wave), -1, 400).sum(-1, keepdim=True)  # (B, L, 1)
        return cols.mean(1), cols[:, :, None]


def detector(decoder):
    det = SimpleNamespace(
        sample_rate_hz=8000,
        column_samples=400,
        columns=20,
        window_samples=8000,
        column_s=0.05,
        batch_size=2,
        device=torch.device("cpu"),
        autocast=contextlib.nullcontext,
        model=SimpleNamespace(encoder=SumEncoder()),
        objective=SimpleNamespace(captioner=decoder),
    )
    det.timestamps_s = lambda n: Detector.timestamps_s(det, n)
    return det


def test_a_split_captioned_in_clip_order_and_skipped_without_a_decoder():
    split = SplitOf()
    decoder = EchoDecoder({round(8000 * 0.1 * (k + 1)): split.captions[i] for k, i in enumerate(split.ids)})
    scores, rows = split_captions(detector(decoder), split, batch_size=2)
    assert rows == [(i, split.captions[i], split.captions[i]) for i in split.ids]
    assert scores["rouge_l"] == pytest.approx(1.0) and scores["bleu_1"] == pytest.approx(1.0) and scores["captions"] == 3
    assert scores["decoding"] == "greedy" and scores["unreadable"] == 0 and "METEOR" in scores["not_computed"]
    assert split_captions(detector(None), split, batch_size=2) == ({"skipped": NO_DECODER}, [])
