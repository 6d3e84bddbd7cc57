"""``sedsynth bench train``: the step it times is the loop's step, SAM's second pass included."""

from __future__ import annotations

from dataclasses import replace

import pytest

from benchmarks.train import run
from tests.conftest import tiny_train_params


@pytest.mark.parametrize("sam_rho", [0.0, 0.075])
def test_the_timed_step_takes_sams_second_pass(shard_folder, tmp_path, one_torch_thread, sam_rho):
    params, folder = shard_folder
    p = tiny_train_params(params, folder, tmp_path / "unused")
    p = replace(p, train=replace(p.train, device="cpu", optim=replace(p.train.optim, sam_rho=sam_rho)))
    figures = run(p, rows=8, steps=1)
    step = figures["step"]
    assert step["passes_per_step"] == (2 if sam_rho else 1)
    assert step["step_s"] > 0 and step["gflop_per_step"] > 0
