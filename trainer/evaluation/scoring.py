"""One model's scores on an evaluation set, computed once, and the metrics read from them.

Input: a :class:`~trainer.evaluation.detector.Detector` and audio as ``(id, path or encoded
bytes)`` pairs with, per clip, the vocabularies to score it against. Output: :class:`Scored`
(per clip: the clip embedding ``(d,)``, frame boundaries ``(L+1,)`` s and, per vocabulary, frame
probabilities ``(L, C)``), and from it the detection (PSDS, segment AUROC, collar F1; the score
files sed_scores_eval reads), grounding (alignment, frame AUROC), retrieval and zero-shot
classification metrics. Audio that cannot be decoded becomes a :class:`~pipeline.schema.Skip`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from pipeline.audio import AudioError, decode_mono
from pipeline.schema import Skip
from trainer.evaluation import metrics as M
from trainer.evaluation.detector import ZERO_SHOT_TEMPLATE, Detector, Vocabulary
from trainer.evaluation.ranking import auroc, retrieval
from trainer.memory import release_freed_heap

F1_SCORES = "scores_f1"  # the folder of the tables collar and segment F1 read, when their median filter is not PSDS's
PACK_CHUNK_BYTES = 64 << 20  # above glibc's largest dynamic mmap threshold (32 MiB): each chunk is a mapping of its own
RELEASE_EVERY_CLIPS = 100  # score_all gives the C heap's free pages back this often (release_freed_heap)


class Packed:
    """Append-only storage for the arrays a whole set keeps: :meth:`put` copies each into the current
    chunk of ``chunk_bytes`` (a new chunk when it is full) and returns a read-only view of the copy;
    :meth:`zeros` gives a writable array there to fill in place.

    Why: a clip's scores are a few small arrays allocated between the forward pass's large
    temporaries, and every one of them kept to the end of the set splits a freed block that the
    C heap then cannot give back or reuse for the next large one. Scoring the 1,600 mixtures of the
    default's train split that way held about 1.2 GB of resident memory for 25 MB of scores, and
    it grew with the set. Copied into a few large chunks they cost their own size; a chunk's pages
    cost nothing until they are written.
    """

    ALIGN_BYTES = 64

    def __init__(self, chunk_bytes: int = PACK_CHUNK_BYTES):
        self.chunk_bytes = chunk_bytes
        self._chunk = np.empty(0, np.uint8)
        self._used = 0

    def zeros(self, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
        """A writable array of zeros inside a chunk, aligned to :attr:`ALIGN_BYTES`."""
        dtype = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if self._used + n > len(self._chunk):
            size = max(self.chunk_bytes, n)
            raw = np.empty(size + self.ALIGN_BYTES, np.uint8)
            start = -raw.ctypes.data % self.ALIGN_BYTES
            self._chunk, self._used = raw[start : start + size], 0
        out = self._chunk[self._used : self._used + n].view(dtype).reshape(shape)
        out.fill(0)
        self._used += -(-n // self.ALIGN_BYTES) * self.ALIGN_BYTES
        return out

    def put(self, a: np.ndarray) -> np.ndarray:
        """A read-only copy of ``a`` (same shape and dtype) inside a chunk."""
        a = np.asarray(a)
        out = self.zeros(a.shape, a.dtype)
        out[...] = a
        out.flags.writeable = False
        return out


@dataclass
class Scored:
    """One model's scores on one set, in clip order (skipped clips left out)."""

    ids: list[str] = field(default_factory=list)
    clips: list[np.ndarray] = field(default_factory=list)
    timestamps_s: list[np.ndarray] = field(default_factory=list)
    probs: list[list[np.ndarray]] = field(default_factory=list)
    waves: dict[str, np.ndarray] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def clip_matrix(self) -> np.ndarray:
        return np.stack(self.clips) if self.clips else np.zeros((0, 0), np.float32)


def subset(v: Vocabulary, rows: list[int]) -> Vocabulary:
    """The entries ``rows`` of ``v``, in that order (a clip's own phrases out of every phrase of a set)."""
    index = torch.tensor(rows, dtype=torch.long, device=v.embeddings.device)
    return Vocabulary(tuple(v.texts[i] for i in rows), v.embeddings[index], v.scale[index], v.bias[index])


def score_all(
    det: Detector,
    audio: Iterable[tuple[str, str | bytes]],
    vocabs: Callable[[str], list[Vocabulary]],
    skips: list[Skip],
    keep_waves: int = 0,
    desc: str = "score",
    total: int | None = None,
) -> Scored:
    """Decode and score each ``(id, path or bytes)``; unreadable audio becomes a :class:`Skip` in
    ``skips`` with one line on stderr (none for a skip already there: a second model scoring the
    same set). The scores kept are read-only views into a :class:`Packed` store.

    Every :data:`RELEASE_EVERY_CLIPS` clips the C heap's free pages go back to the system
    (:func:`release_freed_heap`, which also merges glibc's small free blocks). Without it, scoring
    the 12,821 mixtures of the FSD50K-size test split left the heap growing by about 1.5 MiB a
    clip, nearly all of it free (9 GiB resident after 6,000 clips, 0.2 GiB of it in use); with it
    the process stays near 1.2 GiB at the same speed (0.1-0.2 ms a clip)."""
    from tqdm.auto import tqdm

    out, kept = Scored(), Packed()
    order: list[str] = []

    def waves() -> Iterator[np.ndarray]:
        for i, src in audio:
            try:
                w = decode_mono(src, det.sample_rate_hz)
            except AudioError as e:
                skip = Skip(i, src if isinstance(src, str) else "", e.reason, e.detail)
                if skip not in skips:  # one line for a clip, however many models score it
                    print(f"evaluate: skipping {i}: {e.reason}: {e.detail}", file=sys.stderr)
                    skips.append(skip)
                continue
            order.append(i)
            if len(out.waves) < keep_waves:
                out.waves[i] = w
            yield w

    def per_clip() -> Iterator[list[Vocabulary]]:
        k = 0
        while True:
            yield vocabs(order[k])
            k += 1

    start = time.perf_counter()
    for k, s in enumerate(
        tqdm(det.score(waves(), per_clip()), desc=desc, unit="clip", total=total, mininterval=5.0, leave=False)
    ):
        out.ids.append(order[k])
        out.clips.append(kept.put(s.clip))
        out.timestamps_s.append(kept.put(s.timestamps_s))
        out.probs.append([kept.put(p) for p in s.probs])
        if (k + 1) % RELEASE_EVERY_CLIPS == 0:
            release_freed_heap()
    out.seconds = time.perf_counter() - start
    return out


@torch.no_grad()
def text_matrix(det: Detector, texts: list[str], batch: int = 256) -> np.ndarray:
    """Unit text embeddings ``(len(texts), d)``, ``batch`` texts per forward pass, the C heap's free
    pages given back after each (:func:`release_freed_heap`): without it, the text tower's freed
    buffers stayed resident, 275 MB over 2,849 captions and about 1 GB over the 12,821 of the
    FSD50K-size test split."""
    rows = []
    for i in range(0, len(texts), batch):
        rows.append(det.vocabulary(texts[i : i + batch]).embeddings.cpu().numpy())
        release_freed_heap()
    return np.concatenate(rows) if rows else np.zeros((0, 0), np.float32)


def detection(
    scored: Scored,
    column: int,
    ground_truth: dict,
    durations_s: dict,
    classes,
    e,
    timer: M.Timer,
    *,
    folder: Path | None,
    model: str,
    threshold_source: str = "evaluate.f1_threshold",
) -> dict:
    """SED metrics of vocabulary ``column`` of ``scored`` (:func:`metrics.sed_metrics`, collar F1 at
    ``e.f1_threshold``, a number, after a median filter of ``e.f1_median_filter_frames``) and their
    ``protocol`` (:func:`metrics.protocol`); writes the score files under ``folder``:
    ``scores/<model>/`` (``e.median_filter_frames``, the filter PSDS and AUROC see) and, when F1's
    filter is another, ``scores_f1/<model>/`` (the tables collar and segment F1 were computed on;
    the protocol's ``files`` names the folder of each metric), and the per-class CSV. A class that cannot be a TSV cell
    (:func:`metrics.tsv_cell`) raises ValueError before any file is written."""
    from sed_scores_eval.base_modules.io import write_sed_scores

    if folder is not None:
        for c in classes:  # the score files' header: checked before anything is computed or written
            M.tsv_cell(c, "class")
    ids = scored.ids
    probs = [p[column] for p in scored.probs]
    # each metric makes a clip's filtered table when it reads it: a whole split's at once is about
    # 32 KB a ten-second clip, 0.4 GB per filter at 12,821 clips
    tables = M.lazy_score_dataframes(ids, scored.timestamps_s, probs, classes, e.median_filter_frames)
    truth = {i: ground_truth[i] for i in ids}
    durations = {i: min(durations_s[i], float(t[-1])) for i, t in zip(ids, scored.timestamps_s)}
    f1_tables = None
    if e.f1_median_filter_frames != e.median_filter_frames:
        f1_tables = M.lazy_score_dataframes(ids, scored.timestamps_s, probs, classes, e.f1_median_filter_frames)
    result = M.sed_metrics(
        tables,
        truth,
        durations,
        classes,
        timer,
        segment_s=e.segment_s,
        max_fpr=e.max_fpr,
        threshold=e.f1_threshold,
        f1_scores=f1_tables,
    )
    # a clip's first frame is a whole hop unless the clip is shorter than one
    hop_s = max((float(t[1] - t[0]) for t in scored.timestamps_s), default=float("nan"))
    result["protocol"] = M.protocol(
        classes,
        len(ids),
        sum(len(v) for v in truth.values()),
        frame_hop_s=hop_s,
        median_filter_frames=e.median_filter_frames,
        segment_s=e.segment_s,
        max_fpr=e.max_fpr,
        threshold=e.f1_threshold,
        threshold_source=threshold_source,
        f1_median_filter_frames=e.f1_median_filter_frames,
        f1_scores="scores" if f1_tables is None else F1_SCORES,
    )
    if folder is not None:
        with timer("write_scores", library=True):  # the library's own loop over a dict of tables, one file a clip
            for name, written in (("scores", tables), (F1_SCORES, f1_tables)):
                if written is None:  # F1's filter is PSDS's: its tables are those of scores/
                    continue
                (folder / name / model).mkdir(parents=True, exist_ok=True)
                for i in ids:
                    write_sed_scores(written[i], folder / name / model / f"{i}.tsv")
        with timer("write_tables"):
            result["per_class"].to_csv(folder / f"per_class_{model}.csv", index=False, float_format="%.6g")
    return result


def grounding(scored: Scored, column: int, phrases: Callable[[str], list[tuple[str, list]]], timer: M.Timer) -> dict:
    """Alignment (FLAM's Spearman) and frame AUROC of each clip's own phrases (FLAM: only the
    events present in the clip)."""
    with timer("alignment"):
        # every (clip, phrase) pair's frames in two flat arrays, filled in place: 4.6 million frames
        # at the FSD50K-size test split, where a list of per-pair arrays and its concatenation
        # held them twice over, with an object per pair
        n = sum(p[column].shape[0] * p[column].shape[1] for p in scored.probs)
        scores, labels = np.empty(n, np.float32), np.empty(n, bool)
        values, at = [], 0
        for i, t, p in zip(scored.ids, scored.timestamps_s, scored.probs):
            for q, (_, segments) in enumerate(phrases(i)):
                end = at + p[column].shape[0]
                scores[at:end], labels[at:end] = p[column][:, q], M.labels_on_grid(segments, t)
                values.append(M.spearman(scores[at:end], labels[at:end]))
                at = end
        scores, labels = scores[:at], labels[:at]
        aligned = M.mean_defined(values)
        frame_auc = auroc(scores, labels) if at else float("nan")
    return {"alignment": aligned, "frame_auroc": frame_auc}


def retrieval_metrics(det: Detector, scored: Scored, captions: dict[str, Iterable[str]], timer: M.Timer) -> dict:
    """R@1/5/10 both ways between the scored clips and every caption of them (``captions``: clip -> its captions)."""
    texts = sorted({c for i in scored.ids for c in captions[i]})
    where = {t: k for k, t in enumerate(texts)}
    pairs = [(a, where[c]) for a, i in enumerate(scored.ids) for c in captions[i]]
    with timer("model_scoring_text"):  # a model forward pass, like the audio scoring
        t = text_matrix(det, texts)
    with timer("retrieval"):
        return retrieval(scored.clip_matrix, t, pairs)


def zero_shot_classes(labels: dict[str, str], queries: dict[str, str]) -> tuple[list[str], list[str]]:
    """The classes of the scored clips (``labels``: clip -> class), sorted, and each one's query
    (``queries``: class -> its text, else the class name in lower case)."""
    classes = sorted(set(labels.values()))
    return classes, [queries.get(c, c.replace("_", " ").lower()) for c in classes]


def frame_classification_metrics(scored: Scored, column: int, labels: dict[str, str], classes: list[str], timer: M.Timer) -> dict:
    """Zero-shot accuracy through the frame head: each clip takes the class whose frame probability
    (vocabulary ``column`` of ``scored``, one entry per class of ``classes``) peaks highest."""
    with timer("classification"):
        peaks = np.stack([p[column].max(axis=0) for p in scored.probs]) if scored.ids else np.zeros((0, len(classes)))
        y = np.array([classes.index(labels[i]) for i in scored.ids])
        return {"accuracy": float((peaks.argmax(axis=1) == y).mean()) if len(y) else float("nan")}


def classification_metrics(
    det: Detector, scored: Scored, labels: dict[str, str], queries: dict[str, str], timer: M.Timer
) -> dict:
    """Zero-shot accuracy: each clip against "The sound of {query}" for every class of the scored clips
    (``labels``: clip -> class; ``queries``: class -> its text, else the class name)."""
    classes, texts = zero_shot_classes({i: labels[i] for i in scored.ids}, queries)
    with timer("model_scoring_text"):  # a model forward pass, like the audio scoring
        t = text_matrix(det, [ZERO_SHOT_TEMPLATE.format(q) for q in texts])
    with timer("classification"):
        y = np.array([classes.index(labels[i]) for i in scored.ids])
        return M.classification(scored.clip_matrix, t, y)
