"""Held-out scores the training loop tracks each epoch (the full evaluation is its own stage).

Input: the objective and a loader over a held-out split (fixed crops and negatives). Output:
``valid_loss`` and its terms, ``frame_auroc`` (frame-phrase cosine scores of every real
phrase, positives against negatives, over all frames), and audio->caption / caption->audio
recall@1 within the split. Scores for the untrained model come from the same function at
epoch 0, so the gain is visible in ``valid_log.csv``.

Each batch is scored on its own, never gathered across DDP ranks: under DDP one rank scores
the whole split while the others wait, and its numbers are those of a single process.
"""

from __future__ import annotations

import numpy as np
import torch

from trainer.evaluation.ranking import auroc, retrieval


@torch.no_grad()
def score(objective, loader, device, autocast) -> dict[str, float]:
    """``objective`` (put back in training mode after) on every batch of ``loader``, under ``autocast``
    -> ``valid_<term>`` means, ``frame_auroc``, ``a2t_r1`` and ``t2a_r1``; ``{}`` for an empty loader."""
    objective.eval()
    sums: dict[str, float] = {}
    batches = 0
    frame_scores, frame_labels, clips, captions = [], [], [], []
    for batch in loader:
        batch = batch.to(device)
        with autocast():
            e = objective.model(batch.wave, batch.captions, batch.phrases)
            terms = objective.terms(e, batch, across_ranks=False)  # the other ranks are not scoring
        for k, v in terms.items():
            sums[k] = sums.get(k, 0.0) + float(v)
        batches += 1
        sim = torch.einsum("bld,bnd->bnl", e.frames.float(), e.phrases.float())  # (B, N, L)
        keep = batch.mask.unsqueeze(-1).expand_as(sim)
        frame_scores.append(sim[keep].cpu().numpy())
        frame_labels.append(batch.labels[keep].cpu().numpy())
        clips.append(e.clip.float().cpu().numpy())
        captions.append(e.caption.float().cpu().numpy())
    objective.train()
    if not batches:
        return {}
    out = {f"valid_{k}": v / batches for k, v in sums.items() if not k.endswith(("_t", "_b"))}
    s, y = np.concatenate(frame_scores), np.concatenate(frame_labels).astype(bool)
    out["frame_auroc"] = auroc(s, y)
    a, t = np.concatenate(clips), np.concatenate(captions)
    out |= retrieval(a, t, [(k, k) for k in range(len(a))], ks=(1,))  # a2t_r1, t2a_r1: each clip's own caption
    return out
