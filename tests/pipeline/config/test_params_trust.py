"""params.yaml, --overrides and --set under bad input: every refusal is one line naming the key or the file.

- Every numeric key of the top level and the compute, corpus, clip and ambience sections has
  a range; a value outside it (or NaN/inf anywhere) is refused with the key, the value and
  the accepted range.
- A YAML syntax error names the file (or the --set text), the position and the problem, and
  the command exits with status 2 instead of a traceback.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from sedsynth.cli import main
from pipeline.config.params import ClipParams, ParamsError, parse_override, RANGES
from trainer.config import load_params, Params

from tests.conftest import ROOT
PARAMS = ROOT / "params.yaml"


def _load(*sets: str) -> Params:
    overrides: dict = {}
    from pipeline.config.params import merge

    for text in sets:
        overrides = merge(overrides, parse_override(text))
    return load_params(PARAMS, overrides)


@pytest.mark.parametrize(
    "sets, message",
    [
        (["clip.max_clipped_fraction=-1"], "'clip.max_clipped_fraction' is -1.0; use a fraction in [0, 1]"),
        (["clip.silence_dbfs=.nan"], "'clip.silence_dbfs' is nan; use a finite number"),
        (["clip.silence_dbfs=6"], "'clip.silence_dbfs' is 6.0; use a level in dBFS <= 0"),
        (["ambience.segment_s=-5"], "'ambience.segment_s' is -5.0; use a duration in seconds >= 0.1"),
        (["ambience.segment_s=0"], "'ambience.segment_s' is 0.0; use a duration in seconds >= 0.1"),
        (["ambience.min_recording_s=0", "ambience.segment_s=-5"], "'ambience.segment_s' is -5.0"),
        (["seed=-1"], "'seed' is -1; use a seed in [0, 4294967295]"),
        (["corpus.seed=-3"], "'corpus.seed' is -3"),
        (["compute.workers=0"], "'compute.workers' is 0; use a whole number >= 1"),
        (["clip.segmentation.threshold_percentile=101"], "'clip.segmentation.threshold_percentile' is 101.0; use a percentile in [0, 100]"),
        (["clip.segmentation.threshold_db=5"], "'clip.segmentation.threshold_db' is 5.0; with threshold_reference peak"),
        (["clip.min_duration_s=9"], "'clip.min_duration_s' is 9.0; use a duration below clip.max_duration_s (7.5)"),
        (["mix.relabel.absolute_floor_db=-.inf"], "'mix.relabel.absolute_floor_db' is -inf; use a finite number"),
        (["mix.spec={snr_db: [uniform, .nan, 20]}"], "'mix.spec.snr_db[1]' is nan; use a finite number"),
        (["ambience.keywords=[]"], "'ambience.keywords' is []; use a list of words"),
        (["ambience.keywords=['']"], "or 'all' for every recording"),
        (["ambience.keywords=rain"], "'ambience.keywords' must be a list of str or 'all', got 'rain'"),
        (["clip.splits=[]"], "'clip.splits' is []; use one or more of train, val and eval"),
    ],
)
def test_out_of_range_values_name_key_value_and_range(sets: list[str], message: str) -> None:
    with pytest.raises(ParamsError) as e:
        _load(*sets)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def _numeric_keys(cls: type, prefix: str = "") -> dict[str, type]:
    hints = typing.get_type_hints(cls)
    keys: dict[str, type] = {}
    for f in dataclasses.fields(cls):
        hint, key = hints[f.name], f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hint):
            keys.update(_numeric_keys(hint, key + "."))
        elif hint in (int, float):
            keys[key] = hint
    return keys


def _covered_keys() -> dict[str, type]:
    hints = typing.get_type_hints(Params)
    keys = {name: hint for name, hint in hints.items() if hint in (int, float)}
    for section in ("compute", "corpus", "clip", "ambience"):
        keys.update(_numeric_keys(hints[section], section + "."))
    return keys


def test_every_numeric_key_of_these_sections_has_a_range() -> None:
    keys = _covered_keys()
    assert "clip.segmentation.threshold_db" in keys and "seed" in keys
    assert set(keys) <= set(RANGES), f"no range for {sorted(set(keys) - set(RANGES))}"


@pytest.mark.parametrize("key", sorted(RANGES))
def test_each_range_refuses_what_lies_outside_it(key: str) -> None:
    kind = _covered_keys()[key]
    r = RANGES[key]
    step = 1 if kind is int else 0.5
    outside = []
    if r.lo is not None:
        outside.append(r.lo if r.lo_open else r.lo - step)
    if r.hi is not None:
        outside.append(r.hi if r.hi_open else r.hi + step)
    if kind is float:
        outside += [".nan", ".inf"]
    default = _load()
    for value in outside:
        text = f"{key}={kind(value) if not isinstance(value, str) else value}"
        with pytest.raises(ParamsError, match=rf"'{key}' is "):
            _load(text)
    value = default
    for part in key.split("."):
        value = getattr(value, part)
    assert r.accepts(value), "the shipped value is inside its own range"


def test_the_shipped_params_and_keywords_all_load() -> None:
    assert _load("ambience.keywords=all").ambience.keywords == "all"
    assert _load().clip == ClipParams()


def _cli(capsys, *args: str) -> tuple[int, str]:
    code = main(["clip", *args])
    return code, capsys.readouterr().err


def test_a_yaml_syntax_error_in_params_is_one_line_with_file_and_line(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "params.yaml"
    bad.write_text("seed: 1\nclip:\n  min_duration_s: [1.0,\n  max_duration_s: 7.5\nambience: {\n")
    code, err = _cli(capsys, "--params", str(bad))
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"sedsynth clip: error: params: {bad} line ") and "column" in err


def test_a_yaml_syntax_error_in_an_overrides_file_names_that_file(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "over.yaml"
    bad.write_text("clip:\n  max_duration_s: 5\n   plot_examples: 2\n")
    code, err = _cli(capsys, "--params", str(PARAMS), "--overrides", str(bad))
    assert code == 2 and err.count("\n") == 1
    assert f"params: {bad} line 3, column" in err


def test_an_overrides_file_that_is_not_a_mapping_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "over.yaml"
    bad.write_text("- clip.max_duration_s: 5\n")
    code, err = _cli(capsys, "--params", str(PARAMS), "--overrides", str(bad))
    assert code == 2 and err.count("\n") == 1
    assert f"overrides file {bad} holds a list" in err


def test_a_yaml_syntax_error_in_a_set_names_the_set_text(capsys) -> None:
    code, err = _cli(capsys, "--params", str(PARAMS), "--set", "clip.splits=[train, val")
    assert code == 2 and err.count("\n") == 1
    assert "params: --set 'clip.splits=[train, val' column" in err


def test_a_params_file_with_a_non_text_byte_names_the_file(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "params.yaml"
    bad.write_bytes(b"seed: 1\nclip: \xff\n")
    code, err = _cli(capsys, "--params", str(bad))
    assert code == 2 and err.count("\n") == 1 and str(bad) in err


def test_a_yaml_key_that_is_not_text_is_reported_as_unknown(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text("clip:\n  1: 2\n")
    with pytest.raises(ParamsError, match=r"unknown key 'clip.1'"):
        load_params(path)
