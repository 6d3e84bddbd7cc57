"""Natural phrases for AudioSet labels, and joining phrases into English.

Input: an ontology class (display name and parents). Output: phrases, most
natural first: ``"Chirp, tweet"`` gives ``chirp`` and ``tweet``; ``"Bark"`` (a child of
``Dog``) gives ``bark`` and ``dog bark``; ``"Coin (dropping)"`` gives ``coin dropping``. Every
phrase names the sound: the ontology's descriptions ("A tool or device ...") are never cut into
phrases, since a fragment such as ``a tool or device`` names no sound and would teach a model a
wrong word for it. These rules make the offline default of ``pipeline/data/label_phrases.json``;
an LLM can add variants (:mod:`pipeline.text.label_phrases`).
"""

from __future__ import annotations

import re

from pipeline.ontology import Ontology

ANIMAL_MID = "/m/0jbk"


def _lower(text: str) -> str:
    """Lower-case words, keeping acronyms and mixed-case names (``DTMF``, ``MP3``)."""
    return " ".join(w if any(c.isupper() for c in w[1:]) else w.lower() for w in text.split())


def name_phrases(name: str) -> list[str]:
    """Phrases from a display name: its comma alternatives, parentheses folded in. A parenthesis
    that lists examples (``"Roaring cats (lions, tigers)"``) is dropped, as is a trailing ``etc.``"""
    name = re.sub(r" \([^()]*,[^()]*\)", "", name)
    parts = [p.strip() for p in name.split(", ") if p.strip() not in ("etc.", "etc")]
    if len(parts) > 1 and parts[-1].startswith("and "):  # a list: "Dishes, pots, and pans"
        parts = [", ".join(parts[:-1]) + " " + parts[-1]]
    out: list[str] = []
    for part in parts:
        m = re.fullmatch(r"(.+?) \((.+)\)", part)
        if m:
            head, qualifier = m.group(1), m.group(2)
            adjective = " " not in qualifier and qualifier.endswith(("al", "ic"))
            folded = f"{qualifier} {head}" if adjective else f"{head} {qualifier}"
            out += [folded, head]
        else:
            out.append(part)
    return _unique(_lower(p) for p in out)


def parent_phrase(onto: Ontology, mid: str, phrase: str) -> str | None:
    """``"dog bark"`` for ``Bark``: an animal sound qualified by its one animal parent."""
    parents = onto.parent_mids.get(mid, ())
    if len(parents) != 1 or ANIMAL_MID not in (parents[0], *onto.ancestors(parents[0])):
        return None
    parent = onto.by_mid[parents[0]]
    if parent.abstract:
        return None
    word = _lower(parent.name.split(", ")[0])
    if " " in word or word in phrase:
        return None
    return f"{word} {phrase}"


def label_phrases(onto: Ontology, mid: str, name: str | None = None) -> list[str]:
    """Every derived phrase of a class, most natural first (the display name's first part)."""
    cls = onto.by_mid.get(mid)
    names = name_phrases(name if name is not None else cls.name)
    if cls is None:
        return names
    return _unique([*names, parent_phrase(onto, mid, names[0])])


def join_phrases(phrases: list[str]) -> str:
    """Phrases as natural English: ``a``, ``a and b``, ``a, b and c``."""
    if len(phrases) <= 1:
        return "".join(phrases)
    return ", ".join(phrases[:-1]) + " and " + phrases[-1]


def _unique(items) -> list[str]:
    return list(dict.fromkeys(i for i in items if i))
