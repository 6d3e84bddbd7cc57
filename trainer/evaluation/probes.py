"""Linear probes on frozen encoder features (CaptionStew's protocol, section 4.2 and appendix A.5).

CaptionStew judges an audio encoder by simple heads trained on its frozen final-layer frames:
clip classification after mean pooling or after learned attention pooling ("multi-head attention
pooling (Lee et al., 2019)"; the paper does not give the head count, ``heads`` sets it), and
frame-level detection with a linear layer on every frame. Its figures: mAP for multi-label
tagging (FSD50K), accuracy for single-label classification, PSDS1 for AudioSet-Strong detection;
here the frame probe reports frame AUROC and segment F1, and PSDS stays with
:mod:`trainer.evaluation.metrics`.

Inputs: features the caller extracted, ``(N, T, D)`` frames per clip (numpy or torch), with an
optional ``(N, T)`` bool mask of valid frames for padded clips; labels per clip (``(N,)`` class
indices, or ``(N, C)`` 0/1 for multi-label) or per frame (``(N, T, C)`` 0/1). The train and
held-out splits come in separately. Outputs: dicts of figures (floats and counts). The encoder is
never touched: only the pooling query (attention) and the linear layer are trained, with AdamW for
a fixed number of steps from a fixed seed, on features standardised with the train split's
per-dimension mean and standard deviation. Probes may be fitted from several threads at once: each
seeds its own initialisation under a lock and draws its batches from its own generator.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

from trainer.evaluation.ranking import auroc

PROBE_STEPS = 3000
PROBE_LR = 1e-2
PROBE_WEIGHT_DECAY = 1e-2
FITTED_LOSS = (
    1e-4  # a probe whose batch loss falls below this has fitted its training set (the attention probes, within 300 steps)
)
_SEEDED_INIT = threading.Lock()  # torch's global generator seeds each head's initialisation: one probe at a time


class AttentionPool(nn.Module):
    """One learned query attends over a clip's valid frames (pooling by multi-head attention,
    Lee et al. 2019): frames ``(N, T, D)`` and valid ``(N, T)`` -> clip vector ``(N, D)``."""

    def __init__(self, dim: int, heads: int = 1):
        super().__init__()
        self.query = nn.Parameter(torch.randn(1, 1, dim) * dim**-0.5)
        self.attend = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, frames: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """``self.attend(query, frames, frames, key_padding_mask=~valid)`` computed without projecting
        every frame: with one query, head h's logits are ``frames @ (W_k,h^T q_h) / sqrt(D_h)`` (its
        key bias shifts all of a clip's logits alike), and since the weights sum to one the value
        projection can follow the pooling. ``O(N T D H)`` instead of ``O(N T D^2)``."""
        a, (n, _, d) = self.attend, frames.shape
        h = a.num_heads
        w_q, w_k, w_v = a.in_proj_weight.chunk(3)  # (D, D) each
        b_q, _, b_v = a.in_proj_bias.chunk(3)
        q = (self.query[0, 0] @ w_q.T + b_q).view(h, d // h)  # (H, D_h)
        keys = torch.einsum("hk,hkd->dh", q, w_k.view(h, d // h, d)) / math.sqrt(d // h)  # (D, H)
        logits = (frames @ keys).masked_fill(~valid[..., None], float("-inf"))  # (N, T, H)
        pooled = torch.einsum("nth,ntd->nhd", logits.softmax(dim=1), frames)  # (N, H, D)
        values = torch.einsum("nhd,hkd->nhk", pooled, w_v.view(h, d // h, d)) + b_v.view(h, d // h)  # (N, H, D_h)
        return a.out_proj(values.reshape(n, d))


def mean_pool(frames: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean of each clip's valid frames: ``(N, T, D)``, ``(N, T)`` -> ``(N, D)``."""
    weights = valid.to(frames.dtype).unsqueeze(-1)  # (N, T, 1)
    return (frames * weights).sum(1) / weights.sum(1)


@dataclass(frozen=True)
class ClipProbeSettings:
    """How :func:`clip_probe` pools and trains its head."""

    pooling: Literal["mean", "attention"] = "mean"
    num_classes: int | None = None  # default: the largest label index + 1 (or the labels' C columns)
    heads: int = 1  # attention heads of the pooling
    steps: int = PROBE_STEPS  # AdamW steps, at most (fewer once the head has fitted its training set)
    batch_clips: int = 256  # clips per training step (and per scoring batch)
    learning_rate: float = PROBE_LR
    weight_decay: float = PROBE_WEIGHT_DECAY  # AdamW's decoupled weight decay
    seed: int = 0


def clip_probe(
    train_features,
    train_labels,
    test_features,
    test_labels,
    settings: ClipProbeSettings = ClipProbeSettings(),
    *,
    train_valid=None,
    test_valid=None,
) -> dict:
    """Clip classification probe: pool frames ``(N, T, D)`` to ``(N, D)``, then a linear layer.

    ``train_valid`` and ``test_valid``: the ``(N, T)`` bool masks of valid frames (default: every frame).
    Labels ``(N,)`` class indices train with softmax cross-entropy; ``(N, C)`` 0/1 multi-label
    targets with binary cross-entropy. ``settings.num_classes`` defaults to the largest index + 1 (or C).
    Returns ``{"top1_accuracy": share of test clips whose best class is (one of) its label(s),
    "mean_average_precision": macro AP over the classes with a positive test clip, the clips ranked
    by the class's probability (softmax for single-label, sigmoid for multi-label),
    "classes_scored", "train_clips", "test_clips", "final_train_loss", "pooling", "steps" (taken: at most ``settings.steps``)}``.
    """
    pooling, num_classes, heads, steps = settings.pooling, settings.num_classes, settings.heads, settings.steps
    batch_size, lr, weight_decay, seed = (settings.batch_clips, settings.learning_rate, settings.weight_decay, settings.seed)
    if pooling not in ("mean", "attention"):
        raise ValueError(f"clip_probe: pooling must be 'mean' or 'attention', got {pooling!r}")
    x_train, valid_train = _frames(train_features, train_valid)
    x_test, valid_test = _frames(test_features, test_valid)
    y_train, y_test = _tensor(train_labels, x_train.device), _tensor(test_labels, x_train.device)
    multi_label = y_train.ndim == 2
    if multi_label:
        classes = num_classes or y_train.shape[1]
        y_train = y_train.float()
    else:
        y_train = y_train.long()
        classes = num_classes or int(max(y_train.max(), y_test.max())) + 1
    mean, std = _standardiser(x_train[valid_train])
    dim = x_train.shape[-1]

    def standardised(x: torch.Tensor) -> torch.Tensor:  # a batch at a time: the features are never copied whole
        return (x - mean) / std

    with _SEEDED_INIT, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pool = AttentionPool(dim, heads) if pooling == "attention" else None
        head = nn.Linear(dim, classes)
    model = nn.ModuleDict({"head": head, **({"pool": pool} if pool is not None else {})}).to(x_train.device)

    if pool is None:  # mean pooling has nothing to learn: pool once
        pooled_train, pooled_test = (
            torch.cat([mean_pool(standardised(x), v) for x, v in zip(xs.split(batch_size), vs.split(batch_size))])
            for xs, vs in ((x_train, valid_train), (x_test, valid_test))
        )

        def logits(split: str, idx: torch.Tensor) -> torch.Tensor:
            return head((pooled_train if split == "train" else pooled_test).index_select(0, idx))
    else:

        def logits(split: str, idx: torch.Tensor) -> torch.Tensor:
            x, v = (x_train, valid_train) if split == "train" else (x_test, valid_test)
            return head(pool(standardised(x.index_select(0, idx)), v.index_select(0, idx)))

    loss_of = nn.functional.binary_cross_entropy_with_logits if multi_label else nn.functional.cross_entropy
    final_loss, taken = _fit(
        model,
        lambda idx: loss_of(logits("train", idx), y_train.index_select(0, idx)),
        len(x_train),
        steps,
        batch_size,
        lr,
        weight_decay,
        seed,
    )
    with torch.no_grad():
        scores = torch.cat([logits("test", idx) for idx in torch.arange(len(x_test)).split(batch_size)])
    # probabilities rank the clips for each class: a clip's softmax over the classes (single-label), or
    # each class's sigmoid (multi-label); raw logits carry a per-clip offset that would mix into the ranking
    scores = (scores.float().sigmoid() if multi_label else scores.float().softmax(dim=1)).cpu().numpy()
    targets = y_test.cpu().numpy().astype(bool) if multi_label else np.eye(classes, dtype=bool)[y_test.cpu().numpy()]
    best = scores.argmax(axis=1)
    ap, scored = mean_average_precision(scores, targets)
    return {
        "top1_accuracy": float(targets[np.arange(len(best)), best].mean()),
        "mean_average_precision": ap,
        "classes_scored": scored,
        "train_clips": len(x_train),
        "test_clips": len(x_test),
        "final_train_loss": final_loss,
        "pooling": pooling,
        "steps": taken,
    }


def frame_probe(
    train_features,
    train_targets,
    test_features,
    test_targets,
    *,
    train_valid=None,
    test_valid=None,
    threshold: float = 0.5,
    segment_frames: int = 1,
    steps: int = PROBE_STEPS,
    batch_frames: int = 4096,
    lr: float = PROBE_LR,
    weight_decay: float = PROBE_WEIGHT_DECAY,
    seed: int = 0,
) -> dict:
    """Frame-level detection probe: one linear layer on every frame, ``(N, T, D)`` -> ``(N, T, C)``
    probabilities, trained with binary cross-entropy against 0/1 targets ``(N, T, C)``.

    ``segment_frames`` frames make one segment of the segment F1 (with a frame hop of ``h``
    seconds, ``round(1 / h)`` gives sed_eval's 1 s segments; 1 scores single frames). Returns
    ``{"frame_auroc_macro": mean per-class AUROC over the valid test frames of the classes with
    both positive and negative frames, "classes_scored", "segment_f1": micro F1 over (segment,
    class) pairs at ``threshold``, "segment_f1_macro", "segment_precision", "segment_recall",
    "train_frames", "test_frames", "final_train_loss", "steps" (taken: at most ``steps``)}``.
    """
    x_train, valid_train = _frames(train_features, train_valid)
    x_test, valid_test = _frames(test_features, test_valid)
    targets_train = _tensor(train_targets, x_train.device)
    classes = targets_train.shape[-1]
    targets_train = targets_train.reshape(-1, classes)  # (N T, C): rows picked a batch at a time, as float
    targets = _tensor(test_targets, "cpu").bool().numpy()  # (N, T, C)
    # the valid training frames are rows of the (N T, D) frames: each batch picks and standardises its own,
    # so neither the frames nor the targets are copied whole (a padded corpus's features are hundreds of MB)
    rows = valid_train.reshape(-1).nonzero().squeeze(1)  # (M,)
    flat_train = x_train.reshape(-1, x_train.shape[-1])
    mean, std = _standardiser(flat_train.index_select(0, rows))
    with _SEEDED_INIT, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = nn.Linear(x_train.shape[-1], classes)
    head = head.to(x_train.device)

    def batch_loss(idx: torch.Tensor) -> torch.Tensor:
        picked = rows.index_select(0, idx)
        return nn.functional.binary_cross_entropy_with_logits(
            head((flat_train.index_select(0, picked) - mean) / std), targets_train.index_select(0, picked).float()
        )

    final_loss, taken = _fit(head, batch_loss, len(rows), steps, batch_frames, lr, weight_decay, seed)
    valid_test = valid_test.cpu().numpy()
    scores = np.empty((int(valid_test.sum()), classes), np.float32)  # the valid test frames' probabilities, in order
    predicted = np.zeros(targets.shape, bool)
    clips_per_batch, at = max(1, batch_frames // x_test.shape[1]), 0
    with torch.no_grad():
        for first, x in zip(range(0, len(x_test), clips_per_batch), x_test.split(clips_per_batch)):
            probs = torch.sigmoid(head((x - mean) / std)).float().cpu().numpy()  # (B, T, C)
            predicted[first : first + len(x)] = probs >= threshold
            kept = probs[valid_test[first : first + len(x)]]
            scores[at : at + len(kept)] = kept
            at += len(kept)
    frame_auc, scored = macro_auroc(scores, targets[valid_test])
    return {
        "frame_auroc_macro": frame_auc,
        "classes_scored": scored,
        **segment_f1(predicted, targets, valid_test, segment_frames),
        "train_frames": len(rows),
        "test_frames": len(scores),
        "final_train_loss": final_loss,
        "steps": taken,
    }


def mean_average_precision(scores: np.ndarray, targets: np.ndarray) -> tuple[float, int]:
    """Macro average precision of ``scores (n, C)`` against bool ``targets (n, C)`` over the classes
    with at least one positive -> ``(mAP, classes scored)``; NaN when no class has one."""
    from sklearn.metrics import average_precision_score

    values = [average_precision_score(targets[:, c], scores[:, c]) for c in range(targets.shape[1]) if targets[:, c].any()]
    return (float(np.mean(values)) if values else float("nan")), len(values)


def macro_auroc(scores: np.ndarray, targets: np.ndarray) -> tuple[float, int]:
    """Mean per-class AUROC of ``scores (n, C)`` against bool ``targets (n, C)`` over the classes
    with both labels present -> ``(AUROC, classes scored)``; NaN when no class has both."""
    values = [
        auroc(scores[:, c], targets[:, c]) for c in range(targets.shape[1]) if targets[:, c].any() and not targets[:, c].all()
    ]
    return (float(np.mean(values)) if values else float("nan")), len(values)


def segment_f1(predicted: np.ndarray, targets: np.ndarray, valid: np.ndarray, segment_frames: int = 1) -> dict[str, float]:
    """Segment-based F1 (sed_eval's rule: a class is active in a segment if it is active in any of
    its frames). ``predicted`` and ``targets`` bool ``(N, T, C)``, ``valid`` bool ``(N, T)``;
    segments of ``segment_frames`` frames with no valid frame are left out. Returns
    ``{"segment_f1": micro F1 over (segment, class) pairs, "segment_f1_macro": mean of the per-class
    F1 over classes active in the reference or the prediction, "segment_precision",
    "segment_recall"}`` (micro)."""
    n, t, c = targets.shape
    pad = -t % segment_frames

    def segments(active: np.ndarray) -> np.ndarray:  # (N, T, C) -> (N, S, C)
        active = np.pad(active & valid[..., None], ((0, 0), (0, pad), (0, 0)))
        return active.reshape(n, -1, segment_frames, c).any(axis=2)

    seen = np.pad(valid, ((0, 0), (0, pad))).reshape(n, -1, segment_frames).any(axis=2)  # (N, S)
    est, ref = segments(predicted)[seen], segments(targets)[seen]  # (segments, C)
    tp, fp, fn = (est & ref).sum(0), (est & ~ref).sum(0), (~est & ref).sum(0)  # (C,)
    counted = (tp + fp + fn) > 0
    per_class = 2 * tp[counted] / (2 * tp[counted] + fp[counted] + fn[counted])

    def ratio(a: int, b: int) -> float:
        return float(a / b) if b else float("nan")

    return {
        "segment_f1": ratio(2 * tp.sum(), 2 * tp.sum() + fp.sum() + fn.sum()),
        "segment_f1_macro": float(per_class.mean()) if counted.any() else float("nan"),
        "segment_precision": ratio(tp.sum(), tp.sum() + fp.sum()),
        "segment_recall": ratio(tp.sum(), tp.sum() + fn.sum()),
    }


def _tensor(values, device) -> torch.Tensor:
    """Labels or masks (numpy, list or torch) as a tensor on ``device``."""
    return torch.as_tensor(values if isinstance(values, torch.Tensor) else np.asarray(values), device=device)


def _frames(features, valid) -> tuple[torch.Tensor, torch.Tensor]:
    """Features ``(N, T, D)`` as float32 and their valid mask ``(N, T)`` (all frames when None)."""
    x = (
        features.detach().float()
        if isinstance(features, torch.Tensor)
        else torch.as_tensor(np.asarray(features), dtype=torch.float32)
    )
    if x.ndim != 3:
        raise ValueError(f"probe features must be (N, T, D), got shape {tuple(x.shape)}")
    v = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if valid is None else _tensor(valid, x.device).bool()
    if not v.any(dim=1).all():
        raise ValueError("probe features: every clip needs at least one valid frame")
    return x, v


def _standardiser(frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-dimension mean and standard deviation ``(D,)`` of the train split's valid frames ``(M, D)``."""
    return frames.mean(0), frames.std(0, correction=0).clamp_min(1e-6)


def _fit(
    model: nn.Module,
    batch_loss: Callable[[torch.Tensor], torch.Tensor],
    n: int,
    steps: int,
    batch_size: int,
    lr: float,
    weight_decay: float,
    seed: int,
) -> tuple[float, int]:
    """AdamW on ``batch_loss(indices)`` for at most ``steps`` steps; the batches walk through a
    permutation of the ``n`` items drawn by a generator seeded with ``seed``, a new one for each
    pass (the whole set each step when ``n <= batch_size``). A probe whose batch loss falls below
    :data:`FITTED_LOSS` has fitted its training set and stops: more steps would only grow its
    weights. Returns the last batch's loss and the steps taken."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    draw = torch.Generator().manual_seed(seed)
    loss = torch.tensor(float("nan"))
    order, at = torch.arange(n), n
    for step in range(1, steps + 1):
        if n > batch_size:
            if at + batch_size > n:
                order, at = torch.randperm(n, generator=draw), 0
            idx, at = order[at : at + batch_size], at + batch_size
        else:
            idx = order
        loss = batch_loss(idx)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if loss.item() < FITTED_LOSS:
            return float(loss.detach()), step
    return float(loss.detach()), steps
