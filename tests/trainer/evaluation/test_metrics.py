"""Evaluation metrics on crafted scores whose answers are known by hand.

Detection metrics (PSDS1/2, segment AUROC, collar F1) come from sed_scores_eval; these tests
check that :mod:`trainer.evaluation.metrics` feeds it the right tables and reads back the right
numbers (perfect, shifted, constant and inverted scores on a 0.1 s frame grid), and that the
score files the stage writes let sed_scores_eval recompute PSDS1 exactly. Classification,
alignment, frame labels, the class-by-class confusion, the median filter and the timer are
checked against values worked out by hand.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from trainer.data.labels import frame_labels
from trainer.evaluation import metrics as M

pytestmark = pytest.mark.filterwarnings("ignore:pkg_resources is deprecated:UserWarning")

CLASSES = ["dog", "car", "bell"]
GRID = np.arange(101) * 0.1  # frame boundaries of a 10 s clip: 100 frames of 0.1 s
GROUND_TRUTH = {
    "c0": [(1.0, 3.0, "dog"), (4.5, 6.0, "car")],
    "c1": [(2.0, 7.0, "dog")],
    "c2": [(0.0, 2.5, "bell"), (6.0, 9.0, "car")],
    "c3": [],
    "c4": [(3.0, 5.0, "bell"), (7.0, 8.5, "dog")],
    "c5": [(5.0, 10.0, "car")],
}
IDS = sorted(GROUND_TRUTH)
DURATIONS = {i: 10.0 for i in IDS}


def frames_of(on: float, off: float) -> slice:
    return slice(round(on * 10), round(off * 10))


def perfect_probs(shift: tuple[str, str, float] | None = None) -> list[np.ndarray]:
    """1 inside every event, 0 outside; ``shift=(clip, class, s)`` moves that event's detection."""
    out = []
    for i in IDS:
        p = np.zeros((100, len(CLASSES)))
        for on, off, c in GROUND_TRUTH[i]:
            if shift is not None and (i, c) == shift[:2]:
                on, off = min(on + shift[2], 10.0), min(off + shift[2], 10.0)
            p[frames_of(on, off), CLASSES.index(c)] = 1.0
        out.append(p)
    return out


def sed(probs: list[np.ndarray], **kwargs) -> dict:
    tables = M.score_dataframes(IDS, [GRID] * len(IDS), probs, CLASSES)
    return M.sed_metrics(tables, GROUND_TRUTH, DURATIONS, CLASSES, M.Timer(), **kwargs)


# --------------------------------------------------------------------------- score tables


def test_score_dataframes_layout_and_library_check():
    rng = np.random.default_rng(0)
    probs = [rng.random((100, 3)) for _ in IDS]
    tables = M.score_dataframes(IDS, [GRID] * len(IDS), probs, CLASSES)
    assert list(tables) == IDS
    df = tables["c2"]
    assert list(df.columns) == ["onset", "offset", *CLASSES]
    assert df.shape == (100, 5)
    np.testing.assert_array_equal(df["onset"].to_numpy(), GRID[:-1])
    np.testing.assert_array_equal(df["offset"].to_numpy(), GRID[1:])
    np.testing.assert_array_equal(df[CLASSES].to_numpy(), probs[2])
    from sed_scores_eval.base_modules.scores import validate_score_dataframe

    for df in tables.values():
        validate_score_dataframe(df, event_classes=CLASSES)  # sed_scores_eval's own validation accepts them


# --------------------------------------------------------------------------- detection


def test_perfect_scores_score_perfectly():
    r = sed(perfect_probs())
    for key in ("psds1", "psds2", "auroc", "pauroc", "f1", "precision", "recall", "f1_micro", "segment_f1", "segment_f1_macro"):
        assert r[key] == pytest.approx(1.0), key
    per_class = r["per_class"].set_index("class")
    assert list(per_class.index) == CLASSES
    assert per_class["events"].to_dict() == {"dog": 3, "car": 3, "bell": 2}
    for col in ("psds1", "psds2", "auroc", "f1"):
        assert per_class[col].to_numpy() == pytest.approx([1.0, 1.0, 1.0]), col
    tpr, fpr = r["roc"]
    assert fpr[0] == 0.0 and fpr[-1] == 1.0 and len(tpr) == len(fpr)
    assert tpr == pytest.approx(np.ones_like(tpr))  # a perfect ROC is 1 from FPR 0 on


def test_an_event_detected_40_percent_late_fails_psds1_but_not_psds2():
    # c1's dog (2-7 s) detected at 4-9 s: overlap 3 s, so dtc = gtc = 0.6 < 0.7 (PSDS1), >= 0.1 (PSDS2)
    r = sed(perfect_probs(("c1", "dog", 2.0)))
    assert r["psds2"] == pytest.approx(1.0)
    assert r["psds1"] < 1.0
    # PSDS1 by hand: the late detection is one false positive in 60 s = 60 per hour. Below eFPR
    # 60 the dog class is at eTPR 0 (nothing detected), from 60 to 100 at 2/3; car and bell are
    # at 1 throughout. alpha_st = 1 subtracts the (population) std of the classes' eTPRs.
    below = np.mean([0, 1, 1]) - np.std([0, 1, 1])  # (2 - sqrt 2) / 3
    above = np.mean([2 / 3, 1, 1]) - np.std([2 / 3, 1, 1])  # (8 - sqrt 2) / 9
    assert below == pytest.approx((2 - math.sqrt(2)) / 3) and above == pytest.approx((8 - math.sqrt(2)) / 9)
    assert r["psds1"] == pytest.approx(0.6 * below + 0.4 * above, abs=1e-9)
    per_class = r["per_class"].set_index("class")
    assert per_class.loc["dog", "psds1"] == pytest.approx(0.4 * 2 / 3)
    # 1 s segments: the dog of c1 (2-7 s) found at 4-9 s is 3 true, 2 false and 2 missed segments
    assert r["segment_f1"] < 1.0 and r["segment_f1_macro"] < 1.0
    assert per_class.loc["car", "psds1"] == pytest.approx(1.0) and per_class.loc["bell", "psds1"] == pytest.approx(1.0)
    # collar F1: the late onset misses the 200 ms collar -> dog has tp 2, fp 1, fn 1 (F1 2/3)
    assert per_class.loc["dog", "f1"] == pytest.approx(2 / 3)
    assert r["f1"] == pytest.approx((2 / 3 + 1 + 1) / 3)
    assert r["auroc"] < 1.0


def test_psds1_without_the_std_penalty_is_the_mean_of_the_classes():
    r = sed(perfect_probs(("c1", "dog", 2.0)))
    assert r["psds1_astat0"] == pytest.approx((0.4 * 2 / 3 + 1 + 1) / 3, abs=1e-9)
    assert r["psds1"] < r["psds1_astat0"]  # the same curves with the stability penalty
    assert r["psds2"] == pytest.approx(1.0)


def test_psds1_astat0_equals_a_second_psds_call_with_alpha_st_0():
    """Read from psds1's per-class PSD-ROCs, it is what sed_scores_eval's psds gives with alpha_st 0."""
    from sed_scores_eval import intersection_based

    rng = np.random.default_rng(3)
    probs = [M.smooth(p * 0.4 + rng.random(p.shape) * 0.6, 3) for p in perfect_probs()]
    tables = M.score_dataframes(IDS, [GRID] * len(IDS), probs, CLASSES)
    ours = M.sed_metrics(tables, GROUND_TRUTH, DURATIONS, CLASSES, M.Timer())
    s = M.PSDS1_ASTAT0
    theirs, *_ = intersection_based.psds(
        tables,
        GROUND_TRUTH,
        DURATIONS,
        dtc_threshold=s.dtc,
        gtc_threshold=s.gtc,
        cttc_threshold=s.cttc,
        alpha_ct=s.alpha_ct,
        alpha_st=0.0,
        max_efpr=s.max_efpr,
    )
    assert 0.05 < ours["psds1_astat0"] < 0.95 and ours["psds1"] < ours["psds1_astat0"]
    assert ours["psds1_astat0"] == pytest.approx(float(theirs), abs=1e-12)


def test_protocol_states_every_setting():
    from importlib.metadata import version

    p = M.protocol(
        CLASSES,
        6,
        8,
        frame_hop_s=0.1,
        median_filter_frames=3,
        segment_s=1.0,
        max_fpr=0.1,
        threshold=0.25,
        threshold_source="evaluate.f1_threshold",
    )
    assert p["sed_scores_eval"] == version("sed_scores_eval")
    assert p["psds1"] == {
        "dtc": 0.7,
        "gtc": 0.7,
        "cttc": None,
        "alpha_ct": 0.0,
        "alpha_st": 1.0,
        "max_efpr": 100.0,
        "efpr_unit": "per hour",
    }
    assert p["psds1_astat0"]["alpha_st"] == 0.0 and p["psds1_astat0"]["dtc"] == 0.7
    assert (p["psds2"]["dtc"], p["psds2"]["gtc"], p["psds2"]["cttc"], p["psds2"]["alpha_ct"]) == (0.1, 0.1, 0.3, 0.5)
    f1 = p["collar_f1"]
    assert (f1["onset_collar_s"], f1["offset_collar_s"], f1["offset_collar_rate"], f1["threshold"]) == (0.2, 0.2, 0.2, 0.25)
    assert f1["threshold_source"] == "evaluate.f1_threshold"
    assert p["segment_auroc"]["segment_s"] == 1.0 and p["segment_auroc"]["pauroc_max_fpr"] == 0.1
    assert (p["classes"], p["num_classes"], p["clips"], p["events"], p["frame_hop_s"], p["median_filter_frames"]) == (
        CLASSES,
        3,
        6,
        8,
        0.1,
        3,
    )


def test_an_event_detected_10_percent_late_still_passes_both_psds():
    # 0.5 s late on a 5 s event: dtc = gtc = 0.9
    r = sed(perfect_probs(("c1", "dog", 0.5)))
    assert r["psds1"] == pytest.approx(1.0)
    assert r["psds2"] == pytest.approx(1.0)
    # but the onset is 500 ms off: outside the 200 ms collar of the collar F1
    assert r["f1"] == pytest.approx((2 / 3 + 1 + 1) / 3)


def test_constant_scores_detect_nothing():
    r = sed([np.full((100, 3), 0.5) for _ in IDS])
    assert r["psds1"] == 0.0
    assert r["psds2"] == 0.0
    # one tied block (every segment the same score): chance, as sklearn's roc_auc_score has it (a
    # staircase would give 0 or 1 by the order it put the tie in); pAUROC the triangle under the
    # diagonal up to 0.1, over 0.1
    assert r["auroc"] == pytest.approx(0.5)
    assert r["pauroc"] == pytest.approx(0.05)


def test_inverted_scores_have_auroc_near_zero():
    r = sed([1.0 - p for p in perfect_probs()])
    # a 1 s segment that an event covers only in part (4.5-6.0 s) peaks at 1 there, tied with every
    # negative segment: the tie counts one half, so the area is small but not 0
    assert 0.0 < r["auroc"] < 0.1
    assert r["psds1"] == 0.0
    assert r["f1"] == 0.0


def round_trip(folder, ids: list[str]) -> tuple[float, float]:
    """sed_metrics' PSDS1 on seeded random scores of ``ids``, and sed_scores_eval's PSDS1
    recomputed from the score files and truth TSVs the evaluate stage writes."""
    from sed_scores_eval import intersection_based
    from sed_scores_eval import io as sio

    from trainer.stages.evaluate import write_truth

    rng = np.random.default_rng(7)
    probs = [M.smooth(p * 0.4 + rng.random(p.shape) * 0.6, 3) for i, p in zip(IDS, perfect_probs()) if i in ids]
    truth, durations = {i: GROUND_TRUTH[i] for i in ids}, {i: DURATIONS[i] for i in ids}
    tables = M.score_dataframes(ids, [GRID] * len(ids), probs, CLASSES)
    ours = M.sed_metrics(tables, truth, durations, CLASSES, M.Timer())["psds1"]
    scores_dir = folder / "scores"
    sio.write_sed_scores(tables, scores_dir)
    write_truth(folder, truth, durations)
    assert sorted(p.name for p in scores_dir.iterdir()) == [f"{i}.tsv" for i in ids]
    value, *_ = intersection_based.psds(
        str(scores_dir),
        str(folder / "ground_truth.tsv"),
        sio.read_audio_durations(folder / "durations.tsv"),
        dtc_threshold=0.7,
        gtc_threshold=0.7,
        alpha_ct=0,
        alpha_st=1,
        max_efpr=100,
    )
    return ours, float(value)


def test_round_trip_through_the_score_files(tmp_path):
    """The files the stage writes let sed_scores_eval recompute PSDS1 exactly."""
    ours, theirs = round_trip(tmp_path, [i for i in IDS if GROUND_TRUTH[i]])
    assert 0.05 < ours < 0.95  # a non-trivial value to compare
    assert theirs == pytest.approx(ours, abs=1e-9)


def test_round_trip_with_a_clip_without_events(tmp_path):
    assert GROUND_TRUTH["c3"] == []
    ours, theirs = round_trip(tmp_path, IDS)
    assert theirs == pytest.approx(ours, abs=1e-9)


# --------------------------------------------------------------------------- median filter


def test_smooth_removes_single_frame_spikes_and_keeps_longer_runs():
    p = np.zeros((12, 2))
    p[5, 0] = 1.0  # a one-frame spike in class 0
    p[3:5, 1] = 1.0  # a two-frame run in class 1
    out = M.smooth(p, 3)
    assert out.shape == p.shape
    np.testing.assert_array_equal(out[:, 0], np.zeros(12))
    np.testing.assert_array_equal(out[:, 1], p[:, 1])  # classes are filtered on their own
    q = np.array([0.1, 0.9, 0.2, 0.8, 0.3, 0.7])[:, None]
    np.testing.assert_allclose(M.smooth(q, 3)[:, 0], [0.1, 0.2, 0.8, 0.3, 0.7, 0.7])
    np.testing.assert_array_equal(M.smooth(q, 1), q)
    np.testing.assert_array_equal(M.smooth(p, 0), p)


# --------------------------------------------------------------------------- confusion


def test_confusion_by_hand_counts_partly_covered_frames():
    grids = [np.array([0.0, 0.5, 1.0, 1.5, 2.0]), np.array([0.0, 1.0, 2.0])]
    probs = [
        np.array([[0.9, 0.2], [0.8, 0.3], [0.1, 0.6], [0.0, 0.4]]),  # clip a: columns dog, car
        np.array([[0.5, 0.1], [0.2, 0.7]]),
    ]  # clip b
    truth = {
        "a": [
            (0.0, 0.7, "dog"),  # frames 0 and 1 (0.2 s of frame 1's 0.5 s): dog 0.9, car 0.3 (from the partial frame)
            (1.2, 2.0, "car"),
        ],  # frames 2 (partly) and 3: dog 0.1, car 0.6
        "b": [
            (1.0, 1.5, "dog"),  # frame 1 only (frame 0 ends where it starts): dog 0.2, car 0.7
            (0.2, 0.4, "bell"),
        ],  # not a class of the matrix: left out
        "c": [(0.0, 1.0, "car")],  # a clip that was not scored
    }
    matrix, events = M.confusion(["a", "b"], grids, (p for p in probs), truth, ["dog", "car"])
    np.testing.assert_allclose(matrix, [[(0.9 + 0.2) / 2, (0.3 + 0.7) / 2], [0.1, 0.6]])
    assert events.tolist() == [2, 1]
    # a class without events keeps a row of NaN; its column is still filled
    only_dog = {i: [ev for ev in evs if ev[2] == "dog"] for i, evs in truth.items()}
    matrix, events = M.confusion(["a", "b"], grids, probs, only_dog, ["dog", "car"])
    assert events.tolist() == [2, 0] and np.isnan(matrix[1]).all()
    np.testing.assert_allclose(matrix[0], [0.55, 0.5])
    # an event shorter than a frame takes the frame it lies in
    matrix, _ = M.confusion(["b"], grids[1:], probs[1:], {"b": [(1.2, 1.2, "car")]}, ["dog", "car"])
    np.testing.assert_allclose(matrix[1], [0.2, 0.7])


# --------------------------------------------------------------------------- classification


def test_zero_shot_accuracy_by_hand():
    class_text = np.eye(3)
    audio = np.array(
        [
            [0.9, 0.1, 0.0],  # -> 0
            [0.2, 0.7, 0.1],  # -> 1
            [0.1, 0.3, 0.6],  # -> 2
            [0.5, 0.4, 0.1],  # -> 0
            [0.0, 0.2, 0.8],  # -> 2
        ]
    )
    assert M.classification(audio, class_text, np.array([0, 1, 2, 1, 2])) == {"accuracy": pytest.approx(4 / 5)}
    assert M.classification(audio, class_text, np.array([1, 0, 0, 2, 1])) == {"accuracy": 0.0}
    assert math.isnan(M.classification(audio[:0], class_text, np.array([], dtype=int))["accuracy"])


# --------------------------------------------------------------------------- alignment


def test_alignment_spearman_by_hand():
    y = np.array([0, 1, 1, 0, 0, 1], dtype=bool)
    assert M.alignment([y.astype(float)], [y]) == pytest.approx(1.0)
    assert M.alignment([1.0 - y], [y]) == pytest.approx(-1.0)
    # p ranks 1 3 2 4, y ranks 1.5 3.5 1.5 3.5: centred dot 4, norms sqrt 5 and 2
    p, y2 = np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 1, 0, 1], dtype=bool)
    assert M.alignment([p], [y2]) == pytest.approx(2 / math.sqrt(5))
    # pairs with constant labels are left out; constant scores on varying labels count as 0
    const_labels = [np.zeros(6, dtype=bool), np.ones(6, dtype=bool)]
    assert M.alignment([y.astype(float), 1.0 - y, np.arange(6.0), np.arange(6.0)], [y, y, *const_labels]) == pytest.approx(0.0)
    assert M.alignment([p, np.full(4, 0.3)], [y2, y2]) == pytest.approx(1 / math.sqrt(5))
    assert math.isnan(M.alignment([np.arange(6.0), np.arange(6.0)], const_labels))
    assert math.isnan(M.alignment([], []))


# --------------------------------------------------------------------------- frame labels


def test_labels_on_grid_follow_the_trainer_rule():
    t = np.arange(21) * 0.1  # 20 frames of 0.1 s
    assert np.flatnonzero(M.labels_on_grid([(1.0, 1.5)], t)).tolist() == [10, 11, 12, 13, 14]
    # 1.04-1.24: frame 10 has 0.06 s (>= half a frame), frame 12 only 0.04 s
    assert np.flatnonzero(M.labels_on_grid([(1.04, 1.24)], t)).tolist() == [10, 11]
    # an event shorter than a frame marks the frames holding at least half of it
    assert np.flatnonzero(M.labels_on_grid([(0.52, 0.55)], t)).tolist() == [5]
    assert np.flatnonzero(M.labels_on_grid([(0.58, 0.62)], t)).tolist() == [5, 6]
    assert np.flatnonzero(M.labels_on_grid([(0.0, 0.3), (1.76, 5.0)], t)).tolist() == [0, 1, 2, 18, 19]
    assert not M.labels_on_grid([], t).any()
    # a last frame shorter than the others (a clip ending mid-column, as the detector's grid does)
    t2 = np.array([0.0, 0.08, 0.16, 0.2])
    assert M.labels_on_grid([(0.17, 0.2)], t2).tolist() == [False, False, True]
    for segments, grid in (([(1.04, 1.24), (0.58, 0.62)], t), ([(0.05, 0.19)], t2)):
        spans = np.stack([grid[:-1], grid[1:]], axis=1)
        np.testing.assert_array_equal(M.labels_on_grid(segments, grid), frame_labels(segments, 0.0, spans, 0.5))


# --------------------------------------------------------------------------- timer


def test_timer_splits_library_time_from_the_rest(monkeypatch):
    clock = iter([0.0, 2.0, 10.0, 11.0, 20.0, 30.0, 40.0, 45.0, 50.0, 50.5, 60.0, 64.0])
    monkeypatch.setattr(M, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    timer = M.Timer()
    with timer("psds1", library=True):  # 2 s
        pass
    with timer("median_filter"):  # 1 s
        pass
    with timer("model_scoring_trained"):  # 10 s, not metric work
        pass
    with timer("read_audio"):  # 5 s, not metric work
        pass
    with timer("psds1", library=True):  # 0.5 s more
        pass
    with pytest.raises(RuntimeError), timer("collar_f1", library=True):  # 4 s, counted despite the error
        raise RuntimeError("boom")
    s = timer.summary()
    assert s["psds1_s"] == 2.5 and s["median_filter_s"] == 1.0 and s["collar_f1_s"] == 4.0
    assert s["model_scoring_trained_s"] == 10.0 and s["read_audio_s"] == 5.0
    assert s["total_s"] == 22.5
    assert s["metrics_s"] == 7.5
    assert s["sed_scores_eval_s"] == 6.5
    assert s["outside_sed_scores_eval_share"] == round(1.0 / 7.5, 4)
    assert M.Timer().summary() == {
        "total_s": 0.0,
        "metrics_s": 0.0,
        "sed_scores_eval_s": 0.0,
        "outside_sed_scores_eval_share": 0.0,
    }


# --------------------------------------------------------------------------- statistics in parts


def noisy_split(clips: int = 60, seed: int = 11) -> tuple[dict, dict, dict]:
    """Score tables, truth and durations of ``clips`` clips: the crafted events tiled over the
    split, the scores noise plus a bump over each event (so curves have hundreds of points)."""
    rng = np.random.default_rng(seed)
    ids = [f"n{k:03d}" for k in range(clips)]
    truth = {i: GROUND_TRUTH[IDS[k % len(IDS)]] for k, i in enumerate(ids)}
    probs = []
    for i in ids:
        p = rng.random((100, len(CLASSES))) * 0.5
        for on, off, c in truth[i]:
            p[frames_of(on, off), CLASSES.index(c)] += rng.uniform(0.1, 0.6)
        probs.append(M.smooth(np.clip(p, 0, 1), 3))
    return M.score_dataframes(ids, [GRID] * clips, probs, CLASSES), truth, {i: 10.0 for i in ids}


@pytest.mark.parametrize("settings", [M.PSDS1, M.PSDS2], ids=["psds1", "psds2"])
@pytest.mark.parametrize("part", [7, 1000])
def test_psds_in_parts_is_sed_scores_eval_s_to_the_last_bit(settings, part):
    """Summed a few clips at a time, with the thresholds past max_efpr dropped as they come,
    PSDS, per-class PSDS, the PSD-ROC and every class's curve equal the library's own call."""
    from sed_scores_eval import intersection_based

    tables, truth, durations = noisy_split()
    s = settings
    theirs = intersection_based.psds(
        tables,
        truth,
        durations,
        dtc_threshold=s.dtc,
        gtc_threshold=s.gtc,
        cttc_threshold=s.cttc,
        alpha_ct=s.alpha_ct,
        alpha_st=s.alpha_st,
        unit_of_time="hour",
        max_efpr=s.max_efpr,
    )
    ours = M.psds(tables, truth, durations, s, clips_per_part=part)
    assert 0.05 < theirs[0] < 0.99  # neither nothing nor everything detected
    assert ours[0] == theirs[0] and ours[1] == theirs[1]
    assert all(np.array_equal(a, b) for a, b in zip(ours[2], theirs[2]))
    assert ours[3].keys() == theirs[3].keys()
    for c in CLASSES:
        assert all(np.array_equal(a, b) for a, b in zip(ours[3][c], theirs[3][c]))


def test_running_sums_merge_parts_exactly_in_the_narrowest_integer_type():
    """The running sum of change-point deltas equals one sort of every part's points at once, kept
    in int8 while the counts fit and widened, still exact, once a sum does not."""
    rng = np.random.default_rng(3)
    keys = ["fps", "tps"]
    parts = []
    for _ in range(6):  # repeated points within and across parts
        cps = rng.choice(np.linspace(0, 1, 40), size=rng.integers(1, 30))
        parts.append([(cps, {k: rng.integers(-3, 4, len(cps)) for k in keys})])
    parts.append([(np.array([0.5, 0.5]), {"fps": np.array([100, 100]), "tps": np.array([0, 1])})])  # a sum past int8
    summed = None
    for clips in parts:
        summed = M._add_deltas(summed, clips, None)
        assert np.all(np.diff(summed[0]) > 0)
    cps = np.concatenate([c for p in parts for c, _ in p])
    points = np.unique(cps)
    expected = np.stack(
        [
            np.bincount(
                np.searchsorted(points, cps), np.concatenate([d[k] for p in parts for _, d in p]), minlength=len(points)
            ).astype(np.int64)
            for k in keys
        ],
        axis=1,
    )
    assert np.array_equal(summed[0], points) and np.array_equal(summed[1], expected)
    assert summed[1].dtype == np.int16 and summed[1][points == 0.5, 0] > 127
    assert M._add_deltas(None, parts[0], None)[1].dtype == np.int8


def test_psds_in_parts_keeps_far_fewer_thresholds_than_there_are_change_points():
    """The memory bound: at 60 clips most change points are past max_efpr and are not kept."""
    from sed_scores_eval.intersection_based import intermediate_statistics as intersection

    tables, truth, durations = noisy_split()
    ids = sorted(tables)
    s = M.PSDS2
    criteria = {"dtc_threshold": s.dtc, "gtc_threshold": s.gtc, "cttc_threshold": s.cttc, "time_decimals": 6}
    every = M.summed_deltas(tables, truth, ids, intersection, criteria, clips_per_part=7)
    total_s = sum(durations.values())

    def past(cps, deltas, keys):
        false = np.cumsum(deltas[::-1, keys.index("fps")])[::-1]
        bad = false / total_s * 3600 > s.max_efpr
        return len(bad) if bad.all() else int(np.argmin(bad))

    kept = M.summed_deltas(tables, truth, ids, intersection, criteria, clips_per_part=7, drop_low=past)
    for c in CLASSES:
        assert len(kept[c][0]) < len(every[c][0]) / 4
        # what is kept is the top of the full sum, unchanged
        top = every[c][0] >= kept[c][0][0]
        assert np.array_equal(every[c][0][top], kept[c][0])
        assert all(np.array_equal(every[c][1][k][top], kept[c][1][k]) for k in every[c][1])


@pytest.mark.parametrize("threshold", [0.5, 1.0])
def test_collar_and_segment_f1_and_segment_auroc_in_parts_are_sed_scores_eval_s(threshold):
    """Collar F1 (change points at or below the threshold dropped), segment F1 and segment
    AUROC from statistics summed in parts equal the library's calls; at 1.0 no class has a
    change point above the threshold, which still reads as nothing detected."""
    from sed_scores_eval import collar_based, segment_based
    from sed_scores_eval.base_modules.roc import auroc_from_intermediate_statistics
    from sed_scores_eval.segment_based.intermediate_statistics import accumulated_intermediate_statistics

    tables, truth, durations = noisy_split()
    c = M.COLLAR
    theirs = collar_based.fscore(
        tables,
        truth,
        threshold,
        onset_collar=c.onset_collar_s,
        offset_collar=c.offset_collar_s,
        offset_collar_rate=c.offset_collar_rate,
    )
    ours = M.collar_fscore(tables, truth, threshold, clips_per_part=7)
    assert ours[:3] == theirs[:3] and ours[3] == theirs[3]
    assert (0.05 < theirs[0]["macro_average"] < 0.95) if threshold < 1 else theirs[0]["macro_average"] == 0.0
    segments = M.segment_statistics(tables, truth, durations, 1.0, clips_per_part=7)
    assert (
        segment_based.fscore(None, truth, durations, threshold, deltas=segments, segment_length=1.0)[:3]
        == segment_based.fscore(tables, truth, durations, threshold, segment_length=1.0)[:3]
    )
    mine, _ = accumulated_intermediate_statistics(None, truth, durations, deltas=segments)
    library, _ = accumulated_intermediate_statistics(tables, truth, durations, segment_length=1.0)
    for max_fpr in (None, 0.1):
        assert (
            auroc_from_intermediate_statistics(mine, max_fpr=max_fpr)[0]
            == auroc_from_intermediate_statistics(library, max_fpr=max_fpr)[0]
        )


def test_collected_frees_the_reference_cycles_a_call_leaves_and_unfreezes():
    import gc
    import weakref

    class Node:
        pass

    gc.disable()  # only the helper may collect here
    try:
        with M.collected():
            node = Node()
            node.self = node  # a cycle, as the library's curve sorting leaves one
            ref = weakref.ref(node)
            del node
            assert ref() is not None
        assert ref() is None and gc.get_freeze_count() == 0
    finally:
        gc.enable()
