"""Every detection number evaluate prints recomputes from what it wrote to ``details/`` with
sed_scores_eval alone, and segment AUROC/pAUROC are tie-correct and do not depend on numpy's
sort kernels.

The area checks build segment-level labels and scores with many ties on 1 s frames (so a
segment's score is its frame's), and compare :func:`metrics.roc_area` with a pairwise
Mann-Whitney count (ties one half) and sklearn's ``roc_auc_score`` (its partial area taken back
from the McClish correction), in two interpreters: one with ``NPY_ENABLE_CPU_FEATURES=X86_V2``,
one without it (numpy reads it at import). The end-to-end check runs the stage on the shared
smoke run's checkpoint with collar F1's median filter (9) other than PSDS's (3).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from trainer.evaluation import metrics as M

pytestmark = pytest.mark.filterwarnings("ignore:pkg_resources is deprecated:UserWarning")

ROOT = Path(__file__).resolve().parents[3]
CLASSES = ["dog", "car", "bell"]


def tied_segments(seed: int = 0, clips: int = 40, seconds: int = 10):
    """``(tables, ground truth, durations, labels {class: (N,) bool}, scores {class: (N,)})``: 1 s
    frames, scores on a grid of 0.1 (many ties), each label's chance rising with its score."""
    from sed_scores_eval.base_modules.scores import create_score_dataframe

    rng = np.random.default_rng(seed)
    grid = np.arange(seconds + 1, dtype=np.float64)
    tables, truth = {}, {}
    labels = {c: [] for c in CLASSES}
    scores = {c: [] for c in CLASSES}
    for k in range(clips):
        i = f"clip{k:02d}"
        p = np.round(rng.random((seconds, len(CLASSES))) * 10) / 10
        y = rng.random(p.shape) < 0.15 + 0.6 * p
        truth[i] = [(float(on), float(off), c) for n, c in enumerate(CLASSES) for on, off in runs(y[:, n])]
        tables[i] = create_score_dataframe(p, grid, CLASSES)
        for n, c in enumerate(CLASSES):
            labels[c].append(y[:, n])
            scores[c].append(p[:, n])
    durations = {i: float(seconds) for i in tables}
    return (
        tables,
        truth,
        durations,
        {c: np.concatenate(v) for c, v in labels.items()},
        {c: np.concatenate(v) for c, v in scores.items()},
    )


def runs(active: np.ndarray) -> list[tuple[int, int]]:
    """``(first, past the last)`` of each run of True: one event per run, as DCASE ground truth has it."""
    edges = np.diff(np.r_[0, active.astype(int), 0])
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)))


def mann_whitney(labels: np.ndarray, scores: np.ndarray) -> float:
    """The share of (positive, negative) pairs the positive scores higher, ties one half."""
    pos, neg = scores[labels][:, None], scores[~labels][None, :]
    return float(((pos > neg).sum() + 0.5 * (pos == neg).sum()) / (pos.size * neg.size))


def segment_stats(tables, truth, durations) -> dict:
    from sed_scores_eval.segment_based.intermediate_statistics import accumulated_intermediate_statistics

    stats, _ = accumulated_intermediate_statistics(tables, truth, durations, segment_length=1.0)
    return stats


def test_the_roc_area_counts_ties_one_half_as_sklearn_does():
    tables, truth, durations, labels, scores = tied_segments()
    stats = segment_stats(tables, truth, durations)
    full, partial = M.roc_areas(stats), M.roc_areas(stats, max_fpr=0.1)
    for c in CLASSES:
        assert len(np.unique(scores[c])) <= 11 < len(scores[c]) // 10  # nearly every segment ties with others
        assert full[c] == pytest.approx(mann_whitney(labels[c], scores[c]), abs=1e-12)
    assert full["mean"] == pytest.approx(np.mean([full[c] for c in CLASSES]), abs=1e-15)
    sklearn = pytest.importorskip("sklearn.metrics")
    for c in CLASSES:
        assert full[c] == pytest.approx(sklearn.roc_auc_score(labels[c], scores[c]), abs=1e-12)
        # sklearn's max_fpr answer is McClish-corrected: 1/2 (1 + (A - m^2/2) / (m - m^2/2)); A is the raw area
        m, corrected = 0.1, sklearn.roc_auc_score(labels[c], scores[c], max_fpr=0.1)
        raw = m * m / 2 + (2 * corrected - 1) * (m - m * m / 2)
        assert partial[c] == pytest.approx(raw / m, abs=1e-12)


def test_the_roc_area_is_the_staircase_where_nothing_ties():
    """Distinct scores: the trapezoids are the staircase over sed_scores_eval's ROC curve (sorted by
    (fpr, tpr), stably), to rounding; its own ``staircase_auc`` sorts that curve again by fpr alone,
    unstably, so where a run of positives leaves fpr unchanged the height it keeps is the kernel's pick."""
    from sed_scores_eval.base_modules.roc import roc_curve_from_intermediate_statistics

    tables, truth, durations, _, _ = tied_segments()
    rng = np.random.default_rng(1)
    for t in tables.values():  # break every tie
        t[CLASSES] = t[CLASSES].to_numpy() + rng.random((len(t), len(CLASSES))) * 1e-3
    stats = segment_stats(tables, truth, durations)
    ours = M.roc_areas(stats)
    for c in CLASSES:
        tpr, fpr, *_ = roc_curve_from_intermediate_statistics(stats[c])
        assert ours[c] == pytest.approx(float(np.sum(np.diff(fpr) * tpr[:-1])), abs=1e-12), c


AREAS_IN_A_FRESH_NUMPY = """
import json, sys
import numpy  # first, so numpy reads the variable as this process was given it
from tests.trainer.evaluation.test_written_files_reproduce import segment_stats, tied_segments
from trainer.evaluation import metrics as M
from sed_scores_eval.base_modules.roc import auroc_from_intermediate_statistics
stats = segment_stats(*tied_segments(seed=3, clips=60)[:3])
json.dump({"ours": [M.roc_areas(stats), M.roc_areas(stats, max_fpr=0.1)],
           "library": [auroc_from_intermediate_statistics(stats, max_fpr=m)[0]["mean"] for m in (None, 0.1)]},
          sys.stdout, default=float)
"""


def test_the_roc_area_is_the_same_under_either_numpy_sort_kernel():
    runs = {}
    for name, features in (("x86_v2", "X86_V2"), ("default", None)):
        env = {k: v for k, v in os.environ.items() if k != "NPY_ENABLE_CPU_FEATURES"}
        if features:
            env["NPY_ENABLE_CPU_FEATURES"] = features
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        done = subprocess.run(
            [sys.executable, "-W", "ignore", "-c", AREAS_IN_A_FRESH_NUMPY],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        runs[name] = json.loads(done.stdout)
    assert runs["x86_v2"]["ours"] == runs["default"]["ours"]  # to the last bit
    _, _, _, labels, scores = tied_segments(seed=3, clips=60)
    full = runs["default"]["ours"][0]
    assert full["mean"] == pytest.approx(np.mean([mann_whitney(labels[c], scores[c]) for c in CLASSES]), abs=1e-12)


# --------------------------------------------------------------------------- the stage's files


@pytest.fixture(scope="module")
def evaluated_from_files(smoke_run, tmp_path_factory):
    """The stage on the smoke run's checkpoint, collar F1 after a 9-frame filter and PSDS after 3."""
    from trainer.stages.evaluate import run as evaluate

    p, out, _ = smoke_run
    tmp = tmp_path_factory.mktemp("evaluate-files")
    e = replace(
        p.evaluate,
        checkpoint=str(Path(out) / "checkpoints" / "latest.pt"),
        shards=p.train.data.valid.path,
        event_clips=None,
        pictures=0,
        device="cpu",
        out_dir=str(tmp / "eval"),
        benchmarks={},
        probes=False,
        caption_metrics=False,
        median_filter_frames=3,
        f1_median_filter_frames=9,
    )
    summary = evaluate(replace(p, evaluate=e))
    return tmp / "eval", summary


def trapezoid_area(class_stats, max_fpr=None) -> float:
    """The tie-correct ROC area from sed_scores_eval's statistics, as docs/evaluation.md gives it."""
    _, s = class_stats
    tpr = s["tps"][::-1] / s["n_ref"]
    fpr = s["fps"][::-1] / (s["fps"][::-1] + s["tns"][::-1])
    if max_fpr is not None:
        k = np.searchsorted(fpr, max_fpr, side="right")
        if k < len(fpr):
            tpr = np.append(tpr[:k], np.interp(max_fpr, fpr[k - 1 : k + 1], tpr[k - 1 : k + 1]))
            fpr = np.append(fpr[:k], max_fpr)
    return float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2)) / (max_fpr or 1.0)


@pytest.mark.parametrize("model", ["trained", "untrained"])
def test_every_printed_detection_number_recomputes_from_the_written_files(evaluated_from_files, model):
    from sed_scores_eval import collar_based, intersection_based, segment_based
    from sed_scores_eval.base_modules.io import read_audio_durations, read_ground_truth_events, read_sed_scores
    from sed_scores_eval.segment_based.intermediate_statistics import accumulated_intermediate_statistics

    out, summary = evaluated_from_files
    written = json.loads((out / "metrics.json").read_text())
    folder = out / "details" / "test"
    protocol = json.loads((folder / "protocol.json").read_text())
    assert protocol == written["protocol"]
    files = protocol["files"]
    assert files["scores"]["psds1"] == "scores/<model>" and files["scores"]["f1"] == "scores_f1/<model>"
    scores = {key: read_sed_scores(str(folder / path.replace("<model>", model))) for key, path in files["scores"].items()}
    truth = read_ground_truth_events(str(folder / files["ground_truth"]))
    durations = read_audio_durations(str(folder / files["durations"]))
    assert set(scores["psds1"]) == set(scores["f1"]) == set(durations)
    got = written["test"][model]
    recomputed = {}
    for key in ("psds1", "psds1_astat0", "psds2"):
        s = protocol[key]
        recomputed[key], *_ = intersection_based.psds(
            scores[key],
            truth,
            durations,
            dtc_threshold=s["dtc"],
            gtc_threshold=s["gtc"],
            cttc_threshold=s["cttc"],
            alpha_ct=s["alpha_ct"],
            alpha_st=s["alpha_st"],
            max_efpr=s["max_efpr"],
        )
    c = protocol["collar_f1"]
    f, p, r, _ = collar_based.fscore(
        scores["f1"],
        truth,
        c["threshold"],
        onset_collar=c["onset_collar_s"],
        offset_collar=c["offset_collar_s"],
        offset_collar_rate=c["offset_collar_rate"],
    )
    recomputed |= {
        "f1": f["macro_average"],
        "precision": p["macro_average"],
        "recall": r["macro_average"],
        "f1_micro": f["micro_average"],
    }
    g = protocol["segment_f1"]
    sf, *_ = segment_based.fscore(scores["segment_f1"], truth, durations, g["threshold"], segment_length=g["segment_s"])
    recomputed |= {"segment_f1": sf["micro_average"], "segment_f1_macro": sf["macro_average"]}
    a = protocol["segment_auroc"]
    stats, _ = accumulated_intermediate_statistics(scores["auroc"], truth, durations, segment_length=a["segment_s"])
    recomputed["auroc"] = np.mean([trapezoid_area(v) for v in stats.values()])
    recomputed["pauroc"] = np.mean([trapezoid_area(v, a["pauroc_max_fpr"]) for v in stats.values()])
    assert set(recomputed) == set(files["scores"])
    for key, value in recomputed.items():
        assert got[key] == pytest.approx(float(value), abs=1e-12), key
    assert protocol["median_filter_frames"] == 3 and c["median_filter_frames"] == g["median_filter_frames"] == 9
    assert (folder / "ground_truth.tsv").exists() and sorted(p.name for p in (folder / "scores").iterdir()) == [
        "trained",
        "untrained",
    ]
