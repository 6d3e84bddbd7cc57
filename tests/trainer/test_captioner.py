"""The captioning decoder: causal mask by mode, all-[MASK] parallel inputs, the alternate ratio,
overfitting one caption and decoding it back, and the vocabulary's JSON round trip."""

from __future__ import annotations

import json

import pytest
import torch

from trainer.captioner import (
    SPECIALS,
    CaptionDecoder,
    PretrainedTokens,
    WordVocabulary,
    caption_loss,
    choose_parallel,
    encode_captions,
)

CAPTIONS = ["A dog barks twice, then a car passes.", "Rain falls on a tin roof.", "a dog barks"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny_decoder(decoding="autoregressive", seed: int = 0, **kwargs) -> CaptionDecoder:
    torch.manual_seed(seed)
    return CaptionDecoder(
        WordVocabulary.build(CAPTIONS),
        feature_dim=24,
        dim=32,
        depth=2,
        heads=2,
        ffn=64,
        max_tokens=16,
        dropout=0.0,
        decoding=decoding,
        **kwargs,
    )


def features(b: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(b, 10, 24, generator=torch.Generator().manual_seed(seed))  # (B, T, D)


def test_vocabulary_builds_encodes_and_round_trips_as_json(tmp_path):
    vocab = WordVocabulary.build(CAPTIONS)
    assert vocab.words[:5] == list(SPECIALS) and vocab.words[5] == "a"  # most frequent word first
    ids = vocab.encode("A dog barks twice, then a car passes.")
    assert vocab.decode(ids) == "a dog barks twice, then a car passes."
    assert vocab.decode(vocab.encode("a zebra barks")) == "a [UNK] barks"
    assert vocab.decode([*vocab.encode("a dog"), vocab.eos_id, *vocab.encode("barks")]) == "a dog"
    path = tmp_path / "vocab.json"
    vocab.save(path)
    data = json.loads(path.read_text())  # plain JSON, readable without this code
    assert data == {"kind": "words", "words": vocab.words}
    again = WordVocabulary.load(path)
    assert again.words == vocab.words and again.encode(CAPTIONS[0]) == vocab.encode(CAPTIONS[0])
    path.write_text(json.dumps({"words": ["x"]}))
    with pytest.raises(ValueError, match="not a word vocabulary"):
        WordVocabulary.load(path)


def test_encode_captions_adds_bos_eos_and_pads():
    vocab = WordVocabulary.build(CAPTIONS)
    tokens = encode_captions(vocab, ["a dog barks", "rain"], max_tokens=16)
    assert tokens.tolist()[1] == [vocab.bos_id, vocab.index["rain"], vocab.eos_id, vocab.pad_id, vocab.pad_id]
    cut = encode_captions(vocab, [CAPTIONS[0]], max_tokens=4)
    assert cut.shape == (1, 5) and cut[0, -1] == vocab.eos_id


def test_a_caption_of_megabytes_reaches_the_tokenizer_cut_to_a_bound():
    vocab = WordVocabulary.build(CAPTIONS)
    seen: list[int] = []
    encode = vocab.encode
    vocab.encode = lambda text: seen.append(len(text)) or encode(text)
    tokens = encode_captions(vocab, ["a dog barks " * 400_000], max_tokens=16)
    assert tokens.shape == (1, 17) and seen and max(seen) <= 16 * 64


def test_pretrained_tokens_wraps_a_hugging_face_tokenizer():
    class Fake:  # the attributes and calls of a BERT tokenizer that the wrapper uses
        bos_token_id = eos_token_id = None
        cls_token_id, sep_token_id, pad_token_id, mask_token_id = 101, 102, 0, 103

        def __len__(self):
            return 200

        def encode(self, text, add_special_tokens=True):
            return [110 + len(w) for w in text.split()]

        def decode(self, ids, skip_special_tokens=False):
            return " " + " ".join("x" * (i - 110) for i in ids)

    tok = PretrainedTokens(Fake())
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.mask_id, tok.size) == (101, 102, 0, 103, 200)
    assert tok.decode([*tok.encode("ab c"), 102, 115]) == "xx x"
    del Fake.mask_token_id
    Fake.mask_token_id = None
    with pytest.raises(ValueError, match="mask"):
        PretrainedTokens(Fake())


def test_autoregressive_mode_is_causal():
    dec = tiny_decoder().eval()
    feats, vocab = features(), dec.tokenizer
    tokens = encode_captions(vocab, [CAPTIONS[0]] * 2, max_tokens=16)[:, :-1]
    causal = torch.ones(2, dtype=torch.bool)
    changed = tokens.clone()
    changed[:, 6] = vocab.index["rain"]  # a later token differs
    a, b = dec(tokens, feats, causal), dec(changed, feats, causal)
    torch.testing.assert_close(a[:, :6], b[:, :6], atol=0, rtol=0)  # earlier positions: identical
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_parallel_mode_is_not_causal_and_reads_only_mask_tokens():
    dec = tiny_decoder("parallel").eval()
    feats, vocab = features(), dec.tokenizer
    tokens = encode_captions(vocab, [CAPTIONS[0], CAPTIONS[2]], max_tokens=16)
    inputs, targets = dec.training_inputs(tokens, choose_parallel(2, "parallel"))
    assert (inputs == vocab.mask_id).all() and inputs.shape == targets.shape == (2, 16)  # always max_tokens long
    assert (
        torch.equal(targets[:, : tokens.shape[1] - 1], tokens[:, 1:])
        and (targets[:, tokens.shape[1] - 1 :] == vocab.pad_id).all()
    )
    no_causal = torch.zeros(2, dtype=torch.bool)
    changed = inputs.clone()
    changed[:, 6] = vocab.index["rain"]
    a, b = dec(inputs, feats, no_causal), dec(changed, feats, no_causal)
    assert not torch.allclose(a[:, :6], b[:, :6])  # earlier positions see the later token


def test_loss_ignores_padding():
    dec = tiny_decoder().eval()
    feats, vocab = features(), dec.tokenizer
    tokens = encode_captions(vocab, [CAPTIONS[2], CAPTIONS[0]], max_tokens=16)  # row 0 is padded
    loss = caption_loss(dec, feats, tokens)
    inputs, targets = dec.training_inputs(tokens, torch.zeros(2, dtype=torch.bool))
    logits = dec(inputs, feats, torch.ones(2, dtype=torch.bool))
    real = targets != vocab.pad_id
    expected = torch.nn.functional.cross_entropy(logits[real], targets[real])
    torch.testing.assert_close(loss, expected)


@pytest.mark.parametrize("per", ["step", "example"])
def test_alternate_follows_its_ratio(per):
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([choose_parallel(4, "alternate", 0.75, g, per) for _ in range(2000)])  # (steps, B)
    assert abs(draws.float().mean().item() - 0.75) < 0.03
    rows_agree = (draws == draws[:, :1]).all(dim=1)
    assert rows_agree.all() if per == "step" else not rows_agree.all()
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert all(
        torch.equal(choose_parallel(4, "alternate", 0.75, g1, per), choose_parallel(4, "alternate", 0.75, g2, per))
        for _ in range(20)
    )
    assert not choose_parallel(3, "autoregressive").any() and choose_parallel(3, "parallel").all()
    with pytest.raises(ValueError, match="unknown decoding"):
        choose_parallel(3, "beam")


def test_alternate_mixes_modes_inside_a_batch():
    dec = tiny_decoder("alternate", parallel_ratio=0.5, alternate_per="example")
    tokens = encode_captions(dec.tokenizer, CAPTIONS[:2], max_tokens=16)
    parallel = torch.tensor([True, False])
    inputs, _ = dec.training_inputs(tokens, parallel)
    assert (inputs[0] == dec.tokenizer.mask_id).all()
    assert torch.equal(inputs[1, : tokens.shape[1] - 1], tokens[1, :-1])


def overfit(decoding: str, steps: int) -> tuple[CaptionDecoder, torch.Tensor]:
    dec = tiny_decoder(decoding)
    feats = features(1)
    tokens = encode_captions(dec.tokenizer, [CAPTIONS[0]], max_tokens=16)
    opt = torch.optim.AdamW(dec.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    first = None
    for _ in range(steps):
        loss = caption_loss(dec, feats, tokens, g)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05 * first
    return dec.eval(), feats


def test_overfit_caption_comes_back_by_greedy_decoding():
    dec, feats = overfit("autoregressive", 60)
    assert dec.captions(feats) == ["a dog barks twice, then a car passes."]
    assert dec.generate(feats, max_len=3) == [dec.tokenizer.encode("a dog barks")]


def test_overfit_caption_comes_back_by_parallel_decoding():
    dec, feats = overfit("parallel", 80)
    assert dec.captions(feats) == ["a dog barks twice, then a car passes."]  # parallel is the default here
    assert dec.generate(feats, max_len=3) == [dec.tokenizer.encode("a dog barks")]


def test_mask_predict_keeps_the_confident_tokens_and_repredicts_the_rest():
    dec = tiny_decoder("parallel").eval()
    feats, tok = features(3), dec.tokenizer
    inputs = torch.full((3, 16), tok.mask_id)
    probs, first = dec(inputs, feats, torch.zeros(3, dtype=torch.bool)).softmax(-1).max(-1)
    assert torch.equal(dec.parallel_tokens(feats, steps=1), first)  # one pass: the all-[MASK] argmax
    refined = dec.parallel_tokens(feats, steps=2)  # one refinement: the 8 least confident re-predicted
    low = probs.topk(8, dim=1, largest=False).indices
    kept = torch.ones(3, 16, dtype=torch.bool).scatter(1, low, False)
    assert torch.equal(refined[kept], first[kept])
    again = dec(first.scatter(1, low, tok.mask_id), feats, torch.zeros(3, dtype=torch.bool)).argmax(-1)
    assert torch.equal(refined.gather(1, low), again.gather(1, low))


def test_alternate_training_decodes_both_ways():
    dec, feats = overfit("alternate", 120)
    expected = ["a dog barks twice, then a car passes."]
    assert dec.captions(feats, method="greedy") == expected and dec.captions(feats, method="parallel") == expected


def test_feature_mask_hides_padded_frames():
    dec = tiny_decoder().eval()
    feats, tok = features(2), dec.tokenizer
    inputs = encode_captions(tok, CAPTIONS[:2], max_tokens=16)[:, :-1]
    valid = torch.ones(2, 10, dtype=torch.bool)
    valid[:, 7:] = False
    changed = feats.clone()
    changed[:, 7:] += 5.0
    causal = torch.ones(2, dtype=torch.bool)
    torch.testing.assert_close(dec(inputs, feats, causal, valid), dec(inputs, changed, causal, valid))
    assert not torch.allclose(dec(inputs, feats, causal), dec(inputs, changed, causal))
