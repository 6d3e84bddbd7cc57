"""The trainer's parameters under bad values: every number of the pretrain, train and evaluate sections
has a range, a device or encoder must be one the trainer has, and each refusal is one line naming the
key, the value and what is accepted, when params load (before any data is read or model built)."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from pipeline.config.params import ParamsError, merge, parse_override
from tests.conftest import ROOT
from trainer.config import ENCODER_NAMES, RANGES, SOURCE_RANGES, Params, load_params

PARAMS = ROOT / "params.yaml"
SECTIONS = ("pretrain", "train", "evaluate")


def _load(*sets: str) -> Params:
    overrides: dict = {}
    for text in sets:
        overrides = merge(overrides, parse_override(text))
    return load_params(PARAMS, overrides)


def _numeric_keys(cls: type, prefix: str) -> dict[str, type]:
    """Dotted key -> int or float for each plain number of ``cls`` (lists and number-or-word keys left out)."""
    hints = typing.get_type_hints(cls)
    keys: dict[str, type] = {}
    for f in dataclasses.fields(cls):
        hint, key = hints[f.name], f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hint):
            keys.update(_numeric_keys(hint, key + "."))
        elif hint in (int, float):
            keys[key] = hint
    return keys


def _trainer_numeric_keys() -> dict[str, type]:
    hints = typing.get_type_hints(Params)
    return {k: v for section in SECTIONS for k, v in _numeric_keys(hints[section], section + ".").items()}


def test_every_number_of_the_trainer_sections_has_a_range_and_every_encoder_name_is_built() -> None:
    from trainer.config import SourceParams
    from trainer.encoders import ENCODERS

    keys = _trainer_numeric_keys()
    assert "train.optim.lr" in keys and "evaluate.probe_steps" in keys
    assert set(keys) == set(RANGES), f"no range: {sorted(set(keys) - set(RANGES))}; not a key: {sorted(set(RANGES) - set(keys))}"
    assert set(_numeric_keys(SourceParams, "")) == set(SOURCE_RANGES)
    assert sorted(ENCODER_NAMES) == sorted(ENCODERS)


@pytest.mark.parametrize("key", sorted(RANGES))
def test_each_range_refuses_what_lies_outside_it_and_holds_the_shipped_value(key: str) -> None:
    kind, r = _trainer_numeric_keys()[key], RANGES[key]
    step = 1 if kind is int else 0.5
    outside: list = []
    if r.lo is not None:
        outside.append(r.lo if r.lo_open else r.lo - step)
    if r.hi is not None:
        outside.append(r.hi if r.hi_open else r.hi + step)
    if kind is float:
        outside += [".nan", ".inf"]
    for value in outside:
        text = value if isinstance(value, str) else repr(kind(value))
        with pytest.raises(ParamsError, match=rf"^params: '{key}' is ") as e:
            _load(f"{key}={text}")
        assert "\n" not in str(e.value)
    value = _load()
    for part in key.split("."):
        value = getattr(value, part)
    assert r.accepts(value), "the shipped value lies inside its own range"


@pytest.mark.parametrize(
    "sets, message",
    [
        (["train.data.crop_s=100000"], "'train.data.crop_s' is 100000.0; use a duration in seconds in (0, 600]"),
        (
            ["train.optim.max_steps=-1"],
            "'train.optim.max_steps' is -1; use a number of steps (0: train.optim.epochs decide) in [0, 100000000]",
        ),
        (["train.model.adapter_heads=0"], "'train.model.adapter_heads' is 0; use a number of attention heads in [1, 128]"),
        (["train.optim.lr=1e30"], "'train.optim.lr' is 1e+30; use a learning rate in (0, 1]"),
        (
            ["train.device=tpu"],
            "'train.device' is 'tpu'; use auto (cuda when present), cpu, cuda, cuda:N (the GPU of index N) or mps",
        ),
        (["evaluate.device=cuda:x"], "'evaluate.device' is 'cuda:x'; use auto"),
        (["pretrain.device=gpu"], "'pretrain.device' is 'gpu'; use auto"),
        (["train.optim.epochs=0"], "'train.optim.epochs' is 0; use a number of epochs in [1, 100000]"),
        (["pretrain.steps=0"], "'pretrain.steps' is 0; use a number of steps in [1, 100000000]"),
        (["evaluate.probe_steps=0"], "'evaluate.probe_steps' is 0; use a number of steps in [1, 1000000]"),
        (
            ["train.model.caption_decoder.captions_per_clip=0"],
            "'train.model.caption_decoder.captions_per_clip' is 0; use a number of captions",
        ),
        (["train.loss.prior_weight=-1"], "'train.loss.prior_weight' is -1.0; use a loss weight (0 drops the term) in [0, 10000]"),
        (["train.optim.weight_decay=-0.1"], "'train.optim.weight_decay' is -0.1; use a weight decay in [0, 1]"),
        (["train.model.embed_dim=100"], "'train.model.embed_dim' is 100; use a multiple of train.model.adapter_heads (8)"),
        (["pretrain.final_lr=0.5"], "'pretrain.final_lr' is 0.5; use a learning rate in [0, pretrain.lr (0.001)]"),
        (["train.data.sources=[{weight: 0}]"], "'train.data.sources[0].weight' is 0.0; use a share of the batches"),
        (
            ["evaluate.f1_median_filters=[3, 4]"],
            "'evaluate.f1_median_filters[1]' is 4; use an odd number of frames (1: no filter) in [1, 999]",
        ),
        (["evaluate.f1_median_filter_frames=4"], "'evaluate.f1_median_filter_frames' is 4; use an odd number of frames"),
        (["train.optim.betas=[0.9]"], "'train.optim.betas' is [0.9]; use two numbers in [0, 1)"),
        (["train.model.encoder=big"], "'train.model.encoder' is 'big'; use 'eat-base' or 'small' or 'tiny-vit'"),
        (["mix.spec.placement_tries=1000000000"], "'placement_tries' must be a whole number >= 1 and <= 10000, got 1000000000"),
    ],
)
def test_a_bad_value_is_one_line_naming_its_own_key(sets: list[str], message: str) -> None:
    with pytest.raises(ParamsError) as e:
        _load(*sets)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_sedsynth_train_refuses_a_bad_device_in_one_line_before_training(capsys, monkeypatch) -> None:
    import trainer.stages.train
    from sedsynth.cli import main

    def never(params):
        raise AssertionError("the stage ran with params that should have been refused")

    monkeypatch.setattr(trainer.stages.train, "run", never)
    assert main(["train", "--params", str(PARAMS), "--set", "train.device=tpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sedsynth train: error: params: 'train.device' is 'tpu'; use auto") and err.count("\n") == 1
    for device in ("auto", "cpu", "cuda", "cuda:0", "cuda:15", "mps"):  # what the trainer can run on still loads
        assert _load(f"train.device={device}", f"pretrain.device={device}", f"evaluate.device={device}").train.device == device


@pytest.mark.parametrize("command", ["detect", "describe"])
def test_a_device_flag_the_trainer_cannot_use_is_refused_by_the_argument_parser(command: str, capsys) -> None:
    from sedsynth.cli import main

    extra = ["--query", "dog"] if command == "detect" else []
    with pytest.raises(SystemExit) as e:
        main([command, "a.wav", *extra, "--device", "tpu", "--checkpoint", "missing.pt"])
    assert e.value.code == 2
    assert "argument --device: 'tpu' is not a device: use auto (cuda when present), cpu, cuda, cuda:N" in capsys.readouterr().err
