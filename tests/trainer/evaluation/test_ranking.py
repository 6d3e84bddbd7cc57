"""AUROC and recall@k (by hand, with ties) as the evaluate stage and the training loop's held-out scores use them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainer.evaluation import ranking as R


def test_recall_at_by_hand_with_two_captions_and_ties():
    # 4 clips x 5 captions; clip 0 has captions 0 and 1, clips 1-3 captions 2-4
    sim = np.array(
        [
            [0.2, 0.9, 0.9, 0.1, 0.0],  # best relevant (0.9) tied with irrelevant col 2 -> rank 2
            [0.1, 0.3, 0.8, 0.5, 0.2],  # rank 1
            [0.7, 0.6, 0.1, 0.5, 0.9],  # 3 irrelevant columns above 0.5 -> rank 4
            [0.0, 0.2, 0.3, 0.4, 0.6],  # rank 1
        ]
    )
    pairs = [(0, 0), (0, 1), (1, 2), (2, 3), (3, 4)]
    r = R.retrieval(sim, np.eye(5), pairs, ks=(1, 2, 4))
    assert r["a2t_r1"] == pytest.approx(2 / 4)
    assert r["a2t_r2"] == pytest.approx(3 / 4)
    assert r["a2t_r4"] == pytest.approx(1.0)
    # captions as queries (columns): ranks 2, 1, 2, 2 (0.5 tie with clip 1), 2
    assert r["t2a_r1"] == pytest.approx(1 / 5)
    assert r["t2a_r2"] == pytest.approx(1.0)
    assert set(R.retrieval(sim, np.eye(5), pairs)) == {f"{d}_r{k}" for d in ("a2t", "t2a") for k in (1, 5, 10)}


def test_recall_at_ties_count_against_the_query():
    sim = np.array([[0.5, 0.5, 0.1], [0.3, 0.3, 0.3]])
    assert R.recall_at(sim, [{0}, {2}], ks=(1, 2, 3)) == {1: 0.0, 2: 0.5, 3: 1.0}
    assert R.recall_at(sim, [{1}, {0, 1}], ks=(1, 2)) == {1: 0.0, 2: 1.0}


def test_identity_embeddings_retrieve_perfectly_and_constant_similarity_never_at_rank_1():
    eye = np.eye(4)
    pairs = [(i, i) for i in range(4)]
    assert all(v == 1.0 for v in R.retrieval(eye, eye, pairs).values())
    const = np.ones((4, 3))  # every clip-caption similarity is 3
    r = R.retrieval(const, const, pairs)
    assert r["a2t_r1"] == 0.0 and r["t2a_r1"] == 0.0
    assert r["a2t_r5"] == 1.0  # 4 candidates: rank 4 (after the 3 tied irrelevant ones)


def test_a_query_without_relevant_candidates_is_never_found():
    sim = np.array([[0.9, 0.1, 0.2], [0.9, 0.1, 0.2]])
    # row 0 has nothing relevant: by the docstring's definition it has no relevant column
    # among its k best, whatever k
    r = R.recall_at(sim, [set(), {0}], ks=(1, 3, 5))
    assert r[1] == 0.5
    assert r[3] == 0.5
    assert r[5] == 0.5


def test_auroc_equals_pairwise_count_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(5):
        scores = rng.integers(0, 6, size=60).astype(float)  # many ties
        labels = rng.random(60) < 0.4
        pos, neg = scores[labels], scores[~labels]
        brute = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))
        assert R.auroc(scores, labels) == pytest.approx(brute, abs=1e-12)
    assert R.auroc(np.array([0.1, 0.9, 0.5]), np.array([False, True, False])) == 1.0
    assert math.isnan(R.auroc(np.array([0.1, 0.2]), np.array([True, True])))


@pytest.mark.parametrize("dtype, per_search", [(np.float32, 1 << 20), (np.float64, 1 << 20), (np.float32, 1000)])
def test_auroc_equals_the_average_rank_statistic_to_the_last_bit(dtype, per_search, monkeypatch):
    from scipy.stats import rankdata

    monkeypatch.setattr(R, "POSITIVES_PER_SEARCH", per_search)  # the positives searched in parts or at once

    rng = np.random.default_rng(1)
    for n, levels in ((1_000, 7), (200_000, 1000), (200_000, None)):  # few distinct scores, many, all distinct
        scores = (rng.integers(0, levels, n) / levels if levels else rng.random(n)).astype(dtype)
        labels = rng.random(n) < 0.3
        pos, neg = int(labels.sum()), int((~labels).sum())
        by_ranks = float((rankdata(scores)[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))
        assert R.auroc(scores, labels) == by_ranks
    assert math.isnan(R.auroc(np.array([0.1, np.nan, 0.3], dtype), np.array([True, False, False])))


def test_recall_at_1_on_crafted_matrix():
    def recall_at_1(similarity):  # each row's match is its own column, as the held-out scores count
        return R.recall_at(similarity, [{i} for i in range(len(similarity))], ks=(1,))[1]

    sim = np.array(
        [
            [0.9, 0.1, 0.2, 0.0],  # own column best: hit
            [0.8, 0.5, 0.1, 0.0],  # another column best: miss
            [0.3, 0.7, 0.7, 0.1],  # tie with another column: miss
            [0.0, 0.2, 0.1, 0.4],  # hit
        ]
    )
    assert recall_at_1(sim) == 0.5
    assert recall_at_1(np.eye(5)) == 1.0
    assert recall_at_1(np.ones((3, 3))) == 0.0


@pytest.mark.parametrize("block", [1, 3, 7])
def test_retrieval_in_blocks_equals_the_whole_matrix(block):
    """Ranked a few rows (and, transposed, columns) at a time, with ties and texts shared by
    clips, retrieval gives what the whole similarity matrix gives. Small integer embeddings make
    every product exact, so the comparison holds whatever the BLAS."""
    rng = np.random.default_rng(5)
    audio = rng.integers(-4, 5, (23, 6)).astype(np.float32)
    text = audio[rng.integers(0, 23, 17)] + rng.integers(-2, 3, (17, 6)).astype(np.float32)
    pairs = [(a, int(t)) for a in range(23) for t in rng.choice(17, rng.integers(0, 3), replace=False)]
    whole = R.retrieval(audio, text, pairs, ks=(1, 2, 5), rows_per_block=10**6)
    assert 0.0 < whole["a2t_r2"] < 1.0 and 0.0 < whole["t2a_r2"] < 1.0
    assert R.retrieval(audio, text, pairs, ks=(1, 2, 5), rows_per_block=block) == whole
    sim = audio @ text.T
    a2t = [set() for _ in range(23)]
    for a, t in pairs:
        a2t[a].add(t)
    assert R.recall_at(sim, a2t, ks=(1, 2, 5), rows_per_block=block) == {k: whole[f"a2t_r{k}"] for k in (1, 2, 5)}
