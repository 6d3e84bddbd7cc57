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
- The README: at most 300 lines, one "What you should see" section, links only to files under
  ``docs/`` that exist (and, for a page, to a heading it has), and the docs repeat its test
  command, which is CI's (``tests/test_dvc_pipeline.py`` checks the README against ``.ci/run``).
- ``mkdocs build --strict`` succeeds: no broken link or anchor, no page outside the navigation,
  no docstring the API reference cannot render. Skipped where MkDocs is not installed.
"""

from __future__ import annotations

import argparse
import importlib.util
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
MAX_README_LINES = 300

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.MULTILINE)
README_SECTION = re.compile(r"^<!-- README: (.+?) -->$", re.MULTILINE)


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
        for row in lines[i + 2:]:
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
    """The heading anchors of a page, the README sections it shows included."""
    text = page.read_text(encoding="utf-8")
    for title in README_SECTION.findall(text):
        readme = README.read_text(encoding="utf-8")
        section = re.search(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", readme, re.MULTILINE | re.DOTALL)
        text += "\n" + (section.group(0) if section else "")
    return {slug(h) for h in HEADING.findall(FENCE.sub("", text))}


def test_every_command_is_documented() -> None:
    from sedsynth.cli import build_parser

    code = "\n".join(t for text in pages().values() for t in code_texts(text))
    found = commands(build_parser())
    assert ("bench", "clip") in found and ("train",) in found, found
    missing = [" ".join(c) for c in found if not re.search(r"\bsedsynth\s+" + r"\s+".join(map(re.escape, c)) + r"(?![\w-])", code)]
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
    assert len(readme.splitlines()) <= MAX_README_LINES, f"README.md has {len(readme.splitlines())} lines; keep it to {MAX_README_LINES}"
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


def test_docs_repeat_the_ci_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert ci in (DOCS / "getting-started.md").read_text(encoding="utf-8"), "docs/getting-started.md shows CI's test command"


def test_api_reference_covers_every_package() -> None:
    """Every top-level package has its API page; a page names packages, not modules that may move."""
    api = {p.stem: p.read_text(encoding="utf-8") for p in (DOCS / "api").glob("*.md")}
    for package in ("pipeline", "trainer", "sedsynth", "benchmarks"):
        assert re.search(rf"^::: {package}$", api.get(package, ""), re.MULTILINE), f"docs/api/{package}.md renders ::: {package}"


@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("mkdocs", "material", "mkdocstrings_handlers.python")),
                    reason="MkDocs, mkdocs-material or mkdocstrings[python] is not installed (pip install -e '.[docs]')")
def test_site_builds_strictly(tmp_path: Path) -> None:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert (tmp_path / "site" / "stages" / "mix" / "index.html").is_file()
    assert "What you should see" in (tmp_path / "site" / "getting-started" / "index.html").read_text(encoding="utf-8")
