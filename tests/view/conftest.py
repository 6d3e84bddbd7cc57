"""What ``sedsynth view`` is tested on: the session's debug-sized shards and mixtures, a checkpoint and its evaluation.

The shards and mixtures are the session fixtures every other test shares (``shard_folder``,
``mixed``: the real stages at the debug run's sizes). The checkpoint is the tiny debug model at
its initial weights with the frame bias at 0, so its probabilities sit near 0.5 and cross the
0.5 threshold both inside and outside the labelled segments: the evaluation, by the real
evaluate stage on the test split, then has false alarms and misses to list. Nothing is trained,
so the whole set-up takes seconds.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tests.conftest import tiny_train_params


@dataclass(frozen=True)
class ViewData:
    params: object  # the trainer params the evaluation ran with
    shards: Path
    mixtures: Path
    checkpoint: Path
    evaluation: Path


@pytest.fixture(scope="session")
def view_data(shard_folder, mixed, tmp_path_factory) -> ViewData:
    import torch

    from trainer import checkpoint
    from trainer.model import build_model
    from trainer.objective import Objective
    from trainer.stages.evaluate import run as evaluate
    from trainer.stages.train import config_of

    params, folder = shard_folder
    tmp = tmp_path_factory.mktemp("view")
    p = tiny_train_params(params, folder, tmp / "model")
    torch.manual_seed(0)
    objective = Objective(build_model(p.train.model), p.train.loss)
    with torch.no_grad():
        objective.frame_loss.bias.fill_(0.0)
    ckpt = tmp / "best.pt"
    checkpoint.save(ckpt, objective, step=0, epoch=0, batches_in_epoch=0, config=config_of(p))
    checkpoint.store_entry(ckpt, "calibration", {"threshold": 0.5, "median_filter_frames": 3, "split": "valid", "valid_f1": 0.0})
    p = replace(
        p,
        evaluate=replace(
            p.evaluate,
            checkpoint=str(ckpt),
            shards=str(folder),
            event_clips=None,
            untrained=False,
            probes=False,
            caption_metrics=False,
            pictures=0,
            device="cpu",
            out_dir=str(tmp / "evaluation"),
        ),
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model runs fastest on one thread
    try:
        evaluate(p)
    finally:
        torch.set_num_threads(threads)
    return ViewData(p, folder, mixed[1], ckpt, tmp / "evaluation")


def copy_mixtures(source: Path, target: Path) -> Path:
    """A writable copy of a mixtures folder's tables and audio (a test may then plant bad paths in it)."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.png"))
    return target
