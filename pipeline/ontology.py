"""The AudioSet ontology: class names, MIDs and the parent/child hierarchy.

Input: the ontology JSON shipped in ``pipeline/data`` (or any file of the same format).
Output: an :class:`Ontology` that resolves names and MIDs, lists ancestors, and converts
between AudioSet display names and FSD50K label names.

FSD50K writes AudioSet names with ``_`` for spaces and ``_and_`` for ``", "`` (and for
``", and "``), so ``"Dishes, pots, and pans"`` is ``Dishes_and_pots_and_pans``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"
ONTOLOGY_PATH = DATA_DIR / "audioset_ontology.json"


def fsd50k_label_name(audioset_name: str) -> str:
    """AudioSet display name -> FSD50K label name (``"Chirp, tweet"`` -> ``"Chirp_and_tweet"``)."""
    return audioset_name.replace(", and ", "_and_").replace(", ", "_and_").replace(" ", "_")


@dataclass(frozen=True)
class OntologyClass:
    mid: str
    name: str
    description: str
    child_mids: tuple[str, ...]
    abstract: bool


class Ontology:
    """Lookup over the AudioSet hierarchy. A class may have several parents."""

    def __init__(self, classes: list[OntologyClass]):
        self.by_mid = {c.mid: c for c in classes}
        self.by_name = {c.name: c for c in classes}
        self.by_fsd50k_name = {fsd50k_label_name(c.name): c for c in classes}
        parents: dict[str, set[str]] = {c.mid: set() for c in classes}
        for c in classes:
            for child in c.child_mids:
                parents.setdefault(child, set()).add(c.mid)
        self.parent_mids = {mid: tuple(sorted(p)) for mid, p in parents.items()}

    @classmethod
    def load(cls, path: Path | str = ONTOLOGY_PATH) -> "Ontology":
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls(
            [
                OntologyClass(
                    mid=r["id"],
                    name=r["name"],
                    description=r.get("description", ""),
                    child_mids=tuple(r.get("child_ids", [])),
                    abstract="abstract" in r.get("restrictions", []),
                )
                for r in raw
            ]
        )

    def ancestors(self, mid: str) -> list[str]:
        """All ancestors of ``mid`` (nearest first, each once); empty for unknown MIDs."""
        seen: list[str] = []
        frontier = list(self.parent_mids.get(mid, ()))
        while frontier:
            nxt: list[str] = []
            for p in frontier:
                if p not in seen:
                    seen.append(p)
                    nxt.extend(self.parent_mids.get(p, ()))
            frontier = nxt
        return seen

    def leaf_mids(self, mids: list[str]) -> list[str]:
        """The MIDs of ``mids`` that are not an ancestor of another MID in ``mids``.

        FSD50K label lists carry each label's ancestors; the leaves are the labels proper.
        MIDs missing from the ontology count as leaves.
        """
        unique = list(dict.fromkeys(mids))
        covered: set[str] = set()
        for mid in unique:
            covered.update(self.ancestors(mid))
        return [m for m in unique if m not in covered]


@cache
def default_ontology() -> Ontology:
    """The ontology shipped with the project, loaded once per process."""
    return Ontology.load()
