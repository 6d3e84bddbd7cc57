"""dvc.yaml against the code: every stage depends on everything its command imports and reads.

The import closure is found statically: each project module is parsed with ``ast`` and every
``import`` / ``from ... import`` in it is followed, function-level ones included (imports under
``if TYPE_CHECKING:`` never run and are left out). A stage's closure starts at the ``sedsynth``
subcommand its ``cmd`` runs: ``sedsynth/cli.py``'s module-level imports, the module of the function
the subcommand's row of ``COMMANDS`` names, and the imports of the ``cli.py`` helpers that row calls
(and of those they call). Package data
files (non-Python files inside the project's packages, their READMEs aside) count when their
names appear in a module of the closure.
"""

from __future__ import annotations

import ast
import csv
import json
import os
import shlex
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "trainer", "sedsynth", "benchmarks")  # pyproject's [tool.setuptools.packages.find] include
CLI = "sedsynth/cli.py"


def _module_file(name: str) -> str | None:
    """``pipeline.stages.mix`` -> ``pipeline/stages/mix.py`` (or a package's ``__init__.py``); None outside the project."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = ROOT / Path(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path.relative_to(ROOT).as_posix()
    return None


def _module_name(file: str) -> str:
    parts = Path(file).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement under ``tree`` (function bodies included), except TYPE_CHECKING blocks."""
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            todo.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return found


def _imported_modules(node: ast.Import | ast.ImportFrom, importer: str) -> set[str]:
    """Project module names one import statement in module ``importer`` loads, parent packages included."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            package = importer.split(".")
            is_package = _module_file(importer) is not None and _module_file(importer).endswith("__init__.py")
            package = package if is_package else package[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        names = [base] + [f"{base}.{a.name}" for a in node.names]  # `from pkg import mod` loads pkg.mod
    out = set()
    for name in names:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if _module_file(prefix):
                out.add(prefix)
    return out


@lru_cache(maxsize=None)
def _tree(file: str) -> ast.Module:
    return ast.parse((ROOT / file).read_text(encoding="utf-8"), filename=file)


def _cli_roots(command: str) -> set[str]:
    """Modules ``sedsynth/cli.py`` loads for one subcommand (a row of ``COMMANDS``): its module-level imports,
    the module of the function the row names, the modules of the errors it reports, and the imports of the
    ``cli.py`` functions the row calls (its params loader, its call, its options) and of those they call
    (``_params``), transitively."""
    from sedsynth.cli import COMMANDS

    row = COMMANDS[command]
    tree = _tree(CLI)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    roots = {"sedsynth", "sedsynth.cli"}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            roots |= _imported_modules(node, "sedsynth.cli")
    for target in (row.target, *row.errors):
        roots |= _imported_modules(ast.ImportFrom(module=target.partition(":")[0], names=[], level=0), "sedsynth.cli")
    seen, todo = set(), [f.__name__ for f in (row.params, row.call, row.options) if f is not None]
    while todo:
        name = todo.pop()
        if name in seen or name not in functions:
            continue
        seen.add(name)
        for node in _import_nodes(functions[name]):
            roots |= _imported_modules(node, "sedsynth.cli")
        todo += [c.func.id for c in ast.walk(functions[name]) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)]
    return roots


def import_closure(command: str) -> set[str]:
    """Files of every project module the ``sedsynth`` subcommand ``command`` can import."""
    todo, seen = list(_cli_roots(command)), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name == "sedsynth.cli":
            continue  # its other subcommands' imports are not this stage's
        for node in _import_nodes(_tree(_module_file(name))):
            todo += _imported_modules(node, name)
    return {_module_file(n) for n in seen}


def _string_literals(file: str) -> list[str]:
    """The module's string constants in code: docstrings (bare string statements) and comments are not code."""
    docstrings = {id(n.value) for n in ast.walk(_tree(file)) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [
        n.value
        for n in ast.walk(_tree(file))
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]


def package_data(modules: set[str]) -> set[str]:
    """Package data files whose names appear in a string literal of one of ``modules``."""
    files = [
        p
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*")
        if p.is_file()
        and p.suffix not in (".py", ".pyc")
        and "__pycache__" not in p.parts
        and not p.name.upper().startswith("README")
    ]
    literals = "\n".join(text for m in sorted(modules) for text in _string_literals(m))
    return {p.relative_to(ROOT).as_posix() for p in files if p.name in literals}


def _stages() -> dict[str, dict]:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]


def _cli_command(cmd: str) -> str:
    from sedsynth.cli import build_parser

    argv = shlex.split(cmd)
    assert argv[0] == "sedsynth", f"dvc.yaml: stage command {cmd!r} is not a sedsynth subcommand"
    return build_parser().parse_args(argv[1:]).fn.name


def _covered(path: str, deps: list[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in deps)


def missing_deps(stage: dict) -> list[str]:
    deps = [str(d) for d in stage.get("deps", [])]
    needed = import_closure(_cli_command(stage["cmd"]))
    needed |= package_data(needed)
    return sorted(p for p in needed if not _covered(p, deps))


def test_every_stage_depends_on_the_code_and_data_its_command_loads():
    missing = {name: m for name, stage in _stages().items() if (m := missing_deps(stage))}
    assert not missing, "dvc.yaml: stages miss deps (add them to each stage's deps):\n" + "\n".join(
        f"  {name}: {', '.join(m)}" for name, m in missing.items()
    )


def test_every_code_dep_exists():
    stale = {
        name: [
            d
            for d in stage.get("deps", [])
            if "${" not in str(d) and str(d).split("/")[0] in (*PACKAGES, "configs") and not (ROOT / str(d)).exists()
        ]
        for name, stage in _stages().items()
    }
    stale = {k: v for k, v in stale.items() if v}
    assert not stale, f"dvc.yaml: deps that do not exist (moved or removed; fix the paths): {stale}"


def test_the_closure_follows_function_level_and_relative_imports(tmp_path):
    clip = import_closure("clip")
    assert {"sedsynth/cli.py", "pipeline/stages/clip.py", "pipeline/config/params.py", "pipeline/__init__.py"} <= clip
    assert not any(f.startswith("trainer/") for f in clip), "another subcommand's imports are not the clip stage's"
    train = import_closure("train")
    assert "trainer/stages/train.py" in train and "pipeline/audio.py" in train
    assert "pipeline/data/audioset_ontology.json" in package_data(import_closure("clip"))


@pytest.mark.parametrize("stage", ["clip", "train"])
def test_a_removed_dep_is_reported(stage):
    spec = dict(_stages()[stage])
    assert missing_deps(spec) == []
    spec["deps"] = [d for d in spec["deps"] if d != "pipeline/audio.py"]
    assert "pipeline/audio.py" in missing_deps(spec)


# --------------------------------------------------------------------------- ablations as DVC experiments


@pytest.mark.parametrize("variant", ["full", "no_frame_loss", "no_clip_loss", "shared_projector", "infonce"])
def test_experiment_settings_make_the_pipeline_run_the_variant(variant):
    """``dvc exp run -S`` with the settings gives the params the direct run uses (its seed too), outputs aside."""
    from pipeline.config.params import merge, parse_override
    from trainer import ablations
    from trainer.config import load_params

    base = load_params(ROOT / "params.yaml")
    overrides: dict = {}
    seed = base.ablations.seeds[-1]
    for setting in ablations.experiment_settings(base, variant, seed):
        overrides = merge(overrides, parse_override(setting))
    exp = load_params(ROOT / "params.yaml", overrides)
    direct = ablations.variant_params(base, variant, seed)
    assert exp.seed == direct.seed == seed != base.seed
    assert exp.train == replace_fields(direct.train, out_dir=base.train.out_dir, resume=base.train.resume)
    assert exp.evaluate == replace_fields(
        direct.evaluate, out_dir=base.evaluate.out_dir, checkpoint=f"{base.train.out_dir}/checkpoints/latest.pt"
    )


def replace_fields(obj, **changes):
    from dataclasses import replace

    return replace(obj, **changes)


def _metrics(**changes) -> dict:
    m = {"psds1": 0.2, "psds2": 0.4, "auroc": 0.9, "alignment": 0.5, "t2a_r1": 0.3, "a2t_r1": 0.35, "zero_shot_accuracy": 0.5}
    return m | changes


def test_table_takes_experiments_first_then_folders_and_names_what_is_missing(tmp_path):
    from trainer import ablations

    for v in ("full", "no_clip_loss"):  # run directly: folders
        (tmp_path / v / "evaluation").mkdir(parents=True)
        (tmp_path / v / "evaluation" / "metrics.json").write_text(json.dumps({"test": {"trained": _metrics(psds1=0.9)}}))
    experiments = {"full": _metrics(psds1=0.25), "no_frame_loss": _metrics(psds1=0.0), "f1-low": _metrics()}
    with pytest.raises(FileNotFoundError) as missing:
        ablations.write_table(tmp_path, experiments)
    assert "shared_projector, infonce" in str(missing.value) and "sedsynth ablate --queue shared_projector infonce" in str(
        missing.value
    )
    assert not (tmp_path / "table.md").exists(), "no partial table"
    experiments |= {"shared_projector": _metrics(), "infonce": _metrics()}
    text = ablations.write_table(tmp_path, experiments)
    rows = {r["variant"]: r for r in csv.DictReader((tmp_path / "table.csv").open())}
    assert rows["full"]["source"] == "dvc experiment full" and float(rows["full"]["PSDS1 mean"]) == pytest.approx(0.25)
    assert rows["no_clip_loss"]["source"].endswith("no_clip_loss/evaluation/metrics.json")
    assert "full dvc experiment full" in text.splitlines()[-1]
    assert oct((tmp_path / "table.md").stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_outside_a_dvc_project_there_are_no_experiments(tmp_path):
    from trainer import ablations
    from trainer.config import Params

    assert ablations.experiment_metrics(Params(), tmp_path) == {}


def test_queueing_reports_each_variant_dvc_refuses_and_goes_on(tmp_path, capsys):
    from trainer import ablations
    from trainer.config import Params

    with pytest.raises(ValueError, match="unknown variant 'nope'"):
        ablations.queue_experiments(Params(), ["full", "nope"], tmp_path)  # names checked before anything is queued
    outcome = ablations.queue_experiments(Params(), ["full", "infonce"], tmp_path, seeds=[1234])  # not a DVC project
    assert list(outcome) == ["full-s1234", "infonce-s1234"] and all(v.startswith("refused: ") for v in outcome.values())
    err = capsys.readouterr().err.splitlines()
    assert [line.split(":")[1].strip() for line in err] == ["full-s1234", "infonce-s1234"] and all(
        "not queued" in line for line in err
    )
