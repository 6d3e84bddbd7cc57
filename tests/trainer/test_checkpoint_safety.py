"""Checkpoints are data, never code: every ``.pt`` the project opens is read weights-only.

A pickle whose ``__reduce__`` would create a file is handed to each of the four places that
open one (``sedsynth detect --checkpoint``, the evaluate stage's detector, an eat-base
``encoder_checkpoint``, a planted ``latest.pt`` on resume): the file is never created and one
line names the checkpoint. Malformed and foreign files (random bytes, an empty file, a zip that
is not a torch file, a dict without the expected keys) give the same kind of line. An EAT
checkpoint in fairseq's layout (argparse and omegaconf config objects, numpy meter values
beside the weights) still loads, and what the trainer itself saves reads back with nothing
beyond plain containers and tensors.
"""

from __future__ import annotations

import argparse
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from sedsynth.cli import main
from tests.conftest import tiny_train_params
from tests.trainer.test_encoders import load_eat_weights
from trainer import checkpoint
from trainer.config import Params
from trainer.encoders import EATEncoder, EncoderError, build_encoder, read_eat_checkpoint
from trainer.evaluation.detector import Detector
from trainer.model import build_model
from trainer.objective import Objective
from trainer.stages.evaluate import detectors
from trainer.stages.train import config_of, run


class CreatesAFile:
    """Unpickling this runs code that creates ``marker`` (what a weights-only load must refuse)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('code ran')",)


def plant(path: Path, marker: Path, **fields) -> Path:
    """A checkpoint that looks like the trainer's but runs code when unpickled."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "model": {"w": torch.zeros(2)},
        "step": 0,
        "epoch": 0,
        "batches_in_epoch": 0,
        "torch_rng": torch.get_rng_state(),
        "config": {"train": {}, "seed": 0},
        "metrics": {"payload": CreatesAFile(marker)},
    } | fields
    torch.save(state, path)
    return path


def one_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


@pytest.fixture
def marker(tmp_path) -> Path:
    m = tmp_path / "created-by-the-checkpoint"
    yield m
    assert not m.exists(), "loading the checkpoint ran its code"


# --------------------------------------------------------------------------- the four ways in


def test_detect_cli_refuses_a_checkpoint_that_runs_code(tmp_path, marker, capsys):
    evil = plant(tmp_path / "evil.pt", marker)
    wav, params_yaml = tmp_path / "x.wav", tmp_path / "params.yaml"
    sf.write(wav, np.zeros(16000, dtype=np.float32), 16000)
    params_yaml.write_text("{}\n")
    capsys.readouterr()
    code = main(
        ["detect", str(wav), "--query", "dog", "--params", str(params_yaml), "--checkpoint", str(evil), "--device", "cpu"]
    )
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    line = one_line(err)
    assert line.startswith("sedsynth detect: error: detector:") and str(evil) in line
    assert "exec" in line and "weights-only" in line and "sedsynth train" in line


def test_evaluate_refuses_a_checkpoint_that_runs_code(tmp_path, marker):
    evil = plant(tmp_path / "best.pt", marker)
    with pytest.raises(checkpoint.CheckpointError) as caught:
        detectors(replace(Params().evaluate, checkpoint=str(evil), device="cpu"), seed_fallback=0)
    assert str(evil) in one_line(str(caught.value))
    with pytest.raises(ValueError, match="weights-only"):
        Detector.from_checkpoint(evil, device="cpu")


def test_eat_encoder_checkpoint_that_runs_code_is_refused(tmp_path, marker, capsys):
    evil = tmp_path / "EAT-base_epoch30_pt.pt"
    torch.save({"model": {"blocks.0.norm1.weight": torch.ones(768)}, "cfg": CreatesAFile(marker)}, evil)
    with pytest.raises(EncoderError) as caught:
        build_encoder("eat-base", str(evil))
    line = one_line(str(caught.value))
    assert str(evil) in line and "exec" in line and "EAT-base" in line
    # and through the CLI, as train.model.encoder_checkpoint
    params_yaml = tmp_path / "params.yaml"
    params_yaml.write_text("{}\n")
    capsys.readouterr()
    code = main(
        [
            "train",
            "--params",
            str(params_yaml),
            "--set",
            "train.model.encoder=eat-base",
            "--set",
            f"train.model.encoder_checkpoint={evil}",
            "--set",
            f"train.out_dir={tmp_path / 'out'}",
        ]
    )
    assert code == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("sedsynth train: error: encoder:") and str(evil) in line


def test_resume_refuses_a_planted_latest_checkpoint(shard_folder, tmp_path, marker):
    params, folder = shard_folder
    out = tmp_path / "run"
    latest = plant(out / "checkpoints" / "latest.pt", marker)
    with pytest.raises(checkpoint.CheckpointError) as caught:
        run(tiny_train_params(params, folder, out))
    line = one_line(str(caught.value))
    assert line.startswith("train:") and str(latest) in line and "train.resume=false" in line
    assert latest.exists()  # left for the user to look at, not overwritten


# --------------------------------------------------------------------------- malformed and foreign files


def _zip_that_is_not_torch(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("readme.txt", "hello")


@pytest.mark.parametrize(
    "kind, expect",
    [
        ("random bytes", "its pickle is not plain data"),
        ("empty", "the file is empty"),
        ("zip", "a zip archive that torch.save did not write"),
        ("tensor", "holds a Tensor, not a dict"),
        ("foreign dict", "no model, step, epoch"),
        ("model not tensors", "'model' is not a dict of tensors"),
        ("no train config", "'config' has no 'train' section"),
    ],
)
def test_malformed_checkpoints_give_one_line_naming_the_file(tmp_path, kind, expect, capsys):
    path = tmp_path / "ckpt.pt"
    good = {
        "model": {"w": torch.zeros(1)},
        "step": 0,
        "epoch": 0,
        "batches_in_epoch": 0,
        "torch_rng": torch.get_rng_state(),
        "config": {"train": {}},
    }
    if kind == "random bytes":
        path.write_bytes(np.random.default_rng(0).bytes(4096))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "zip":
        _zip_that_is_not_torch(path)
    elif kind == "tensor":
        torch.save(torch.zeros(3), path)
    elif kind == "foreign dict":
        torch.save({"state_dict": {"w": torch.zeros(1)}}, path)
    elif kind == "model not tensors":
        torch.save(good | {"model": {"w": [1, 2]}}, path)
    else:
        torch.save(good | {"config": {"seed": 1}}, path)
    with pytest.raises(checkpoint.CheckpointError) as caught:
        checkpoint.read(path, "detector")
    line = one_line(str(caught.value))
    assert line.startswith("detector:") and str(path) in line and expect in line, line
    assert "expected a checkpoint written by `sedsynth train`" in line
    assert "Re-running" not in line and "weights_only` set to `False" not in line  # never torch's advice to load it unsafely
    # the CLI prints it as one error line, no traceback
    params_yaml = tmp_path / "params.yaml"
    params_yaml.write_text("{}\n")
    capsys.readouterr()
    assert (
        main(
            [
                "detect",
                str(params_yaml),
                "--query",
                "q",
                "--params",
                str(params_yaml),
                "--checkpoint",
                str(path),
                "--device",
                "cpu",
            ]
        )
        == 2
    )
    assert one_line(capsys.readouterr().err).startswith("sedsynth detect: error:")


def test_missing_checkpoint_is_a_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        checkpoint.read(tmp_path / "nope.pt")


def test_malformed_eat_checkpoints_give_one_line(tmp_path):
    for name, content in (("random.pt", np.random.default_rng(1).bytes(2048)), ("random.safetensors", b"\xff" * 64)):
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(EncoderError) as caught:
            load_eat_weights(_tiny_eat(0), str(path))
        line = one_line(str(caught.value))
        assert str(path) in line and "EAT-base" in line
    listing = tmp_path / "list.pt"
    torch.save([torch.zeros(1)], listing)
    with pytest.raises(EncoderError, match="holds a list, not a dict"):
        load_eat_weights(_tiny_eat(0), str(listing))


# --------------------------------------------------------------------------- what must still load


FAIRSEQ = (
    ("patch_embed.", "modality_encoders.IMAGE.local_encoder.proj."),
    ("cls_token", "modality_encoders.IMAGE.extra_tokens"),
    ("pre_norm.", "modality_encoders.IMAGE.context_encoder.norm."),
    ("blocks.", "blocks."),
)


def _tiny_eat(seed: int) -> EATEncoder:
    torch.manual_seed(seed)
    return EATEncoder(dim=32, depth=1, heads=2).eval()


def test_eat_checkpoint_in_fairseq_layout_with_config_objects_loads(tmp_path):
    """fairseq writes ``args`` (argparse), ``cfg`` (omegaconf) and meter states (numpy) beside the weights."""
    omegaconf = pytest.importorskip("omegaconf")
    source = _tiny_eat(0)
    weights = {}
    for key, value in source.state_dict().items():
        ours, theirs = next((o, t) for o, t in FAIRSEQ if key.startswith(o))
        weights[theirs + key[len(ours) :]] = value.clone()
    cfg = omegaconf.OmegaConf.create(
        {
            "model": {
                "_name": "data2vec_multi",
                "embed_dim": 32,
                "depth": 1,
                "layer_norm_first": False,
                "modalities": {"image": {"patch_size": 16}},
            },
            "optimization": {"lr": [0.0005], "max_update": 400000},
            "task": {"_name": "mae_image_pretraining", "target_length": 1024},
            "checkpoint": {"save_dir": None},
            "common": {"fp16": True, "seed": 1},
        }
    )
    path = tmp_path / "EAT-base_epoch30_pt.pt"
    torch.save(
        {
            "args": argparse.Namespace(arch="data2vec_multi", lr=[0.0005], seed=1),
            "cfg": cfg,
            "model": weights,
            "criterion": None,
            "optimizer_history": [
                {
                    "criterion_name": "ModelCriterion",
                    "optimizer_name": "FairseqAdam",
                    "num_updates": 400000,
                    "lr_scheduler_state": {"best": None},
                }
            ],
            "task_state": {},
            "last_optimizer_state": {"state": {0: {"exp_avg": torch.zeros(2)}}},
            "extra_state": {
                "epoch": 30,
                "previous_training_time": 1.5,
                "meter": np.array([0.5, 0.25]),
                "metrics": {"train": [(0, "loss", "AverageMeter", {"val": np.float64(1.5), "sum": np.float32(3.0), "count": 2})]},
            },
        },
        path,
    )
    with pytest.raises(Exception):  # the layout really holds more than a weights-only load takes by default
        torch.load(path, weights_only=True)
    target = _tiny_eat(1)
    assert load_eat_weights(target, str(path)) == {"loaded": len(source.state_dict()), "missing": []}
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value), key
    assert set(read_eat_checkpoint(str(path))[1]) == set(source.state_dict())


def test_what_the_trainer_saves_reads_back_weights_only(shard_folder, tmp_path):
    params, folder = shard_folder
    p = tiny_train_params(params, folder, tmp_path / "m")
    torch.manual_seed(0)
    objective = Objective(build_model(p.train.model), p.train.loss)
    optimizer = torch.optim.AdamW(objective.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    path = tmp_path / "ck.pt"
    metrics = {"best": {"valid_loss": np.float32(0.5), "epoch": np.int64(2)}, "where": Path("x")}
    checkpoint.save(
        path,
        objective,
        optimizer=optimizer,
        scheduler=scheduler,
        step=3,
        epoch=1,
        batches_in_epoch=2,
        config=config_of(p),
        metrics=metrics,
    )
    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(path)) == []
    state = checkpoint.read(path)
    assert state["config"] == config_of(p)
    assert state["metrics"] == {"best": {"valid_loss": 0.5, "epoch": 2}, "where": "x"}
    assert type(state["metrics"]["best"]["epoch"]) is int
