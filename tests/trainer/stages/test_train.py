"""The training loop end to end on CPU: its outputs, a resume that continues exactly where it
stopped (and a fresh start when the settings changed, but not for a key renamed since the
checkpoint was written), and which settings a resume may change."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace

import pytest
import torch

from tests.conftest import tiny_train_params
from trainer.data.stream import make_stream
from trainer.encoders import build_encoder
from trainer.model import build_model
from trainer.objective import Objective
from trainer.optim import lr_lambda, optimizer_for
from trainer.stages.train import LOWER_IS_BETTER, compatible, config_of, improves, run, start_or_resume


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_train_smoke_run_writes_outputs(smoke_run):
    p, out, summary = smoke_run
    for name in (
        "checkpoints/latest.pt",
        "checkpoints/best.pt",
        "train_log.csv",
        "valid_log.csv",
        "metrics.json",
        "curves.png",
        "config.json",
        "skipped.csv",
    ):
        assert (out / name).is_file(), name
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    train_rows = read_csv(out / "train_log.csv")
    assert [int(r["step"]) for r in train_rows] == [1, 2, 3]
    for r in train_rows:
        assert math.isfinite(float(r["loss"])) and math.isfinite(float(r["clip"])) and math.isfinite(float(r["frame"]))
        assert float(r["lr"]) >= 0
    valid_rows = read_csv(out / "valid_log.csv")
    assert int(valid_rows[0]["epoch"]) == 0 and int(valid_rows[0]["step"]) == 0  # the untrained model
    assert int(valid_rows[-1]["step"]) == 3
    for r in valid_rows:
        assert math.isfinite(float(r["valid_loss"]))
        assert 0 <= float(r["frame_auroc"]) <= 1 and 0 <= float(r["a2t_r1"]) <= 1
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == summary["steps"] == 3
    assert metrics["untrained"]["epoch"] == 0
    key = p.train.best_by  # best.pt: the epoch with the best held-out score of this kind
    best_score = (min if key in LOWER_IS_BETTER else max)(float(r[key]) for r in valid_rows[1:])
    assert metrics["best"][key] == pytest.approx(best_score, rel=1e-5)
    latest = torch.load(out / "checkpoints" / "latest.pt", weights_only=True)
    assert latest["step"] == 3 and latest["config"] == config_of(p, latest["config"]["data_fingerprint"])
    assert len(latest["config"]["data_fingerprint"]) == 16
    assert not any(k.startswith("model.text.model.") for k in latest["model"])  # the frozen text tower is not saved


def test_the_end_of_a_run_stores_the_threshold_chosen_on_the_valid_split(smoke_run):
    from trainer import checkpoint
    from trainer.evaluation.calibration import calibrate_checkpoint
    from trainer.evaluation.testset import read_split

    p, out, summary = smoke_run
    entry = summary["calibration"]
    assert json.loads((out / "metrics.json").read_text())["calibration"] == entry
    for name in ("best.pt", "latest.pt"):
        path = out / "checkpoints" / name
        assert torch.serialization.get_unsafe_globals_in_checkpoint(str(path)) == []
        assert checkpoint.read(path)["calibration"] == entry  # weights-only, beside everything a resume needs
    valid = read_split(p.train.data.valid.path, p.train.data.valid.split)
    assert (entry["split"], entry["classes"], entry["clips"]) == ("valid", len(valid.classes), len(valid.ids))
    assert entry["events"] == sum(len(v) for v in valid.ground_truth().values())
    assert entry["step"] == summary["best"]["step"]
    assert 0.0 <= entry["valid_f1"] <= 1.0 and math.isfinite(entry["threshold"])
    # the filter and threshold with the best valid F1 among every filter tried (the shorter among equals)
    tried = entry["tried"]
    assert [t["median_filter_frames"] for t in tried] == sorted(p.evaluate.f1_median_filters)
    best = max(tried, key=lambda t: t["valid_f1"])
    assert {k: entry[k] for k in best} == best
    # chosen with best.pt: scoring it again gives the same entry
    again = calibrate_checkpoint(
        out / "checkpoints" / "best.pt", p.train.data.valid.path, "valid", p.evaluate.f1_median_filters, device="cpu"
    )
    assert again == entry
    # one filter: that filter's own best threshold
    alone = calibrate_checkpoint(out / "checkpoints" / "best.pt", p.train.data.valid.path, "valid", [5], device="cpu")
    assert {k: alone[k] for k in ("median_filter_frames", "threshold", "valid_f1")} == next(
        t for t in tried if t["median_filter_frames"] == 5
    )


def test_no_calibration_without_a_valid_split_of_shards(smoke_run):
    from types import SimpleNamespace

    from trainer.config import SourceParams
    from trainer.stages.train import calibrate

    p, out, _ = smoke_run
    for valid in (None, SourceParams(kind="captions", path="x.csv", split="valid")):
        setup = SimpleNamespace(
            train=replace(p.train, data=replace(p.train.data, valid=valid)), best_path=out / "checkpoints" / "best.pt"
        )
        assert calibrate(p, setup) == {}


def _train_rows(out) -> dict[int, dict]:
    return {int(r["step"]): r for r in read_csv(out / "train_log.csv")}


def test_resume_continues_exactly(shard_folder, tmp_path, capsys):
    params, folder = shard_folder

    def config(out, max_steps, **changes):
        base = tiny_train_params(params, folder, out, checkpoint_every_steps=2, log_every_steps=1, **changes)
        return replace(base, train=replace(base.train, optim=replace(base.train.optim, max_steps=max_steps)))

    # the train split gives at least 4 steps of batch 4 in one epoch
    probe = config(tmp_path / "probe", 4)
    stream = make_stream(probe, build_encoder("small"), probe.train.data.sources, shuffle=True)
    assert stream.rows_per_worker(1) // 4 >= 4

    a_out, b_out = tmp_path / "a", tmp_path / "b"
    run(config(a_out, 4))
    a_rows = _train_rows(a_out)
    assert sorted(a_rows) == [1, 2, 3, 4] and all(int(r["epoch"]) == 0 for r in a_rows.values())

    run(config(b_out, 2))
    stopped = torch.load(b_out / "checkpoints" / "latest.pt", weights_only=True)
    assert stopped["step"] == 2
    assert sorted(_train_rows(b_out)) == [1, 2]
    capsys.readouterr()
    summary = run(config(b_out, 4))
    assert "resuming from" in capsys.readouterr().out
    assert summary["steps"] == 4
    b_rows = _train_rows(b_out)
    assert sorted(b_rows) == [1, 2, 3, 4]
    for step in (1, 2, 3, 4):
        ra, rb = a_rows[step], b_rows[step]
        assert int(ra["epoch"]) == int(rb["epoch"]), step
        for key in ("loss", "clip", "frame", "lr", "clip_t", "clip_b", "frame_t", "frame_b"):
            assert float(rb[key]) == pytest.approx(float(ra[key]), abs=1e-5), (step, key)
    a_state = torch.load(a_out / "checkpoints" / "latest.pt", weights_only=True)
    b_state = torch.load(b_out / "checkpoints" / "latest.pt", weights_only=True)
    for k, v in a_state["model"].items():
        assert torch.allclose(v.float(), b_state["model"][k].float(), atol=1e-5), k

    # another setting: no resume, a fresh start (and a fresh log)
    capsys.readouterr()
    summary = run(
        config(
            b_out,
            1,
            model=replace(params.train.model, encoder="small", embed_dim=16, adapter_heads=4, adapter_ffn=64, freeze_text=True),
        )
    )
    assert "not resuming" in capsys.readouterr().out
    assert summary["steps"] == 1
    assert sorted(_train_rows(b_out)) == [1]
    assert torch.load(b_out / "checkpoints" / "latest.pt", weights_only=True)["config"]["train"]["model"]["embed_dim"] == 16


def test_compatible_ignores_resumable_keys_only():
    from trainer.config import Params

    base = Params()
    t = base.train
    same = replace(
        base,
        train=replace(
            t,
            out_dir="elsewhere",
            resume=False,
            log_every_steps=3,
            checkpoint_every_steps=7,
            threads=2,
            device="cpu",
            compile=True,
            data=replace(t.data, num_workers=9),
            optim=replace(t.optim, epochs=99, max_steps=5),
        ),
    )
    assert compatible(config_of(base), config_of(same)) == []
    changed = replace(
        base,
        seed=base.seed + 1,
        train=replace(
            t, model=replace(t.model, embed_dim=16), optim=replace(t.optim, lr=1.0), data=replace(t.data, batch_size=3)
        ),
    )
    assert compatible(config_of(base), config_of(changed)) == [
        "seed",
        "train.data.batch_size",
        "train.model.embed_dim",
        "train.optim.lr",
    ]
    assert compatible(config_of(base), config_of(replace(base, train=replace(t, loss=replace(t.loss, frame_chunk_clips=2))))) == [
        "train.loss.frame_chunk_clips"
    ]


def test_a_checkpoint_older_than_a_setting_resumes_at_its_default():
    from trainer.config import Params

    base = Params()
    older = config_of(base)
    del older["train"]["bf16_residual"], older["train"]["compile_mode"]  # written before the settings existed
    assert compatible(older, config_of(base)) == []
    assert compatible(older, config_of(replace(base, train=replace(base.train, compile_mode="max-autotune-no-cudagraphs")))) == []
    assert compatible(older, config_of(replace(base, train=replace(base.train, bf16_residual=True)))) == ["train.bf16_residual"]


def _resume_from(p, saved: dict, tmp_path, capsys) -> tuple:
    """Save ``saved`` as a checkpoint, resume from it with ``p``'s settings (asserting that it does); returns the position."""
    old = tmp_path / "latest.pt"
    torch.save(saved, old)
    t = p.train
    objective = Objective(build_model(t.model), t.loss)
    optimizer = optimizer_for(objective, t.optim)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(t.optim.warmup_steps, 3))
    capsys.readouterr()
    position = start_or_resume(old, True, config_of(p, saved["config"]["data_fingerprint"]), objective, optimizer, scheduler)
    assert "resuming from" in capsys.readouterr().out
    return position


def test_a_checkpoint_written_before_a_key_was_renamed_still_resumes(smoke_run, tmp_path, capsys):
    p, out, _ = smoke_run
    saved = torch.load(out / "checkpoints" / "latest.pt", weights_only=True)
    data = saved["config"]["train"]["data"]
    data["negatives"] = data.pop("negative_sampling")  # as checkpoints stored it before the rename
    step, epoch, micro_batches_done, best = _resume_from(p, saved, tmp_path, capsys)
    assert (step, epoch, micro_batches_done, best) == (3, saved["epoch"], saved["batches_in_epoch"], saved["metrics"]["best"])


def test_best_checkpoint_follows_the_direction_of_its_score():
    assert improves({"frame_auroc": 0.8}, {}, "frame_auroc")  # any score beats none
    assert improves({"frame_auroc": 0.8}, {"frame_auroc": 0.7}, "frame_auroc")
    assert not improves({"frame_auroc": 0.6}, {"frame_auroc": 0.7}, "frame_auroc")
    assert improves({"valid_loss": 1.0}, {"valid_loss": 2.0}, "valid_loss")
    assert not improves({"valid_loss": 3.0}, {"valid_loss": 2.0}, "valid_loss")
    assert not improves({}, {}, "valid_loss")  # no held-out split: no best.pt from scores


def test_a_checkpoint_from_before_a_setting_existed_still_resumes(smoke_run, tmp_path, capsys):
    p, out, _ = smoke_run
    saved = torch.load(out / "checkpoints" / "latest.pt", weights_only=True)
    del saved["config"]["train"]["loss"]["region_weight"]  # as checkpoints stored it before the region loss
    for source in saved["config"]["train"]["data"]["sources"]:
        del source["level"]
    _resume_from(p, saved, tmp_path, capsys)


def test_the_region_loss_trains_alone_or_beside_the_frame_loss(shard_folder, tmp_path):
    params, folder = shard_folder
    base = tiny_train_params(params, folder, tmp_path / "region")
    t = base.train
    for frame_weight in (0.0, 1.0):
        p = replace(
            base,
            train=replace(
                t,
                data=replace(t.data, valid=None),
                optim=replace(t.optim, max_steps=2),
                loss=replace(t.loss, region_weight=1.0, frame_weight=frame_weight),
                out_dir=str(tmp_path / f"region{frame_weight}"),
            ),
        )
        run(p)
        rows = list(csv.DictReader(open(tmp_path / f"region{frame_weight}" / "train_log.csv")))
        assert rows and all(float(r["region"]) > 0 and math.isfinite(float(r["region"])) for r in rows)
        assert ("frame" in rows[0]) == (frame_weight > 0)


def test_between_logs_a_step_reads_no_tensor():
    """Reading a loss term (``float``) makes the host wait for the device to finish the step; the
    loop reads them only on log steps and the last one. Meta tensors stand in: reading one raises."""
    from types import SimpleNamespace

    from trainer.stages.train import log_step

    class Bar:
        def __init__(self):
            self.shown = []

        def update(self, n):
            pass

        def set_postfix(self, values, refresh):
            self.shown.append(values)

    rows = []
    setup = SimpleNamespace(
        train=SimpleNamespace(log_every_steps=5),
        total_steps=12,
        world=SimpleNamespace(main=True, size=1),
        scheduler=SimpleNamespace(get_last_lr=lambda: [1e-3]),
        passes=1,
    )
    logs = SimpleNamespace(progress=Bar(), train=SimpleNamespace(add=rows.append), throughput=lambda size, passes: {})
    unreadable = {"loss": torch.zeros((), device="meta"), "frame": torch.zeros((), device="meta")}
    for step in (1, 2, 3, 4, 6, 11):
        log_step(setup, logs, step, 0, unreadable)
    assert rows == [] and logs.progress.shown == []
    for step in (5, 12):  # a log step and the last step read them
        with pytest.raises((RuntimeError, NotImplementedError)):
            log_step(setup, logs, step, 0, unreadable)
    readable = {"loss": torch.tensor(1.5), "frame": torch.tensor(0.5)}
    log_step(setup, logs, 10, 0, readable)
    assert [r["step"] for r in rows] == [10] and rows[0]["loss"] == 1.5 and logs.progress.shown[-1]["loss"] == "1.500"


def test_the_steps_give_the_freed_heap_back(shard_folder, tmp_path, monkeypatch):
    """The loop polls the releaser after every optimizer step; with a period of 0 each step after
    the first releases (the first poll starts the clock)."""
    import inspect

    import trainer.memory as memory

    released = []
    monkeypatch.setattr(memory, "RELEASE_EVERY_S", 0.0)
    monkeypatch.setattr(memory, "release_freed_heap", lambda: released.append(inspect.stack()[2].function))
    params, folder = shard_folder
    base = tiny_train_params(params, folder, tmp_path / "run")
    p = replace(base, train=replace(base.train, optim=replace(base.train.optim, max_steps=3)))
    assert run(p)["steps"] == 3
    assert released.count("train_epoch") == 2
