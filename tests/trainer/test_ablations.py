"""The ablations with several seeds per variant: run folders, experiment names, and the mean/range table.

No training here: runs are stood in for by fake ``metrics.json`` files.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from pipeline.config.params import ParamsError
from tests.conftest import ROOT
from trainer import ablations
from trainer.config import Params, load_params

SEEDS = (1234, 1235, 1236)


def _metrics(**changes) -> dict:
    m = {"psds1": 0.2, "psds2": 0.4, "auroc": 0.9, "alignment": 0.5, "t2a_r1": 0.3, "a2t_r1": 0.35, "zero_shot_accuracy": 0.5}
    return m | changes


def _write(path: Path, metrics: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.json").write_text(json.dumps({"test": {"trained": metrics, "untrained": {"psds1": 0.0}}}))


def _write_seed(out: Path, variant: str, seed: int, **changes) -> None:
    _write(ablations.run_dir(out, variant, seed) / "evaluation", _metrics(**changes))


def _all_variants(out: Path, seeds=SEEDS, **changes) -> None:
    for v in ablations.VARIANTS:
        for seed in seeds:
            _write_seed(out, v, seed, **changes)


def _rows(out: Path) -> dict[str, dict]:
    with (out / "table.csv").open() as f:
        return {r["variant"]: r for r in csv.DictReader(f)}


def _md_row(text: str, name: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| {name}"))
    return [cell.strip() for cell in line.strip("|").split("|")]


# --------------------------------------------------------------------------- seeds: folders, params, experiments


def test_default_seeds_are_three_and_params_yaml_agrees():
    assert Params().ablations.seeds == SEEDS
    assert load_params(ROOT / "params.yaml").ablations.seeds == SEEDS


@pytest.mark.parametrize("seeds", [[], [5, 5], [-1]])
def test_bad_seed_lists_are_refused_naming_the_key(seeds):
    with pytest.raises(ParamsError, match="ablations.seeds"):
        load_params(ROOT / "params.yaml", {"ablations": {"seeds": seeds}})


def test_each_seed_runs_in_its_own_folder_with_its_seed():
    base = Params()
    made = [ablations.variant_params(base, "infonce", s) for s in SEEDS]
    assert [p.seed for p in made] == list(SEEDS)
    assert [p.train.out_dir for p in made] == [f"models/ablations/infonce/seed{s}" for s in SEEDS]
    assert [p.evaluate.out_dir for p in made] == [f"models/ablations/infonce/seed{s}/evaluation" for s in SEEDS]
    assert all(p.train.loss.clip == "infonce" for p in made)
    with pytest.raises(ValueError, match="seed -3"):
        ablations.variant_params(base, "infonce", -3)


def test_each_seed_is_its_own_experiment_with_its_seed(monkeypatch):
    calls = []

    def fake_dvc(*args, cwd="."):
        calls.append(args)
        return subprocess.CompletedProcess(args, 0, stdout="[]", stderr="")

    monkeypatch.setattr(ablations, "_dvc", fake_dvc)
    base = Params()
    settings = [ablations.experiment_settings(base, "no_clip_loss", s) for s in SEEDS]
    assert [[x for x in one if x.startswith("seed=")] for one in settings] == [[f"seed={s}"] for s in SEEDS]
    assert all("train.loss.clip_weight=0.0" in one for one in settings)

    outcome = ablations.queue_experiments(base, ["full", "no_clip_loss"])
    names = [f"{v}-s{s}" for v in ("full", "no_clip_loss") for s in SEEDS]
    assert outcome == dict.fromkeys(names, "queued")
    queued = [c for c in calls if c[:2] == ("exp", "run")]
    assert [c[c.index("-n") + 1] for c in queued] == names
    assert [c[c.index("seed=" + c[c.index("-n") + 1].rsplit("-s", 1)[1]) - 1] for c in queued] == ["-S"] * len(names)

    calls.clear()
    assert list(ablations.queue_experiments(base, ["full"], seeds=[1235])) == ["full-s1235"]
    assert len([c for c in calls if c[:2] == ("exp", "run")]) == 1


def test_an_existing_seed_experiment_is_left_and_the_others_queued(monkeypatch, capsys):
    monkeypatch.setattr(ablations, "experiment_metrics", lambda params, repo=".": {"full-s1235": _metrics()})
    monkeypatch.setattr(ablations, "_dvc", lambda *a, cwd=".": subprocess.CompletedProcess(a, 0, "", ""))
    outcome = ablations.queue_experiments(Params(), ["full"])
    assert outcome == {"full-s1234": "queued", "full-s1235": "exists", "full-s1236": "queued"}
    assert "dvc exp remove full-s1235" in capsys.readouterr().err


def test_a_variant_runs_the_stages_it_is_given_on_its_own_params():
    calls = []
    summary = ablations.run_variant(
        Params(),
        "infonce",
        1235,
        train=lambda p: calls.append(("train", p)),
        evaluate=lambda p: calls.append(("evaluate", p)) or {"test": {}},
    )
    assert summary == {"test": {}} and [what for what, _ in calls] == ["train", "evaluate"]
    assert all(p == ablations.variant_params(Params(), "infonce", 1235) for _, p in calls)


def test_score_only_evaluates_the_runs_checkpoint_and_names_the_run_to_make_without_one(tmp_path):
    params = dataclasses.replace(Params(), ablations=dataclasses.replace(Params().ablations, out_dir=str(tmp_path)))
    seen = []
    with pytest.raises(FileNotFoundError, match="sedsynth ablate infonce --seed 1235"):
        ablations.run_variant(params, "infonce", 1235, train=None, evaluate=seen.append)
    assert seen == []
    checkpoint = Path(ablations.variant_params(params, "infonce", 1235).evaluate.checkpoint)
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"weights")
    ablations.run_variant(params, "infonce", 1235, train=None, evaluate=lambda p: seen.append(p) or {})
    assert seen == [ablations.variant_params(params, "infonce", 1235)] and checkpoint.read_bytes() == b"weights"


# --------------------------------------------------------------------------- the table: mean and range over seeds


def test_table_gives_mean_and_range_over_the_seeds(tmp_path):
    _all_variants(tmp_path)
    for seed, value in zip(SEEDS, (0.29, 0.31, 0.33)):
        _write_seed(tmp_path, "full", seed, psds1=value, t2a_r1=value)
    text = ablations.write_table(tmp_path)
    full = _md_row(text, "FineLAP (Ours)")
    assert full[0] == "FineLAP (Ours)", "all seeds done: no n"
    assert full[1] == "31.0 (29.0-33.0)" and full[3] == "0.310 (0.290-0.330)"
    assert _md_row(text, "FineLAP-InfoNCE")[3] == "0.200 (0.200-0.200)"
    rows = _rows(tmp_path)
    assert float(rows["full"]["PSDS1 mean"]) == pytest.approx(0.31)
    assert (float(rows["full"]["PSDS1 min"]), float(rows["full"]["PSDS1 max"])) == pytest.approx((0.29, 0.33))
    assert rows["full"]["PSDS1 n"] == "3" and rows["full"]["n"] == "3" and rows["full"]["seeds"] == "1234 1235 1236"
    assert float(rows["full"]["T2A R@1 max"]) == pytest.approx(33.0)
    assert rows["full"]["source"].count("/seed") == 3


def test_alpha_st_0_psds1_is_a_column_only_when_the_metrics_have_it(tmp_path):
    _all_variants(tmp_path)
    ablations.write_table(tmp_path)
    assert not any(key.startswith("PSDS1 (alpha_st 0)") for key in _rows(tmp_path)["full"])
    _all_variants(tmp_path, **{ablations.PSDS1_ALPHA_ST0_KEY: 0.5, "some_new_metric": 1.0})
    text = ablations.write_table(tmp_path)
    head = [cell.strip() for cell in text.splitlines()[0].strip("|").split("|")]
    assert head[3:5] == ["PSDS1", "PSDS1 (alpha_st 0)"]
    assert _md_row(text, "FineLAP (Ours)")[4] == "0.500 (0.500-0.500)"
    assert float(_rows(tmp_path)["full"]["PSDS1 (alpha_st 0) mean"]) == pytest.approx(0.5)
    assert "PSDS1 (alpha_st 0) =" in text and "alpha_st 1" in text


def test_overlapping_ranges_are_within_noise_and_apart_ones_a_direction(tmp_path):
    _all_variants(tmp_path)
    for seed, full, frame in zip(SEEDS, (0.30, 0.32, 0.34), (0.26, 0.31, 0.28)):  # ranges overlap at 0.30-0.31
        _write_seed(tmp_path, "full", seed, psds1=full, auroc=0.9)
        _write_seed(tmp_path, "no_frame_loss", seed, psds1=frame, auroc=0.6 + seed % 2 * 0.01)
    text = ablations.write_table(tmp_path)
    frame = next(line for line in text.splitlines() if line.startswith("- w/o Frame-level Loss"))
    assert f"PSDS1 {ablations.WITHIN_NOISE} (paper down);" in frame, frame
    assert "AUROC down;" in frame, frame
    assert "within noise: the variant's range over its seeds overlaps the full model's" in text


def test_missing_seeds_show_how_many_ran(tmp_path):
    _all_variants(tmp_path)
    for seed in SEEDS[1:]:
        (ablations.run_dir(tmp_path, "shared_projector", seed) / "evaluation" / "metrics.json").unlink()
    _write_seed(tmp_path, "infonce", SEEDS[2], **{ablations.PSDS1_ALPHA_ST0_KEY: 0.4})  # a metric only one run has
    text = ablations.write_table(tmp_path)
    row = _md_row(text, "w/o Decoupled Projector")
    assert row[0] == "w/o Decoupled Projector (n=1/3)" and row[3] == "0.200"
    assert _md_row(text, "FineLAP-InfoNCE")[4] == "0.400 n=1"
    rows = _rows(tmp_path)
    assert (rows["shared_projector"]["n"], rows["shared_projector"]["n planned"], rows["shared_projector"]["seeds"]) == (
        "1",
        "3",
        "1234",
    )
    assert rows["full"]["n"] == "3"


def test_a_variant_with_no_run_means_no_table(tmp_path):
    _all_variants(tmp_path)
    for seed in SEEDS:
        (ablations.run_dir(tmp_path, "infonce", seed) / "evaluation" / "metrics.json").unlink()
    with pytest.raises(FileNotFoundError, match="sedsynth ablate --queue infonce"):
        ablations.write_table(tmp_path)
    assert not (tmp_path / "table.md").exists()


def test_experiments_come_before_folders_seed_by_seed(tmp_path):
    _all_variants(tmp_path)
    experiments = {"full-s1235": _metrics(psds1=0.8), "full": _metrics(psds1=0.0)}  # "full": before seeds, unused here
    ablations.write_table(tmp_path, experiments)
    full = _rows(tmp_path)["full"]
    assert float(full["PSDS1 max"]) == pytest.approx(0.8) and float(full["PSDS1 min"]) == pytest.approx(0.2)
    assert "dvc experiment full-s1235" in full["source"] and full["n"] == "3"


def test_a_variant_folder_from_before_seeds_reads_as_one_seed(tmp_path):
    _all_variants(tmp_path)
    for seed in SEEDS:
        (ablations.run_dir(tmp_path, "no_clip_loss", seed) / "evaluation" / "metrics.json").unlink()
    _write(tmp_path / "no_clip_loss" / "evaluation", _metrics(psds1=0.7))
    text = ablations.write_table(tmp_path)
    row = _md_row(text, "w/o Clip-level Loss")
    assert row[0] == "w/o Clip-level Loss (n=1/3)" and row[3] == "0.700"
    rows = _rows(tmp_path)
    assert rows["no_clip_loss"]["seeds"] == ablations.BEFORE_SEEDS
    assert rows["no_clip_loss"]["source"].endswith("no_clip_loss/evaluation/metrics.json")
    _write_seed(tmp_path, "no_clip_loss", 1236, psds1=0.1)  # a run with a seed: the folder of before seeds is no longer read
    ablations.write_table(tmp_path)
    assert _rows(tmp_path)["no_clip_loss"]["seeds"] == "1236"
    assert float(_rows(tmp_path)["no_clip_loss"]["PSDS1 mean"]) == pytest.approx(0.1)


def test_seeds_of_the_table_follow_the_params(tmp_path):
    _all_variants(tmp_path, seeds=(7, 8))
    ablations.write_table(tmp_path, seeds=(7, 8))
    assert _rows(tmp_path)["full"]["n planned"] == "2" and _rows(tmp_path)["full"]["seeds"] == "7 8"


def test_direction_is_judged_on_means_and_noise_needs_overlapping_ranges_of_several_seeds():
    S = ablations.Spread
    full = S(0.30, 0.28, 0.32, 3)
    assert ablations.our_direction(S(0.27, 0.25, 0.29, 3), full, 0.01) == ablations.WITHIN_NOISE
    assert ablations.our_direction(S(0.25, 0.24, 0.26, 3), full, 0.01) == "down"
    assert ablations.our_direction(S(0.35, 0.33, 0.37, 3), full, 0.01) == "up"
    assert ablations.our_direction(S(0.305, 0.2, 0.4, 3), full, 0.01) == "="  # means within the tolerance
    assert ablations.our_direction(S(0.25, 0.25, 0.25, 1), S(0.30, 0.30, 0.30, 1), 0.01) == "down"  # one seed each: no range
    assert ablations.our_direction(S(float("nan"), float("nan"), float("nan"), 0), full, 0.01) == "no value"


def test_a_table_of_named_variants_keeps_full_and_says_what_it_leaves_out(tmp_path):
    for v in ("full", "no_frame_loss"):
        for seed in SEEDS:
            _write_seed(tmp_path, v, seed, psds1=0.0 if v == "no_frame_loss" else 0.2)
    with pytest.raises(FileNotFoundError):
        ablations.write_table(tmp_path)  # every variant asked for, three never run
    text = ablations.write_table(tmp_path, variants=["no_frame_loss"])
    assert set(_rows(tmp_path)) == {"full", "no_frame_loss"}
    assert "Not in this table (not asked for): w/o Clip-level Loss" in text
    with pytest.raises(ValueError, match="unknown variant 'nope'"):
        ablations.write_table(tmp_path, variants=["nope"])
