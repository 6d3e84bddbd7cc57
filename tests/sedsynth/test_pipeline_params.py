"""``sedsynth pipeline`` checks every stage's params, the data stages' and the trainer's, before its first
stage runs: a bad value stops it at once in one line naming the key, with exit status 2."""

from __future__ import annotations

import pytest

import sedsynth.cli as cli
from sedsynth import PIPELINE
from tests.conftest import ROOT

PARAMS = ROOT / "params.yaml"


@pytest.fixture
def ran(monkeypatch) -> list[str]:
    """The stages the pipeline runs, in order; each stands in for the real one and does nothing."""
    names: list[str] = []
    for name in PIPELINE:
        monkeypatch.setattr(cli.COMMANDS[name].target.replace(":", "."), lambda params, name=name: names.append(name) or {})
    return names


@pytest.mark.parametrize(
    "setting, key",
    [
        ("train.optim.lr=.nan", "train.optim.lr"),
        ("train.optim.epochs=0", "train.optim.epochs"),
        ("evaluate.device=tpu", "evaluate.device"),
        ("pretrain.crop_s=100000", "pretrain.crop_s"),
        ("shards.shard_size_mb=0", "shards.shard_size_mb"),
        ("clip.min_duration_s=9", "clip.min_duration_s"),
    ],
)
def test_a_bad_param_of_any_stage_stops_the_pipeline_before_its_first_stage(ran, capsys, setting: str, key: str) -> None:
    assert cli.main(["pipeline", "--params", str(PARAMS), "--set", setting]) == 2
    out, err = capsys.readouterr()
    assert ran == [] and "pipeline:" not in out
    assert err.startswith(f"sedsynth pipeline: error: params: '{key}'") and err.count("\n") == 1
    assert cli.main(["pipeline", "--params", str(PARAMS)]) == 0  # without it, every stage runs in order
    assert ran == list(PIPELINE) and f"pipeline: {len(PIPELINE)} stages in " in capsys.readouterr().out


@pytest.mark.parametrize(
    "setting, key",
    [
        ("evaluate.out_dir=/", "evaluate.out_dir"),
        ("train.out_dir=data/dataset", "train.out_dir"),
        ("pretrain.out_dir=data/events", "pretrain.out_dir"),
    ],
)
def test_a_training_stages_bad_output_folder_stops_the_pipeline_before_its_first_stage(
    ran, capsys, setting: str, key: str
) -> None:
    assert cli.main(["pipeline", "--params", str(PARAMS), "--set", setting]) == 2
    out, err = capsys.readouterr()
    assert ran == [] and "pipeline:" not in out
    assert err.startswith(f"sedsynth pipeline: error: {key} is ") and err.count("\n") == 1
