"""The global collar-F1 threshold chosen on a split: sed_scores_eval's F1 at it, and no threshold does better.

Crafted scores on a 0.1 s frame grid (the events of ``test_metrics``), rounded to two decimals so
the candidates are few and each can be checked with ``collar_based.fscore`` itself.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from sed_scores_eval import collar_based

from tests.trainer.evaluation.test_metrics import CLASSES, GRID, GROUND_TRUTH, IDS, perfect_probs
from trainer.evaluation import calibration as C
from trainer.evaluation import metrics as M

pytestmark = pytest.mark.filterwarnings("ignore:pkg_resources is deprecated:UserWarning")


def tables(probs: list[np.ndarray]) -> dict:
    return M.score_dataframes(IDS, [GRID] * len(IDS), probs, CLASSES)


def library_f1(scores: dict, threshold: float) -> float:
    f, *_ = collar_based.fscore(scores, GROUND_TRUTH, threshold, onset_collar=0.2, offset_collar=0.2, offset_collar_rate=0.2)
    return float(f["macro_average"])


def noisy(scale: float, seed: int) -> list[np.ndarray]:
    """Events at ``scale`` with noise below it, two decimals: a real trade-off between hits and false alarms."""
    rng = np.random.default_rng(seed)
    return [np.round(M.smooth((p * 0.5 + rng.random(p.shape) * 0.45) * scale, 3), 2) for p in perfect_probs(("c1", "dog", 0.5))]


def test_the_chosen_threshold_has_the_library_f1_and_no_candidate_beats_it():
    scores = tables(noisy(1.0, 0))
    chosen = C.choose_threshold(scores, GROUND_TRUTH)
    assert chosen.f1 == pytest.approx(library_f1(scores, chosen.threshold), abs=1e-12)
    assert 0 < chosen.f1 < 1
    assert 10 < len(chosen.candidates) < 250 and np.all(np.diff(chosen.candidates) > 0)
    for t, f in zip(chosen.candidates, chosen.candidate_f1):
        assert f == pytest.approx(library_f1(scores, float(t)), abs=1e-12), t  # every candidate read as the library reads it
        assert f <= chosen.f1
    for t in np.linspace(0.0, 1.0, 41):  # and thresholds that are no candidate
        assert library_f1(scores, float(t)) <= chosen.f1 + 1e-12, t
    assert chosen.threshold == chosen.candidates[np.argmax(chosen.candidate_f1)]


def test_at_or_above_and_above_the_threshold_score_alike():
    """``score >= t`` (detect) scores as ``score > t`` (sed_scores_eval): no statistics change at a candidate."""
    scores = tables(noisy(1.0, 1))
    chosen = C.choose_threshold(scores, GROUND_TRUTH)
    for t in [chosen.threshold, *chosen.candidates[::7]]:
        assert library_f1(scores, float(np.nextafter(t, -np.inf))) == library_f1(scores, float(t)), t


def test_probabilities_all_below_one_half_still_find_their_threshold():
    probs = [p * 0.3 for p in perfect_probs()]  # events at 0.3, silence at 0: nothing reaches 0.5
    scores = tables(probs)
    assert library_f1(scores, 0.5) == 0.0
    chosen = C.choose_threshold(scores, GROUND_TRUTH)
    assert 0.0 < chosen.threshold < 0.3
    assert chosen.f1 == pytest.approx(1.0) and library_f1(scores, chosen.threshold) == pytest.approx(1.0)


def test_too_many_candidates_keeps_quantiles_and_each_class_best():
    from sed_scores_eval.base_modules.precision_recall import best_fscore_from_intermediate_statistics

    scores = tables(noisy(1.0, 2))
    stats = M.collar_statistics(scores, GROUND_TRUTH)
    few = C.candidate_thresholds(stats, max_candidates=8)
    _, _, _, own, _ = best_fscore_from_intermediate_statistics(stats)
    assert len(few) <= 8 + len(CLASSES)
    assert set(np.round([t for t in own.values() if np.isfinite(t)], 12)) <= set(np.round(few, 12))
    chosen = C.choose_threshold(scores, GROUND_TRUTH, max_candidates=8)
    assert chosen.f1 == pytest.approx(library_f1(scores, chosen.threshold), abs=1e-12)


def test_collar_statistics_summed_a_clip_at_a_time_equal_the_librarys_to_the_last_bit():
    scores = tables(noisy(1.0, 3))
    want, _ = collar_based.accumulated_intermediate_statistics(
        scores, GROUND_TRUTH, onset_collar=0.2, offset_collar=0.2, offset_collar_rate=0.2
    )
    got = M.collar_statistics(scores, GROUND_TRUTH, clips_per_part=1)
    assert got.keys() == want.keys()
    for c, (cps, stats) in want.items():
        np.testing.assert_array_equal(got[c][0], cps)
        assert got[c][1].keys() == stats.keys()
        for k, v in stats.items():
            np.testing.assert_array_equal(got[c][1][k], v, err_msg=f"{c} {k}")


def test_lazy_tables_are_the_filtered_tables_and_choose_the_same_threshold():
    probs = noisy(0.9, 4)
    lazy = M.lazy_score_dataframes(IDS, [GRID] * len(IDS), probs, CLASSES, frames=5)
    eager = tables([M.smooth(p, 5) for p in probs])
    assert sorted(lazy.keys()) == sorted(eager)
    for i in IDS:
        pd.testing.assert_frame_equal(lazy[i], eager[i])
    a, b = C.choose_threshold(lazy, GROUND_TRUTH), C.choose_threshold(eager, GROUND_TRUTH)
    assert (a.threshold, a.f1) == (b.threshold, b.f1) and np.array_equal(a.candidate_f1, b.candidate_f1)


def test_threshold_setting_number_checkpoint_and_fallback(tmp_path):
    from trainer import checkpoint

    assert C.threshold_setting(0.3, tmp_path / "absent.pt") == (0.3, "evaluate.f1_threshold", None)
    old = tmp_path / "old.pt"  # a checkpoint written before calibration existed
    torch.save(
        {"model": {}, "step": 7, "epoch": 1, "batches_in_epoch": 0, "torch_rng": torch.get_rng_state(), "config": {"train": {}}},
        old,
    )
    warned: list[str] = []
    t, source, stored = C.threshold_setting("checkpoint", old, warn=warned.append)
    assert (t, stored) == (0.5, None) and "fallback 0.5" in source and len(warned) == 1 and str(old) in warned[0]
    checkpoint.store_entry(old, "calibration", {"threshold": np.float64(0.123), "valid_f1": 0.4, "split": "valid"})
    t, source, stored = C.threshold_setting("checkpoint", old, warn=warned.append)
    assert t == 0.123 and "valid split" in source and stored["valid_f1"] == 0.4 and len(warned) == 1
    assert C.threshold_setting(None, old, "--threshold", warn=warned.append)[0] == 0.123


def test_f1_threshold_param_takes_checkpoint_or_a_probability(tmp_path):
    from pipeline.config.params import ParamsError
    from trainer.config import load_params

    path = tmp_path / "params.yaml"
    path.write_text("{}\n")
    assert load_params(path).evaluate.f1_threshold == "checkpoint"
    assert load_params(path, {"evaluate": {"f1_threshold": 0.3}}).evaluate.f1_threshold == 0.3
    assert load_params(path, {"evaluate": {"f1_threshold": 1}}).evaluate.f1_threshold == 1.0
    for bad in ("calibrated", 1.5, -0.1):
        with pytest.raises(ParamsError, match="evaluate.f1_threshold"):
            load_params(path, {"evaluate": {"f1_threshold": bad}})
