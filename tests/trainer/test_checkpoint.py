"""A checkpoint round trip: weights, batch-norm statistics, optimizer moments, scheduler, step
counters and the RNG come back exactly, and a model of another shape refuses the file."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from trainer import checkpoint
from trainer.data.stream import Batch
from trainer.model import build_model
from trainer.objective import Objective
from trainer.optim import lr_lambda, optimizer_for


def _fake_batch(model, B: int = 2, N: int = 3, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    L = model.encoder.num_frames
    labels = torch.rand(B, N, L, generator=g) < 0.3
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, 2] = False
    return Batch(
        ids=[str(i) for i in range(B)],
        wave=torch.randn(B, 16000, generator=g) * 0.1,
        captions=["a dog barks", "rain falls"][:B],
        phrases=[["dog bark", "rain", "car"], ["rain", "dog bark", ""]][:B],
        labels=labels,
        mask=mask,
        has_frames=torch.ones(B, dtype=torch.bool),
        skips=[],
    )


def test_checkpoint_round_trip(smoke_run, tmp_path):
    p, _, _ = smoke_run
    t = p.train
    torch.manual_seed(0)
    first = Objective(build_model(t.model), t.loss)
    optimizer = optimizer_for(first, t.optim)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(2, 10))
    batch = _fake_batch(first.model)
    for _ in range(2):  # move weights, batch-norm statistics, optimizer moments
        first(batch)["loss"].backward()
        optimizer.step(), scheduler.step(), optimizer.zero_grad()
    path = tmp_path / "ck" / "latest.pt"
    checkpoint.save(
        path,
        first,
        optimizer=optimizer,
        scheduler=scheduler,
        step=2,
        epoch=1,
        batches_in_epoch=5,
        config={"train": {"x": 1}},
        metrics={"best": {"a": 1}},
    )
    rng = torch.get_rng_state()
    torch.rand(10)  # move the generator on

    torch.manual_seed(1)
    second = Objective(build_model(t.model), t.loss)
    optimizer2 = optimizer_for(second, t.optim)
    scheduler2 = torch.optim.lr_scheduler.LambdaLR(optimizer2, lr_lambda(2, 10))
    state = checkpoint.restore(checkpoint.read(path), second, optimizer2, scheduler2, path=path)
    assert (state["step"], state["epoch"], state["batches_in_epoch"], state["config"], state["metrics"]) == (
        2,
        1,
        5,
        {"train": {"x": 1}},
        {"best": {"a": 1}},
    )
    assert torch.equal(torch.get_rng_state(), rng)
    a, b = first.state_dict(), second.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert scheduler2.last_epoch == scheduler.last_epoch == 2
    assert optimizer2.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
    sa, sb = optimizer.state_dict()["state"], optimizer2.state_dict()["state"]
    assert sa.keys() == sb.keys()
    for k in sa:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(sa[k][name], sb[k][name])
    first.eval(), second.eval()
    with torch.no_grad():
        ta, tb = first(batch), second(batch)
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k
    # a model of another shape does not load
    third = Objective(build_model(replace(t.model, embed_dim=16)), t.loss)
    with pytest.raises((ValueError, RuntimeError)):
        checkpoint.restore(checkpoint.read(path), third, path=path)


def test_entries_stored_after_training_read_back_weights_only(tmp_path):
    import numpy as np

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    path = tmp_path / "best.pt"
    checkpoint.save(path, model, step=4, epoch=1, batches_in_epoch=0, config={"train": {"x": 1}})
    assert checkpoint.read_entry(path, "calibration") is None  # a checkpoint from before calibration: no entry, still reads
    before = checkpoint.read(path)
    entry = {"threshold": np.float64(0.0123), "valid_f1": np.float32(0.5), "split": "valid", "classes": np.int64(7)}
    checkpoint.store_entry(path, "calibration", entry)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt"]  # written under a temporary name, then renamed
    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(path)) == []
    state = checkpoint.read(path)  # weights only
    assert state["calibration"] == {"threshold": 0.0123, "valid_f1": 0.5, "split": "valid", "classes": 7}
    assert type(state["calibration"]["threshold"]) is float and type(state["calibration"]["classes"]) is int
    assert checkpoint.read_entry(path, "calibration") == state["calibration"]
    assert checkpoint.read_entry(path, "step") == 4
    for key in ("step", "epoch", "config", "metrics"):
        assert state[key] == before[key], key
    for k, v in before["model"].items():
        assert torch.equal(state["model"][k], v), k


@pytest.mark.parametrize(
    "bad",
    [
        0.5,
        {"threshold": "high"},
        {"threshold": float("nan")},
        {"valid_f1": 0.1},
        {"threshold": 0.5, "median_filter_frames": 4},
        {"threshold": 0.5, "median_filter_frames": "7"},
    ],
)
def test_a_malformed_calibration_is_refused_naming_the_file(tmp_path, bad):
    path = tmp_path / "ck.pt"
    checkpoint.save(path, torch.nn.Linear(2, 2), step=0, epoch=0, batches_in_epoch=0, config={"train": {}})
    state = torch.load(path, weights_only=True)
    torch.save(state | {"calibration": bad}, path)
    for read in (lambda: checkpoint.read(path), lambda: checkpoint.read_entry(path, "calibration")):
        with pytest.raises(checkpoint.CheckpointError, match="calibration") as caught:
            read()
        assert str(path) in str(caught.value)
