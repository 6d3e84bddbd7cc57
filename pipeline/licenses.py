"""Licences of source audio: short names, and which of two is more restrictive.

Input: a licence as sources state it, a Creative Commons URL (FSD50K metadata) or a short
name (a library's metadata CSV). Output: one of ``CC0``, ``CC-BY``, ``CC-Sampling+``,
``CC-BY-NC`` or ``unknown``. A derived work (a mixture, a dataset) carries the most
restrictive licence of its sources; ``unknown`` ranks as the most restrictive of all.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

_URL_PARTS = {
    "publicdomain/zero": "CC0",
    "licenses/by-nc": "CC-BY-NC",
    "licenses/by/": "CC-BY",
    "sampling+": "CC-Sampling+",
}
ORDER = ("CC0", "CC-BY", "CC-Sampling+", "CC-BY-NC", "unknown")  # most permissive first
_SHORT = {name.lower().replace(" ", "-"): name for name in ORDER}
_SHORT.update(
    {
        "cc-0": "CC0",
        "public-domain": "CC0",
        "cc-by-4.0": "CC-BY",
        "cc-by-3.0": "CC-BY",
        "cc-by-nc-4.0": "CC-BY-NC",
        "cc-by-nc-3.0": "CC-BY-NC",
        "cc-sampling-plus": "CC-Sampling+",
    }
)


def license_name(text: str) -> str:
    """A licence URL or short name -> its short name, else ``unknown``."""
    for key, name in _URL_PARTS.items():
        if key in text:
            return name
    return _SHORT.get(text.strip().lower().replace(" ", "-"), "unknown")


def most_restrictive(licenses: Iterable[str]) -> str:
    """The most restrictive of some short names (``CC0`` for none)."""
    rank = {name: i for i, name in enumerate(ORDER)}
    return max(licenses, key=lambda x: rank.get(x, len(ORDER) - 1), default="CC0")


def allowed_licenses_problem(names: Iterable[str]) -> str | None:
    """Why a list of licence names (``mix.allowed_licenses``) is not usable, or None if it is.

    Each name must be one of :data:`ORDER` exactly, as stored in the manifests: a filter that
    spells ``cc-by`` would silently drop every CC-BY source.
    """
    names = list(names)
    if not names:
        return f"is empty, so every source would be dropped; list the licences to keep. Known names: {', '.join(ORDER)}"
    for name in names:
        if name in ORDER:
            continue
        folded = str(name).strip().lower().replace(" ", "-")
        close = _SHORT.get(folded) or next((_SHORT[k] for k in difflib.get_close_matches(folded, list(_SHORT), n=1)), None)
        hint = f"did you mean {close}? " if close else ""
        return f"holds {name!r}, not a licence name; {hint}Known names: {', '.join(ORDER)}"
    return None
