"""``sedsynth bench``: one subcommand per benchmark, each with only its own flags and defaults, and
each running its benchmark (recording stand-ins here, nothing is measured)."""

from __future__ import annotations

import pytest

from benchmarks import run as bench
from sedsynth.cli import build_parser, main
from tests.conftest import ROOT

FLAGS = {  # benchmark -> its flags and their defaults
    "clip": {"corpus": None, "clips": 400, "repeat": 3},
    "mix": {"mixtures": 2000, "workers": "1,2", "scaper_python": None, "scaper_mixtures": 200, "repeat": 3, "profile": False},
    "shards": {"repeat": 3},
    "import": {"clips": 10000},
    "mixing": {"rows": 200, "scaper_python": None, "repeat": 3},
    "train": {"rows": None, "batches": 2, "steps": 5, "preset": "default", "peak_tflops": None, "batch": None, "profile": False},
    "evaluate": {"clips": 10000},
    "detection": {"epochs": 15, "out": "models/bench_detection", "score_only": False},
    "llm-cache": {"repeat": 3},
    "real-library": {"sounds": None, "out": "models/bench_real_library"},
    "scale": {"sizes": "1000,10000", "out": "bench-out/scale", "train": False, "stages": None, "keep": False, "reuse": False},
}
SHARED = {"command", "what", "fn", "params", "overrides", "set"}


def test_every_benchmark_is_a_subcommand_with_only_its_own_flags():
    assert set(FLAGS) == set(bench.BENCHMARKS)
    parser = build_parser()
    for name, flags in FLAGS.items():
        args = vars(parser.parse_args(["bench", name]))
        assert args["what"] == name and {k: v for k, v in args.items() if k not in SHARED} == flags


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            "bench mix --mixtures 3000 --workers 1 --scaper-mixtures 300 --repeat 2 --profile",
            {"mixtures": 3000, "workers": "1", "scaper_mixtures": 300, "repeat": 2, "profile": True},
        ),
        (
            "bench mixing --rows 50 --scaper-python /opt/scaper/bin/python --repeat 2",
            {"rows": 50, "scaper_python": "/opt/scaper/bin/python", "repeat": 2},
        ),
        ("bench detection --epochs 11 --out models/bench_detection", {"epochs": 11, "out": "models/bench_detection"}),
        (
            "bench train --rows 8 --steps 1 --preset gpu --peak-tflops 989",
            {"rows": 8, "steps": 1, "preset": "gpu", "peak_tflops": 989.0},
        ),
        ("bench train --preset gpu --batch 256 --profile", {"preset": "gpu", "batch": 256, "profile": True}),
        ("bench detection --epochs 11 --score-only", {"epochs": 11, "score_only": True}),
    ],
)
def test_a_benchmarks_flags_parse(argv, expected):
    args = vars(build_parser().parse_args(argv.split()))
    assert {k: args[k] for k in expected} == expected


@pytest.mark.parametrize(
    "argv, says",
    [
        ("bench clip --epochs 3", "unrecognized arguments: --epochs 3"),
        ("bench detection --repeat 2", "unrecognized arguments: --repeat 2"),
        ("bench llm-cache --rows 5", "unrecognized arguments: --rows 5"),
        ("bench", "usage: sedsynth bench"),
        ("bench nope", "invalid choice: 'nope'"),
    ],
)
def test_another_benchmarks_flag_or_no_benchmark_is_refused(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv.split())
    assert exit_.value.code == 2 and says in capsys.readouterr().err


def test_the_command_runs_the_benchmark_it_names_with_its_flags(monkeypatch):
    ran = []
    monkeypatch.setitem(bench.BENCHMARKS, "llm-cache", lambda args, params: ran.append((args.what, args.repeat, params.seed)))
    assert main(["bench", "llm-cache", "--repeat", "1", "--params", str(ROOT / "params.yaml"), "--set", "seed=7"]) == 0
    assert ran == [("llm-cache", 1, 7)]


def test_the_view_benchmark_parses_and_runs_the_views_own(monkeypatch):
    import sys
    import types

    args = vars(build_parser().parse_args(["bench", "view", "--rows", "500", "--repeat", "2", "--save", "out.json"]))
    assert {k: args[k] for k in ("what", "rows", "repeat", "save")} == {
        "what": "view",
        "rows": 500,
        "repeat": 2,
        "save": "out.json",
    }
    assert {k: v for k, v in vars(build_parser().parse_args(["bench", "view"])).items() if k not in SHARED} == {
        "rows": 100000,
        "repeat": 3,
    }
    ran = []
    view_bench = types.ModuleType("sedsynth.view.bench")
    view_bench.main = lambda args, params: ran.append((args.what, args.rows, params.seed)) or 0
    monkeypatch.setitem(sys.modules, "sedsynth.view.bench", view_bench)
    assert main(["bench", "view", "--rows", "5", "--params", str(ROOT / "params.yaml"), "--set", "seed=7"]) == 0
    assert ran == [("view", 5, 7)]
