"""SAM in the training loop: the loop's step against a SAM step computed by hand (gradient
accumulation and clipping included), two forward passes per step in a real run, the loss at ``w``
logged as a one-pass run logs it, and a resume from a SAM checkpoint."""

from __future__ import annotations

import contextlib
import csv
from dataclasses import dataclass, field, replace

import pytest
import torch
from torch import nn

from tests.conftest import tiny_train_params
from trainer import distributed
from trainer.config import TrainParams
from trainer.logs import CsvLog
from trainer.objective import Objective
from trainer.sam import SAM
from trainer.stages.train import Logs, Setup, run, train_epoch

pytestmark = pytest.mark.usefixtures("one_torch_thread")

A = torch.tensor([[3.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
B = torch.tensor([1.0, -2.0], dtype=torch.float64)
W0 = (0.7, -1.3)


def quadratic(w: torch.Tensor) -> torch.Tensor:
    """L(w) = 1/2 w'Aw - b'w; its gradient is Aw - b."""
    return 0.5 * w @ A @ w - B @ w


class Quadratic(nn.Module):
    """An objective whose loss on a batch is ``batch.scale * L(w)``; counts its forward passes."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(W0, dtype=torch.float64))
        self.calls = 0

    def forward(self, batch) -> dict[str, torch.Tensor]:
        self.calls += 1
        return {"loss": batch.scale * quadratic(self.w)}


@dataclass
class ScaledBatch:
    scale: float
    ids: list[str] = field(default_factory=lambda: ["clip"])
    skips: list = field(default_factory=list)
    sources: list[int] = field(default_factory=lambda: [0])

    def to(self, device):
        return self


class NoStream:
    def set_epoch(self, *args) -> None:
        pass


def one_sam_step(tmp_path, scales: list[float], rho: float, lr: float, clip: float) -> tuple[Quadratic, list[dict]]:
    """The loop's first optimizer step (:func:`train_epoch`) over micro-batches of ``scales`` with SAM around SGD."""
    objective = Quadratic()
    t = TrainParams()
    t = replace(t, log_every_steps=1, optim=replace(t.optim, grad_accum=len(scales), clip_grad_norm=clip, sam_rho=rho))
    optimizer = SAM(torch.optim.SGD(objective.parameters(), lr=lr), rho)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    setup = Setup(
        seed=0,
        train=t,
        world=distributed.World(0, 1, 0, torch.device("cpu")),
        objective=objective,
        stream=NoStream(),
        loader=[ScaledBatch(s) for s in scales],
        valid_loader=None,
        optimizer=optimizer,
        scheduler=scheduler,
        autocast=contextlib.nullcontext,
        total_steps=1,
        config={},
        out=tmp_path,
        passes=2,
    )
    logs = Logs(CsvLog(tmp_path / "train_log.csv"), CsvLog(tmp_path / "valid_log.csv"), _Quiet(), skipped_items=[])
    assert train_epoch(setup, objective, logs, 0, 0, 0, {}) == (1, len(scales), False)
    return objective, logs.train.rows


class _Quiet:
    def update(self, n) -> None:
        pass

    def set_postfix(self, *args, **kwargs) -> None:
        pass


@pytest.mark.parametrize("clip", [0.0, 0.5])
def test_the_loops_step_is_the_hand_computed_sam_step(tmp_path, clip):
    scales, rho, lr = [1.0, 3.0], 0.3, 0.1
    objective, rows = one_sam_step(tmp_path, scales, rho, lr, clip)
    assert objective.calls == 2 * len(scales)  # every micro-batch at w, then again at w + e_w

    w = torch.tensor(W0, dtype=torch.float64)
    mean = sum(scales) / len(scales)  # the accumulated gradient is the micro-batches' mean
    g = mean * (A @ w - B)
    e = rho * g / torch.linalg.norm(g)
    g_adv = mean * (A @ (w + e) - B)
    if clip:  # only the applied gradient (the one at w + e_w) is clipped, as clip_grad_norm_ clips (its eps 1e-6)
        g_adv = g_adv * min(1.0, clip / (float(torch.linalg.norm(g_adv)) + 1e-6))
    expected = w - lr * g_adv
    assert objective.w.detach().tolist() == pytest.approx(expected.tolist(), rel=1e-12)
    plain = w - lr * (g * min(1.0, clip / (float(torch.linalg.norm(g)) + 1e-6)) if clip else g)
    assert not torch.allclose(expected, plain)
    # the logged loss is the first pass's (at w) on the last micro-batch; the throughput shows two passes
    assert rows[0]["loss"] == pytest.approx(scales[-1] * float(quadratic(w)))
    assert rows[0]["passes_per_step"] == 2 and rows[0]["clip_passes_per_s"] == pytest.approx(2 * rows[0]["clips_per_s"])


def _rows(out) -> list[dict]:
    with open(out / "train_log.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_a_sam_run_takes_two_passes_per_step_and_resumes(shard_folder, tmp_path, monkeypatch, capsys):
    params, folder = shard_folder
    calls = []
    forward = Objective.forward
    monkeypatch.setattr(Objective, "forward", lambda self, batch: calls.append(1) or forward(self, batch))

    def config(out, max_steps, sam_rho=0.0):
        base = tiny_train_params(params, folder, out)
        t = base.train
        return replace(
            base, train=replace(t, data=replace(t.data, valid=None), optim=replace(t.optim, max_steps=max_steps, sam_rho=sam_rho))
        )

    plain = run(config(tmp_path / "plain", 1))
    assert len(calls) == 1 and "passes_per_step" not in plain
    calls.clear()
    sam = run(config(tmp_path / "sam", 1, sam_rho=0.075))
    assert len(calls) == 2 and sam["passes_per_step"] == 2

    (p_row,), (s_row,) = _rows(tmp_path / "plain"), _rows(tmp_path / "sam")
    # the defaults: the loss terms as they were, one pass, no captioning term
    assert set(p_row) == {
        "step",
        "epoch",
        "lr",
        "clips_per_s",
        "loss",
        "clip",
        "clip_t",
        "clip_b",
        "phrase_clip",
        "phrase_clip_t",
        "phrase_clip_b",
        "frame",
        "frame_t",
        "frame_b",
    }
    w = params.train.loss
    assert float(p_row["loss"]) == pytest.approx(
        w.clip_weight * float(p_row["clip"])
        + w.phrase_clip_weight * float(p_row["phrase_clip"])
        + w.frame_weight * float(p_row["frame"]),
        rel=1e-5,
    )
    # SAM logs the loss at w: the plain run's, on the same batch with the same weights and dropout
    for key in ("loss", "clip", "frame"):
        assert float(s_row[key]) == pytest.approx(float(p_row[key]), rel=1e-6), key
    assert int(s_row["passes_per_step"]) == 2
    assert float(s_row["clip_passes_per_s"]) == pytest.approx(2 * float(s_row["clips_per_s"]), rel=1e-4)
    p_state = torch.load(tmp_path / "plain" / "checkpoints" / "latest.pt", weights_only=True)
    s_state = torch.load(tmp_path / "sam" / "checkpoints" / "latest.pt", weights_only=True)
    assert set(s_state["optimizer"]["state"][0]) == set(p_state["optimizer"]["state"][0])  # AdamW's state dict
    assert any(not torch.equal(v, s_state["model"][k]) for k, v in p_state["model"].items())  # another update

    calls.clear()
    capsys.readouterr()
    summary = run(config(tmp_path / "sam", 2, sam_rho=0.075))
    assert "resuming from" in capsys.readouterr().out
    assert summary["steps"] == 2 and len(calls) == 2
    assert [int(r["step"]) for r in _rows(tmp_path / "sam")] == [1, 2]


def test_optimizer_for_wraps_adamw_in_sam_only_with_a_radius():
    from trainer.optim import optimizer_for, passes_per_step

    module, optim = Quadratic(), TrainParams().optim
    plain = optimizer_for(module, optim)
    assert isinstance(plain, torch.optim.AdamW) and passes_per_step(plain) == 1
    sam = optimizer_for(module, replace(optim, sam_rho=0.075, sam_adaptive=True))
    assert isinstance(sam, SAM) and isinstance(sam.base, torch.optim.AdamW) and (sam.rho, sam.adaptive) == (0.075, True)
    assert passes_per_step(sam) == 2 and sam.param_groups is sam.base.param_groups
