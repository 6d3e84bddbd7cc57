"""Readers of real strong-label corpora, and writing them as shards.

Each corpus kind has a module with ``read(root: Path, options: dict) -> (list[ImportedClip],
list[Skip])``: it parses the corpus's own annotation files in their published layout into
:class:`~pipeline.schema.ImportedClip` records (no audio is read) and reports every row it
cannot use as a :class:`~pipeline.schema.Skip` with its reason. :mod:`pipeline.imports.writer`
turns the clips into the same Parquet shards the synthetic pipeline writes.

Every file a reader or the writer opens under the corpus root must also resolve under it: one
that a symbolic link leads out of the root is skipped as ``outside-root``
(:func:`pipeline.imports.dcase.outside_root`), so a downloaded corpus cannot make an import read
``~/.ssh`` or ``/etc`` into its shards or its messages.
"""

from __future__ import annotations

import importlib

KINDS = {
    "audioset-strong": "pipeline.imports.audioset_strong",  # AudioSet-Strong segment TSVs
    "tacos": "pipeline.imports.tacos",  # TACOS strong free-text captions
    "desed": "pipeline.imports.dcase",  # DESED real (DCASE task 4 TSVs)
    "dcase-tsv": "pipeline.imports.dcase",  # any DCASE strong TSV (filename onset offset event_label)
    "urban-sed": "pipeline.imports.urban_sed",  # URBAN-SED txt or JAMS annotations
}


def reader(kind: str):
    """The ``read`` function of a corpus kind; ``ValueError`` naming the kinds for an unknown one."""
    if kind not in KINDS:
        raise ValueError(f"import: unknown corpus kind {kind!r}; one of {', '.join(KINDS)}")
    module = importlib.import_module(KINDS[kind])
    return getattr(module, "read_" + kind.replace("-", "_"), None) or module.read
