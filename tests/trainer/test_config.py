"""The trainer's parameters: one source of defaults, and checkpoints written before a key was renamed."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.config.params import ParamsError
from tests.conftest import ROOT
from trainer.config import SECTIONS, Params, current_train_section, load_params


def replace_sampling(p: Params, mode: str) -> Params:
    return dataclasses.replace(
        p, train=dataclasses.replace(p.train, data=dataclasses.replace(p.train.data, negative_sampling=mode))
    )


@pytest.mark.parametrize("section", SECTIONS)
def test_the_dataclass_defaults_are_params_yaml(section):
    """params.yaml is the file users edit; ``Params()`` (what code and tests build without it) says the same."""
    assert getattr(Params(), section) == getattr(load_params(ROOT / "params.yaml"), section)


def test_a_stored_train_section_gets_the_renamed_keys():
    current = dataclasses.asdict(replace_sampling(Params(), "phrase").train)
    old = {**current, "data": {k if k != "negative_sampling" else "negatives": v for k, v in current["data"].items()}}
    assert "negatives" in old["data"] and "negative_sampling" not in old["data"]
    upgraded = current_train_section(old)
    assert upgraded == current and upgraded["data"]["negative_sampling"] == "phrase"
    assert "negatives" in old["data"], "the stored section itself is left as it is"
    assert current_train_section(current) == current


def test_a_params_file_with_the_old_key_is_told_the_new_name():
    with pytest.raises(ParamsError, match="train.data.negatives.*negative_sampling"):
        load_params(ROOT / "params.yaml", {"train": {"data": {"negatives": "phrase"}}})


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs" / "train").glob("*.yaml")))
def test_every_shipped_override_file_loads_over_params_yaml(name):
    from pipeline.config.params import read_yaml_mapping

    p = load_params(ROOT / "params.yaml", read_yaml_mapping(ROOT / "configs" / "train" / name, "overrides file"))
    if name == "finelap_data.yaml":  # FineLAP's recipe: frame-level shard corpora, clip-level caption corpora
        levels = {(s.kind, s.level) for s in p.train.data.sources}
        assert levels == {("shards", "frame"), ("captions", "clip")} and p.train.data.sources[0].path == "data/dataset"
