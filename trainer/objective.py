"""The model and its losses as one module (so DDP sees every trainable parameter).

``forward(batch)`` returns named scalars: ``loss`` (the weighted total) and every term and
learned temperature/bias, which the loop logs as they are.

With ``train.loss.caption_weight > 0`` the objective also holds a captioning decoder
(:mod:`trainer.captioner`, built from the model's ``caption_decoder`` settings) that
cross-attends to the encoder's frames and predicts the batch's decoder targets
(``Batch.target_captions``); its mean token cross-entropy is the ``caption`` term, weighted by
``lambda_cap`` (Cacophony Eq. 3: ``L = L_con + lambda_cap * L_cap``). The decoder's weights are part
of the objective's state, so checkpoints carry them with the model; a word vocabulary is set
after the training texts are read (:meth:`Objective.use_caption_vocabulary`).

Under DDP the contrastive, frame, region and prior terms see the global batch (see
:mod:`trainer.losses`); the caption term is each rank's own token mean, averaged over ranks.
:meth:`Objective.unused_parameters` names the trainable weights no term reaches with the chosen
weights (an ablation's idle head), which DDP must be told about.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from trainer.captioner import WordVocabulary, build_decoder, caption_loss, encode_captions, tokenizer_for
from trainer.data.stream import Batch
from trainer.losses import FrameSigmoidLoss, PhraseClipLoss, PriorLoss, RegionContrastiveLoss, build_clip_loss
from trainer.model import Embeddings, FineLAP

KEEP_DTYPE = ("encoder_frames",)  # read by the decoder under the caller's autocast, not copied to float32


def _float32(e: Embeddings) -> Embeddings:
    return dataclasses.replace(
        e,
        **{
            f.name: v.float() for f in dataclasses.fields(e) if f.name not in KEEP_DTYPE and (v := getattr(e, f.name)) is not None
        },
    )


class Objective(nn.Module):
    def __init__(self, model: FineLAP, loss_params):
        super().__init__()
        p = loss_params
        self.model, self.p = model, p
        self.clip_loss = build_clip_loss(p.clip, p.init_scale, p.init_bias) if p.clip_weight > 0 else None
        self.frame_loss = FrameSigmoidLoss(p.init_scale, p.init_bias, p.frame_chunk_clips) if p.frame_weight > 0 else None
        self.phrase_clip_loss = PhraseClipLoss(p.init_scale, p.init_bias) if p.phrase_clip_weight > 0 else None
        self.prior_loss = PriorLoss() if model.per_text is not None and p.frame_weight > 0 else None
        self.region_loss = RegionContrastiveLoss(p.init_scale) if p.region_weight > 0 else None
        self.captioner = None
        if p.caption_weight > 0:
            settings = model.caption_decoder
            if settings is None:
                raise ValueError(
                    "objective: train.loss.caption_weight > 0 needs a model built with caption_decoder settings (build_model)"
                )
            self.captioner = build_decoder(settings, model.encoder.width, tokenizer_for(settings))

    def use_caption_vocabulary(self, vocabulary: WordVocabulary) -> None:
        """Decode with ``vocabulary`` (the trained words); it must be as large as the decoder's embedding."""
        if self.captioner is None:
            raise ValueError("objective: no captioning decoder (train.loss.caption_weight is 0)")
        if vocabulary.size != self.captioner.embed.num_embeddings:
            raise ValueError(
                f"objective: a vocabulary of {vocabulary.size} entries for a decoder of {self.captioner.embed.num_embeddings}; "
                "was it trained with another train.model.caption_decoder.vocabulary_words?"
            )
        self.captioner.tokenizer = vocabulary

    def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
        return self.terms(self.model(batch.wave, batch.captions, batch.phrases), batch)

    def unused_parameters(self) -> list[str]:
        """Names of trainable parameters that no loss term reaches, for DDP's ``find_unused_parameters``
        (DDP stops at the second step when a parameter it waits for gets no gradient): the clip projector without the clip loss, the frame adapter
        without frame and region losses, the frame loss's own ``t'`` and ``b'`` with per-text
        logits (FLAM), and the per-text MLPs without the frame loss. Every other parameter
        reaches the loss on every batch (a loss with nothing to score returns a zero that still
        depends on its parameters)."""
        idle: list[nn.Module] = []
        m = self.model
        if self.clip_loss is None and self.phrase_clip_loss is None and m.local is not None:
            idle.append(m.global_proj)
        if self.frame_loss is None and self.region_loss is None and m.local is not None:
            idle.append(m.local)
        if m.per_text is not None:
            idle.append(self.frame_loss if self.frame_loss is not None else m.per_text)
        ids = {id(p) for module in idle for p in module.parameters()}
        return [name for name, p in self.named_parameters() if p.requires_grad and id(p) in ids]

    def terms(self, e: Embeddings, batch: Batch, across_ranks: bool = True) -> dict[str, torch.Tensor]:
        """The loss terms (float32 scalars) for embeddings ``e`` of ``batch``; ``across_ranks``: under
        DDP, over the global batch (False: ``batch`` alone, as a held-out batch is scored).

        They are computed in float32 even under autocast: in bf16 a logit ``t * cos + b`` with
        t = 10 is off by up to 0.04 and the summed loss keeps 3 significant digits; the losses
        cost little next to the encoders. The captioning decoder is a network of its own: it runs
        under the caller's autocast, its cross-entropy in float32.
        """
        with torch.autocast(e.clip.device.type, enabled=False):
            terms = self._terms(_float32(e), batch, across_ranks)
        if self.captioner is not None:
            terms["caption"] = self.caption_term(e.encoder_frames, batch.target_captions)
            terms["loss"] = terms["loss"] + self.p.caption_weight * terms["caption"]
        return terms

    def caption_term(self, encoder_frames: torch.Tensor, targets: list[list[str]]) -> torch.Tensor:
        """The decoder's mean token cross-entropy on ``targets`` (per clip, its decoder captions) given
        the encoder's frames ``(B, L, D)``; each of a clip's k captions reads the clip's frames."""
        counts = torch.tensor([len(row) for row in targets], device=encoder_frames.device)
        if len(targets) != encoder_frames.shape[0] or int(counts.min()) < 1:
            raise ValueError("objective: the captioning loss needs at least one decoder caption per clip (Batch.target_captions)")
        tokens = encode_captions(self.captioner.tokenizer, [c for row in targets for c in row], self.captioner.max_tokens)
        features = encoder_frames.repeat_interleave(counts, dim=0)  # (sum k, L, D)
        return caption_loss(self.captioner, features, tokens)

    def _terms(self, e: Embeddings, batch: Batch, across_ranks: bool) -> dict[str, torch.Tensor]:
        terms: dict[str, torch.Tensor] = {}
        total = e.clip.new_zeros(())
        if self.clip_loss is not None:
            terms |= self.clip_loss(e.clip, e.caption, across_ranks)
            total = total + self.p.clip_weight * terms["clip"]
        if self.phrase_clip_loss is not None:
            terms |= self.phrase_clip_loss(e.clip, e.phrases, batch.labels, batch.mask, across_ranks)
            total = total + self.p.phrase_clip_weight * terms["phrase_clip"]
        if self.frame_loss is not None:
            terms |= self.frame_loss(e.frames, e.phrases, batch.labels, batch.mask, e.phrase_scale, e.phrase_bias, across_ranks)
            total = total + self.p.frame_weight * terms["frame"]
        if self.region_loss is not None:
            terms |= self.region_loss(e.frames, e.phrases, batch.labels, batch.mask, across_ranks)
            total = total + self.p.region_weight * terms["region"]
        if self.prior_loss is not None:
            terms |= self.prior_loss(batch.phrases, batch.labels, batch.mask, e.phrase_bias, batch.has_frames, across_ranks)
            total = total + self.p.prior_weight * terms["prior"]
        return {"loss": total, **terms}
