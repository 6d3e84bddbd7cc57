"""One detection threshold for every class, and the median filter it applies to, chosen on a held-out
split where they maximise macro collar F1.

Input: sed_scores_eval score DataFrames (``{clip: DataFrame(onset, offset, <class>...)}``, the
median-filtered probabilities the evaluate stage scores) and the split's ground truth
(``{clip: [(onset_s, offset_s, class)]}``). Output: :class:`Calibration`, the threshold and the
macro collar F1 at it (the collars of the reported F1, :data:`~trainer.evaluation.metrics.COLLAR`).
:func:`calibrate_checkpoint` tries each median filter of ``evaluate.f1_median_filters`` and keeps
the filter and threshold with the highest F1 (ties: the shorter filter): a longer filter joins the
fragments of one event that the collars would count as false detections.

Each class's collar statistics are piecewise constant in the threshold and change only at that
class's change-point scores, so the macro F1 of a global threshold changes only at the union of
those scores. The candidates are the midpoints between consecutive distinct values of that
union (every one of them when there are at most ``max_candidates``, else that many evenly spaced
in rank, i.e. quantiles, plus each class's own best threshold), so on a set of this project's
size the search is exact. A midpoint lies strictly inside an interval where no class's statistics
change, so ``score > t`` (sed_scores_eval) and ``score >= t`` (``sedsynth detect``) give the same
collar F1 there. Statistics and F1 are sed_scores_eval's: the collar statistics are computed
once, a part of clips at a time with each clip's score table made as it is read (so memory does
not grow with the split's deltas or tables), each class's F1 curve over its thresholds comes from
``fscore_curve_from_intermediate_statistics``, and a candidate's macro F1 is the mean of the
classes' curves read at it (the lookup ``collar_based.fscore`` does).

:func:`calibrate_checkpoint` does it for a trainer checkpoint on a split of our shards (scored
as ``sedsynth evaluate`` scores its test split) and stores the result in checkpoints;
:func:`threshold_setting` turns ``evaluate.f1_threshold`` (a number or ``checkpoint``) into the
number to use and a line saying where it came from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from trainer import checkpoint
from trainer.evaluation import metrics as M

FALLBACK_THRESHOLD = 0.5  # evaluate.f1_threshold: checkpoint, with a checkpoint that holds no calibration


@dataclass(frozen=True)
class Calibration:
    """The chosen threshold, its macro collar F1, and every candidate tried with its F1 (ascending thresholds)."""

    threshold: float
    f1: float
    candidates: np.ndarray
    candidate_f1: np.ndarray


def candidate_thresholds(stats: dict, max_candidates: int = 100_000) -> np.ndarray:
    """Midpoints ``(K,)`` between consecutive distinct change-point scores of all classes (ascending),
    one below the lowest and one above the highest; at most ``max_candidates`` of them evenly spaced
    in rank, plus each class's own best threshold."""
    from sed_scores_eval.base_modules.precision_recall import best_fscore_from_intermediate_statistics

    points = np.unique(np.concatenate([np.asarray(s, dtype=np.float64) for s, _ in stats.values()] or [np.zeros(0)]))
    points = points[np.isfinite(points)]
    if not len(points):
        return np.array([FALLBACK_THRESHOLD])
    step = max(float(np.diff(points).min()) if len(points) > 1 else 0.0, 1e-6)
    edges = np.concatenate([[points[0] - step], points, [points[-1] + step]])
    mids = (edges[:-1] + edges[1:]) / 2
    if len(mids) <= max_candidates:
        return mids
    ranked = mids[np.unique(np.round(np.linspace(0, len(mids) - 1, max_candidates)).astype(int))]
    best = [float(best_fscore_from_intermediate_statistics(class_stats)[3]) for class_stats in _each_class(stats)]
    own = [t for t in best if np.isfinite(t)]
    return np.unique(np.concatenate([ranked, own]))


def choose_threshold(scores, ground_truth: dict, max_candidates: int = 100_000) -> Calibration:
    """The global threshold with the highest macro collar F1 on ``scores`` (ties: the lowest such threshold).

    ``scores``: ``{clip: DataFrame}`` or a ``lazy_dataset`` of them
    (:func:`~trainer.evaluation.metrics.lazy_score_dataframes`); ``ground_truth`` must name every
    clip of ``scores`` (an empty list for a clip without events).
    """
    from sed_scores_eval.base_modules.precision_recall import fscore_curve_from_intermediate_statistics

    stats = M.collar_statistics(scores, ground_truth)
    candidates = candidate_thresholds(stats, max_candidates)
    total = np.zeros(len(candidates))
    for class_stats in _each_class(stats):
        f, _, _, thresholds, _ = fscore_curve_from_intermediate_statistics(class_stats)
        # f[k]: the class's F1 when the threshold lies below thresholds[k] (ascending) and not below
        # thresholds[k - 1]; the last threshold is inf, so every candidate finds its place
        total += f[np.searchsorted(thresholds, candidates, side="right")]
    f1 = total / max(len(stats), 1)
    best = int(np.argmax(f1))
    return Calibration(float(candidates[best]), float(f1[best]), candidates, f1)


def _each_class(stats: dict) -> Iterator[tuple]:
    """``stats``' per-class values one at a time, the garbage of the sed_scores_eval curve made from
    each collected before the next (:func:`~trainer.evaluation.metrics.collected`): all classes'
    curves at once would hold several copies of the statistics, and their garbage 0.8 GB at
    5,128 clips of 30 classes."""
    for class_stats in stats.values():
        with M.collected():
            yield class_stats


def calibrate_checkpoint(
    path: str | Path,
    shards: str,
    split: str,
    median_filters: Iterable[int],
    store_in: Iterable[str | Path] = (),
    device: str = "auto",
    overlap: float = 0.5,
    batch_size: int = 16,
) -> dict:
    """Score ``split`` of the shards at ``shards`` with checkpoint ``path`` (every label a class queried by
    its most used phrase: the evaluate stage's test-split scoring) and choose the median filter (one of
    ``median_filters``) and threshold; the plain-data entry is stored as ``calibration`` in each
    checkpoint of ``store_in`` (atomically) and returned: ``{threshold, valid_f1, median_filter_frames,
    tried, shards, split, classes, clips, events, step, collars}`` (``tried``: each filter's best
    threshold and F1; ``step``: the scored checkpoint's).
    """
    from trainer.evaluation.detector import Detector
    from trainer.evaluation.scoring import score_all
    from trainer.evaluation.testset import read_split

    data = read_split(shards, split)
    det = Detector.from_checkpoint(path, device=device, overlap=overlap, batch_size=batch_size)
    vocab = det.vocabulary([data.queries()[c] for c in data.classes])
    skips: list = []
    scored = score_all(det, data.audio(), lambda i: [vocab], skips, desc=f"calibrate on {split}", total=len(data.ids))
    truth = data.ground_truth()
    tried = []
    for k in sorted(set(median_filters)):  # each clip's table is made, filtered, when the statistics read it
        tables = M.lazy_score_dataframes(scored.ids, scored.timestamps_s, [p[0] for p in scored.probs], data.classes, k)
        chosen = choose_threshold(tables, {i: truth[i] for i in scored.ids})
        tried.append({"median_filter_frames": int(k), "threshold": chosen.threshold, "valid_f1": chosen.f1})
    best = max(tried, key=lambda t: t["valid_f1"])  # the first (shortest filter) among equals
    entry = {
        **best,
        "tried": tried,
        "shards": str(shards),
        "split": split,
        "classes": len(data.classes),
        "clips": len(scored.ids),
        "events": sum(len(truth[i]) for i in scored.ids),
        "step": int(checkpoint.read_entry(path, "step")),
        "collars": asdict(M.COLLAR),
    }
    for target in store_in:
        checkpoint.store_entry(target, "calibration", entry)
    return entry


def f1_median_filter(setting: int | str | None, stored: dict | None, default: int) -> int:
    """``evaluate.f1_median_filter_frames`` -> frames: a number as it is; ``checkpoint`` (or None) the
    filter stored with the threshold (``stored``: the checkpoint's calibration), else ``default``."""
    if setting is not None and not isinstance(setting, str):
        return int(setting)
    return int(stored.get("median_filter_frames", default)) if stored else int(default)


def threshold_setting(
    setting: float | str | None,
    checkpoint_path: str | Path,
    named: str = "evaluate.f1_threshold",
    warn: Callable[[str], None] = print,
) -> tuple[float, str, dict | None]:
    """``evaluate.f1_threshold`` (or ``sedsynth detect --threshold``, ``named`` in the source line) ->
    ``(threshold, where it came from, the checkpoint's calibration or None)``.

    A number is used as it is; ``checkpoint`` (or None) means the threshold stored in
    ``checkpoint_path`` (:func:`calibrate_checkpoint`), else :data:`FALLBACK_THRESHOLD`, with a
    line passed to ``warn``.
    """
    if setting is not None and not isinstance(setting, str):
        return float(setting), named, None
    stored = checkpoint.read_entry(checkpoint_path, "calibration")
    if stored is None:
        warn(
            f"warning: {checkpoint_path} holds no calibrated threshold (written before calibration, or trained without "
            f"train.data.valid); using {FALLBACK_THRESHOLD}"
        )
        return FALLBACK_THRESHOLD, f"fallback {FALLBACK_THRESHOLD}: the checkpoint holds no calibrated threshold", None
    f1 = float(stored.get("valid_f1", float("nan")))
    source = f"stored in the checkpoint: chosen on the {stored.get('split', '?')} split, macro collar F1 {f1:.4f} there"
    return float(stored["threshold"]), source, stored
