"""The documentation site (``docs/``, ``mkdocs.yml``) covers the project, and the README stays short.

What counts as documented:

- A command: every ``sedsynth`` subcommand, nested ones included, appears as
  ``sedsynth <command path>`` inside code (a code span or a fenced block) on some page. The
  parser is walked recursively: its subparsers, and a positional argument whose ``choices`` say
  what to run (``sedsynth bench WHAT``), whose choices count as nested commands
  (``sedsynth bench clip``).
- A parameter: every key of ``params.yaml``, flattened to a dotted path (mappings nest; a list
  or an empty mapping is one key: ``train.data.sources``, ``mix.spec``), either appears whole
  inside code on some page (``mix.mixtures.train``, ``--set clip.max_duration_s=5``), or is a row
  of a parameter table: a Markdown table whose header's first cell is the code span of a prefix
  of the path (``| `clip.segmentation` | default | ... |``) and a row whose first cell holds the
  code span of the rest (``| `hop_s` | ...``). A leaf name in prose does not count: ``out_dir``
  is a key of a dozen sections, and a table row only counts under the section that heads it.
  A parameter table's row that names no key of ``params.yaml`` is stale and fails too.
- The README: at most 150 lines, one "What you should see" section with one table and one
  picture, links only to files under ``docs/`` that exist (and, for a page, to a heading it has),
  and the docs repeat its test command, which is CI's (``tests/test_dvc_pipeline.py`` checks the
  README against ``.ci/run``).
- One source for every figure: the README's table of the default run's figures is what
  ``docs/hooks/figures.py`` renders from ``benchmarks/results/`` (``python docs/hooks/figures.py``
  writes it again); every result file has its command, commit, machine and figures, and every
  placeholder and marker on a page resolves. ``sedsynth bench ... --save`` writes a file of that
  format.
- Rendering: no ``\\|`` inside a code span in a table (Python-Markdown shows the backslash); no
  page names a scratch file or folder outside the repository.
- ``mkdocs build --strict`` succeeds: no broken link or anchor, no page outside the navigation,
  no docstring the API reference cannot render. Skipped where MkDocs is not installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
MAX_README_LINES = 150

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.MULTILINE)
RESULTS = ROOT / "benchmarks" / "results"


def pages() -> dict[str, str]:
    """Every Markdown page of the site, by its path under ``docs/``."""
    return {str(p.relative_to(DOCS)): p.read_text(encoding="utf-8") for p in sorted(DOCS.rglob("*.md"))}


def code_texts(markdown: str) -> list[str]:
    """The text inside the page's fenced blocks and code spans."""
    blocks = [m.group(0) for m in FENCE.finditer(markdown)]
    prose = FENCE.sub("", markdown)
    return blocks + [m.group(2) for m in CODE_SPAN.finditer(prose)]


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path under ``parser``: subparsers, recursively, and the choices of a positional
    argument that names what to run."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((*path, name))
                found += commands(sub, (*path, name))
        elif not action.option_strings and action.choices and not isinstance(action.choices, dict):
            found += [(*path, str(choice)) for choice in action.choices]
    return found


def flat_keys(mapping: dict, prefix: str = "") -> list[str]:
    """Dotted paths of ``mapping``'s leaves; a list or an empty mapping is a leaf."""
    keys = []
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        keys += flat_keys(value, path + ".") if isinstance(value, dict) and value else [path]
    return keys


def table_keys(markdown: str) -> set[str]:
    """The dotted paths a page's parameter tables document: header prefix + row name."""
    keys: set[str] = set()
    lines = markdown.splitlines()
    for i, line in enumerate(lines[:-1]):
        if not (line.startswith("|") and re.match(r"^\|[\s:|-]+\|$", lines[i + 1].strip())):
            continue
        prefix = re.fullmatch(r"`([\w.-]+)`", line.strip("|").split("|")[0].strip())
        if not prefix:
            continue
        for row in lines[i + 2 :]:
            if not row.startswith("|"):
                break
            first = re.split(r"(?<!\\)\|", row.strip("|"))[0]
            keys |= {f"{prefix.group(1)}.{name}" for name in re.findall(r"`([\w.-]+)`", first)}
    return keys


def slug(heading: str) -> str:
    """A heading's anchor as Python-Markdown's toc extension (and GitHub, for these headings) writes it."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    """The heading anchors of a page."""
    return {slug(h) for h in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8")))}


def figures_hook():
    """``docs/hooks/figures.py``, the one renderer of the figures (MkDocs loads it by path, as this does)."""
    spec = importlib.util.spec_from_file_location("docs_figures_hook", DOCS / "hooks" / "figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_command_is_documented() -> None:
    from sedsynth.cli import build_parser

    code = "\n".join(t for text in pages().values() for t in code_texts(text))
    found = commands(build_parser())
    assert ("bench", "clip") in found and ("train",) in found, found
    missing = [
        " ".join(c) for c in found if not re.search(r"\bsedsynth\s+" + r"\s+".join(map(re.escape, c)) + r"(?![\w-])", code)
    ]
    assert not missing, f"commands no docs page names in code: {', '.join('sedsynth ' + m for m in missing)}"


def test_every_parameter_is_documented() -> None:
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    keys = flat_keys(params)
    assert "mix.mixtures.train" in keys and "train.data.sources" in keys and "mix.spec" in keys
    documented: set[str] = set()
    code = "\n".join(t for text in pages().values() for t in code_texts(text))
    for text in pages().values():
        documented |= table_keys(text)
    missing = [k for k in keys if k not in documented and not re.search(rf"(?<![\w.]){re.escape(k)}(?![\w])", code)]
    assert not missing, f"params.yaml keys no docs page documents: {', '.join(missing)}"
    stale = sorted(documented - set(keys))
    assert not stale, f"parameter tables name keys params.yaml does not have: {', '.join(stale)}"


def test_readme_is_short_and_links_into_the_docs() -> None:
    readme = README.read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= MAX_README_LINES, (
        f"README.md has {len(readme.splitlines())} lines; keep it to {MAX_README_LINES}"
    )
    assert len(re.findall(r"^## What you should see$", readme, re.MULTILINE)) == 1
    bad = []
    for target in LINK.findall(FENCE.sub("", readme)):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path, _, anchor = target.partition("#")
        if not path.startswith("docs/") or not (ROOT / path).is_file():
            bad.append(f"{target} (not a file under docs/)")
        elif anchor and path.endswith(".md") and anchor not in anchors(ROOT / path):
            bad.append(f"{target} (no such heading)")
    assert not bad, f"README.md links: {'; '.join(bad)}"
    section = re.search(r"^## What you should see\n.*?(?=^## |\Z)", readme, re.MULTILINE | re.DOTALL).group(0)
    assert len(re.findall(r"^\|[\s:|-]+\|$", section, re.MULTILINE)) == 1, "one table in 'What you should see'"
    assert len(re.findall(r"!\[[^\]]*\]\(", section)) == 1, "one picture in 'What you should see'"


def test_readme_figures_are_the_results_files() -> None:
    """The README's table of the default run is what the hook renders from benchmarks/results/default.json;
    after changing a result file, ``python docs/hooks/figures.py`` writes it again."""
    hook = figures_hook()
    readme = README.read_text(encoding="utf-8")
    assert "<!-- figures:default -->" in readme and "<!-- /figures:default -->" in readme
    assert hook.render_readme(readme) == readme, (
        "README.md's figures differ from benchmarks/results/: run python docs/hooks/figures.py"
    )
    psds1 = hook.text(hook.load("default"), "trained.psds1")
    assert f"| {psds1} |" in readme


def test_every_result_file_names_its_run_and_every_page_placeholder_resolves() -> None:
    hook = figures_hook()
    files = sorted(RESULTS.glob("*.json"))
    assert {"default", "detection"} <= {p.stem for p in files}
    for path in files:
        result = json.loads(path.read_text(encoding="utf-8"))
        missing = {"benchmark", "command", "commit", "machine", "figures"} - set(result)
        assert not missing, f"{path.name}: no {', '.join(sorted(missing))}"
        assert re.fullmatch(r"[0-9a-f]{40}(\+modified)?", result["commit"]), f"{path.name}: commit {result['commit']!r}"
        for template in (result.get("headline") or {}).values():
            if isinstance(template, str):
                hook.fill(result, template)  # a figure a template names that the file lacks raises KeyError
    for name, text in pages().items():
        rendered = hook.render_page(re.sub(r"\\\{\{.*?\}\}", "", text))  # a placeholder written out, escaped, stays
        assert not re.search(r"^<!-- figures:", rendered, re.MULTILINE), f"docs/{name}: a figures marker the hook does not know"
        assert not re.search(r"\{\{\s*(figure|source)\(\s*\"", rendered), f"docs/{name}: a placeholder left unrendered"
    headlines = hook.headline_table()
    assert headlines.count("\n") - 1 == sum("headline" in json.loads(p.read_text()) for p in files)


def test_bench_save_writes_a_result_file(tmp_path: Path, monkeypatch) -> None:
    """``sedsynth bench NAME --save PATH``: the figures the benchmark returns, the lines it printed, the
    command that reproduces it, the machine and the commit, in the format the docs render."""
    from benchmarks import run as bench
    from sedsynth.cli import main

    def stand_in(args, params):
        print("bench llm-cache: 1.5 ms against 300 ms")
        return {"append_ms": 1.5, "rewrite_ms": 300, "ratio": 200.0, "sizes": (5000, 100000)}

    monkeypatch.setitem(bench.BENCHMARKS, "llm-cache", stand_in)
    saved = tmp_path / "results" / "llm-cache.json"
    assert main(["bench", "llm-cache", "--repeat", "1", "--params", str(ROOT / "params.yaml"), "--save", str(saved)]) == 0
    result = json.loads(saved.read_text(encoding="utf-8"))
    assert (
        result["benchmark"] == "llm-cache"
        and result["command"] == "sedsynth bench llm-cache --params " + str(ROOT / "params.yaml") + " --repeat 1"
    )
    assert result["figures"] == {"append_ms": 1.5, "rewrite_ms": 300, "ratio": 200.0, "sizes": [5000, 100000]}
    assert result["printed"] == ["bench llm-cache: 1.5 ms against 300 ms"]
    assert result["machine"] and (result["commit"] is None or re.fullmatch(r"[0-9a-f]{40}(\+modified)?", result["commit"]))
    hook = figures_hook()
    assert hook.text(result, "sizes") == "5,000-100,000" and hook.fill(result, "{ratio}x") == "200.0x"


def test_no_escaped_pipe_inside_code_in_a_table() -> None:
    """Python-Markdown's tables show the backslash of ``\\|`` inside a code span; name the choices apart."""
    bad = [
        f"docs/{name}:{i}"
        for name, text in pages().items()
        for i, line in enumerate(FENCE.sub("", text).splitlines(), 1)
        if line.startswith("|") and any("\\|" in m.group(2) for m in CODE_SPAN.finditer(line))
    ]
    assert not bad, f"a code span with \\| in a table: {', '.join(bad)}"


def test_no_page_names_scratch_files_or_run_history() -> None:
    """The docs say what is: no files outside the repository, no scripts that are not in it, no history of runs."""
    banned = re.compile(r"/tmp/|bench-out/\w+\.py|load average|mallinfo|earlier versions|the run before", re.IGNORECASE)
    texts = {f"docs/{name}": text for name, text in pages().items() if name not in ("reliability.md", "view.md")}
    texts["README.md"] = README.read_text(encoding="utf-8")
    bad = [f"{name}: {m.group(0)!r}" for name, text in texts.items() for m in banned.finditer(text)]
    assert not bad, "; ".join(bad)


def test_the_slow_tier_names_existing_tests() -> None:
    """Every node-id prefix of tests/conftest.py's SLOW names a test that exists (renamed tests fall out of the tier)."""
    from tests.conftest import SLOW, slow_tier_tests

    for prefix in (*SLOW, *sorted(slow_tier_tests())):
        path, _, name = prefix.partition("::")
        source = (ROOT / path).read_text(encoding="utf-8")
        assert re.search(rf"^def {re.escape(name)}", source, re.MULTILINE), f"no test {prefix}*"
    assert re.search(r'^\s*"slow: ', (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.MULTILINE), (
        "pyproject.toml registers the slow marker"
    )


def test_docs_repeat_the_ci_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert ci in (DOCS / "getting-started.md").read_text(encoding="utf-8"), "docs/getting-started.md shows CI's test command"


def test_api_reference_covers_every_package() -> None:
    """Every top-level package has its API page, listing every module (the hook's table) before its entry points."""
    api = {p.stem: p.read_text(encoding="utf-8") for p in (DOCS / "api").glob("*.md")}
    for package in ("pipeline", "trainer", "sedsynth", "benchmarks"):
        assert re.search(rf"^<!-- modules: {package}\b", api.get(package, ""), re.MULTILINE), (
            f"docs/api/{package}.md lists its modules"
        )
        assert re.search(rf"^::: {package}\.", api[package], re.MULTILINE), f"docs/api/{package}.md renders its entry points"


@pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("mkdocs", "material", "mkdocstrings_handlers.python")),
    reason="MkDocs, mkdocs-material or mkdocstrings[python] is not installed (pip install -e '.[docs]')",
)
def test_site_builds_strictly(tmp_path: Path) -> None:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    site = tmp_path / "site"
    assert (site / "stages" / "mix" / "index.html").is_file()
    hook = figures_hook()
    started = (site / "getting-started" / "index.html").read_text(encoding="utf-8")
    assert (
        "What you should see" in started
        and f'<td style="text-align: right;">{hook.figure("default", "trained.psds1")}</td>' in started
    )
    benchmarks = (site / "benchmarks" / "index.html").read_text(encoding="utf-8")
    assert hook.figure("clip", "clip_source_s_per_s") in benchmarks and "{{" not in benchmarks
    words = sum(
        len(
            re.sub(
                r"<[^>]+>",
                " ",
                re.search(
                    r"<article.*?</article>", (site / "api" / p / "index.html").read_text(encoding="utf-8"), re.DOTALL
                ).group(0),
            ).split()
        )
        for p in ("pipeline", "trainer", "sedsynth", "benchmarks")
    )
    assert words < 15000, f"the API reference has {words} words: the public surface only"
