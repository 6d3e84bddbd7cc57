"""The learning-rate schedule: linear warm-up, then cosine to zero, as the optimizer sees it."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from trainer.optim import lr_lambda


def test_lr_lambda_warmup_then_cosine():
    f = lr_lambda(4, 12)
    assert [f(s) for s in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert f(4) == pytest.approx(1.0)
    assert f(8) == pytest.approx(0.5)
    assert f(6) == pytest.approx(0.5 * (1 + math.cos(math.pi * 2 / 8)))
    assert f(12) == pytest.approx(0.0, abs=1e-12) and f(50) == pytest.approx(0.0, abs=1e-12)
    after = [f(s) for s in range(4, 13)]
    assert all(x >= y for x, y in itertools.pairwise(after))
    # through the scheduler: the lr the optimizer sees
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, f)
    seen = []
    for _ in range(12):
        seen.append(opt.param_groups[0]["lr"])
        opt.step(), sched.step()
    assert seen[:4] == pytest.approx([0.5, 1.0, 1.5, 2.0]) and seen[8] == pytest.approx(1.0)
