"""Metrics read from rankings: AUROC, and retrieval recall@k both ways.

Inputs: scores ``(n,)`` with bool labels ``(n,)`` (AUROC); a similarity matrix ``(queries,
candidates)`` with each query's relevant candidates (recall@k), or audio and text embeddings
with their matching pairs (retrieval). Outputs: floats, NaN where a metric is undefined.
Shared by the training loop's held-out scores (:mod:`trainer.heldout`) and the evaluate stage.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata


def auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve of ``scores (n,)`` against bool ``labels (n,)``, by the rank
    statistic (ties get average ranks); NaN without both classes."""
    pos = int(labels.sum())
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        return float("nan")
    ranks = rankdata(scores)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


def recall_at(similarity: np.ndarray, relevant: list[set[int]], ks=(1, 5, 10)) -> dict[int, float]:
    """Rows are queries, columns candidates; ``relevant[i]`` the columns that count for row ``i``.

    R@k: share of rows with a relevant column among their k best. Ties are broken against the
    query (a relevant column tied with an irrelevant one ranks after it), so constant scores
    give chance level or less, never a perfect score.
    """
    n = similarity.shape[0]
    out = {}
    best_relevant = np.array([similarity[i, sorted(r)].max() if r else -np.inf for i, r in enumerate(relevant)])
    mask = np.zeros_like(similarity, dtype=bool)
    for i, r in enumerate(relevant):
        mask[i, sorted(r)] = True
    # rank of the best relevant column = irrelevant columns scoring at least as high, plus one
    rank = ((similarity >= best_relevant[:, None]) & ~mask).sum(axis=1) + 1
    rank = np.where([bool(r) for r in relevant], rank, np.inf)  # nothing relevant: never found
    for k in ks:
        out[k] = float((rank <= k).mean()) if n else float("nan")
    return out


def retrieval(audio: np.ndarray, text: np.ndarray, pairs: list[tuple[int, int]], ks=(1, 5, 10)) -> dict[str, float]:
    """Audio embeddings ``(A, d)``, text embeddings ``(T, d)`` and the matching ``(audio, text)``
    index pairs -> ``a2t_r{k}`` (a clip finds any of its captions among all texts) and
    ``t2a_r{k}`` (a caption finds any clip it describes)."""
    a2t_rel: list[set[int]] = [set() for _ in range(len(audio))]
    t2a_rel: list[set[int]] = [set() for _ in range(len(text))]
    for a, t in pairs:
        a2t_rel[a].add(t)
        t2a_rel[t].add(a)
    sim = audio @ text.T
    a2t, t2a = recall_at(sim, a2t_rel, ks), recall_at(sim.T, t2a_rel, ks)
    return {**{f"a2t_r{k}": v for k, v in a2t.items()}, **{f"t2a_r{k}": v for k, v in t2a.items()}}
