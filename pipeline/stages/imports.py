"""The import stage: a real strong-label corpus -> the shard folder the synthetic pipeline writes.

Input: a corpus kind (:data:`pipeline.imports.KINDS`), its root folder in the corpus's
published layout, and the reader's options (``imports.options[<kind>]`` from the params, with
``options`` given here on top). Output, in ``out_dir`` (default ``imports.out_dir`` with
``{kind}`` filled in): shards, ``index.json``, the dataset card, ``clusters/``, licences,
``skipped.csv`` and ``summary.json`` (see :mod:`pipeline.imports.writer`). Not a DVC stage:
the corpora live outside the repository; run it with ``sedsynth import KIND ROOT``.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config.params import folders_besides
from pipeline.imports import KINDS, reader
from pipeline.imports.writer import write_import
from pipeline.outputs import check_out_dir


class CorpusImportError(ValueError):
    """An import the user must set up differently; the message says how."""


def run(params, kind: str, root: Path | str, out_dir: Path | str | None = None, options: dict | None = None, index=None) -> dict:
    """Read the corpus under ``root`` and write its shard folder; returns the summary.

    ``index``: a prepared :class:`~pipeline.text.clustering.ClusterIndex` (default: built
    from ``params.clusters``).
    """
    if kind not in KINDS:
        raise CorpusImportError(f"import: unknown corpus kind {kind!r}; one of {', '.join(KINDS)}")
    unknown = sorted(set(params.imports.options) - set(KINDS))
    if unknown:
        raise CorpusImportError(f"params: imports.options names unknown corpus kind(s) {unknown}; use {', '.join(KINDS)}")
    root = Path(root)
    if not root.is_dir():
        raise CorpusImportError(
            f"import {kind}: corpus root {root} is not a folder; pass the folder that holds the corpus's annotation files"
        )
    out_dir = Path(out_dir or params.imports.out_dir.format(kind=kind))
    check_out_dir(out_dir, "imports.out_dir", {**folders_besides(params, "imports.out_dir"), "the corpus root": root})
    merged = {**params.imports.options.get(kind, {}), **(options or {})}
    clips, skips = reader(kind)(root, merged)
    return write_import(clips, skips, root, out_dir, params, kind, index=index)
