"""A short training run shared by the tests of the loop's outputs and of checkpoints."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.conftest import tiny_train_params
from trainer.stages.train import run


@pytest.fixture(scope="session")
def smoke_run(shard_folder, tmp_path_factory):
    params, folder = shard_folder
    out = tmp_path_factory.mktemp("smoke")
    base = tiny_train_params(params, folder, out)
    p = replace(base, train=replace(base.train, optim=replace(base.train.optim, max_steps=3)))
    summary = run(p)
    return p, out, summary
