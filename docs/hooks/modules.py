"""MkDocs hook: every module of a package, with the one-line summary its docstring starts with.

An API page holding ``<!-- modules: pipeline -->`` gets, in its place, a table of ``pipeline``
and every module and subpackage under it, each with the first sentence of its docstring (read
with ``ast``, nothing imported; Sphinx roles become code spans, as in the rendered docstrings).
A module without a docstring needs its summary on the marker's following lines, one
``module: summary`` a line, before ``-->``::

    <!-- modules: pipeline
    pipeline.mix: The mix stage's machinery: ...
    -->

The build fails on a module with neither, so a new module cannot go unlisted or undescribed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- modules: (?P<package>[\w.]+)(?P<given>(?:\n(?!-->)[^\n]*)*?)\s*-->$", re.MULTILINE)
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|obj|exc|const):`(~?)([^`]+)`")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(])")


def modules(package: str) -> list[tuple[str, Path]]:
    """``package`` and every module and subpackage under it, by dotted name, in name order."""
    root = ROOT / package.replace(".", "/")
    found = []
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if any(p.startswith("_") and p != "__main__" for p in name.split(".")):
            continue
        found.append((name, path))
    return sorted(found)


def summary(path: Path) -> str | None:
    """The first sentence of the module's docstring, on one line; None without a docstring."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    if not doc or not doc.strip():
        return None
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    first = SENTENCE_END.split(paragraph, maxsplit=1)[0]
    return ROLE.sub(lambda m: f"``{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}``", first)


def table(package: str, given: dict[str, str]) -> str:
    lines = ["| module | what it is |", "| --- | --- |"]
    missing = []
    for name, path in modules(package):
        text = summary(path) or given.get(name)
        if not text:
            missing.append(name)
            continue
        lines.append(f"| `{name}` | {text.replace('|', chr(92) + '|')} |")
    if missing:
        raise ValueError(f"modules without a docstring or a summary on the page: {', '.join(missing)}")
    return "\n".join(lines)


def render(markdown: str) -> str:
    def one(match: re.Match) -> str:
        given = dict(line.split(":", 1) for line in match.group("given").strip().splitlines() if line.strip())
        return table(match.group("package"), {k.strip(): v.strip() for k, v in given.items()})

    return MARKER.sub(one, markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:
    return render(markdown)
