"""params.yaml, --overrides and --set under bad input: every refusal is one line naming the key or the file.

- Every numeric key of the top level and the compute, corpus, clip and ambience sections has
  a range; a value outside it (or NaN/inf anywhere) is refused with the key, the value and
  the accepted range.
- A YAML syntax error names the file (or the --set text), the position and the problem, and
  the command exits with status 2 instead of a traceback.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from pipeline.config.params import RANGES, ClipParams, ParamsError, parse_override, read_yaml_mapping
from sedsynth.cli import main
from tests.conftest import ROOT
from trainer.config import Params, load_params

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
        (
            ["clip.segmentation.threshold_percentile=101"],
            "'clip.segmentation.threshold_percentile' is 101.0; use a percentile in [0, 100]",
        ),
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


# --- files that are not params: aliases, devices, pipes, other files' contents ---------------------


def _cli_child(tmp_path: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``sedsynth clip ARGS`` in a child with 4 GiB of address space, so a regression fails instead of eating the machine."""
    limit = "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)); from sedsynth.cli import main; "
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-c", limit + "sys.exit(main(sys.argv[1:]))", "clip", "--params", str(PARAMS), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    return done.stderr


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path: Path) -> None:
    bomb = tmp_path / "over.yaml"
    levels = ["    l0: &l0 [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]"]
    levels += [f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 9)]  # 10^9 zeros
    bomb.write_text("mix:\n  spec:\n" + "\n".join(levels) + "\n")
    err = _one_line(_cli_child(tmp_path, "--overrides", str(bomb)))
    assert (
        err
        == f"sedsynth clip: error: params: {bomb} line 4, column 14: an alias (*l0); params take no YAML aliases: write the value out in full\n"
    )


def test_a_recursive_alias_is_refused_in_one_line(tmp_path: Path) -> None:
    looped = tmp_path / "over.yaml"
    looped.write_text("mix:\n  spec: &s\n    inner: *s\n")
    assert "an alias (*s); params take no YAML aliases" in _one_line(_cli_child(tmp_path, "--overrides", str(looped)))


def test_a_set_value_may_not_hold_an_alias_either() -> None:
    with pytest.raises(ParamsError, match=r"an alias \(\*a\)"):
        parse_override("mix.spec={a: &a [1], b: *a}")


def test_the_shipped_yaml_files_use_no_aliases() -> None:
    from pipeline.config.params import read_yaml_mapping

    for path in [PARAMS, *sorted((ROOT / "configs").rglob("*.yaml"))]:
        assert read_yaml_mapping(path), path


@pytest.mark.parametrize("kind", ["device", "pipe", "folder"])
def test_a_params_path_that_is_no_regular_file_is_refused_without_reading(tmp_path: Path, kind: str) -> None:
    path = {"device": Path("/dev/zero"), "pipe": tmp_path / "fifo.yaml", "folder": tmp_path}[kind]
    if kind == "pipe":
        os.mkfifo(path)  # opening it to read would wait for a writer forever
    err = _one_line(_cli_child(tmp_path, "--overrides", str(path), timeout=30))
    assert f"params: overrides file {path} is a" in err and "not a file; pass a YAML file" in err


def test_a_params_file_larger_than_the_bound_is_refused(tmp_path: Path) -> None:
    from pipeline.config.loading import MAX_PARAMS_BYTES

    big = tmp_path / "over.yaml"
    big.write_text("seed: 1\n" + "#" * MAX_PARAMS_BYTES + "\n")
    with pytest.raises(ParamsError, match=rf"^params: overrides file {big} is larger than 1024 KiB"):
        read_yaml_mapping(big, "overrides file")


def test_an_overrides_file_that_is_not_params_is_named_but_its_contents_are_not_shown(tmp_path: Path, capsys) -> None:
    shadow = tmp_path / "shadow"
    shadow.write_text("root:$6$s3cr3tsalt$hashhashhash:20228:0:99999:7:::\ndaemon:*:20228:0:99999:7:::\n")
    code, err = _cli(capsys, "--params", str(PARAMS), "--overrides", str(shadow))
    assert code == 2 and err.count("\n") == 1
    assert err == (
        f"sedsynth clip: error: params: overrides file {shadow} has a top-level key that is not a section name "
        "(not shown); is it a params file?\n"
    )
    nested = tmp_path / "nested.yaml"
    nested.write_text("clip:\n  root:$6$s3cr3tsalt$hash:20228:: 1\n")
    code, err = _cli(capsys, "--params", str(PARAMS), "--overrides", str(nested))
    assert code == 2 and "s3cr3t" not in err and "'clip' holds a key that is not a parameter name (not shown)" in err


def test_a_long_value_is_cut_in_the_error(capsys) -> None:
    code, err = _cli(capsys, "--params", str(PARAMS), "--set", "clip.plot_examples=" + "x" * 5000)
    assert code == 2 and "'clip.plot_examples' must be int, got 'xxx" in err and len(err) < 200


@pytest.mark.parametrize(
    "sets, missing, message",
    [
        (
            ["mix.export.jams=true"],
            "jams",
            "sedsynth mix: error: params: 'mix.export.jams' is true but the jams package is not installed; "
            "pip install -e '.[jams]' (the jams extra), or set mix.export.jams: false\n",
        ),
        (
            ["mix.spec.time_stretch_factor=[uniform, 0.9, 1.1]"],
            "pedalboard",
            "sedsynth mix: error: params: 'mix.spec.stretch_method' is rubberband but the pedalboard package is not installed; "
            "pip install pedalboard, or set mix.spec.stretch_method: varispeed\n",
        ),
    ],
)
def test_a_setting_whose_package_is_missing_is_refused_when_params_load(
    tmp_path: Path, capsys, monkeypatch, sets, missing, message
) -> None:
    """Refused in one line naming what to install, before any mixture is made (not a traceback after mixing them all)."""
    from pipeline.config import params

    installed = params.installed
    monkeypatch.setattr(params, "installed", lambda module: module != missing and installed(module))
    out = tmp_path / "mix"
    args = ["mix", "--params", str(PARAMS), "--set", f"mix.out_dir={out}", *[a for s in sets for a in ("--set", s)]]
    assert main(args) == 2
    assert capsys.readouterr().err == message
    assert not out.exists() and not list(tmp_path.iterdir())
    monkeypatch.setattr(params, "installed", lambda module: True)
    _load(*sets)  # with the package installed the same settings load
