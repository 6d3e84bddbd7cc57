"""Captioning scores: BLEU-1..4, ROUGE-L and CIDEr-D of generated captions against references.

Input: one predicted caption per clip and, per clip, one or more reference captions (strings).
Output (:func:`caption_scores`): corpus figures as the COCO caption evaluation code computes them
(``pycocoevalcap`` 1.2, the code that audio-captioning benchmarks and ``aac-metrics`` use): BLEU
with the closest reference length and corpus-level brevity penalty, ROUGE-L as the mean over
clips of the F-measure (beta 1.2) of the best precision and best recall over the references, and
CIDEr-D (n-grams 1-4, tf-idf over the references of the scored set, clipped candidate counts,
a Gaussian length penalty with sigma 6, times 10) averaged over clips. CaptionStew reports
ROUGE-L for captioning.

Text is lower-cased and split into words and numbers; punctuation is dropped, which is what the
COCO code's PTB tokenizer does to plain captions, here without Java. METEOR and SPICE (hence
SPIDEr) need Java programs and, for SPICE, models fetched at first use: they are not computed.

:func:`split_captions` captions a split's clips with a detector's captioning decoder (the
objective's ``captioner``, present when the checkpoint was trained with
``train.loss.caption_weight > 0``), which cross-attends to the encoder's frames as in training.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

NOT_COMPUTED = "METEOR, SPICE and SPIDEr need Java tools (SPICE also downloaded models); not computed"
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*")


def tokens(text: str) -> list[str]:
    """Lower-case words and numbers of ``text`` (inner apostrophes kept), punctuation dropped."""
    return _WORD.findall(text.lower())


def ngrams(words: list[str], n: int = 4) -> Counter:
    """Counts of every 1..n-gram of ``words`` (tuples)."""
    return Counter(tuple(words[i : i + k]) for k in range(1, n + 1) for i in range(len(words) - k + 1))


def bleu(predictions: list[list[str]], references: list[list[list[str]]], n: int = 4) -> list[float]:
    """Corpus BLEU-1..n of tokenised predictions against their references: clipped n-gram
    matches and candidate n-grams summed over the corpus, the reference length per clip the one
    closest to the candidate's (the shorter on a tie), one brevity penalty for the corpus."""
    small, tiny = 1e-9, 1e-15
    correct, guess = [0] * n, [0] * n
    test_len = ref_len = 0
    for words, refs in zip(predictions, references):
        best: Counter = Counter()
        for r in refs:
            best |= ngrams(r, n)  # the maximum count of each n-gram over the references
        for gram, count in ngrams(words, n).items():
            correct[len(gram) - 1] += min(count, best[gram])
        for k in range(n):
            guess[k] += max(0, len(words) - k)
        test_len += len(words)
        ref_len += min((abs(len(r) - len(words)), len(r)) for r in refs)[1]
    scores, product = [], 1.0
    for k in range(n):
        product *= (correct[k] + tiny) / (guess[k] + small)
        scores.append(product ** (1 / (k + 1)))
    ratio = (test_len + tiny) / (ref_len + small)
    penalty = math.exp(1 - 1 / ratio) if ratio < 1 else 1.0
    return [s * penalty for s in scores]


def lcs_length(a: list[str], b: list[str]) -> int:
    """Length of the longest common subsequence of two token lists."""
    row = [0] * (len(b) + 1)
    for x in a:
        diagonal = 0
        for j, y in enumerate(b, start=1):
            diagonal, row[j] = row[j], diagonal + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def rouge_l(predictions: list[list[str]], references: list[list[list[str]]], beta: float = 1.2) -> float:
    """Mean over clips of ROUGE-L: the F-measure (``beta``) of the best LCS precision and the best
    LCS recall over the clip's references (0 when either is 0)."""
    values = []
    for words, refs in zip(predictions, references):
        lcs = [lcs_length(r, words) for r in refs]
        precision = max(x / len(words) if words else 0.0 for x in lcs)
        recall = max(x / len(r) if r else 0.0 for x, r in zip(lcs, refs))
        values.append((1 + beta**2) * precision * recall / (recall + beta**2 * precision) if precision and recall else 0.0)
    return float(np.mean(values))


def cider_d(predictions: list[list[str]], references: list[list[list[str]]], n: int = 4, sigma: float = 6.0) -> float:
    """Mean over clips of CIDEr-D: per n-gram order the cosine of tf-idf vectors (idf from the
    references of this set; the candidate's weights clipped at the reference's), times a Gaussian
    penalty on the difference in length (the COCO code counts bigrams as the length), averaged
    over orders and references, times 10."""
    document_frequency: Counter = Counter()
    for refs in references:
        document_frequency.update({g for r in refs for g in ngrams(r, n)})
    log_docs = math.log(len(references))

    def vector(words: list[str]) -> tuple[list[dict], list[float], int]:
        vec: list[dict] = [{} for _ in range(n)]
        counts = ngrams(words, n)
        for gram, tf in counts.items():
            vec[len(gram) - 1][gram] = tf * (log_docs - math.log(max(1.0, document_frequency[gram])))
        norms = [math.sqrt(sum(v * v for v in order.values())) for order in vec]
        return vec, norms, sum(tf for gram, tf in counts.items() if len(gram) == 2)

    scores = []
    for words, refs in zip(predictions, references):
        vec, norms, length = vector(words)
        total = np.zeros(n)
        for r in refs:
            vec_r, norms_r, length_r = vector(r)
            for k in range(n):
                value = sum(min(w, vec_r[k].get(g, 0.0)) * vec_r[k].get(g, 0.0) for g, w in vec[k].items())
                if norms[k] and norms_r[k]:
                    value /= norms[k] * norms_r[k]
                total[k] += value * math.exp(-((length - length_r) ** 2) / (2 * sigma**2))
        scores.append(10.0 * total.mean() / len(refs))
    return float(np.mean(scores))


def caption_scores(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> dict:
    """Predicted captions (one per clip) and reference captions (at least one per clip), in the
    same clip order -> ``{"bleu_1", "bleu_2", "bleu_3", "bleu_4", "rouge_l", "cider_d", "captions"}``
    (BLEU and ROUGE-L in [0, 1], CIDEr-D in [0, 10]; ``captions``: clips scored)."""
    if len(predictions) != len(references) or not predictions:
        raise ValueError(
            f"caption_scores: {len(predictions)} predictions for {len(references)} clips; need one per clip, at least one"
        )
    if any(not refs for refs in references):
        raise ValueError("caption_scores: every clip needs at least one reference caption")
    pred = [tokens(p) for p in predictions]
    refs = [[tokens(r) for r in rs] for rs in references]
    b = bleu(pred, refs)
    return {
        **{f"bleu_{k + 1}": float(v) for k, v in enumerate(b)},
        "rouge_l": rouge_l(pred, refs),
        "cider_d": cider_d(pred, refs),
        "captions": len(pred),
    }


NO_DECODER = "the checkpoint has no captioning decoder (trained with train.loss.caption_weight 0)"


def caption_decoder(det):
    """The detector's captioning decoder (a :class:`trainer.captioner.CaptionDecoder`), or None."""
    decoder = getattr(det.objective, "captioner", None)
    return decoder if decoder is not None and callable(getattr(decoder, "captions", None)) else None


@torch.no_grad()
def generate(det, decoder, frames: list[np.ndarray], batch_size: int) -> list[str]:
    """One caption per clip from its encoder frames ``(L_i, D)`` (padding masked), ``batch_size``
    clips at a time, with the decoder's own decoding (greedy, or parallel for a parallel-trained one)."""
    from trainer.evaluation.encoder_probes import padded

    out: list[str] = []
    for start in range(0, len(frames), batch_size):
        x, valid = padded(frames[start : start + batch_size])
        with det.autocast():
            out += decoder.captions(torch.from_numpy(x).to(det.device), feature_mask=torch.from_numpy(valid).to(det.device))
    return out


def split_captions(det, split, batch_size: int) -> tuple[dict, list[tuple[str, str, str]]]:
    """Caption every clip of ``split`` (a :class:`~trainer.evaluation.testset.ShardSplit`) with the
    detector's decoder -> ``(scores, rows)``: :func:`caption_scores` against each clip's caption
    plus ``{"decoding": greedy or parallel, "unreadable", "not_computed"}``, and ``(id, prediction, reference)`` per
    clip; without a decoder ``({"skipped": why}, [])``."""
    from trainer.evaluation.encoder_probes import mixture_features

    decoder = caption_decoder(det)
    if decoder is None:
        return {"skipped": NO_DECODER}, []
    ids, (frames,), unreadable = mixture_features([det], split, split.ids)
    if not ids:
        return {"skipped": "no clip of the split could be read"}, []
    predictions = generate(det, decoder, frames, batch_size)
    references = [split.captions[i] for i in ids]
    method = "parallel" if decoder.decoding == "parallel" else "greedy"  # what decoder.captions uses by default
    scores = caption_scores(predictions, [[r] for r in references]) | {
        "decoding": method,
        "unreadable": len(unreadable),
        "not_computed": NOT_COMPUTED,
    }
    return scores, list(zip(ids, predictions, references))
