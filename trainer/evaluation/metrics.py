"""Detection, alignment and classification metrics on scores computed once, and the protocol they follow.

Inputs: per-clip frame probabilities ``(L, C)`` with frame boundaries ``(L+1,)`` seconds,
ground-truth events ``{clip: [(onset_s, offset_s, class)]}`` and clip durations; similarity
matrices for classification. Outputs: plain dicts of floats and per-class tables. Retrieval
recall@k and AUROC, which the training loop's held-out scores share, are in
:mod:`trainer.evaluation.ranking`.

Detection metrics are sed_scores_eval's (no re-implementation), after a median filter of 3
frames: PSDS1 (dtc = gtc = 0.7, alpha_ct 0, max_efpr 100 per hour) twice, ``psds1`` with the
stability penalty alpha_st 1 (DESED, DCASE) and ``psds1_astat0`` without it (alpha_st 0, as
FineLAP reports AudioSet-Strong; read from the same per-class PSD-ROCs, no second pass), and
PSDS2 (dtc = gtc = 0.1, cttc 0.3, alpha_ct 0.5, alpha_st 1); segment AUROC and pAUROC (1 s
segments, max_fpr 0.1, normalised by max_fpr as sed_scores_eval does) from one pass of segment
statistics, the area tie-correct and independent of numpy's sort kernels (:func:`roc_area`); collar F1 at one global threshold (200 ms onset collar, offset collar the larger of
200 ms and 20% of the event; the threshold is chosen on the valid split, see
:mod:`trainer.evaluation.calibration`). :func:`protocol` writes all of that down beside the
numbers. :func:`confusion` tabulates, class by class, how strongly every query fires on each
class's ground-truth events. :class:`Timer` splits the wall time between sed_scores_eval's own
calls and the rest. :func:`tsv_cell` is the check every TSV writer of the evaluation passes its
cells through (score files, detections): no tab, line break or other control character.
"""

from __future__ import annotations

import gc
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.ndimage import median_filter
from scipy.stats import rankdata

from pipeline.schema import text_problem
from pipeline.shards.rows import shown
from trainer.data.labels import frame_labels
from trainer.memory import release_freed_heap

# sed_scores_eval imports dcase_util, which imports the deprecated pkg_resources
warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)


@dataclass(frozen=True)
class PsdsSettings:
    dtc: float
    gtc: float
    cttc: float | None
    alpha_ct: float
    alpha_st: float
    max_efpr: float = 100.0


PSDS1 = PsdsSettings(dtc=0.7, gtc=0.7, cttc=None, alpha_ct=0.0, alpha_st=1.0)
PSDS1_ASTAT0 = PsdsSettings(dtc=0.7, gtc=0.7, cttc=None, alpha_ct=0.0, alpha_st=0.0)  # FineLAP's AudioSet-Strong PSDS1
PSDS2 = PsdsSettings(dtc=0.1, gtc=0.1, cttc=0.3, alpha_ct=0.5, alpha_st=1.0)
PSDS = {"psds1": PSDS1, "psds1_astat0": PSDS1_ASTAT0, "psds2": PSDS2}  # metric key -> its settings
PSDS_UNIT_OF_TIME = "hour"  # max_efpr is false positives per hour


@dataclass(frozen=True)
class CollarSettings:
    """Collar F1: onset within ``onset_collar_s``; offset within max(``offset_collar_s``, rate x event length)."""

    onset_collar_s: float
    offset_collar_s: float
    offset_collar_rate: float


COLLAR = CollarSettings(onset_collar_s=0.2, offset_collar_s=0.2, offset_collar_rate=0.2)


@dataclass
class Timer:
    """Wall seconds per named step; ``library`` marks time spent inside sed_scores_eval."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    library_s: float = 0.0

    @contextmanager
    def __call__(self, name: str, library: bool = False):
        start = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - start
            self.seconds[name] += took
            if library:
                self.library_s += took

    def summary(self, outside_metrics: tuple[str, ...] = ("model_scoring", "read_")) -> dict[str, float]:
        """Seconds per step, the total, and the share of the metric work (steps not named in
        ``outside_metrics``) spent outside sed_scores_eval's own calls."""
        total = sum(self.seconds.values())
        metric = sum(v for k, v in self.seconds.items() if not k.startswith(outside_metrics))
        return {
            **{f"{k}_s": round(v, 4) for k, v in self.seconds.items()},
            "total_s": round(total, 4),
            "metrics_s": round(metric, 4),
            "sed_scores_eval_s": round(self.library_s, 4),
            "outside_sed_scores_eval_share": round((metric - self.library_s) / metric, 4) if metric else 0.0,
        }


def smooth(probs: np.ndarray, frames: int) -> np.ndarray:
    """Median filter of ``frames`` frames along time, each class on its own ``(L, C) -> (L, C)``."""
    if frames <= 1:
        return probs
    return median_filter(probs, size=(frames, 1), mode="nearest")


def score_dataframes(ids, timestamps_s, probs, classes) -> dict[str, pd.DataFrame]:
    """Per-clip arrays -> sed_scores_eval score DataFrames (``onset``, ``offset``, one column per class)."""
    return {i: _score_dataframe(t, p, list(classes)) for i, t, p in zip(ids, timestamps_s, probs)}


def lazy_score_dataframes(ids, timestamps_s, probs, classes, frames: int = 1):
    """:func:`score_dataframes` of the probabilities median-filtered over ``frames`` (:func:`smooth`),
    as a ``lazy_dataset`` keyed by clip that makes a clip's table each time it is read, so a whole
    split's tables are never held at once; sed_scores_eval takes it wherever it takes the dict."""
    import lazy_dataset

    classes = list(classes)
    rows = {i: (t, p) for i, t, p in zip(ids, timestamps_s, probs)}
    return lazy_dataset.new(rows).map(lambda row: _score_dataframe(row[0], smooth(row[1], frames), classes))


def tsv_cell(text: str, what: str = "a TSV cell") -> str:
    """``text`` as it is when it can be a cell (or a header) of a TSV file, which DCASE's and
    sed_scores_eval's readers split into lines and tabs; raises ValueError naming ``what`` when it
    holds a tab, CR, LF, NEL, U+2028, U+2029 or another control character
    (:func:`~pipeline.schema.text_problem`): written, it would forge rows or columns. The
    readers refuse such labels and ids first (``bad-label``), so here it is the last guard."""
    problem = text_problem(text)
    if problem is not None:
        raise ValueError(f"{what} {shown(text)} {problem}: it cannot be written into a TSV file")
    return text


def _score_dataframe(timestamps_s, probs, classes: list) -> pd.DataFrame:
    from sed_scores_eval.base_modules.scores import create_score_dataframe

    return create_score_dataframe(np.asarray(probs, dtype=np.float64), np.asarray(timestamps_s, dtype=np.float64), classes)


def sed_metrics(
    scores,
    ground_truth: dict,
    durations_s: dict,
    classes,
    timer: Timer,
    *,
    segment_s: float = 1.0,
    max_fpr: float = 0.1,
    threshold: float = 0.5,
    f1_scores: dict | None = None,
) -> dict:
    """All detection metrics for one score set (collar F1 at ``threshold``, on ``f1_scores`` when
    given: the same scores after collar F1's own median filter). ``scores`` and ``f1_scores``:
    ``{clip: DataFrame}`` or a ``lazy_dataset`` of them (:func:`lazy_score_dataframes`).

    Returns ``{"psds1", "psds1_astat0", "psds2", "auroc", "pauroc", "f1", "precision", "recall",
    "f1_micro", "segment_f1" (micro over ``segment_s`` segments at ``threshold``), "segment_f1_macro":
    float, "per_class": DataFrame, "psd_1_roc": (etpr, efpr), "psd_2_roc": ...,
    "psd_1_class_mean", "psd_2_class_mean", "roc": (tpr, fpr) macro average over classes}``.
    """
    from sed_scores_eval import segment_based
    from sed_scores_eval.base_modules.roc import roc_curve_from_intermediate_statistics
    from sed_scores_eval.intersection_based.psds import (
        multi_class_psd_roc_from_single_class_psd_rocs,
        psds_from_psd_roc,
    )
    from sed_scores_eval.segment_based.intermediate_statistics import (
        accumulated_intermediate_statistics,
    )

    out: dict = {}
    per_class = pd.DataFrame(index=pd.Index(list(classes), name="class"))
    for name, s in (("psds1", PSDS1), ("psds2", PSDS2)):
        with timer(name, library=True), collected():
            value, single, roc, class_rocs = psds(scores, ground_truth, durations_s, s)
        out[name] = float(value)
        per_class[name] = pd.Series({k: float(v) for k, v in single.items()})
        out[f"psd_{name.removeprefix('psds')}_roc"] = roc
        with timer("roc_average"):
            out[f"psd_{name.removeprefix('psds')}_class_mean"] = mean_psd_roc(class_rocs, s.max_efpr)
        if name == "psds1":  # alpha_st only weighs the per-class PSD-ROCs, which do not depend on it
            with timer("psds1", library=True), collected():
                a = PSDS1_ASTAT0
                etpr, efpr = multi_class_psd_roc_from_single_class_psd_rocs(class_rocs, alpha_st=a.alpha_st, max_efpr=a.max_efpr)
                out["psds1_astat0"] = float(psds_from_psd_roc(etpr, efpr, a.max_efpr))
    with timer("segment_auroc", library=True):
        segments = segment_statistics(scores, ground_truth, durations_s, segment_s)
        stats, _ = accumulated_intermediate_statistics(None, ground_truth, durations_s, deltas=segments)
        auc, pauc = roc_areas(stats), roc_areas(stats, max_fpr=max_fpr)
        with collected():
            curves = roc_curve_from_intermediate_statistics(stats)
        del stats  # the split's segment statistics: a few hundred MB at 12,821 clips, not kept under collar F1
    out["auroc"], out["pauroc"] = float(auc["mean"]), float(pauc["mean"])
    per_class["auroc"] = pd.Series({k: float(v) for k, v in auc.items() if k != "mean"})
    per_class["pauroc"] = pd.Series({k: float(v) for k, v in pauc.items() if k != "mean"})
    with timer("roc_average"):
        out["roc"] = macro_roc(curves, classes)
    del curves

    def segment_f1(deltas) -> None:  # the frame probe's figure, for the head: 1 s segments at the same threshold
        sf, _, _, _ = segment_based.fscore(None, ground_truth, durations_s, threshold, deltas=deltas, segment_length=segment_s)
        out["segment_f1"], out["segment_f1_macro"] = float(sf["micro_average"]), float(sf["macro_average"])

    if f1_scores is None:  # the same segments: scored now, so they are not kept under collar F1
        with timer("segment_f1", library=True):
            segment_f1(segments)
    del segments
    with timer("collar_f1", library=True):
        f, p, r, _ = collar_fscore(scores if f1_scores is None else f1_scores, ground_truth, threshold)
    out["f1"], out["precision"], out["recall"] = float(f["macro_average"]), float(p["macro_average"]), float(r["macro_average"])
    out["f1_micro"] = float(f["micro_average"])
    if f1_scores is not None:
        with timer("segment_f1", library=True):
            segment_f1(segment_statistics(f1_scores, ground_truth, durations_s, segment_s))
    for key, d in (("f1", f), ("precision", p), ("recall", r)):
        per_class[key] = pd.Series({k: float(v) for k, v in d.items() if not k.endswith("_average")})
    per_class.insert(0, "events", pd.Series(event_counts(ground_truth)).reindex(per_class.index).fillna(0).astype(int))
    out["per_class"] = per_class.reset_index()
    return out


def roc_area(class_stats: tuple, max_fpr: float | None = None) -> float:
    """Area under one class's ROC curve from sed_scores_eval's accumulated segment statistics
    (``(change-point scores (K,) ascending, {tps, fps, tns, n_ref})``), ties counted one half: the
    Mann-Whitney AUC, ``sklearn.metrics.roc_auc_score`` of the segments' labels and scores. With
    ``max_fpr``, the area up to that false-positive rate divided by it (sed_scores_eval's pAUROC,
    no McClish correction; sklearn's partial area before its correction, the curve read linearly
    between the operating points on either side of ``max_fpr``).

    The operating points are taken in threshold order, strictest first, where both rates only grow,
    and joined by straight lines (the trapezoid rule): a threshold step that passes positive and
    negative segments of one score at once is a diagonal, half its box. Nothing is sorted, so the
    value does not depend on numpy's sort kernels. sed_scores_eval's ``auroc_from_intermediate_statistics``
    draws a staircase after an unstable ``argsort`` of the false-positive rates: where rates tie, the
    height it keeps depends on the kernel (``NPY_ENABLE_CPU_FEATURES``), and a tied step counts 0 or
    1; without ties between positive and negative segments the two areas are the same.
    """
    _, stats = class_stats
    tpr = np.asarray(stats["tps"], dtype=np.float64)[::-1] / stats["n_ref"]
    fps = np.asarray(stats["fps"], dtype=np.float64)[::-1]
    with np.errstate(invalid="ignore", divide="ignore"):
        fpr = fps / (np.asarray(stats["tns"], dtype=np.float64)[::-1] + fps)
    if not (np.isfinite(fpr).all() and np.isfinite(tpr).all()):  # no negative or no positive segment: no curve
        return float("nan")
    if max_fpr is not None:
        stop = int(np.searchsorted(fpr, max_fpr, side="right"))
        if stop < len(fpr):  # the line between the last point within max_fpr and the next one, read at max_fpr
            edge = np.interp(max_fpr, fpr[stop - 1 : stop + 1], tpr[stop - 1 : stop + 1]) if stop else tpr[0]
            tpr, fpr = np.append(tpr[:stop], edge), np.append(fpr[:stop], max_fpr)
    area = float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))
    return area if max_fpr is None else area / max_fpr


def roc_areas(stats: dict, max_fpr: float | None = None) -> dict:
    """:func:`roc_area` of every class of ``stats`` (``{class: (scores, statistics)}``) and their
    ``mean``, the dict sed_scores_eval's ``auroc_from_intermediate_statistics`` returns."""
    areas = {c: roc_area(s, max_fpr) for c, s in stats.items()}
    areas["mean"] = float(np.mean(list(areas.values()))) if areas else float("nan")
    return areas


@contextmanager
def collected():
    """Around a sed_scores_eval call that makes curves: what exists before it is frozen, and the
    call's garbage is collected after it (only what the call made is scanned: a few ms); then the
    C heap's free pages go back to the system (:func:`release_freed_heap`).

    The library sorts each curve (``curves.xsort``) through a recursive inner function, a
    reference cycle that keeps a Python int per change point (40 bytes) alive until the cyclic
    collector runs, which in a process of this size it rarely does: hundreds of MB over a
    split's curves. What a call frees stays in glibc's heap for its next small allocations
    otherwise: PSDS2 on the 5,128 clips of the FSD50K-size valid split left 350 MB of it free.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.collect()
        gc.unfreeze()
        release_freed_heap()


CLIPS_PER_PART = 256  # statistic deltas are computed this many clips at a time (:func:`summed_deltas`)
ALL_CLIPS = "all clips"  # the one key of summed deltas handed to sed_scores_eval


def psds(
    scores: dict[str, pd.DataFrame],
    ground_truth: dict,
    durations_s: dict,
    s: PsdsSettings,
    *,
    clips_per_part: int = CLIPS_PER_PART,
) -> tuple:
    """sed_scores_eval's intersection-based PSDS (``intersection_based.psds``, same return value:
    ``(psds, {class: psds}, (etpr, efpr), {class: (tpr, efpr, scores)})``, equal to the last bit)
    in a small part of the library's memory: one part of clips at a time, and only the change
    points a PSD-ROC can still use.

    The library gathers every clip's statistic deltas (per class: one column for true
    positives, one for false positives and, with a cross-trigger criterion, one per other
    class) before it sums them, which at 10,000 clips of 20 classes is several GiB. Here they
    come from :func:`summed_deltas`. Deltas at scores so low that the false positives counted
    so far already put every lower threshold past ``max_efpr`` are dropped as they come: each
    clip's counts are non-negative at every threshold, so those thresholds stay past it, and the
    library cuts them from every PSD-ROC. The summed deltas then go through the library's own
    accumulation, PSD-ROCs and areas.
    """
    from sed_scores_eval.base_modules.io import parse_audio_durations, parse_inputs
    from sed_scores_eval.intersection_based import intermediate_statistics as intersection
    from sed_scores_eval.intersection_based.psds import (
        _single_class_roc_from_intermediate_statistics,
        multi_class_psd_roc_from_single_class_psd_rocs,
        psds_from_psd_roc,
        seconds_per_unit_of_time,
    )

    scores, ground_truth, ids = parse_inputs(scores, ground_truth)
    total_s = sum(parse_audio_durations(durations_s, audio_ids=ids).values())
    unit_s = seconds_per_unit_of_time[PSDS_UNIT_OF_TIME]

    def past_max_efpr(cps: np.ndarray, deltas: np.ndarray, keys: list[str]) -> int:
        # false positives at each threshold so far (a threshold counts every change point at or
        # above it), as a rate the way the library computes it; a cross-trigger rate only adds to it
        false = np.cumsum(deltas[::-1, keys.index("fps")])[::-1]
        past = (false / total_s) * unit_s > s.max_efpr
        return len(past) if past.all() else int(np.argmin(past))  # the run of thresholds past it from the bottom

    criteria = {"dtc_threshold": s.dtc, "gtc_threshold": s.gtc, "cttc_threshold": s.cttc, "time_decimals": 6}
    summed = summed_deltas(
        scores, ground_truth, ids, intersection, criteria, drop_low=past_max_efpr, clips_per_part=clips_per_part
    )
    stats = intersection.accumulated_intermediate_statistics_from_deltas({ALL_CLIPS: summed}, ground_truth)
    single = _single_class_roc_from_intermediate_statistics(
        stats, dataset_duration=total_s, alpha_ct=s.alpha_ct, unit_of_time=PSDS_UNIT_OF_TIME, max_efpr=s.max_efpr
    )
    etpr, efpr = multi_class_psd_roc_from_single_class_psd_rocs(single, alpha_st=s.alpha_st, max_efpr=s.max_efpr)
    per_class = {c: psds_from_psd_roc(tpr, e, s.max_efpr) for c, (tpr, e, _) in single.items()}
    return psds_from_psd_roc(etpr, efpr, s.max_efpr), per_class, (etpr, efpr), single


def collar_fscore(
    scores: dict[str, pd.DataFrame],
    ground_truth: dict,
    threshold: float,
    c: CollarSettings = COLLAR,
    *,
    clips_per_part: int = CLIPS_PER_PART,
) -> tuple:
    """sed_scores_eval's ``collar_based.fscore`` at ``threshold`` (same return value ``(f, p, r,
    stats)``), from :func:`summed_deltas` without the change points at or below ``threshold``:
    the library reads the statistics of the first change point above it, which only points at
    or above that one make."""
    from sed_scores_eval.base_modules.io import parse_inputs
    from sed_scores_eval.base_modules.precision_recall import single_fscore_from_intermediate_statistics
    from sed_scores_eval.collar_based import intermediate_statistics as collar

    scores, ground_truth, ids = parse_inputs(scores, ground_truth)
    summed = summed_deltas(
        scores,
        ground_truth,
        ids,
        collar,
        collar_criteria(c),
        clips_per_part=clips_per_part,
        drop_low=lambda cps, deltas, keys: int(np.searchsorted(cps, threshold, side="right")),
    )
    stats = collar.accumulated_intermediate_statistics_from_deltas({ALL_CLIPS: summed}, ground_truth)
    return single_fscore_from_intermediate_statistics(stats, threshold=threshold)


def collar_statistics(scores, ground_truth: dict, c: CollarSettings = COLLAR, *, clips_per_part: int = CLIPS_PER_PART) -> dict:
    """sed_scores_eval's accumulated collar statistics over every threshold (what
    ``collar_based.accumulated_intermediate_statistics`` returns: ``{class: (change-point scores,
    {tps, fps, n_ref})}``, equal to the last bit), from :func:`summed_deltas`: the library would
    first gather every clip's deltas, which grows with the split. ``scores``: a dict of score
    DataFrames or a ``lazy_dataset`` of them (each table made when it is read)."""
    from sed_scores_eval.base_modules.io import parse_inputs
    from sed_scores_eval.collar_based import intermediate_statistics as collar

    scores, ground_truth, ids = parse_inputs(scores, ground_truth)
    summed = summed_deltas(scores, ground_truth, ids, collar, collar_criteria(c), clips_per_part=clips_per_part)
    return collar.accumulated_intermediate_statistics_from_deltas({ALL_CLIPS: summed}, ground_truth)


def collar_criteria(c: CollarSettings) -> dict:
    """The keyword arguments of sed_scores_eval's collar-based statistics for collars ``c``."""
    return {
        "onset_collar": c.onset_collar_s,
        "offset_collar": c.offset_collar_s,
        "offset_collar_rate": c.offset_collar_rate,
        "return_onset_offset_dist_sum": False,
        "time_decimals": 6,
    }


def segment_statistics(
    scores: dict[str, pd.DataFrame],
    ground_truth: dict,
    durations_s: dict,
    segment_s: float,
    *,
    clips_per_part: int = CLIPS_PER_PART,
) -> dict:
    """sed_scores_eval's segment-based statistics deltas over the split, summed
    (:func:`summed_deltas`), as ``deltas=`` for ``segment_based`` functions: ``{ALL_CLIPS: {class:
    (change-point scores, {statistic: deltas})}}``. Nothing is dropped: the library reads the
    reference count from the lowest threshold."""
    from sed_scores_eval.base_modules.io import parse_audio_durations, parse_inputs
    from sed_scores_eval.segment_based import intermediate_statistics as segment

    scores, ground_truth, ids = parse_inputs(scores, ground_truth)
    durations = parse_audio_durations(durations_s, audio_ids=ids)
    criteria = {"audio_durations": durations, "segment_length": segment_s, "time_decimals": 6}
    return {ALL_CLIPS: summed_deltas(scores, ground_truth, ids, segment, criteria, clips_per_part=clips_per_part)}


def summed_deltas(
    scores: dict,
    ground_truth: dict,
    ids: list[str],
    kind,
    criteria: dict,
    *,
    drop_low: Callable[[np.ndarray, np.ndarray, list[str]], int] | None = None,
    clips_per_part: int = CLIPS_PER_PART,
) -> dict:
    """The statistic deltas of every clip of ``ids``, summed per class and distinct score ->
    ``{class: (change-point scores (K,) ascending, {statistic: deltas (K,)})}``, what
    sed_scores_eval's accumulation makes of one clip's deltas.

    ``kind``: sed_scores_eval's ``intersection_based``, ``collar_based`` or ``segment_based``
    ``intermediate_statistics`` module, whose own per-clip worker computes the deltas of
    ``clips_per_part`` clips at a time with ``criteria``, after the checks its
    ``intermediate_statistics_deltas`` makes on the whole split. Deltas are counts, so their
    sums are exact in any order. ``drop_low(scores, deltas (K, S), statistic names)`` (optional)
    says how many of the lowest change points so far no threshold of interest can depend on;
    those go, and so do later ones at or below the highest of them.
    """
    from sed_scores_eval.base_modules.ground_truth import multi_label_to_single_label_ground_truths
    from sed_scores_eval.base_modules.scores import validate_score_dataframe
    from sed_scores_eval.base_modules.statistics import _worker as event_worker

    classes = validate_score_dataframe(scores[ids[0]])[1]
    truth = multi_label_to_single_label_ground_truths(ground_truth, classes)
    summed: dict = {}  # class -> (scores, deltas (K, S), statistic names, floor)
    step = max(1, clips_per_part)
    for start in range(0, len(ids), step):
        part = ids[start : start + step]
        if hasattr(kind, "statistics_fn"):  # event-based: the shared worker with the kind's criterion
            deltas = event_worker(part, scores, truth, kind.statistics_fn, criteria, kind.acceleration_fn)
        else:  # segment-based: its own worker
            deltas = kind._worker(
                part, scores, truth, criteria["audio_durations"], criteria["segment_length"], classes, criteria["time_decimals"]
            )
        for c in classes:
            summed[c] = _add_deltas(summed.get(c), [deltas[i][c] for i in part], drop_low)
        del deltas
        release_freed_heap()  # a part's deltas are many small arrays: freed, they would split the heap under the next part's
    # the library's arithmetic sees at least int32 (it cumulates the deltas), one class's columns at a time
    out = {}
    for c in list(summed):
        cps, d, keys, _ = summed.pop(c)
        wide = np.promote_types(d.dtype, np.int32) if d.dtype.kind in "iu" else d.dtype
        out[c] = (cps, {k: np.ascontiguousarray(d[:, n], dtype=wide) for n, k in enumerate(keys)})
    return out


def _add_deltas(summed: tuple | None, clips: list[tuple], drop_low) -> tuple:
    """One class's running sum of deltas plus those of ``clips`` (each ``(change-point scores (k,),
    {statistic: deltas (k,)})``) -> ``(scores (K,) ascending and distinct, deltas (K, S),
    statistic names, floor)``; change points at or below ``floor`` are dropped (:func:`summed_deltas`).

    The part's change points are summed among themselves, then merged into the running sum where
    they fall (:func:`_merged`), and counts are kept in the narrowest integer type that holds
    them (:func:`_narrowest`; at most 9 in a change point of the FSD50K-size valid split, most of
    them 0): a split's running sum can reach millions of change points of 32 statistics before
    ``drop_low`` cuts any, and sorting it anew in int64 with each part took several times its size."""
    keys = summed[2] if summed is not None else sorted(clips[0][1])  # one order for every part (clips list them in any)
    floor = summed[3] if summed is not None else -np.inf
    cps = np.concatenate([c for c, _ in clips])
    deltas = np.stack([np.concatenate([d[k] for _, d in clips]) for k in keys], axis=1)
    keep = cps > floor
    cps, deltas = _distinct(cps[keep], deltas[keep])
    if summed is not None:
        first = int(np.searchsorted(summed[0], floor, side="right"))  # past the placeholder left when every point was dropped
        cps, deltas = _merged(summed[0][first:], summed[1][first:], cps, deltas)
    cut = drop_low(cps, deltas, keys) if drop_low is not None and len(cps) else 0
    if cut:
        floor, cps, deltas = cps[cut - 1], cps[cut:], deltas[cut:]
    if not len(cps) and floor > -np.inf:  # all dropped: one change point with nothing in it, at the floor, keeps the
        cps, deltas = np.array([floor]), np.zeros((1, len(keys)), deltas.dtype)  # library's curves one point long
    return cps, deltas, keys, floor


def _distinct(cps: np.ndarray, deltas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Change points ``(k,)`` in any order with their deltas ``(k, S)`` -> sorted distinct points
    with the deltas of equal points summed, in the narrowest type (:func:`_narrowest`)."""
    order = np.argsort(cps, kind="stable")
    cps, deltas = cps[order], deltas[order]
    if len(cps):
        starts = np.flatnonzero(np.r_[True, cps[1:] != cps[:-1]])
        cps, deltas = cps[starts], np.add.reduceat(deltas, starts, axis=0)
    return cps, deltas.astype(_narrowest(deltas), copy=False)


def _merged(old_cps: np.ndarray, old: np.ndarray, cps: np.ndarray, deltas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two sets of sorted distinct change points and their deltas -> their union, sorted, with the
    deltas of a point in both summed; one new array each, in the narrowest type that holds the sums."""
    at = np.searchsorted(old_cps, cps)  # where each new point goes: before the first old point not below it
    shared = at < len(old_cps)
    shared[shared] = old_cps[at[shared]] == cps[shared]
    fresh = ~shared
    exact = np.int64 if old.dtype.kind in "iu" and deltas.dtype.kind in "iu" else np.result_type(old, deltas)
    sums = old[at[shared]].astype(exact) + deltas[shared]
    dtype = np.result_type(old, deltas, _narrowest(sums))
    merged_cps = np.insert(old_cps, at[fresh], cps[fresh])
    merged = np.insert(old.astype(dtype, copy=False), at[fresh], deltas[fresh].astype(dtype, copy=False), axis=0)
    merged[at[shared] + np.searchsorted(at[fresh], at[shared], side="right")] = (
        sums  # each shared old point, moved by the new ones before it
    )
    return merged_cps, merged


def _narrowest(a: np.ndarray) -> np.dtype:
    """The smallest signed integer type holding every value of integer ``a`` (``a``'s own type otherwise)."""
    if a.dtype.kind not in "iu":
        return a.dtype
    lo, hi = (int(a.min()), int(a.max())) if a.size else (0, 0)
    return next(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64) if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max)


def event_counts(ground_truth: dict) -> dict[str, int]:
    """Ground-truth events per class of ``{clip: [(onset_s, offset_s, class)]}``."""
    events: dict[str, int] = defaultdict(int)
    for evs in ground_truth.values():
        for *_, c in evs:
            events[c] += 1
    return dict(events)


def confusion(ids, timestamps_s, probs, ground_truth: dict, classes) -> tuple[np.ndarray, np.ndarray]:
    """Class-by-class confusion of frame scores -> ``(matrix (C, C), events (C,))``.

    Inputs: per-clip frame probabilities ``(L, C)`` (one column per class of ``classes``, already
    median-filtered) on frame edges ``(L+1,)`` seconds, and ground truth ``{clip: [(onset_s,
    offset_s, class)]}``. Cell ``[t, q]`` is the mean, over the events of true class ``t``, of
    query ``q``'s peak probability on the frames whose interval overlaps the event (by any amount,
    so a partly covered frame counts); the diagonal is each class on its own events. ``events``
    counts the events of each row; a class without events (or whose events miss the frame grid,
    or events of a class not in ``classes``) leaves a row of NaN.
    """
    where = {c: k for k, c in enumerate(classes)}
    total, events = np.zeros((len(where), len(where))), np.zeros(len(where), dtype=int)
    for i, t, p in zip(ids, timestamps_s, probs):
        t = np.asarray(t, dtype=np.float64)
        for on, off, c in ground_truth.get(i, []):
            inside = (t[:-1] < off) & (t[1:] > on)
            if c in where and inside.any():
                total[where[c]] += np.asarray(p)[inside].max(axis=0)
                events[where[c]] += 1
    with np.errstate(invalid="ignore"):
        return total / events[:, None], events


def protocol(
    classes,
    clips: int,
    events: int,
    *,
    frame_hop_s: float,
    median_filter_frames: int,
    segment_s: float,
    max_fpr: float,
    threshold: float,
    threshold_source: str,
    f1_median_filter_frames: int | None = None,
    f1_scores: str = "scores",
) -> dict:
    """How the detection numbers of one set were computed, as plain data for its metrics file:
    the sed_scores_eval version, every PSDS setting, the median filter, the collar F1 settings,
    threshold (and where it came from) and median filter (``f1_median_filter_frames``, default
    ``median_filter_frames``), the AUROC segments, the classes, the clips and events scored and
    the frame hop of the scores; ``files``: the score folder each metric reads (``f1_scores``: the
    one collar and segment F1 read, beside PSDS's and AUROC's ``scores``), relative to the set's
    details folder, ``<model>`` standing for the model's name, and the ground truth and durations."""
    from importlib.metadata import version

    classes = list(classes)
    return {
        "sed_scores_eval": version("sed_scores_eval"),
        **{
            name: {
                "dtc": s.dtc,
                "gtc": s.gtc,
                "cttc": s.cttc,
                "alpha_ct": s.alpha_ct,
                "alpha_st": s.alpha_st,
                "max_efpr": s.max_efpr,
                "efpr_unit": f"per {PSDS_UNIT_OF_TIME}",
            }
            for name, s in PSDS.items()
        },
        "median_filter_frames": int(median_filter_frames),
        "collar_f1": {
            "onset_collar_s": COLLAR.onset_collar_s,
            "offset_collar_s": COLLAR.offset_collar_s,
            "offset_collar_rate": COLLAR.offset_collar_rate,
            "threshold": float(threshold),
            "threshold_source": threshold_source,
            "average": "macro over classes (f1_micro: micro)",
            "median_filter_frames": int(median_filter_frames if f1_median_filter_frames is None else f1_median_filter_frames),
        },
        "segment_auroc": {
            "segment_s": float(segment_s),
            "pauroc_max_fpr": float(max_fpr),
            "pauroc_normalisation": "area up to max_fpr divided by max_fpr (no McClish correction)",
            "area": "trapezoid rule over the operating points in threshold order: tied segments count "
            "one half (sklearn's roc_auc_score), independent of numpy's sort kernels",
        },
        "segment_f1": {
            "segment_s": float(segment_s),
            "threshold": float(threshold),
            "median_filter_frames": int(median_filter_frames if f1_median_filter_frames is None else f1_median_filter_frames),
            "average": "micro over classes (segment_f1_macro: macro)",
        },
        "files": {
            "ground_truth": "ground_truth.tsv",
            "durations": "durations.tsv",
            "scores": {
                **{k: "scores/<model>" for k in ("psds1", "psds1_astat0", "psds2", "auroc", "pauroc")},
                **{
                    k: f"{f1_scores}/<model>" for k in ("f1", "precision", "recall", "f1_micro", "segment_f1", "segment_f1_macro")
                },
            },
        },
        "classes": classes,
        "num_classes": len(classes),
        "clips": int(clips),
        "events": int(events),
        "frame_hop_s": float(frame_hop_s),
    }


def macro_roc(curves, classes, grid: int = 201) -> tuple[np.ndarray, np.ndarray]:
    """Per-class ROC curves (sed_scores_eval's ``{class: (tpr, fpr, ...)}``) -> mean TPR ``(grid,)``
    on an FPR grid ``(grid,)``."""
    fpr_grid = np.linspace(0.0, 1.0, grid)
    mean = np.zeros(grid)
    used = 0
    for c in classes:
        if c in curves and len(curves[c][1]):
            tpr, fpr = curves[c][0], curves[c][1]
            mean += np.interp(fpr_grid, fpr, tpr)
            used += 1
    return (mean / max(used, 1)), fpr_grid


def mean_psd_roc(class_rocs: dict, max_efpr: float, grid: int = 201) -> tuple[np.ndarray, np.ndarray]:
    """Mean of the single-class PSD-ROCs (``{class: (tpr, efpr, ...)}``, step curves) ->
    ``(etpr, efpr)`` on an eFPR grid: the PSD-ROC without the stability penalty (alpha_st 0)."""
    efpr_grid = np.linspace(0.0, max_efpr, grid)
    curves = []
    for tpr, efpr, *_ in class_rocs.values():
        tpr, efpr = np.asarray(tpr, dtype=float), np.asarray(efpr, dtype=float)
        at = np.searchsorted(efpr, efpr_grid, side="right") - 1
        curves.append(np.where(at >= 0, tpr[np.clip(at, 0, None)], 0.0))
    return (np.mean(curves, axis=0) if curves else np.zeros(grid)), efpr_grid


def alignment(probs_per_pair: list[np.ndarray], labels_per_pair: list[np.ndarray]) -> float:
    """FLAM's alignment: mean Spearman correlation between an event's frame scores and its 0/1
    frame labels, over the (clip, event) pairs whose labels are not constant."""
    return mean_defined([spearman(p, y) for p, y in zip(probs_per_pair, labels_per_pair)])


def spearman(probs: np.ndarray, labels: np.ndarray) -> float | None:
    """One (clip, event) pair's Spearman correlation between frame scores and 0/1 frame labels (0
    for constant scores); ``None`` where the labels are constant (the pair does not count)."""
    if labels.all() or not labels.any():
        return None
    rp, ry = rankdata(probs), rankdata(labels)
    return 0.0 if rp.std() == 0 else float(np.corrcoef(rp, ry)[0, 1])


def mean_defined(values: list[float | None]) -> float:
    """The mean of the values that are not ``None`` (NaN without any): :func:`alignment` over pairs."""
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else float("nan")


def labels_on_grid(segments_s, timestamps_s: np.ndarray) -> np.ndarray:
    """An event's segments -> active frames ``(L,)`` of a clip's frame grid (the trainer's overlap rule)."""
    spans = np.stack([timestamps_s[:-1], timestamps_s[1:]], axis=1)
    return frame_labels(list(segments_s), 0.0, spans)


def classification(audio: np.ndarray, class_text: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Zero-shot accuracy: each clip ``(A, d)`` takes the class text ``(C, d)`` it is closest to."""
    if not len(labels):
        return {"accuracy": float("nan")}
    predicted = (audio @ class_text.T).argmax(axis=1)
    return {"accuracy": float((predicted == labels).mean())}
