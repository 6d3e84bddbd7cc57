"""Held-out scores the training loop tracks each epoch (the full evaluation is its own stage).

Input: the objective and a loader over a held-out split (fixed crops and negatives). Output:
``valid_loss`` and its terms, ``frame_auroc`` (frame-phrase cosine scores of every real
phrase, positives against negatives, over all frames), and audio->caption / caption->audio
recall@1 within the split. Scores for the untrained model come from the same function at
epoch 0, so the gain is visible in ``valid_log.csv``.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import rankdata


def auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve by the rank statistic (ties get average ranks)."""
    pos = int(labels.sum())
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        return float("nan")
    ranks = rankdata(scores)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


def recall_at_1(similarity: np.ndarray) -> float:
    """Share of rows whose best column is their own index (ties count as misses)."""
    best = similarity.argmax(axis=1)
    own = similarity[np.arange(len(similarity)), np.arange(len(similarity))]
    unique_best = (similarity >= own[:, None]).sum(axis=1) == 1
    return float(((best == np.arange(len(similarity))) & unique_best).mean())


@torch.no_grad()
def score(objective, loader, device, autocast) -> dict[str, float]:
    objective.eval()
    sums: dict[str, float] = {}
    batches = 0
    frame_scores, frame_labels, clips, captions = [], [], [], []
    for batch in loader:
        batch = batch.to(device)
        with autocast():
            e = objective.model(batch.wave, batch.captions, batch.phrases)
            terms = objective.terms(e, batch)
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
    out["a2t_r1"], out["t2a_r1"] = recall_at_1(a @ t.T), recall_at_1(t @ a.T)
    return out
