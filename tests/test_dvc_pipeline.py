"""The real DVC pipeline, end to end, on a small embedded corpus; and the README's commands."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _dvc(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, DVC_NO_ANALYTICS="1", PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_dvc_repro_runs_every_stage_to_valid_shards(tmp_path: Path) -> None:
    work = tmp_path / "project"
    work.mkdir()
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / name, work / name)
    shutil.copytree(ROOT / "pipeline", work / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "configs", work / "configs")
    shutil.copytree(ROOT / "trainer", work / "trainer", ignore=shutil.ignore_patterns("__pycache__"))
    params = yaml.safe_load((work / "params.yaml").read_text())
    params["corpus"]["fsd50k_clips"] = 60
    params["corpus"]["ambience_recordings"] = 8
    params["clip"]["plot_examples"] = 2
    params["mix"]["mixtures"] = {"train": 12, "valid": 3, "test": 3}
    params["mix"]["event_split"] = "random"  # 60 clips leave too few FSD50K val/eval clips for 5-event mixtures
    params["mix"]["spec"] = {"events_per_mixture": ["choose", [1, 2, 3]]}
    params["mix"]["export"]["timelines"] = 1
    params["train"]["data"].update(batch_size=4, num_workers=0, piece_rows=4)
    params["train"]["model"].update(embed_dim=32, adapter_ffn=64)
    params["train"]["optim"].update(epochs=2, warmup_steps=2)
    params["evaluate"]["pictures"] = 1
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert _dvc(work, "init", "--no-scm", "-q").returncode == 0

    first = _dvc(work, "repro")
    assert first.returncode == 0, first.stdout + first.stderr
    events = work / "data" / "events"
    backgrounds = work / "data" / "backgrounds"
    clips = pq.read_table(events / "manifest.parquet")
    segments = pq.read_table(backgrounds / "manifest.parquet")
    assert clips.num_rows > 10 and segments.num_rows > 3
    assert len(list((events / "audio").glob("*.flac"))) == clips.num_rows
    assert len(list((backgrounds / "audio").glob("*.flac"))) == segments.num_rows
    summary = json.loads((events / "summary.json").read_text())
    assert summary["skipped_by_reason"].get("multi-label", 0) > 0, "the corpus has multi-label clips to exclude"
    assert json.loads((backgrounds / "summary.json").read_text())["skipped_by_reason"].get("filtered-category", 0) > 0
    mixtures = work / "data" / "mixtures"
    assert pq.read_table(mixtures / "mixtures.parquet").num_rows == 18
    assert len(list((mixtures / "audio").rglob("*.flac"))) == 18
    for split in ("train", "valid", "test"):
        assert (mixtures / "metadata" / split / "events.tsv").exists()
    assert (work / "dvc.lock").exists()
    dataset = work / "data" / "dataset"
    index = json.loads((dataset / "index.json").read_text())
    assert {s: v["num_rows"] for s, v in index["splits"].items()} == {"train": 12, "valid": 3, "test": 3}
    from pipeline.shards.validate import validate

    assert validate(dataset, decode=True)["rows"] == 18
    metrics = json.loads((work / "models" / "finelap" / "metrics.json").read_text())
    assert metrics["steps"] == 6 and metrics["epochs"] == 2
    assert (work / "models" / "finelap" / "checkpoints" / "latest.pt").exists()
    assert [r["epoch"] for r in csv.DictReader((work / "models" / "finelap" / "valid_log.csv").open())] == ["0", "1", "2"]
    evaluation = work / "models" / "finelap" / "evaluation"
    scores = json.loads((evaluation / "metrics.json").read_text())
    assert set(scores["test"]) == {"trained", "untrained", "gain"} and scores["test"]["trained"]["clips"] == 3
    assert len(list((evaluation / "details" / "test" / "scores" / "trained").glob("*.tsv"))) == 3
    assert (evaluation / "plots" / "psds1_roc_trained.csv").exists() and len(list((evaluation / "details" / "pictures").glob("*.png"))) == 1
    assert not (work / "models" / "ablations").exists(), "the ablations are not part of the default repro"

    again = _dvc(work, "repro")
    assert again.returncode == 0 and "didn't change" in again.stdout + again.stderr


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci in (ROOT / "README.md").read_text(), "the README's test command and .ci/run agree"
