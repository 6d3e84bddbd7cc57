"""The model and its losses as one module (so DDP sees every trainable parameter).

``forward(batch)`` returns named scalars: ``loss`` (the weighted total) and every term and
learned temperature/bias, which the loop logs as they are.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from trainer.data.stream import Batch
from trainer.losses import FrameSigmoidLoss, PriorLoss, RegionContrastiveLoss, build_clip_loss
from trainer.model import Embeddings, FineLAP


def _float32(e: Embeddings) -> Embeddings:
    return dataclasses.replace(e, **{f.name: v.float() for f in dataclasses.fields(e) if (v := getattr(e, f.name)) is not None})


class Objective(nn.Module):
    def __init__(self, model: FineLAP, loss_params):
        super().__init__()
        p = loss_params
        self.model, self.p = model, p
        self.clip_loss = build_clip_loss(p.clip, p.init_scale, p.init_bias) if p.clip_weight > 0 else None
        self.frame_loss = FrameSigmoidLoss(p.init_scale, p.init_bias, p.frame_chunk_clips) if p.frame_weight > 0 else None
        self.prior_loss = PriorLoss() if model.per_text is not None and p.frame_weight > 0 else None
        self.region_loss = RegionContrastiveLoss(p.init_scale) if p.region_weight > 0 else None

    def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
        return self.terms(self.model(batch.wave, batch.captions, batch.phrases), batch)

    def terms(self, e: Embeddings, batch: Batch) -> dict[str, torch.Tensor]:
        """The loss terms (float32 scalars) for embeddings ``e`` of ``batch``.

        They are computed in float32 even under autocast: in bf16 a logit ``t * cos + b`` with
        t = 10 is off by up to 0.04 and the summed loss keeps 3 significant digits; the losses
        cost little next to the encoders.
        """
        with torch.autocast(e.clip.device.type, enabled=False):
            return self._terms(_float32(e), batch)

    def _terms(self, e: Embeddings, batch: Batch) -> dict[str, torch.Tensor]:
        terms: dict[str, torch.Tensor] = {}
        total = e.clip.new_zeros(())
        if self.clip_loss is not None:
            terms |= self.clip_loss(e.clip, e.caption)
            total = total + self.p.clip_weight * terms["clip"]
        if self.frame_loss is not None:
            terms |= self.frame_loss(e.frames, e.phrases, batch.labels, batch.mask, e.phrase_scale, e.phrase_bias)
            total = total + self.p.frame_weight * terms["frame"]
        if self.region_loss is not None:
            terms |= self.region_loss(e.frames, e.phrases, batch.labels, batch.mask)
            total = total + self.p.region_weight * terms["region"]
        if self.prior_loss is not None:
            terms |= self.prior_loss(batch.phrases, batch.labels, batch.mask, e.phrase_bias, batch.has_frames)
            total = total + self.p.prior_weight * terms["prior"]
        return {"loss": total, **terms}
