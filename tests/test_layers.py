"""The house rules of the code: imports run downwards only, no two modules import each other, and no
pipeline function takes more than eight positional parameters.

Layers, top to bottom (a module may import its own layer or a lower one):

    6  sedsynth                    the command (and its view and ablate commands), above everything
    5  benchmarks                  the benchmarks, which the command runs and which never import it
    4  trainer.stages              the trainer's DVC stages (train, evaluate)
    3  trainer                     the trainer's machinery
    2  pipeline.stages             the data stages, one file per DVC stage
    1  pipeline.clip, .ambience, .corpus, .mix, .text, .shards   the data stages' machinery
    0  pipeline (root modules), pipeline.config   schema, audio, outputs, configuration, ...

Within a layer, stage files never import each other, and the import graph has no cycles (every
import counts, function-level ones included; ``if TYPE_CHECKING:`` blocks never run and are left
out). Imports are read with ``ast``, so nothing is executed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.test_dvc_trust import _import_nodes as _imports  # every import statement, TYPE_CHECKING blocks left out

PACKAGES = ("pipeline", "trainer", "sedsynth", "benchmarks")
MACHINERY = (
    "pipeline.clip",
    "pipeline.ambience",
    "pipeline.corpus",
    "pipeline.imports",
    "pipeline.mix",
    "pipeline.text",
    "pipeline.shards",
)
STAGES = ("pipeline.stages", "trainer.stages")


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layer(module: str) -> int:
    """The layer of a project module (higher imports lower)."""
    if module.split(".")[0] == "sedsynth":
        return 6
    if module.split(".")[0] == "benchmarks":
        return 5
    if _within(module, "trainer.stages"):
        return 4
    if _within(module, "trainer"):
        return 3
    if _within(module, "pipeline.stages"):
        return 2
    if any(_within(module, p) for p in MACHINERY):
        return 1
    return 0


def _module_file(name: str, root: Path) -> Path | None:
    base = root / Path(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _targets(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool, root: Path) -> set[str]:
    """Project modules one import statement names (``from pkg import mod`` names ``pkg.mod``)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = importer.split(".") if is_package else importer.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([base] if base else []))
        names = [f"{base}.{a.name}" if _module_file(f"{base}.{a.name}", root) else base for a in node.names]
    return {n for n in names if n.split(".")[0] in PACKAGES and _module_file(n, root)}


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Module name -> the project modules it imports."""
    graph: dict[str, set[str]] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            graph[name] = set().union(*(_targets(n, name, is_package, root) for n in _imports(tree))) - {name}
    return graph


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports that run upwards, or from one stage file to another."""
    bad = []
    for importer, targets in sorted(graph.items()):
        for target in sorted(targets):
            if layer(target) > layer(importer):
                bad.append(f"{importer} (layer {layer(importer)}) imports {target} (layer {layer(target)})")
            elif any(_within(importer, s) and _within(target, s) for s in STAGES) and not target.endswith("stages"):
                bad.append(f"{importer} imports {target}: a stage imports another stage")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that import each other, directly or around a loop (Tarjan's components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_imports_run_downwards_only():
    bad = upward_imports(import_graph())
    assert not bad, "imports that run upwards (move the code down, or pass what it needs in):\n  " + "\n  ".join(bad)


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "modules that import each other: " + "; ".join(" <-> ".join(c) for c in found)


MAX_POSITIONAL = 8  # past this many, callers pass by name (``*,``): a long positional call is easy to get out of order


def long_positional(root: Path = ROOT, package: str = "pipeline") -> list[str]:
    """Functions of ``package`` taking more than :data:`MAX_POSITIONAL` positional parameters (``self`` and ``cls`` count)."""
    found = []
    for path in sorted((root / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = len(node.args.posonlyargs) + len(node.args.args)
                if n > MAX_POSITIONAL:
                    found.append(f"{path.relative_to(root).as_posix()}:{node.lineno} {node.name} ({n})")
    return found


def test_no_pipeline_function_takes_more_than_eight_positional_parameters():
    found = long_positional()
    assert not found, f"make the parameters past the first few keyword-only (*,) and pass them by name: {', '.join(found)}"


@pytest.mark.parametrize("package", ["trainer", "sedsynth", "benchmarks"])
def test_no_trainer_command_or_benchmark_function_takes_more_than_eight_positional_parameters(package):
    found = long_positional(package=package)
    assert not found, f"make the parameters past the first few keyword-only (*,) and pass them by name: {', '.join(found)}"


def test_a_long_positional_signature_is_reported(toy):
    _write(
        toy,
        {
            "pipeline/mix/render.py": "def f(a, b, c, d, e, f, g, h, *, i):\n    pass\n\ndef g(a, b, c, d, e, f, g, h, i):\n    pass\n"
        },
    )
    assert long_positional(toy) == ["pipeline/mix/render.py:4 g (9)"]


def test_every_dvc_stage_is_one_file_named_for_it():
    import yaml

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    for name, stage in stages.items():
        files = [f"pipeline/stages/{name}.py", f"trainer/stages/{name}.py"]
        present = [f for f in files if (ROOT / f).is_file()]
        assert len(present) == 1, f"dvc.yaml stage {name!r}: expected exactly one of {files}"
        deps = [str(d).rstrip("/") for d in stage["deps"]]
        assert any(present[0] == d or present[0].startswith(d + "/") for d in deps), (
            f"dvc.yaml stage {name!r} does not depend on {present[0]}"
        )
        tree = ast.parse((ROOT / present[0]).read_text(encoding="utf-8"))
        assert [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"] == ["run"], (
            f"{present[0]} has no run()"
        )


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def toy(tmp_path):
    """A tiny tree in the project's shape, clean until a test plants a bad import."""
    _write(
        tmp_path,
        {
            "pipeline/__init__.py": "",
            "pipeline/schema.py": "X = 1\n",
            "pipeline/mix/__init__.py": "",
            "pipeline/mix/render.py": "from pipeline.schema import X\n",
            "pipeline/stages/__init__.py": "",
            "pipeline/stages/mix.py": "from pipeline.mix import render\n",
            "pipeline/stages/shards.py": "def run():\n    from ..schema import X\n",
            "trainer/__init__.py": "",
            "trainer/model.py": "import pipeline.schema\n",
            "sedsynth/__init__.py": "",
            "sedsynth/cli.py": "def main():\n    from pipeline.stages import mix\n",
            "benchmarks/__init__.py": "",
        },
    )
    return tmp_path


def test_the_checks_pass_a_clean_tree_and_resolve_relative_imports(toy):
    graph = import_graph(toy)
    assert graph["pipeline.stages.shards"] == {"pipeline.schema"}
    assert graph["pipeline.stages.mix"] == {"pipeline.mix.render"}
    assert graph["sedsynth.cli"] == {"pipeline.stages.mix"}
    assert upward_imports(graph) == [] and cycles(graph) == []


@pytest.mark.parametrize(
    "rel, line, expected",
    [
        (
            "pipeline/schema.py",
            "def f():\n    from pipeline.mix.render import f\n",
            "pipeline.schema (layer 0) imports pipeline.mix.render (layer 1)",
        ),
        ("trainer/model.py", "from sedsynth import cli\n", "trainer.model (layer 3) imports sedsynth.cli (layer 6)"),
        ("benchmarks/run.py", "from sedsynth import PIPELINE\n", "benchmarks.run (layer 5) imports sedsynth (layer 6)"),
        ("pipeline/stages/shards.py", "from pipeline.stages.mix import run\n", "a stage imports another stage"),
    ],
)
def test_an_upward_import_is_reported(toy, rel, line, expected):
    with open(toy / rel, "a") as f:
        f.write(line)
    bad = upward_imports(import_graph(toy))
    assert any(expected in b for b in bad), bad


def test_a_cycle_through_a_function_level_import_is_reported(toy):
    with open(toy / "pipeline/mix/render.py", "a") as f:
        f.write("def g():\n    from pipeline.mix import bank\n")
    _write(toy, {"pipeline/mix/bank.py": "from pipeline.mix.render import X\n"})
    assert cycles(import_graph(toy)) == [["pipeline.mix.bank", "pipeline.mix.render"]]
    with open(toy / "pipeline/mix/bank.py", "a") as f:
        f.write("if TYPE_CHECKING:\n    from pipeline.mix.render import g\n")
    assert cycles(import_graph(toy)) == [["pipeline.mix.bank", "pipeline.mix.render"]]
