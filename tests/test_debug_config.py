"""configs/debug.yaml: ``sedsynth pipeline --overrides configs/debug.yaml`` runs every stage of dvc.yaml, in its
order, on tiny data; each stage writes what dvc.yaml says it writes, all of it under debug/, and evaluate ends
with finite metrics. The run takes about half a minute on two CPU cores."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml

from sedsynth.cli import PIPELINE, main
from tests.conftest import ROOT, debug_params

DEBUG_CONFIG = ROOT / "configs" / "debug.yaml"
DEFAULT_RUN_FOLDERS = ("data/", "models/")


def dvc_stages() -> dict:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]


def resolved(template: str) -> str:
    """A dvc.yaml path (``${clip.out_dir}/summary.json``) with the debug run's params filled in."""

    def value(match: re.Match) -> str:
        node = debug_params()
        for part in match.group(1).split("."):
            node = getattr(node, part)
        return str(node)

    return re.sub(r"\$\{([\w.]+)\}", value, template)


def stage_paths(stage: dict, *kinds: str) -> list[str]:
    """The paths a dvc.yaml stage names through params under ``kinds`` (``outs``, ``metrics``, ``plots``, ``deps``),
    resolved; its code dependencies aside."""
    entries = [
        next(iter(e)) if isinstance(e, dict) else e for kind in kinds for e in stage.get(kind, [])
    ]  # {path: {cache: false}}
    return [resolved(e) for e in entries if "${" in e]


def strings(value) -> list[str]:
    """Every string inside a params section (dataclasses, as dicts)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in strings(v)]
    return []


def test_the_pipeline_is_dvc_yaml_in_its_order():
    stages = dvc_stages()
    assert tuple(stages) == PIPELINE
    assert {name: stage["cmd"] for name, stage in stages.items()} == {name: f"sedsynth {name}" for name in PIPELINE}


def test_every_folder_of_the_debug_run_is_under_debug():
    import dataclasses

    for name, stage in dvc_stages().items():
        paths = stage_paths(stage, "outs", "metrics", "plots", "deps")
        assert paths and all(path.startswith("debug/") for path in paths), (name, paths)
    leftover = [s for s in strings(dataclasses.asdict(debug_params())) if s.startswith(DEFAULT_RUN_FOLDERS)]
    assert not leftover, f"configs/debug.yaml leaves these params on the default run's folders: {leftover}"


@pytest.mark.usefixtures("one_torch_thread")
def test_the_debug_run_goes_through_every_stage(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # its folders are relative: debug/ lands in tmp_path
    assert main(["pipeline", "--params", str(ROOT / "params.yaml"), "--overrides", str(DEBUG_CONFIG)]) == 0
    printed = capsys.readouterr().out
    for name in PIPELINE:
        assert re.search(rf"^pipeline: {name} done in \d+\.\d s$", printed, re.MULTILINE), name
    assert re.search(rf"^pipeline: {len(PIPELINE)} stages in \d+\.\d s$", printed, re.MULTILINE)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["debug"]  # nothing beside it
    for name, stage in dvc_stages().items():
        for path in stage_paths(stage, "outs", "metrics", "plots"):
            assert Path(path).exists(), f"{name} did not write {path}"

    def finite_only(constant: str):
        raise AssertionError(f"metrics.json holds {constant}")

    metrics = json.loads(Path(debug_params().evaluate.out_dir, "metrics.json").read_text(), parse_constant=finite_only)
    numbers = [v for model in ("trained", "untrained") for v in metrics["test"][model].values()]
    assert numbers and all(isinstance(v, (int, float)) and math.isfinite(v) for v in numbers)
    assert metrics["test"]["trained"]["clips"] == debug_params().mix.mixtures.test


def test_the_first_stage_that_fails_stops_the_run_with_its_own_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    clash = "corpus.ambience_dir=debug/sources/fsd50k"  # refused before the first stage writes anything
    assert main(["pipeline", "--params", str(ROOT / "params.yaml"), "--overrides", str(DEBUG_CONFIG), "--set", clash]) == 2
    out, err = capsys.readouterr()
    assert "pipeline:" not in out  # no stage after it ran
    assert err.startswith("sedsynth corpus: error: corpus.fsd50k_dir is debug/sources/fsd50k, which is also corpus.ambience_dir")
    assert len(err.strip().splitlines()) == 1 and not any(tmp_path.iterdir())
