"""The real DVC pipeline, end to end, on a small embedded corpus, in git as a user has it:
repro, the default views, experiments, metrics and params diffs; and the README's commands."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    return dict(os.environ, DVC_NO_ANALYTICS="1", PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")


def _dvc(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, env=_env(), check=True, capture_output=True, timeout=60)


STAGES = {"corpus", "clip", "ambience", "mix", "captions", "clusters", "shards", "pretrain", "train", "evaluate"}
METRICS = {"models/pretrain/metrics.json", "models/finelap/metrics.json", "models/finelap/evaluation/metrics.json"}


def test_dvc_repro_runs_every_stage_to_valid_shards(tmp_path: Path) -> None:
    work = tmp_path / "project"
    work.mkdir()
    for name in ("dvc.yaml", "params.yaml", ".gitignore", ".dvcignore"):
        shutil.copy(ROOT / name, work / name)
    for package in ("pipeline", "trainer", "sedsynth", "benchmarks"):
        shutil.copytree(ROOT / package, work / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "configs", work / "configs")
    params = yaml.safe_load((work / "params.yaml").read_text())
    params["compute"]["workers"] = (
        1  # tiny data: no cluster to boot per stage (the lock test runs the default's 2 workers under DVC)
    )
    params["corpus"]["fsd50k_clips"] = 60
    params["corpus"]["ambience_recordings"] = 8
    params["clip"]["plot_examples"] = 2
    params["mix"]["mixtures"] = {"train": 12, "valid": 3, "test": 3}
    params["mix"]["event_split"] = "random"  # 60 clips leave too few FSD50K val/eval clips for 5-event mixtures
    params["mix"]["spec"] = {"events_per_mixture": ["choose", [1, 2, 3]]}
    params["mix"]["export"]["timelines"] = 1
    params["pretrain"].update(steps=3, batch_size=2, crop_s=1.0, warmup_steps=1)
    params["train"]["data"].update(batch_size=4, num_workers=0, piece_rows=4)
    params["train"]["model"].update(embed_dim=32, adapter_ffn=64)
    params["train"]["optim"].update(epochs=2, warmup_steps=2)
    params["evaluate"]["pictures"] = 1
    params["evaluate"]["probe_steps"] = 50  # tiny data: a few steps fit the probes
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    _git(work, "init", "-q")
    _git(work, "config", "user.name", "sedsynth test")
    _git(work, "config", "user.email", "test@sedsynth.invalid")
    assert _dvc(work, "init", "-q").returncode == 0
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", "project")

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
    assert (evaluation / "plots" / "psds1_roc_trained.csv").exists() and len(
        list((evaluation / "details" / "pictures").glob("*.png"))
    ) == 1
    assert not (work / "models" / "ablations").exists(), "the ablations are not part of the default repro"
    assert json.loads((work / "models" / "pretrain" / "metrics.json").read_text())["steps"] == 3
    assert (work / "models" / "pretrain" / "checkpoints" / "encoder.pt").exists()

    again = _dvc(work, "repro")
    assert again.returncode == 0 and "didn't change" in again.stdout + again.stderr
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", "pipeline run")
    assert not subprocess.run(["git", "ls-files", "data", "models"], cwd=work, capture_output=True, text=True).stdout, (
        "no generated file is in git: DVC caches them all, dvc.lock names them"
    )
    _check_default_views(work)
    _check_experiments(work, scores)


def _check_default_views(work: Path) -> None:
    """dvc status, dag and metrics show list the default pipeline only, without warnings."""
    status = _dvc(work, "status")
    assert status.returncode == 0 and not status.stderr, status.stderr
    assert "up to date" in status.stdout, status.stdout
    dag = _dvc(work, "dag", "--md")
    assert dag.returncode == 0 and not dag.stderr, dag.stderr
    assert set(re.findall(r'node\d+\["(.+?)"\]', dag.stdout)) == STAGES, dag.stdout
    shown = _dvc(work, "metrics", "show", "--json")
    assert shown.returncode == 0 and not shown.stderr, shown.stderr
    assert set(json.loads(shown.stdout)[""]["data"]) == METRICS


def _check_experiments(work: Path, baseline: dict) -> None:
    """An experiment re-runs what its params touch and carries its metrics; the ablations queue as experiments."""
    run = _dvc(work, "exp", "run", "-n", "f1-low", "-S", "evaluate.f1_threshold=0.3")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "'evaluate'" in run.stdout and "Running stage 'train'" not in run.stdout, run.stdout
    shown = _dvc(work, "exp", "show", "--json")
    assert shown.returncode == 0, shown.stderr
    commit = next(row for row in json.loads(shown.stdout) if row["rev"] != "workspace")
    rows = {"baseline": commit["data"], **{r["name"]: r["data"] for e in commit["experiments"] for r in e["revs"]}}
    for name, data in rows.items():
        assert set(data["metrics"]) == METRICS, name
        assert all(m.get("data") and not m.get("error") for m in data["metrics"].values()), (name, data["metrics"])
    evaluated = json.loads((work / "models" / "finelap" / "evaluation" / "metrics.json").read_text())
    assert rows["f1-low"]["metrics"]["models/finelap/evaluation/metrics.json"]["data"]["test"] == evaluated["test"]
    assert rows["baseline"]["metrics"]["models/finelap/evaluation/metrics.json"]["data"]["test"] == baseline["test"]
    assert rows["f1-low"]["params"]["params.yaml"]["data"]["evaluate"]["f1_threshold"] == 0.3

    params_diff = _dvc(work, "params", "diff", "--json")
    changed = json.loads(params_diff.stdout)
    assert list(changed["params.yaml"]) == ["evaluate.f1_threshold"], changed
    assert (changed["params.yaml"]["evaluate.f1_threshold"]["old"], changed["params.yaml"]["evaluate.f1_threshold"]["new"]) == (
        "checkpoint",
        0.3,
    )
    metrics_diff = json.loads(_dvc(work, "metrics", "diff", "--json", "--all").stdout)["models/finelap/evaluation/metrics.json"]
    f1 = {k: v for k, v in metrics_diff.items() if k.startswith("test.trained.") and "f1" in k}
    assert f1 and all(v["old"] is not None and v["new"] is not None for v in f1.values()), metrics_diff

    from trainer import ablations
    from trainer.config import load_params

    params = load_params(work / "params.yaml")
    read = ablations.experiment_metrics(params, work)["f1-low"]  # the table's metrics: test.trained and the encoder's probes
    assert read == ablations.run_metrics(evaluated) and read.items() >= evaluated["test"]["trained"].items()
    assert "probe_frame_auroc" in read
    queued = subprocess.run(
        [sys.executable, "-m", "sedsynth", "ablate", "--queue", "no_frame_loss", "--seed", "1235"],
        cwd=work,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert queued.returncode == 0, queued.stdout + queued.stderr
    status = _dvc(work, "queue", "status")
    assert re.search(r"no_frame_loss-s1235\s+.*Queued", status.stdout), status.stdout


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci in (ROOT / "README.md").read_text(), "the README's test command and .ci/run agree"
