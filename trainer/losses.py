"""FineLAP's dual-stream sigmoid loss and its options, as small modules returning named terms.

- :class:`SigmoidClipLoss` (SigLIP, Zhai et al. 2023; FineLAP eq. 2): binary loss over all
  B x B' audio-caption pairs, logit ``t * cos + b`` with learnable ``t = exp(log_t)`` (init 10)
  and ``b`` (init -10), summed over pairs and divided by B. Under DDP the captions of every
  rank are gathered (with gradients), so each clip sees the global batch's captions as negatives.
  (The paper prints the logit as ``t*s - b``; SigLIP and the init b = -10 mean ``t*s + b``.)
- :class:`InfoNCEClipLoss`: the symmetric InfoNCE of CLAP (the "FineLAP-InfoNCE" ablation).
- :class:`FrameSigmoidLoss` (FineLAP eq. 3): binary loss over B x N x L frame-phrase pairs
  with its own ``t'``, ``b'``, averaged over the valid pairs (clips with frame labels, real
  phrases). ``chunk_clips`` computes it a few clips at a time and recomputes each chunk's
  logits in the backward pass, so memory does not grow with B x N x L; it equals the
  reference computation. With per-text scale and bias (FLAM) those replace ``t'`` and ``b'``;
  the bias reaches the loss detached, so only :class:`PriorLoss` trains it.
- :class:`PhraseClipLoss`: the clip embedding against each of the clip's N phrases (the frame
  loss's positives and cluster negatives), a binary loss with its own ``t``, ``b`` whose target is
  whether the phrase sounds anywhere in the clip, averaged over the valid pairs. It ties the clip
  path to single sound names, which captions listing 1-5 events do not: zero-shot classification
  queries one name at a time.
- :class:`RegionContrastiveLoss` (TACOS eq. 6, Primus et al. 2025): each labelled phrase
  (region text) against the frames it covers, a softmax over that text and the texts of the
  batch's other clips, the log-likelihood summed over the phrase's frames and divided by
  their number, then averaged over phrases.
- :class:`PriorLoss` (FLAM eq. 10): BCE between each distinct phrase's bias and its share of
  positive frames in the batch.

All inputs are unit-norm embeddings. Every module returns a dict of named scalars.

Under DDP (``across_ranks``, the default, with a process group of several ranks) every loss sees
the global batch, as one process given all ranks' clips would: texts of other ranks are gathered
with gradients, and counts and batch statistics are summed over ranks. Each rank returns its
share scaled so that the mean over ranks, which DDP's gradient averaging takes, is the
single-process loss of the global batch (and its gradient). ``across_ranks=False`` scores a batch
on its own (the held-out split, scored on one rank).
"""

from __future__ import annotations

import hashlib
import math

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint


def ranks(across_ranks: bool = True) -> tuple[int, int]:
    """``(rank, world size)`` of the process group the losses span: ``(0, 1)`` without one or when
    not ``across_ranks``."""
    import torch.distributed as dist

    if across_ranks and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _row_counts(n: int, device: torch.device) -> list[int]:
    """Every rank's ``n`` (rows it gathers), in rank order."""
    import torch.distributed as dist

    counts = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(counts, torch.tensor([n], dtype=torch.long, device=device))
    return [int(c) for c in counts]


def _gather_rows(x: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """All ranks' ``x`` (``counts[r]`` rows on rank r) concatenated along dim 0; shorter parts are
    padded for the all_gather, which wants equal shapes."""
    import torch.distributed as dist

    longest = max(counts)
    if longest == 0:  # every rank knows the counts, so all skip the all_gather together
        return x.new_zeros((0, *x.shape[1:]))
    padded = x.new_zeros((longest, *x.shape[1:]))
    padded[: x.shape[0]] = x
    parts = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(parts, padded.contiguous())
    return torch.cat([p[:n] for p, n in zip(parts, counts)], dim=0)


class _GatherWithGrad(torch.autograd.Function):
    """all_gather whose backward sums every rank's gradient for this rank's slice."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        import torch.distributed as dist

        ctx.counts, ctx.rank = counts, dist.get_rank()
        return _gather_rows(x, counts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        import torch.distributed as dist

        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        start = sum(ctx.counts[: ctx.rank])
        return grad[start : start + ctx.counts[ctx.rank]], None


def gather_with_grad(x: torch.Tensor, across_ranks: bool = True, same_rows: bool = True) -> tuple[torch.Tensor, int]:
    """All ranks' ``x`` concatenated along dim 0 (gradients flow back), and this rank's offset in it.

    ``same_rows``: every rank has as many rows (a batch: the loader drops partial batches), so
    their counts need not be exchanged first. Without a process group, or not ``across_ranks``,
    it is ``(x, 0)``. Every rank must call it, whatever its rows.
    """
    rank, size = ranks(across_ranks)
    if size == 1:
        return x, 0
    counts = [x.shape[0]] * size if same_rows else _row_counts(x.shape[0], x.device)
    return _GatherWithGrad.apply(x, counts), sum(counts[:rank])


def gather_rows(x: torch.Tensor, across_ranks: bool = True) -> tuple[torch.Tensor, int]:
    """All ranks' ``x`` (any number of rows each, no gradient) concatenated along dim 0, and this
    rank's offset in it; ``(x, 0)`` in a world of one."""
    rank, size = ranks(across_ranks)
    if size == 1:
        return x, 0
    counts = _row_counts(x.shape[0], x.device)
    return _gather_rows(x.detach(), counts), sum(counts[:rank])


def sum_over_ranks(x: torch.Tensor, across_ranks: bool = True) -> torch.Tensor:
    """``x`` (a count or a statistic, no gradient) summed over the ranks; ``x`` in a world of one."""
    if ranks(across_ranks)[1] == 1:
        return x
    import torch.distributed as dist

    total = x.detach().clone()
    dist.all_reduce(total)
    return total


class SigmoidClipLoss(nn.Module):
    """audio ``(B, d)``, text ``(B, d)`` -> ``{"clip": loss, "clip_t": t, "clip_b": b}``."""

    def __init__(self, init_scale: float = 10.0, init_bias: float = -10.0):
        super().__init__()
        self.log_scale = nn.Parameter(torch.tensor(math.log(init_scale)))
        self.bias = nn.Parameter(torch.tensor(float(init_bias)))

    def forward(self, audio: torch.Tensor, text: torch.Tensor, across_ranks: bool = True) -> dict[str, torch.Tensor]:
        texts, offset = gather_with_grad(text, across_ranks)
        logits = self.log_scale.exp() * audio @ texts.T + self.bias  # (B, B_global)
        labels = -torch.ones_like(logits)
        labels.diagonal(offset).fill_(1.0)  # clip i's caption is column offset + i (no index tensor: no wait for the GPU)
        loss = -F.logsigmoid(labels * logits).sum() / audio.shape[0]
        return {"clip": loss, "clip_t": self.log_scale.exp().detach(), "clip_b": self.bias.detach()}


class InfoNCEClipLoss(nn.Module):
    """audio ``(B, d)``, text ``(B, d)`` -> ``{"clip": symmetric cross-entropy, "clip_t": t}``."""

    def __init__(self, init_scale: float = 10.0, init_bias: float = 0.0):
        super().__init__()
        self.log_scale = nn.Parameter(torch.tensor(math.log(init_scale)))

    def forward(self, audio: torch.Tensor, text: torch.Tensor, across_ranks: bool = True) -> dict[str, torch.Tensor]:
        audios, a_off = gather_with_grad(audio, across_ranks)
        texts, t_off = gather_with_grad(text, across_ranks)
        scale = self.log_scale.exp()
        idx = torch.arange(audio.shape[0], device=audio.device)
        a2t = F.cross_entropy(scale * audio @ texts.T, idx + t_off)
        t2a = F.cross_entropy(scale * text @ audios.T, idx + a_off)
        return {"clip": (a2t + t2a) / 2, "clip_t": scale.detach()}


def frame_logits(frames: torch.Tensor, phrases: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """frames ``(B, L, d)``, phrases ``(B, N, d)``, scale/bias scalar or ``(B, N)`` -> ``(B, N, L)``."""
    sim = torch.einsum("bld,bnd->bnl", frames, phrases)
    if scale.dim() == 2:
        scale, bias = scale.unsqueeze(-1), bias.unsqueeze(-1)
    return scale * sim + bias


def frame_loss_sum(frames, phrases, labels, weight, scale, bias) -> torch.Tensor:
    """Sum of ``-log sigmoid(z * logit)`` over the pairs, each weighted ``(B, N, L)``."""
    z = labels.to(frames.dtype) * 2 - 1
    return -(F.logsigmoid(z * frame_logits(frames, phrases, scale, bias)) * weight).sum()


class FrameSigmoidLoss(nn.Module):
    """frames ``(B, L, d)``, phrases ``(B, N, d)``, labels ``(B, N, L)`` bool, mask ``(B, N)`` bool
    -> ``{"frame": loss, "frame_t": t', "frame_b": b'}``; optional per-text ``scale``/``bias`` ``(B, N)``.

    Under DDP the pairs are averaged over the valid pairs of every rank (ranks hold different
    numbers of them)."""

    def __init__(self, init_scale: float = 10.0, init_bias: float = -10.0, chunk_clips: int = 0):
        super().__init__()
        self.log_scale = nn.Parameter(torch.tensor(math.log(init_scale)))
        self.bias = nn.Parameter(torch.tensor(float(init_bias)))
        self.chunk_clips = chunk_clips

    def forward(self, frames, phrases, labels, mask, scale=None, bias=None, across_ranks: bool = True) -> dict[str, torch.Tensor]:
        if scale is None:
            scale, bias = self.log_scale.exp(), self.bias
        else:
            bias = bias.detach()  # FLAM: the SED loss does not train the per-text bias
        weight = mask.unsqueeze(-1).expand_as(labels).to(frames.dtype)
        ranks_total = ranks(across_ranks)[1]
        # this rank's sum over the global count, times the ranks: their mean is the global average
        count = sum_over_ranks(weight.sum(), across_ranks).clamp(min=1.0) / ranks_total
        b = frames.shape[0]
        step = self.chunk_clips if 0 < self.chunk_clips < b else b
        total = frames.new_zeros(())
        for i in range(0, b, step):
            part = slice(i, i + step)
            s, bb = (scale[part], bias[part]) if scale.dim() == 2 else (scale, bias)
            args = (frames[part], phrases[part], labels[part], weight[part], s, bb)
            total = total + (checkpoint(frame_loss_sum, *args, use_reentrant=False) if step < b else frame_loss_sum(*args))
        out = {"frame": total / count}
        if scale.dim() == 0:
            out |= {"frame_t": scale.detach(), "frame_b": bias.detach()}
        return out


class PhraseClipLoss(nn.Module):
    """clip ``(B, d)``, phrases ``(B, N, d)``, labels ``(B, N, L)`` bool, mask ``(B, N)`` bool
    -> ``{"phrase_clip": loss, "phrase_clip_t": t, "phrase_clip_b": b}``.

    A phrase is a positive when any of its frames is labelled (it sounds in the clip's crop).
    Under DDP the pairs are averaged over the valid pairs of every rank."""

    def __init__(self, init_scale: float = 10.0, init_bias: float = -10.0):
        super().__init__()
        self.log_scale = nn.Parameter(torch.tensor(math.log(init_scale)))
        self.bias = nn.Parameter(torch.tensor(float(init_bias)))

    def forward(self, clip, phrases, labels, mask, across_ranks: bool = True) -> dict[str, torch.Tensor]:
        scale = self.log_scale.exp()
        logits = scale * torch.einsum("bd,bnd->bn", clip, phrases) + self.bias  # (B, N)
        z = labels.any(-1).to(clip.dtype) * 2 - 1
        weight = mask.to(clip.dtype)
        count = sum_over_ranks(weight.sum(), across_ranks).clamp(min=1.0) / ranks(across_ranks)[1]
        loss = -(F.logsigmoid(z * logits) * weight).sum() / count
        return {"phrase_clip": loss, "phrase_clip_t": scale.detach(), "phrase_clip_b": self.bias.detach()}


class RegionContrastiveLoss(nn.Module):
    """frames ``(B, L, d)``, phrases ``(B, N, d)``, labels ``(B, N, L)`` bool, mask ``(B, N)`` bool
    -> ``{"region": loss, "region_t": t}``.

    A region is a real phrase with at least one labelled frame (a phrase's segments together:
    regions of one text in one clip are one region). For frame ``l`` of region ``k`` of clip
    ``i`` the positive is the region's text and the negatives are every region text of the
    other clips in the batch (TACOS's D-minus; cluster negatives and the clip's own other
    regions are not negatives), logit ``t * cos`` with learnable ``t`` (init ``init_scale``).
    A batch with no region gives 0. Under DDP the batch is the global one: every rank's region
    texts are gathered (with gradients) as negatives, and the mean is over every rank's regions.
    """

    def __init__(self, init_scale: float = 10.0):
        super().__init__()
        self.log_scale = nn.Parameter(torch.tensor(math.log(init_scale)))

    def forward(self, frames, phrases, labels, mask, across_ranks: bool = True) -> dict[str, torch.Tensor]:
        scale = self.log_scale.exp()
        b, device = frames.shape[0], frames.device
        region = mask & labels.any(-1)  # (B, N)
        clip_of, slot = region.nonzero(as_tuple=True)  # (K,) each region's clip and phrase slot
        # the global batch: every rank's region texts (K_all, d), and the global clip of each
        rank, ranks_total = ranks(across_ranks)
        clips_before = gather_rows(torch.tensor([b], device=device), across_ranks)[0][:rank].sum()
        clip_offset = int(clips_before)  # this rank's first clip in the global batch
        texts, offset = gather_with_grad(phrases[clip_of, slot], across_ranks, same_rows=False)  # (K_all, d)
        clips, _ = gather_rows(clip_of + clip_offset, across_ranks)  # (K_all,)
        if texts.shape[0] == 0:  # no region on any rank (each rank takes this branch); t stays in the graph for DDP
            return {"region": frames.sum() * 0 + scale * 0, "region_t": scale.detach()}
        logits = scale * torch.einsum("bld,kd->blk", frames, texts)  # (B, L, K_all)
        other = clips.unsqueeze(0) != torch.arange(clip_offset, clip_offset + b, device=device).unsqueeze(1)  # (B, K_all)
        negatives = torch.logsumexp(
            logits.masked_fill(~other.unsqueeze(1), float("-inf")), dim=-1
        )  # (B, L); -inf without negatives
        positive = logits[clip_of, :, offset + torch.arange(len(clip_of), device=device)]  # (K, L) this rank's regions
        log_p = positive - torch.logaddexp(positive, negatives[clip_of])  # (K, L)
        frames_in = labels[clip_of, slot].to(frames.dtype)  # (K, L)
        per_region = -(log_p * frames_in).sum(-1) / frames_in.sum(-1)
        # this rank's sum over all ranks' regions, times the ranks: their mean is the global mean
        return {"region": per_region.sum() * ranks_total / texts.shape[0], "region_t": scale.detach()}


def phrase_ids(phrases: list[str], device: torch.device) -> torch.Tensor:
    """A 64-bit id per phrase (the first 8 bytes of its BLAKE2b digest), the same in every process:
    what ranks exchange instead of strings (two phrases of a batch share one with odds of 1 in 2^64)."""
    ids = [int.from_bytes(hashlib.blake2b(p.encode("utf-8"), digest_size=8).digest(), "little", signed=True) for p in phrases]
    return torch.tensor(ids, dtype=torch.long, device=device)


class PriorLoss(nn.Module):
    """phrases (B x N strings), labels ``(B, N, L)``, mask ``(B, N)``, bias ``(B, N)`` -> ``{"prior": loss}``.

    Each distinct phrase's target is its share of positive frames over all frame-labelled
    clips and frames of the batch (clips that do not list it count as negative); its logit is
    the bias of its first occurrence, and the loss is the mean BCE over distinct phrases. Under
    DDP the batch is the global one: phrases (as :func:`phrase_ids`) and positive frames are
    gathered from every rank, and each phrase's BCE is counted on the rank of its first occurrence.
    """

    def forward(
        self,
        phrases: list[list[str]],
        labels: torch.Tensor,
        mask: torch.Tensor,
        bias: torch.Tensor,
        has_frames: torch.Tensor,
        across_ranks: bool = True,
    ) -> dict[str, torch.Tensor]:
        device = bias.device
        flat = [p for row in phrases for p in row]
        keep = mask.reshape(-1).nonzero().squeeze(-1).tolist()
        positives = labels.reshape(-1, labels.shape[-1])[keep].float().sum(-1)  # (K,)
        # every rank's phrases and positive frames, in rank order (each rank gathers, whatever its K)
        ids, offset = gather_rows(phrase_ids([flat[i] for i in keep], device), across_ranks)  # (K_all,)
        positives_all, _ = gather_rows(positives, across_ranks)
        frames_total = sum_over_ranks(has_frames.float().sum(), across_ranks).clamp(min=1) * labels.shape[-1]
        if ids.numel() == 0:
            return {"prior": bias.sum() * 0}
        _, group = torch.unique(ids, return_inverse=True)  # (K_all,) each phrase's distinct-phrase index
        distinct = int(group.max()) + 1
        target = torch.zeros(distinct, device=device).index_add_(0, group, positives_all) / frames_total
        first = torch.full((distinct,), len(ids), device=device, dtype=torch.long)
        first = first.scatter_reduce(0, group, torch.arange(len(ids), device=device), reduce="amin")  # (U,)
        mine = (first >= offset) & (first < offset + len(keep))  # distinct phrases first seen on this rank
        logit = bias.reshape(-1)[keep][first[mine] - offset]
        bce = F.binary_cross_entropy_with_logits(logit, target[mine].clamp(0, 1), reduction="sum")
        # this rank's sum over all distinct phrases, times the ranks: their mean is the global mean
        return {"prior": bce * ranks(across_ranks)[1] / distinct}


def build_clip_loss(kind: str, init_scale: float, init_bias: float) -> nn.Module:
    if kind == "sigmoid":
        return SigmoidClipLoss(init_scale, init_bias)
    if kind == "infonce":
        return InfoNCEClipLoss(init_scale)
    raise ValueError(f"loss: unknown clip loss {kind!r}; use sigmoid or infonce")
