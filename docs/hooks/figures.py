"""Every figure the docs quote, from one place: the result files in ``benchmarks/results/``.

A result file (``benchmarks/results/<name>.json``) holds one run: ``benchmark``, ``what`` it
measures, the ``command`` that printed the figures, the ``commit`` they were measured on, the
``machine``, and the ``figures`` themselves (``sedsynth bench ... --save PATH`` writes those
fields, and ``printed``, the lines the benchmark printed). A file the docs quote in their
headline table adds ``headline``: what, figure, peer and ratio as templates whose ``{path}``
names a figure (``{stages.mix.wall_s}``), ``section``, the anchor on the Benchmarks page, and
``order``, its place in the table. An
optional ``format`` maps figure paths (glob patterns) to format specs (``".3f"``); otherwise an
integer is written with thousands separators, a float as it is stored, a list as its range.

In a page (MkDocs, through this hook):

- ``{{ figure("clip", "clip_source_s_per_s") }}`` is that figure;
- ``<!-- figures:default -->`` is the default run's table (``default.json``'s ``rows``, trained
  against untrained); ``<!-- figures:headlines -->`` the headline table of every file with a
  ``headline``; ``<!-- figures:detection -->`` the detection benchmark's epochs;
  ``<!-- figures:scale -->`` the full-size data stages; ``<!-- figures:real_library -->`` and
  ``<!-- figures:real_library_classes -->`` the recipe on real recordings, overall and per class;
- ``{{ source("clip") }}`` names a file's command, commit, machine and path;
- a backslash before either (``\\{{ figure(...) }}``) keeps it as written, without the backslash.

README.md is rendered by GitHub, without hooks, so it holds the rendered table between
``<!-- figures:default -->`` and ``<!-- /figures:default -->``; ``python docs/hooks/figures.py``
writes it again from the results, and ``tests/test_docs.py`` fails while it differs.
"""

from __future__ import annotations

import fnmatch
import json
import re
import sys
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
REPOSITORY = "benchmarks/results"

FIGURE = re.compile(r"(\\?)\{\{\s*figure\(\s*\"([\w.-]+)\"\s*,\s*\"([\w.*-]+)\"\s*\)\s*\}\}")
SOURCE = re.compile(r"(\\?)\{\{\s*source\(\s*\"([\w.-]+)\"\s*\)\s*\}\}")
MARKER = re.compile(r"^<!-- figures:(\w+) -->$", re.MULTILINE)
BLOCK = re.compile(r"^<!-- figures:(\w+) -->\n.*?^<!-- /figures:\1 -->$", re.MULTILINE | re.DOTALL)
TEMPLATE = re.compile(r"\{([\w.-]+)\}")


@lru_cache(maxsize=None)
def load(name: str) -> dict:
    """The result file ``benchmarks/results/<name>.json``."""
    path = RESULTS / f"{name}.json"
    if not path.is_file():
        raise KeyError(f"no result file {REPOSITORY}/{name}.json")
    return json.loads(path.read_text(encoding="utf-8"))


def names() -> list[str]:
    """Every result file's name, sorted."""
    return sorted(p.stem for p in RESULTS.glob("*.json"))


def value(result: dict, path: str):
    """The figure at a dotted ``path`` of ``result["figures"]``."""
    found = result["figures"]
    for part in path.split("."):
        if not isinstance(found, dict) or part not in found:
            raise KeyError(f"{result['benchmark']}: no figure {path!r}")
        found = found[part]
    return found


def _spec(result: dict, path: str) -> str | None:
    for pattern, spec in result.get("format", {}).items():
        if fnmatch.fnmatchcase(path, pattern):
            return spec
    return None


def _one(number, spec: str | None) -> str:
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        return str(number)
    if spec:
        return format(number, spec)
    return f"{number:,}" if isinstance(number, int) else repr(number)


def text(result: dict, path: str) -> str:
    """A figure as the docs write it: its format spec, thousands separators for an integer, a
    list as its range (``776-817``), or its only value."""
    found, spec = value(result, path), _spec(result, path)
    if isinstance(found, list):
        low, high = min(found), max(found)
        return _one(low, spec) if low == high else f"{_one(low, spec)}-{_one(high, spec)}"
    return _one(found, spec)


def fill(result: dict, template: str) -> str:
    """``template`` with each ``{path}`` replaced by that figure."""
    return TEMPLATE.sub(lambda m: text(result, m.group(1)), template)


def figure(name: str, path: str) -> str:
    return text(load(name), path)


def short(commit: str) -> str:
    return commit[:7]


def source(name: str) -> str:
    """One line naming where a result file's figures come from."""
    result = load(name)
    return f"`{result['command']}` at commit `{short(result['commit'])}` ({result['machine']}); `{REPOSITORY}/{name}.json`"


def default_table() -> str:
    """The default run's figures: one row per ``rows`` entry, trained against untrained."""
    result = load("default")
    lines = ["| figure | trained | untrained |", "| --- | ---: | ---: |"]
    for label, key in result["rows"]:
        lines.append(f"| {label} | {text(result, 'trained.' + key)} | {text(result, 'untrained.' + key)} |")
    return "\n".join(lines)


def headline_table() -> str:
    """One row per result file with a ``headline``: what, figure, the peer in the same run, ratio, command."""
    lines = ["| what | figure | peer in the same run | ratio | command |", "| --- | --- | --- | --- | --- |"]
    headed = [(load(name)["headline"].get("order", 0), name) for name in names() if "headline" in load(name)]
    for _, name in sorted(headed):
        result = load(name)
        head = result["headline"]
        cells = [
            f"[{head['what']}](#{head['section']})",
            fill(result, head["figure"]),
            fill(result, head["peer"]),
            fill(result, head["ratio"]),
            f"`{result['command']}`",
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def detection_table() -> str:
    """The detection benchmark's epochs: held-out figures against training steps."""
    result = load("detection")
    lines = [
        "| steps | PSDS1 | PSDS2 | segment AUROC | zero-shot, clip / frame head | encoder probe, AUROC / segment F1 |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in value(result, "epochs"):
        lines.append(
            f"| {row['step']:,} | {row['psds1']:.3f} | {row['psds2']:.3f} | {row['auroc']:.3f} | "
            f"{row['zero_shot_accuracy']:.3f} / {row['zero_shot_frame_accuracy']:.3f} | "
            f"{row['probe_frame_auroc']:.3f} / {row['probe_segment_f1']:.3f} |"
        )
    return "\n".join(lines)


def scale_table() -> str:
    """The full-size data stages: wall time and the peak memory of each stage's process tree."""
    result = load("scale")
    lines = ["| stage | wall s | peak RSS, MiB | anon, MiB | PSS, MiB |", "| --- | ---: | ---: | ---: | ---: |"]
    for stage in value(result, "stages"):
        cells = [text(result, f"stages.{stage}.{key}") for key in ("wall_s", "peak_rss_mib", "anon_mib", "pss_mib")]
        lines.append(f"| `{stage}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


REAL = (("real-library", "default recipe"), ("real-library-recipe", "configs/library.yaml"))  # result files, their column


def real_library_table() -> str:
    """The default recipe and ``configs/library.yaml`` on real recordings (trained), beside the default run's trained model."""
    default = load("default")
    results = [(load(name), column) for name, column in REAL]
    head = " | ".join(f"real, {column}" for _, column in results)
    lines = [f"| figure | real, untrained | {head} | default run |", "| --- | ---: |" + " ---: |" * (len(results) + 1)]

    def score(result: dict, path: str) -> str:  # a bench result file's figures are stored unrounded
        found = value(result, path)
        return "-" if found is None else f"{found:.3f}"

    for label, key in default["rows"]:
        cells = [score(results[0][0], "untrained." + key)] + [score(r, "trained." + key) for r, _ in results]
        lines.append(f"| {label} | " + " | ".join(cells + [text(default, "trained." + key)]) + " |")
    return "\n".join(lines)


def real_library_classes() -> str:
    """Each class's PSDS on real recordings under both recipes (test events of each), best PSDS2 of the last first."""
    results = [(value(load(name), "per_class"), column) for name, column in REAL]
    head = " | ".join(f"{column}: events, PSDS1, PSDS2" for _, column in results)
    lines = [f"| class | {head} |", "| --- |" + " ---: |" * len(results)]
    last = results[-1][0]
    for label in sorted(last, key=lambda c: (-last[c]["psds2"], c)):
        cells = [
            f"{r[label]['events']:,}, {r[label]['psds1']:.3f}, {r[label]['psds2']:.3f}" if label in r else "-" for r, _ in results
        ]
        lines.append(f"| `{label}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


TABLES = {
    "default": default_table,
    "headlines": headline_table,
    "detection": detection_table,
    "scale": scale_table,
    "real_library": real_library_table,
    "real_library_classes": real_library_classes,
}


def rendered(kind: str) -> str:
    if kind not in TABLES:
        raise ValueError(f"unknown figures marker {kind!r}: one of {', '.join(TABLES)}")
    return TABLES[kind]()


def render_page(markdown: str) -> str:
    """A docs page with its markers and ``figure(...)`` placeholders replaced."""
    markdown = MARKER.sub(lambda m: rendered(m.group(1)), markdown)
    markdown = SOURCE.sub(lambda m: m.group(0)[1:] if m.group(1) else source(m.group(2)), markdown)
    return FIGURE.sub(lambda m: m.group(0)[1:] if m.group(1) else figure(m.group(2), m.group(3)), markdown)


def render_readme(readme: str) -> str:
    """README.md with every ``<!-- figures:KIND -->`` ... ``<!-- /figures:KIND -->`` block written again."""
    return BLOCK.sub(lambda m: f"<!-- figures:{m.group(1)} -->\n{rendered(m.group(1))}\n<!-- /figures:{m.group(1)} -->", readme)


def on_pre_build(config) -> None:
    load.cache_clear()  # mkdocs serve: a result file edited since the last build


def on_page_markdown(markdown: str, page, config, files) -> str:
    return render_page(markdown)


def main(argv: list[str]) -> int:
    """``python docs/hooks/figures.py [--check]``: write README.md's figure blocks from the results
    (``--check``: only say whether they are up to date; exit status 1 when not)."""
    readme = ROOT / "README.md"
    old = readme.read_text(encoding="utf-8")
    new = render_readme(old)
    if "--check" in argv:
        print("README.md's figures are up to date" if new == old else "README.md's figures differ from benchmarks/results/")
        return 0 if new == old else 1
    if new != old:
        readme.write_text(new, encoding="utf-8")
    print("README.md's figures written from benchmarks/results/")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
