"""One source of defaults: ``Params()`` is exactly what the project's ``params.yaml`` holds.

``params.yaml`` is what users edit and what the committed outputs were made with, so where the
two disagree, the dataclass default is the one to change.
"""

from __future__ import annotations

import dataclasses

from pipeline.config.params import ExcerptParams, Params, load_params
from sedsynth.cli import TRAINER_SECTIONS  # the sections the data stages leave to the trainer
from tests.conftest import ROOT


def _differences(default: object, configured: object, key: str = "") -> list[str]:
    """Dotted keys whose dataclass default differs from the configured value, with both values."""
    if dataclasses.is_dataclass(default) and type(default) is type(configured):
        return [
            d
            for f in dataclasses.fields(default)
            for d in _differences(getattr(default, f.name), getattr(configured, f.name), f"{key}.{f.name}".lstrip("."))
        ]
    return [] if default == configured else [f"{key}: default {default!r}, params.yaml {configured!r}"]


def test_dataclass_defaults_are_the_params_yaml_values() -> None:
    configured = load_params(ROOT / "params.yaml", skip_sections=TRAINER_SECTIONS)
    assert not _differences(Params(), configured), "\n".join(_differences(Params(), configured))
    assert Params() == configured


def test_differences_name_the_key_and_both_values() -> None:
    changed = dataclasses.replace(Params(), clip=dataclasses.replace(Params().clip, silence_dbfs=-60.0))
    assert _differences(Params(), changed) == ["clip.silence_dbfs: default -80.0, params.yaml -60.0"]


def test_clip_and_ambience_declare_the_excerpt_keys_once() -> None:
    shared = {f.name for f in dataclasses.fields(ExcerptParams)}
    assert shared == {"clip_level", "max_clipped_fraction", "silence_dbfs", "envelope_frame_s", "envelope_hop_s"}
    assert isinstance(Params().clip, ExcerptParams) and isinstance(Params().ambience, ExcerptParams)
