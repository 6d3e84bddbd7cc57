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
- :class:`RegionContrastiveLoss` (TACOS eq. 6, Primus et al. 2025): each labelled phrase
  (region text) against the frames it covers, a softmax over that text and the texts of the
  batch's other clips, the log-likelihood summed over the phrase's frames and divided by
  their number, then averaged over phrases.
- :class:`PriorLoss` (FLAM eq. 10): BCE between each distinct phrase's bias and its share of
  positive frames in the batch.

All inputs are unit-norm embeddings. Every module returns a dict of named scalars.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint


class _GatherWithGrad(torch.autograd.Function):
    """all_gather whose backward sums every rank's gradient for this rank's slice."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        n = grad.shape[0] // dist.get_world_size()
        return grad[dist.get_rank() * n:(dist.get_rank() + 1) * n]


def gather_with_grad(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """All ranks' ``x`` concatenated along dim 0 (gradients flow back), and this rank's offset."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x, 0
    return _GatherWithGrad.apply(x), dist.get_rank() * x.shape[0]


class SigmoidClipLoss(nn.Module):
    """audio ``(B, d)``, text ``(B, d)`` -> ``{"clip": loss, "clip_t": t, "clip_b": b}``."""

    def __init__(self, init_scale: float = 10.0, init_bias: float = -10.0):
        super().__init__()
        self.log_scale = nn.Parameter(torch.tensor(math.log(init_scale)))
        self.bias = nn.Parameter(torch.tensor(float(init_bias)))

    def forward(self, audio: torch.Tensor, text: torch.Tensor) -> dict[str, torch.Tensor]:
        texts, offset = gather_with_grad(text)
        logits = self.log_scale.exp() * audio @ texts.T + self.bias  # (B, B_global)
        labels = -torch.ones_like(logits)
        idx = torch.arange(audio.shape[0], device=audio.device)
        labels[idx, idx + offset] = 1.0
        loss = -F.logsigmoid(labels * logits).sum() / audio.shape[0]
        return {"clip": loss, "clip_t": self.log_scale.exp().detach(), "clip_b": self.bias.detach()}


class InfoNCEClipLoss(nn.Module):
    """audio ``(B, d)``, text ``(B, d)`` -> ``{"clip": symmetric cross-entropy, "clip_t": t}``."""

    def __init__(self, init_scale: float = 10.0, init_bias: float = 0.0):
        super().__init__()
        self.log_scale = nn.Parameter(torch.tensor(math.log(init_scale)))

    def forward(self, audio: torch.Tensor, text: torch.Tensor) -> dict[str, torch.Tensor]:
        audios, a_off = gather_with_grad(audio)
        texts, t_off = gather_with_grad(text)
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
    -> ``{"frame": loss, "frame_t": t', "frame_b": b'}``; optional per-text ``scale``/``bias`` ``(B, N)``."""

    def __init__(self, init_scale: float = 10.0, init_bias: float = -10.0, chunk_clips: int = 0):
        super().__init__()
        self.log_scale = nn.Parameter(torch.tensor(math.log(init_scale)))
        self.bias = nn.Parameter(torch.tensor(float(init_bias)))
        self.chunk_clips = chunk_clips

    def forward(self, frames, phrases, labels, mask, scale=None, bias=None) -> dict[str, torch.Tensor]:
        if scale is None:
            scale, bias = self.log_scale.exp(), self.bias
        else:
            bias = bias.detach()  # FLAM: the SED loss does not train the per-text bias
        weight = mask.unsqueeze(-1).expand_as(labels).to(frames.dtype)
        count = weight.sum().clamp(min=1.0)
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


class RegionContrastiveLoss(nn.Module):
    """frames ``(B, L, d)``, phrases ``(B, N, d)``, labels ``(B, N, L)`` bool, mask ``(B, N)`` bool
    -> ``{"region": loss, "region_t": t}``.

    A region is a real phrase with at least one labelled frame (a phrase's segments together:
    regions of one text in one clip are one region). For frame ``l`` of region ``k`` of clip
    ``i`` the positive is the region's text and the negatives are every region text of the
    other clips in the batch (TACOS's D-minus; cluster negatives and the clip's own other
    regions are not negatives), logit ``t * cos`` with learnable ``t`` (init ``init_scale``).
    A batch with no region gives 0. Texts are those of this rank (no gather under DDP).
    """

    def __init__(self, init_scale: float = 10.0):
        super().__init__()
        self.log_scale = nn.Parameter(torch.tensor(math.log(init_scale)))

    def forward(self, frames, phrases, labels, mask) -> dict[str, torch.Tensor]:
        scale = self.log_scale.exp()
        region = mask & labels.any(-1)  # (B, N)
        clip_of, slot = region.nonzero(as_tuple=True)  # (K,) each region's clip and phrase slot
        if clip_of.numel() == 0:
            return {"region": frames.sum() * 0, "region_t": scale.detach()}
        texts = phrases[clip_of, slot]  # (K, d)
        logits = scale * torch.einsum("bld,kd->blk", frames, texts)  # (B, L, K)
        other = clip_of.unsqueeze(0) != torch.arange(frames.shape[0], device=frames.device).unsqueeze(1)  # (B, K)
        negatives = torch.logsumexp(logits.masked_fill(~other.unsqueeze(1), float("-inf")), dim=-1)  # (B, L); -inf without negatives
        positive = logits[clip_of, :, torch.arange(len(clip_of), device=frames.device)]  # (K, L)
        log_p = positive - torch.logaddexp(positive, negatives[clip_of])  # (K, L)
        frames_in = labels[clip_of, slot].to(frames.dtype)  # (K, L)
        per_region = -(log_p * frames_in).sum(-1) / frames_in.sum(-1)
        return {"region": per_region.mean(), "region_t": scale.detach()}


class PriorLoss(nn.Module):
    """phrases (B x N strings), labels ``(B, N, L)``, mask ``(B, N)``, bias ``(B, N)`` -> ``{"prior": loss}``.

    Each distinct phrase's target is its share of positive frames over all frame-labelled
    clips and frames of the batch (clips that do not list it count as negative).
    """

    def forward(self, phrases: list[list[str]], labels: torch.Tensor, mask: torch.Tensor, bias: torch.Tensor,
                has_frames: torch.Tensor) -> dict[str, torch.Tensor]:
        flat = [p for row in phrases for p in row]
        keep = mask.reshape(-1).nonzero().squeeze(-1).tolist()
        if not keep:
            return {"prior": bias.sum() * 0}
        unique = sorted({flat[i] for i in keep})
        where = {p: j for j, p in enumerate(unique)}
        group = torch.tensor([where[flat[i]] for i in keep], device=bias.device)
        positives = labels.reshape(-1, labels.shape[-1])[keep].float().sum(-1)  # (K,)
        frames_total = has_frames.float().sum().clamp(min=1) * labels.shape[-1]
        target = torch.zeros(len(unique), device=bias.device).index_add_(0, group, positives) / frames_total
        first = torch.full((len(unique),), len(keep), device=bias.device, dtype=torch.long)
        first = first.scatter_reduce(0, group, torch.arange(len(keep), device=bias.device), reduce="amin")
        logit = bias.reshape(-1)[keep][first]
        return {"prior": F.binary_cross_entropy_with_logits(logit, target.clamp(0, 1))}


def build_clip_loss(kind: str, init_scale: float, init_bias: float) -> nn.Module:
    if kind == "sigmoid":
        return SigmoidClipLoss(init_scale, init_bias)
    if kind == "infonce":
        return InfoNCEClipLoss(init_scale)
    raise ValueError(f"loss: unknown clip loss {kind!r}; use sigmoid or infonce")
