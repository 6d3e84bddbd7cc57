"""The loss modules: clip sigmoid and InfoNCE, frame sigmoid (chunked and not), FLAM's prior loss.

Each is checked against its formula written out by hand (values and the gradients that
matter), the chunked frame loss against the unchunked one.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from trainer.losses import FrameSigmoidLoss, InfoNCEClipLoss, PhraseClipLoss, PriorLoss, RegionContrastiveLoss, SigmoidClipLoss


def unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def test_loss_init_values():
    for loss in (SigmoidClipLoss(), FrameSigmoidLoss()):
        assert loss.log_scale.exp().item() == pytest.approx(10.0)
        assert loss.bias.item() == -10.0
    assert InfoNCEClipLoss().log_scale.exp().item() == pytest.approx(10.0)


def test_sigmoid_clip_loss_matches_hand_computation():
    audio = unit(torch.tensor([[1.0, 0.2], [0.3, -1.0], [-0.6, 0.8]], dtype=torch.float64))
    text = unit(torch.tensor([[0.9, 0.1], [0.5, -0.7], [0.2, 1.0]], dtype=torch.float64))
    loss_fn = SigmoidClipLoss()
    out = loss_fn(audio, text)

    t, b, B = 10.0, -10.0, 3
    expected, d_bias = 0.0, 0.0
    for i in range(B):
        for j in range(B):
            cos = sum(audio[i, k].item() * text[j, k].item() for k in range(2))
            z = 1.0 if i == j else -1.0
            logit = t * cos + b
            expected += -math.log(1.0 / (1.0 + math.exp(-z * logit)))
            d_bias += -z / (1.0 + math.exp(z * logit))  # d/db of -log sigmoid(z * logit)
    assert out["clip"].item() == pytest.approx(expected / B, rel=1e-6)
    assert out["clip_t"].item() == pytest.approx(10.0) and out["clip_b"].item() == -10.0

    out["clip"].backward()
    assert loss_fn.log_scale.grad is not None and loss_fn.bias.grad is not None
    assert torch.isfinite(loss_fn.log_scale.grad) and loss_fn.log_scale.grad.item() != 0.0
    assert loss_fn.bias.grad.item() == pytest.approx(d_bias / B, rel=1e-5)


def test_infonce_clip_loss_matches_cross_entropy_reference():
    g = torch.Generator().manual_seed(3)
    audio = unit(torch.randn(4, 5, generator=g, dtype=torch.float64))
    text = unit(torch.randn(4, 5, generator=g, dtype=torch.float64))
    out = InfoNCEClipLoss()(audio, text)
    logits = 10.0 * audio @ text.T
    target = torch.arange(4)
    reference = (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2
    assert torch.allclose(out["clip"], reference, rtol=1e-6)
    # and by hand: mean of -log softmax on the diagonal, both directions
    by_hand = -(torch.log_softmax(logits, 1).diagonal().mean() + torch.log_softmax(logits, 0).diagonal().mean()) / 2
    assert torch.allclose(out["clip"], by_hand, rtol=1e-6)


def _frame_inputs(seed: int = 0, B: int = 5, N: int = 4, L: int = 7, d: int = 3):
    g = torch.Generator().manual_seed(seed)
    frames = unit(torch.randn(B, L, d, generator=g, dtype=torch.float64))
    phrases = unit(torch.randn(B, N, d, generator=g, dtype=torch.float64))
    labels = torch.rand(B, N, L, generator=g) < 0.4
    mask = torch.rand(B, N, generator=g) < 0.7
    mask[0, :] = True
    mask[1, -1] = False  # some invalid phrases for sure
    mask[3, :] = False  # a clip without frame labels
    return frames, phrases, labels, mask


def _frame_run(chunk: int, frames, phrases, labels, mask, scale=None, bias=None):
    loss_fn = FrameSigmoidLoss(chunk_clips=chunk).double()
    f = frames.clone().requires_grad_(True)
    p = phrases.clone().requires_grad_(True)
    s = bias_t = None
    if scale is not None:
        s = scale.clone().requires_grad_(True)
        bias_t = bias.clone().requires_grad_(True)
    out = loss_fn(f, p, labels, mask, s, bias_t)
    out["frame"].backward()
    return out, f.grad, p.grad, loss_fn, s, bias_t


def test_frame_loss_matches_formula_and_ignores_invalid_phrases():
    frames, phrases, labels, mask = _frame_inputs()
    out, _, p_grad, loss_fn, _, _ = _frame_run(0, frames, phrases, labels, mask)
    total, count = 0.0, 0
    for b in range(frames.shape[0]):
        for n in range(phrases.shape[1]):
            if not mask[b, n]:
                continue
            for l in range(frames.shape[1]):
                z = 1.0 if labels[b, n, l] else -1.0
                logit = 10.0 * float(frames[b, l] @ phrases[b, n]) - 10.0
                total += math.log1p(math.exp(-z * logit))
                count += 1
    assert out["frame"].item() == pytest.approx(total / count, rel=1e-6)  # t = exp(float32 log 10)
    assert out["frame_t"].item() == pytest.approx(10.0) and out["frame_b"].item() == -10.0
    assert loss_fn.log_scale.grad is not None and loss_fn.bias.grad is not None
    # invalid phrases get no gradient and do not change the loss
    assert torch.all(p_grad[~mask] == 0) and torch.any(p_grad[mask] != 0)
    moved = phrases.clone()
    moved[~mask] = unit(torch.ones_like(moved[~mask]))
    assert _frame_run(0, frames, moved, labels, mask)[0]["frame"].item() == pytest.approx(out["frame"].item(), rel=1e-12)


def test_phrase_clip_loss_matches_formula_and_ignores_invalid_phrases():
    frames, phrases, labels, mask = _frame_inputs()
    clip = unit(frames.mean(dim=1)).requires_grad_()
    phrases = phrases.clone().requires_grad_()
    loss_fn = PhraseClipLoss().double()
    out = loss_fn(clip, phrases, labels, mask)
    total, count = 0.0, 0
    for b in range(clip.shape[0]):
        for n in range(phrases.shape[1]):
            if mask[b, n]:
                z = 1.0 if labels[b, n].any() else -1.0  # a phrase sounding in any frame is a positive
                total += math.log1p(math.exp(-z * (10.0 * float(clip[b].detach() @ phrases[b, n].detach()) - 10.0)))
                count += 1
    assert out["phrase_clip"].item() == pytest.approx(total / count, rel=1e-6)
    out["phrase_clip"].backward()
    assert torch.all(phrases.grad[~mask] == 0) and torch.any(phrases.grad[mask] != 0)
    assert loss_fn.log_scale.grad is not None and loss_fn.bias.grad is not None


@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_frame_loss_chunked_equals_unchunked(chunk):
    frames, phrases, labels, mask = _frame_inputs(seed=1)
    ref, rf, rp, rloss, _, _ = _frame_run(0, frames, phrases, labels, mask)
    out, f, p, loss, _, _ = _frame_run(chunk, frames, phrases, labels, mask)
    assert torch.allclose(out["frame"], ref["frame"], rtol=1e-12, atol=0)
    assert torch.allclose(f, rf, rtol=1e-10, atol=1e-14)
    assert torch.allclose(p, rp, rtol=1e-10, atol=1e-14)
    assert torch.allclose(loss.log_scale.grad, rloss.log_scale.grad, rtol=1e-10)
    assert torch.allclose(loss.bias.grad, rloss.bias.grad, rtol=1e-10)


@pytest.mark.parametrize("chunk", [0, 2])
def test_frame_loss_per_text_bias_gets_no_gradient(chunk):
    frames, phrases, labels, mask = _frame_inputs(seed=2)
    g = torch.Generator().manual_seed(9)
    scale = torch.rand(mask.shape, generator=g, dtype=torch.float64) * 5 + 5
    bias = -8 + torch.randn(mask.shape, generator=g, dtype=torch.float64)
    out, f, _, loss_fn, s, b = _frame_run(chunk, frames, phrases, labels, mask, scale, bias)
    assert b.grad is None  # only the prior loss trains the per-text bias
    assert s.grad is not None and torch.all(s.grad[~mask] == 0) and torch.any(s.grad[mask] != 0)
    assert loss_fn.log_scale.grad is None and loss_fn.bias.grad is None  # t', b' are replaced
    assert "frame_t" not in out and "frame_b" not in out
    ref = _frame_run(0, frames, phrases, labels, mask, scale, bias)
    assert torch.allclose(out["frame"], ref[0]["frame"], rtol=1e-12)
    assert torch.allclose(f, ref[1], rtol=1e-10, atol=1e-14) and torch.allclose(s.grad, ref[4].grad, rtol=1e-10, atol=1e-14)
    # the per-text scale and bias are really used: logit = s * cos + b
    sim = torch.einsum("bld,bnd->bnl", frames, phrases)
    z = labels.double() * 2 - 1
    w = mask.unsqueeze(-1).expand_as(labels).double()
    expected = -(F.logsigmoid(z * (scale.unsqueeze(-1) * sim + bias.unsqueeze(-1))) * w).sum() / w.sum()
    assert torch.allclose(out["frame"], expected, rtol=1e-12)


def test_prior_loss_targets_are_positive_frame_shares():
    L = 4
    phrases = [["dog", "cat", ""], ["dog", "car", "x"], ["bird", "dog", "cat"], ["", "", ""]]
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.bool)
    has_frames = torch.tensor([True, True, True, False])
    labels = torch.zeros(4, 3, L, dtype=torch.bool)
    labels[0, 0, :2] = True  # dog: 2 frames
    labels[0, 1, :] = True  # cat: 4 frames
    labels[1, 0, 1:] = True  # dog: 3 frames
    labels[1, 2, :] = True  # masked: must not count
    labels[2, 1, 0] = True  # dog: 1 frame
    labels[2, 2, 3] = True  # cat: 1 frame
    bias = torch.tensor([[-1.0, -2.0, 5.0], [-3.0, -4.0, 5.0], [-5.0, -6.0, -7.0], [5.0, 5.0, 5.0]], requires_grad=True)
    out = PriorLoss()(phrases, labels, mask, bias, has_frames)

    frames_total = 3 * L  # three frame-labelled clips
    targets = {"bird": 0 / frames_total, "car": 0 / frames_total, "cat": 5 / frames_total, "dog": 6 / frames_total}
    logits = {"bird": -5.0, "car": -4.0, "cat": -2.0, "dog": -1.0}  # each phrase's first occurrence
    expected = 0.0
    for name, y in targets.items():
        x = logits[name]
        sig = 1 / (1 + math.exp(-x))
        expected += -(y * math.log(sig) + (1 - y) * math.log(1 - sig))
    assert out["prior"].item() == pytest.approx(expected / len(targets), rel=1e-6)
    out["prior"].backward()
    grad = bias.grad
    assert grad[0, 0] != 0 and grad[0, 1] != 0 and grad[1, 1] != 0 and grad[2, 0] != 0
    assert grad[1, 0] == 0 and grad[2, 1] == 0 and grad[2, 2] == 0  # repeats use the first occurrence
    assert torch.all(grad[~mask] == 0)

    empty = PriorLoss()(phrases, labels, torch.zeros_like(mask), bias, has_frames)
    assert empty["prior"].item() == 0.0


def _unit(*shape: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


def test_region_loss_matches_a_loop_over_regions_and_frames():
    """TACOS eq. 6: per region, -mean over its frames of log softmax(region text vs other clips' region texts)."""
    B, N, L, d = 3, 4, 6, 8
    frames, phrases = _unit(B, L, d, seed=1), _unit(B, N, d, seed=2)
    labels = torch.zeros(B, N, L, dtype=torch.bool)
    labels[0, 0, 1:4] = True
    labels[0, 1, 3:6] = True  # a second region of clip 0: not a negative for the first
    labels[1, 0, 0:2] = True
    labels[2, 2, 5] = True
    labels[2, 3, 0:3] = True  # masked out below: neither a region nor a negative
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[2, 3] = False
    loss = RegionContrastiveLoss(init_scale=5.0)
    out = loss(frames, phrases, labels, mask)

    regions = [(i, k) for i in range(B) for k in range(N) if mask[i, k] and labels[i, k].any()]
    expected = []
    for i, k in regions:
        negatives = [phrases[j, m] for j, m in regions if j != i]
        per_frame = []
        for t in torch.nonzero(labels[i, k]).flatten().tolist():
            logits = 5.0 * torch.stack([frames[i, t] @ phrases[i, k]] + [frames[i, t] @ n for n in negatives])
            per_frame.append(-(logits[0] - torch.logsumexp(logits, 0)))
        expected.append(torch.stack(per_frame).mean())
    assert torch.allclose(out["region"], torch.stack(expected).mean(), atol=1e-5)
    assert torch.isclose(out["region_t"], torch.tensor(5.0))


def test_region_loss_is_zero_without_regions_and_trains_the_frames():
    frames = _unit(2, 5, 8, seed=3).requires_grad_()
    phrases = _unit(2, 3, 8, seed=4)
    none = RegionContrastiveLoss()(frames, phrases, torch.zeros(2, 3, 5, dtype=torch.bool), torch.ones(2, 3, dtype=torch.bool))
    assert none["region"].item() == 0.0
    labels = torch.zeros(2, 3, 5, dtype=torch.bool)
    labels[0, 0, :2] = labels[1, 1, 2:] = True
    out = RegionContrastiveLoss()(frames, phrases, labels, torch.ones(2, 3, dtype=torch.bool))
    out["region"].backward()
    assert frames.grad[0, :2].abs().sum() > 0 and frames.grad[0, 2:].abs().sum() == 0  # only a region's frames get a gradient
