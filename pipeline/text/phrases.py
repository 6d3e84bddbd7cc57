"""Natural phrases for AudioSet labels, and joining phrases into English.

Input: an ontology class (display name, description, parents). Output: phrases, most
natural first: ``"Chirp, tweet"`` gives ``chirp`` and ``tweet``; ``"Bark"`` (a child of
``Dog``) gives ``bark`` and ``dog bark``; ``"Coin (dropping)"`` gives ``coin dropping``; a
description that starts "The sound of ..." adds what follows (``"Plop"`` -> ``a small object
dropping into a liquid``). These rules make the offline default of
``pipeline/data/label_phrases.json``; an LLM can add variants (:mod:`pipeline.text.label_phrases`).
"""

from __future__ import annotations

import re

from pipeline.ontology import Ontology

ANIMAL_MID = "/m/0jbk"
_DESCRIPTION_LEADS = re.compile(
    r"^(?:the |a |an )?(?:characteristic |distinctive |typical )?sounds? (?:of|made by|produced by|created by) ", re.IGNORECASE
)
_DESCRIPTION_STOPS = re.compile(r"[,;:(]| that | which | where | when | whose | such as | usually | typically | often | especially | e\.g\.")
MIN_DESCRIPTION_WORDS, MAX_DESCRIPTION_WORDS = 3, 7


def _lower(text: str) -> str:
    """Lower-case words, keeping acronyms and mixed-case names (``DTMF``, ``MP3``)."""
    return " ".join(w if any(c.isupper() for c in w[1:]) else w.lower() for w in text.split())


def name_phrases(name: str) -> list[str]:
    """Phrases from a display name: its comma alternatives, parentheses folded in."""
    parts = [p.strip() for p in name.split(", ")]
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


def description_phrase(description: str) -> str | None:
    """What a "The sound of ..." description names, if that is a short phrase."""
    first = description.strip().split(". ")[0].rstrip(".")
    lead = _DESCRIPTION_LEADS.match(first)
    if not lead:
        return None
    rest = first[lead.end():]
    stop = _DESCRIPTION_STOPS.search(rest)
    rest = rest[: stop.start()] if stop else rest
    words = rest.split()
    if not MIN_DESCRIPTION_WORDS <= len(words) <= MAX_DESCRIPTION_WORDS:
        return None
    return _lower(" ".join(words))


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
    extra = [parent_phrase(onto, mid, names[0]), description_phrase(cls.description)]
    return _unique([*names, *(e for e in extra if e)])


def join_phrases(phrases: list[str]) -> str:
    """Phrases as natural English: ``a``, ``a and b``, ``a, b and c``."""
    if len(phrases) <= 1:
        return "".join(phrases)
    return ", ".join(phrases[:-1]) + " and " + phrases[-1]


def _unique(items) -> list[str]:
    return list(dict.fromkeys(i for i in items if i))
