"""Which sources a mix run may use and which split each serves: the licence filter, then disjoint splits.

Input: the event clips and background segments read by :mod:`pipeline.mix.sources`,
``params.mix`` (``allowed_licenses``, ``event_split``, ``holdout``, ``mixtures``), the resolved
spec and the seed. Output: the sources ``mix.allowed_licenses`` keeps (and a
:class:`~pipeline.schema.Skip` with a count per licence for the rest), then per split a pool
of events and one of backgrounds that share no source: events by FSD50K's own split (dev
train -> train, dev val -> valid, eval -> test) or, with ``event_split: random`` and for a
library (which has no split), by source clip or file; backgrounds by the recording they were
cut from. The assignment is a hashed order of (seed, source id), so it does not depend on the
order the sources were listed in. A split its pools cannot serve raises
:class:`~pipeline.mix.sources.MixError` with the counts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections import Counter

from pipeline.config.mix_spec import MixSpec
from pipeline.config.params import MixParams
from pipeline.licenses import license_name
from pipeline.mix.scaper_library import LIBRARY_DATASET
from pipeline.mix.sources import MixError
from pipeline.schema import SPLITS, BackgroundSegment, EventClip, Skip

FSD50K_TO_MIX_SPLIT = {"train": "train", "val": "valid", "eval": "test"}
MIX_TO_FSD50K_SPLIT = {v: k for k, v in FSD50K_TO_MIX_SPLIT.items()}


def filter_licenses(events: list[EventClip], backgrounds: list[BackgroundSegment], allowed: tuple[str, ...]
                    ) -> tuple[list[EventClip], list[BackgroundSegment], list[Skip], dict[str, dict[str, int]]]:
    """Keep the sources whose licence is in ``allowed``: (events, backgrounds, skips, dropped).

    ``dropped`` counts the sources left out per kind (``events``, ``backgrounds``) and licence.
    A background without licence metadata (a library read without a metadata CSV) is ``unknown``.
    """
    allowed_text = ", ".join(allowed)
    kept_events = [e for e in events if e.license in allowed]
    kept_backgrounds = [b for b in backgrounds if license_name(b.license) in allowed]
    skips = [Skip(e.clip_id, e.audio_path, "license-not-allowed", f"licence {e.license} is not in mix.allowed_licenses [{allowed_text}]")
             for e in events if e.license not in allowed]
    for b in backgrounds:
        name = license_name(b.license)
        if name not in allowed:
            stated = f"'{b.license}'" if b.license.strip() else "none in the library's metadata"
            skips.append(Skip(b.segment_id, b.audio_path, "license-not-allowed",
                              f"licence {name} (stated: {stated}) is not in mix.allowed_licenses [{allowed_text}]"))
    dropped = {
        "events": dict(sorted(Counter(e.license for e in events if e.license not in allowed).items())),
        "backgrounds": dict(sorted(Counter(n for n in (license_name(b.license) for b in backgrounds) if n not in allowed).items())),
    }
    return kept_events, kept_backgrounds, skips, dropped


def describe_license_drops(dropped: dict[str, dict[str, int]], allowed: tuple[str, ...]) -> str:
    """One phrase: what ``mix.allowed_licenses`` left out, per kind and licence."""
    def part(counts: dict[str, int], what: str) -> str:
        n = sum(counts.values())
        per = ", ".join(f"{lic} {k}" for lic, k in counts.items())
        return f"{n} {what}" + (f" ({per})" if per else "")

    if not any(dropped.values()):
        return f"mix.allowed_licenses [{', '.join(allowed)}] dropped no source"
    text = (f"mix.allowed_licenses [{', '.join(allowed)}] dropped {part(dropped['events'], 'event clips')} and "
            f"{part(dropped['backgrounds'], 'background segments')}")
    if "unknown" in dropped["events"] or "unknown" in dropped["backgrounds"]:
        text += "; sources without licence metadata are 'unknown': add unknown to mix.allowed_licenses to use them"
    return text


def _rank(seed: int, salt: str, key: str) -> bytes:
    return hashlib.blake2b(f"{seed}:{salt}:{key}".encode(), digest_size=8).digest()


def allocate_groups(groups: list[str], fractions: dict[str, float], needed: list[str], seed: int, salt: str) -> dict[str, str]:
    """Groups -> splits in the given proportions (a hashed order; at least one per needed split)."""
    order = sorted(set(groups), key=lambda g: _rank(seed, salt, g))
    n = len(order)
    counts = {s: int(math.floor(fractions[s] * n)) for s in SPLITS}
    for s in needed:
        if counts[s] == 0 and fractions[s] > 0:
            counts[s] = 1
    while sum(counts.values()) > n:  # take back from the largest share
        biggest = max(SPLITS, key=lambda s: counts[s])
        counts[biggest] -= 1
    counts["train"] += n - sum(counts.values())
    out, i = {}, 0
    for s in SPLITS:
        for g in order[i : i + counts[s]]:
            out[g] = s
        i += counts[s]
    return out


def assign_splits(
    events: list[EventClip], backgrounds: list[BackgroundSegment], p: MixParams, spec: MixSpec, seed: int
) -> tuple[dict[str, list[EventClip]], dict[str, list[BackgroundSegment]]]:
    """Disjoint event and background pools per split; raises :class:`MixError` if one is too small."""
    counts = dataclasses.asdict(p.mixtures)
    fractions = dataclasses.asdict(p.holdout)
    needed = [s for s in SPLITS if counts[s] > 0]
    by_fsd50k = p.event_split == "fsd50k" and not (events and all(e.source_dataset == LIBRARY_DATASET for e in events))
    if by_fsd50k:
        event_split = {e.clip_id: FSD50K_TO_MIX_SPLIT.get(e.source_split, "train") for e in events}
    else:
        by_source = allocate_groups([e.source_id for e in events], fractions, needed, seed, "events")
        event_split = {e.clip_id: by_source[e.source_id] for e in events}
    by_recording = allocate_groups([b.source_id for b in backgrounds], fractions, needed, seed, "backgrounds")
    event_pools = {s: [e for e in events if event_split[e.clip_id] == s] for s in SPLITS}
    bg_pools = {s: [b for b in backgrounds if by_recording[b.source_id] == s] for s in SPLITS}

    most = int(spec.events_per_mixture.bounds()[1])
    if needed and not backgrounds:
        raise MixError("mix: no background segments are left to mix over")
    for s in needed:
        if not bg_pools[s]:
            recordings = len({b.source_id for b in backgrounds})
            raise MixError(
                f"mix: split '{s}' has no background: {len(backgrounds)} segments from {recordings} recordings cannot "
                f"give every split its own recordings; add ambience recordings, set mix.mixtures.{s}: 0, or change mix.holdout"
            )
        have = len(event_pools[s])
        need = (most if spec.distinct_clips else 1) if most > 0 else 0
        if have < need:
            source = (f" (the clips of FSD50K's '{MIX_TO_FSD50K_SPLIT[s]}' split; mix.event_split: random splits by source clip instead)"
                      if by_fsd50k else "")
            wanted = f"a mixture draws up to {most} distinct clips" if spec.distinct_clips else "a mixture needs at least one"
            raise MixError(
                f"mix: split '{s}' has {have} event clips{source} but {wanted}; add source clips, set mix.mixtures.{s}: 0"
                + (", or allow repeats with mix.spec.distinct_clips: false" if spec.distinct_clips else "")
            )
    return event_pools, bg_pools
