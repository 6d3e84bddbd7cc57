"""The training loop across processes and interruptions: exactly ``optim.epochs`` epochs whatever the
loader workers, a run killed after a checkpoint that resumes to the logs and metrics of a straight
run, DDP told about the parameters an ablation leaves idle, and two ranks under torchrun (each
ablation; a held-out split scored as one process scores it; SIGTERM; a resume)."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import ROOT, tiny_train_params
from trainer import checkpoint
from trainer.data.stream import collate, make_stream
from trainer.heldout import score
from trainer.model import build_model
from trainer.objective import Objective
from trainer.stages.train import run

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TIMING = ("wall_s", "clips_per_s", "train_clips_per_s")  # the only columns and keys that differ between equal runs


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def leaves(value, path: str = "") -> dict:
    """``value`` (metrics, log rows) as ``{path: leaf}`` without the timing entries, numbers as floats."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() if key not in TIMING for k, v in leaves(item, f"{path}/{key}").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in leaves(item, f"{path}/{i}").items()}
    try:
        return {path: float(value)}
    except (TypeError, ValueError):
        return {path: value}


def assert_same(got, expected, what: str) -> None:
    """``got`` equals ``expected`` but for timing, numbers to 6 significant digits (as the CSV logs hold them)."""
    got, expected = leaves(got), leaves(expected)
    assert sorted(got) == sorted(expected), what
    numbers = [k for k, v in expected.items() if isinstance(v, float)]
    assert {k: got[k] for k in numbers} == pytest.approx({k: expected[k] for k in numbers}, rel=1e-5, nan_ok=True), what
    assert {k: got[k] for k in expected if k not in numbers} == {k: v for k, v in expected.items() if k not in numbers}, what


def with_changes(params, out: Path, batch_size: int = 4, num_workers: int = 0, epochs: int = 2, **train_changes):
    """``params`` training into ``out`` on one torch thread, with these data and epochs settings."""
    t = params.train
    return replace(
        params,
        train=replace(
            t,
            out_dir=str(out),
            threads=1,
            **train_changes,
            data=replace(t.data, batch_size=batch_size, num_workers=num_workers),
            optim=replace(t.optim, epochs=epochs),
        ),
    )


def test_a_run_logs_exactly_its_epochs_whatever_the_loader_workers(shard_folder, tmp_path):
    params, folder = shard_folder
    # two workers share 20 clips as 10 + 10 in epoch 0 and 9 + 9 (and 2 left for later) in epoch 1:
    # batches of 5 make 4 steps, then 2; a schedule of twice epoch 0's length ran a third epoch
    p = with_changes(tiny_train_params(params, folder, tmp_path), tmp_path / "run", batch_size=5, num_workers=2)
    summary = run(p)
    assert summary["epochs"] == 2 and summary["steps"] == 6
    assert [int(r["epoch"]) for r in read_csv(tmp_path / "run" / "valid_log.csv")] == [0, 1, 2]
    assert [(int(r["step"]), int(r["epoch"])) for r in read_csv(tmp_path / "run" / "train_log.csv")] == [
        (1, 0),
        (2, 0),
        (3, 0),
        (4, 0),
        (5, 1),
        (6, 1),
    ]


class Killed(Exception):
    """Stands for kill -9 right after a checkpoint: nothing the run holds in memory reaches the disk."""


def test_a_run_killed_after_a_checkpoint_resumes_to_the_logs_of_a_straight_run(shard_folder, tmp_path, monkeypatch):
    params, folder = shard_folder

    def config(out):  # two epochs of 5 steps, latest.pt every 3 steps
        return with_changes(tiny_train_params(params, folder, out), out, checkpoint_every_steps=3)

    straight = run(config(tmp_path / "straight"))
    assert straight["epochs"] == 2 and straight["steps"] == 10  # 5 steps per epoch

    stopped = tmp_path / "stopped"
    save = checkpoint.save

    def save_then_die(path, *args, **kwargs):
        save(path, *args, **kwargs)
        if path.name == "latest.pt" and kwargs["step"] == 3:  # step 3, mid-epoch 0
            raise Killed

    monkeypatch.setattr(checkpoint, "save", save_then_die)
    with pytest.raises(Killed):
        run(config(stopped))
    monkeypatch.setattr(checkpoint, "save", save)
    # a killed writer's temporaries (earlier and present names; as large as the checkpoint) go at the rerun
    left = [
        stopped / "checkpoints" / ".latest.pt.tmp-999999999",  # no such process
        stopped / "checkpoints" / f".latest.pt.{os.getpid()}.0123456789abcdef.tmp",
    ]  # this id, given again to a restarted job
    for path in left:
        path.write_bytes(b"partial")
    resumed = run(config(stopped))

    assert not any(path.exists() for path in left)
    for name in ("train_log.csv", "valid_log.csv", "skipped.csv"):
        assert_same(read_csv(stopped / name), read_csv(tmp_path / "straight" / name), name)
    for summary, out in ((straight, tmp_path / "straight"), (resumed, stopped)):
        assert json.loads((out / "metrics.json").read_text()) == json.loads(json.dumps(summary))
    assert_same(resumed, straight, "metrics.json")
    assert resumed["untrained"]["epoch"] == 0


@pytest.mark.parametrize(
    "loss, model",
    [
        ({}, {}),
        ({"clip_weight": 0.0}, {}),  # FineLAP w/o clip-level loss: the clip projector is idle
        ({"frame_weight": 0.0}, {}),  # w/o frame-level loss: the frame adapter is idle
        ({"clip_weight": 0.0}, {"adapter": "shared"}),  # one projector for both: nothing idle
        ({"frame_weight": 0.0, "region_weight": 1.0}, {}),  # the region loss trains the adapter
        ({}, {"per_text_logits": True}),  # FLAM: per-text scale and bias replace the frame loss's own
        ({"frame_weight": 0.0}, {"per_text_logits": True}),  # ... and without the frame loss, the per-text MLPs idle
    ],
)
def test_the_parameters_ddp_is_told_are_unused_are_those_without_gradient(shard_folder, loss, model):
    params, folder = shard_folder
    p = tiny_train_params(params, folder, Path("unused"))
    t = p.train
    t = replace(t, loss=replace(t.loss, **loss), model=replace(t.model, **model))
    torch.manual_seed(0)
    objective = Objective(build_model(t.model), t.loss)
    stream = make_stream(replace(p, train=t), objective.model.encoder, t.data.sources, shuffle=False)
    batch = collate([item for item, _ in zip(stream, range(4))])
    objective(batch)["loss"].backward()
    no_gradient = [n for n, q in objective.named_parameters() if q.requires_grad and q.grad is None]
    assert objective.unused_parameters() == no_gradient


# ---- two ranks under torchrun

TORCHRUN = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node", "2"]
# `sedsynth train` once per ablation in the same two processes, in one process group (torch cannot
# join a second one in a process), so the imports and the text model are loaded once.
ABLATIONS = """
import sys
from sedsynth.cli import main
from trainer import distributed
params, out = sys.argv[1:]
world = distributed.setup("cpu")
try:
    for name, change in (("no_clip_loss", "train.loss.clip_weight=0"), ("no_frame_loss", "train.loss.frame_weight=0")):
        code = main(["train", "--params", params, "--set", f"train.out_dir={out}/{name}", "--set", change])
        if code:
            raise SystemExit(code)
finally:
    distributed.teardown(world)
"""


def write_params(p, path: Path) -> Path:
    """``p``'s seed and train section as a params file the CLI reads."""
    section = json.loads(json.dumps(dataclasses.asdict(p.train)))  # tuples as lists
    path.write_text(yaml.safe_dump({"seed": p.seed, "train": section}, sort_keys=False))
    return path


def torchrun_params(shard_folder, tmp_path: Path, **train_changes):
    """Two ranks of batch 5 on 2 s crops: epoch 0 has 2 steps, epoch 1 has 1 (each rank's deal is 10, then 9 clips)."""
    params, folder = shard_folder
    p = with_changes(tiny_train_params(params, folder, tmp_path), tmp_path / "out", batch_size=5, **train_changes)
    return replace(p, train=replace(p.train, data=replace(p.train.data, crop_s=2.0)))


def start(args: list[str], log: Path) -> subprocess.Popen:
    """torchrun with ``args``, its output in ``log`` (a file: ranks that outlive torchrun cannot block the test on a pipe)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "w") as f:
        return subprocess.Popen([*TORCHRUN, *args], cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)


def ours(marker: str) -> list:
    """The running processes whose command line names ``marker`` (a test's folder: its torchrun and ranks)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.pid != os.getpid() and any(marker in part for part in proc.info["cmdline"] or []):
            found.append(proc)
    return found


def kill(job: subprocess.Popen, marker: str) -> None:
    """SIGKILL torchrun ``job`` and every rank it started (processes naming ``marker``)."""
    for proc in ours(marker):
        proc.kill()
    job.wait()


def finish(job: subprocess.Popen, log: Path, timeout_s: float) -> tuple[int, str]:
    """The exit code and output of ``job``; it and its ranks are killed if it outlives ``timeout_s``."""
    try:
        job.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill(job, str(log.parent))
        pytest.fail(f"torchrun still running after {timeout_s} s:\n{log.read_text()[-3000:]}")
    return job.returncode, log.read_text()


def test_two_ranks_train_each_ablation(shard_folder, tmp_path):
    p = torchrun_params(shard_folder, tmp_path)  # DDP stopped at the second step when a head had no gradient
    p = replace(p, train=replace(p.train, data=replace(p.train.data, valid=None), optim=replace(p.train.optim, max_steps=2)))
    script = tmp_path / "ablations.py"
    script.write_text(ABLATIONS)
    log = tmp_path / "torchrun.log"
    code, output = finish(
        start([str(script), str(write_params(p, tmp_path / "params.yaml")), str(tmp_path / "out")], log), log, 90
    )
    assert code == 0, output[-3000:]
    for name, term in (("no_clip_loss", "frame"), ("no_frame_loss", "clip")):
        rows = read_csv(tmp_path / "out" / name / "train_log.csv")
        assert [int(r["step"]) for r in rows] == [1, 2] and all(float(r[term]) > 0 for r in rows), name


def test_two_ranks_score_the_held_out_split_stop_on_sigterm_and_resume(shard_folder, tmp_path):
    p = torchrun_params(shard_folder, tmp_path, checkpoint_every_steps=1)
    out, args = Path(p.train.out_dir), ["-m", "sedsynth", "train", "--params", str(write_params(p, tmp_path / "params.yaml"))]

    # SIGTERM to torchrun (as a scheduler sends it) once step 1 is saved: every rank stops, none waits for the others
    log = tmp_path / "torchrun.log"
    job = start(args, log)
    latest = out / "checkpoints" / "latest.pt"
    deadline = time.monotonic() + 60
    while not latest.exists() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if not latest.exists():
        kill(job, str(tmp_path))
        pytest.fail(f"no checkpoint within 60 s (held-out scoring under DDP did not end):\n{log.read_text()[-3000:]}")
    job.send_signal(signal.SIGTERM)
    stopped_at = time.monotonic()
    code, output = finish(job, log, 60)
    # torchrun itself kills a rank that ignores SIGTERM only after 30 s
    assert code != 0 and time.monotonic() - stopped_at < 20 and ours(str(tmp_path)) == [], output[-3000:]
    assert [f.name for f in latest.parent.iterdir() if f.name.startswith(".")] == []  # no checkpoint temporary left
    assert [int(r["epoch"]) for r in read_csv(out / "valid_log.csv")] == [0]  # the untrained scores are on disk

    # the rerun resumes and ends after the two configured epochs, each step and epoch logged once
    code, output = finish(start(args, log), log, 90)
    assert code == 0 and "resuming from" in output, output[-3000:]
    valid = read_csv(out / "valid_log.csv")
    assert [(int(r["epoch"]), int(r["step"])) for r in valid] == [(0, 0), (1, 2), (2, 3)]
    assert [(int(r["step"]), int(r["epoch"])) for r in read_csv(out / "train_log.csv")] == [(1, 0), (2, 0), (3, 1)]
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["epochs"], metrics["steps"], metrics["untrained"]["epoch"]) == (2, 3, 0)

    # the held-out scores are those one process gives the same weights: the initial ones, and latest.pt's
    t = p.train
    torch.manual_seed(p.seed)
    objective = Objective(build_model(t.model), t.loss)
    loader = torch.utils.data.DataLoader(
        make_stream(p, objective.model.encoder, [t.data.valid], shuffle=False), batch_size=5, collate_fn=collate
    )
    for row, weights in ((valid[0], None), (valid[-1], latest)):
        if weights is not None:
            checkpoint.restore(checkpoint.read(weights), objective, restore_rng=False)
        expected = score(objective, loader, torch.device("cpu"), contextlib.nullcontext)
        assert {k: float(row[k]) for k in expected} == pytest.approx(expected, rel=1e-5, abs=1e-6), row["epoch"]
