"""Which sources a mix run may use and which split each serves: the licence filter, then disjoint splits.

Input: the event clips and background segments read by :mod:`pipeline.mix.sources`,
``params.mix`` (``allowed_licenses``, ``event_split``, ``holdout``, ``background_split``,
``mixtures``), the resolved spec and the seed. Output: the sources ``mix.allowed_licenses``
keeps (and a :class:`~pipeline.schema.Skip` with a count per licence for the rest), then per
split a pool of events and one of backgrounds:

- events by FSD50K's own split (dev train -> train, dev val -> valid, eval -> test), or with
  ``event_split: random`` by source clip; a library's files (which have no split) within each
  label, so that every label reaches every split it has files enough for (:func:`label_counts`);
- backgrounds by the recording they were cut from (``background_split: recording``), by
  segment (``segment``: one recording's segments may serve different splits), or every
  background in every split (``shared``: the splits' backgrounds are not held out).

Every assignment is a hashed order of (seed, source id), so it does not depend on the order the
sources were listed in, and a file added to one label moves no file of another. A split its
pools cannot serve raises :class:`~pipeline.mix.sources.MixError` saying what to change.
:func:`label_coverage` and :func:`capped_splits` describe the pools for the run's reports.
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


def filter_licenses(
    events: list[EventClip], backgrounds: list[BackgroundSegment], allowed: tuple[str, ...], from_library: tuple[str, ...] = ()
) -> tuple[list[EventClip], list[BackgroundSegment], list[Skip], dict[str, dict[str, int]]]:
    """Keep the sources whose licence is in ``allowed``: (events, backgrounds, skips, dropped).

    ``dropped`` counts the sources left out per kind (``events``, ``backgrounds``) and licence.
    A background without licence metadata (a library read without a metadata CSV) is ``unknown``.
    ``from_library`` names the kinds read from a Scaper-layout library: their skips name the
    library's file (``source_path``, relative to the library folder), not the excerpt analysed
    from it for this run; the others name the input folder's file (``audio_path``).
    """
    allowed_text = ", ".join(allowed)
    kept_events = [e for e in events if e.license in allowed]
    kept_backgrounds = [b for b in backgrounds if license_name(b.license) in allowed]
    event_path = (lambda e: e.source_path) if "events" in from_library else (lambda e: e.audio_path)
    background_path = (lambda b: b.source_path) if "backgrounds" in from_library else (lambda b: b.audio_path)
    skips = [
        Skip(
            e.clip_id,
            event_path(e),
            "license-not-allowed",
            f"licence {e.license} is not in mix.allowed_licenses [{allowed_text}]",
        )
        for e in events
        if e.license not in allowed
    ]
    for b in backgrounds:
        name = license_name(b.license)
        if name not in allowed:
            stated = f"'{b.license}'" if b.license.strip() else "none in the library's metadata"
            skips.append(
                Skip(
                    b.segment_id,
                    background_path(b),
                    "license-not-allowed",
                    f"licence {name} (stated: {stated}) is not in mix.allowed_licenses [{allowed_text}]",
                )
            )
    dropped = {
        "events": dict(sorted(Counter(e.license for e in events if e.license not in allowed).items())),
        "backgrounds": dict(
            sorted(Counter(n for n in (license_name(b.license) for b in backgrounds) if n not in allowed).items())
        ),
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
    text = (
        f"mix.allowed_licenses [{', '.join(allowed)}] dropped {part(dropped['events'], 'event clips')} and "
        f"{part(dropped['backgrounds'], 'background segments')}"
    )
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


# the order in which a label with fewer files than splits fills them: a label in train is
# learnt, one in test is scored; valid (calibration and model choice) comes last
LABEL_PRIORITY = ("train", "test", "valid")


def label_counts(n: int, fractions: dict[str, float], needed: list[str]) -> dict[str, int]:
    """How many of a label's ``n`` files each split gets.

    Input: the file count, ``mix.holdout``'s fractions and the splits that make mixtures.
    Output: split -> count, summing to ``n``. The counts follow the fractions (largest
    remainder) and every needed split with a share gets at least one file when the label has
    files enough for all of them; with fewer files they go one each in :data:`LABEL_PRIORITY`
    order (2 files: train and test; 1 file: train).
    """
    must = [s for s in LABEL_PRIORITY if s in needed and fractions[s] > 0]
    if n <= len(must):
        return {s: int(s in must[:n]) for s in SPLITS}
    quota = {s: fractions[s] * n for s in SPLITS}
    counts = {s: int(math.floor(quota[s])) for s in SPLITS}
    by_remainder = sorted(
        (s for s in LABEL_PRIORITY if fractions[s] > 0), key=lambda s: (-(quota[s] - counts[s]), LABEL_PRIORITY.index(s))
    )
    for s in by_remainder[: n - sum(counts.values())]:
        counts[s] += 1
    for s in must:
        if counts[s] == 0:  # taken from the largest share that can spare one
            donor = max(
                (d for d in LABEL_PRIORITY if counts[d] > (1 if d in must else 0)),
                key=lambda d: (counts[d], -LABEL_PRIORITY.index(d)),
            )
            counts[donor] -= 1
            counts[s] = 1
    return counts


def allocate_per_label(
    items: list[tuple[str, str]], fractions: dict[str, float], needed: list[str], seed: int, salt: str
) -> dict[str, str]:
    """(label, source id) pairs -> source id -> split, each label's sources apart in :func:`label_counts`' numbers.

    Within a label the sources are taken in the hashed order of (seed, source id): adding a
    file moves no file of another label, and of its own label only those at a boundary.
    """
    by_label: dict[str, set[str]] = {}
    for label, source in items:
        by_label.setdefault(label, set()).add(source)
    out: dict[str, str] = {}
    for label in sorted(by_label):
        order = sorted(by_label[label], key=lambda g: _rank(seed, salt, g))
        counts = label_counts(len(order), fractions, needed)
        i = 0
        for s in SPLITS:
            for g in order[i : i + counts[s]]:
                out[g] = s
            i += counts[s]
    return out


def split_backgrounds(
    backgrounds: list[BackgroundSegment], p: MixParams, needed: list[str], seed: int
) -> dict[str, list[BackgroundSegment]]:
    """Background pools per split by ``mix.background_split``: whole recordings, single segments, or all shared."""
    fractions = dataclasses.asdict(p.holdout)
    if p.background_split == "shared":
        return {s: list(backgrounds) if s in needed else [] for s in SPLITS}
    if p.background_split == "segment":
        by_segment = allocate_groups([b.segment_id for b in backgrounds], fractions, needed, seed, "background-segments")
        return {s: [b for b in backgrounds if by_segment[b.segment_id] == s] for s in SPLITS}
    by_recording = allocate_groups([b.source_id for b in backgrounds], fractions, needed, seed, "backgrounds")
    return {s: [b for b in backgrounds if by_recording[b.source_id] == s] for s in SPLITS}


def _no_background(split: str, backgrounds: list[BackgroundSegment], p: MixParams, needed: list[str]) -> MixError:
    """The refusal of a split left without backgrounds, naming ``mix.background_split``'s other choices."""
    recordings = len({b.source_id for b in backgrounds})
    choices = (
        "set mix.background_split: segment (a recording's mixture-length segments split across the splits) or shared "
        "(every background in every split, so the splits' backgrounds are not held out)"
    )
    if p.background_split == "segment":
        return MixError(
            f"mix: split '{split}' has no background: {len(backgrounds)} segments cannot give each of the {len(needed)} splits "
            f"that make mixtures its own segments; set mix.background_split: shared (every background in every split, not held "
            f"out), add background recordings or longer ones, set mix.mixtures.{split}: 0, or change mix.holdout"
        )
    few = recordings < len(needed)
    return MixError(
        f"mix: split '{split}' has no background: {len(backgrounds)} segments from {recordings} recordings cannot give "
        + (
            f"each of the {len(needed)} splits that make mixtures its own recordings, whatever mix.holdout says; "
            if few
            else "every split its own recordings; "
        )
        + f"{choices}, add background recordings, set mix.mixtures.{split}: 0"
        + ("" if few else ", or change mix.holdout")
    )


def needed_splits(p: MixParams) -> list[str]:
    """The splits ``mix.mixtures`` asks mixtures of, in :data:`~pipeline.schema.SPLITS` order."""
    counts = dataclasses.asdict(p.mixtures)
    return [s for s in SPLITS if counts[s] > 0]


def assign_splits(
    events: list[EventClip], backgrounds: list[BackgroundSegment], p: MixParams, spec: MixSpec, seed: int
) -> tuple[dict[str, list[EventClip]], dict[str, list[BackgroundSegment]]]:
    """Event and background pools per split (:func:`split_pools`), checked (:func:`check_pools`)."""
    event_pools, bg_pools = split_pools(events, backgrounds, p, seed)
    check_pools(event_pools, bg_pools, events, backgrounds, p, spec)
    return event_pools, bg_pools


def events_by_fsd50k(events: list[EventClip], p: MixParams) -> bool:
    """Whether the clip stage's events go by FSD50K's split (a library's go by label whatever ``event_split`` says)."""
    return p.event_split == "fsd50k" and (not events or any(e.source_dataset != LIBRARY_DATASET for e in events))


def split_pools(
    events: list[EventClip], backgrounds: list[BackgroundSegment], p: MixParams, seed: int
) -> tuple[dict[str, list[EventClip]], dict[str, list[BackgroundSegment]]]:
    """Event and background pools per split: events never shared; backgrounds as ``mix.background_split`` says."""
    fractions = dataclasses.asdict(p.holdout)
    needed = needed_splits(p)
    library = [e for e in events if e.source_dataset == LIBRARY_DATASET]
    clips = [e for e in events if e.source_dataset != LIBRARY_DATASET]  # the clip stage's, with FSD50K's split
    if events_by_fsd50k(events, p):
        event_split = {e.clip_id: FSD50K_TO_MIX_SPLIT.get(e.source_split, "train") for e in clips}
    else:
        by_source = allocate_groups([e.source_id for e in clips], fractions, needed, seed, "events")
        event_split = {e.clip_id: by_source[e.source_id] for e in clips}
    if library:  # a library has no split of its own: its files are split within each label
        by_file = allocate_per_label([(e.label, e.source_id) for e in library], fractions, needed, seed, "events")
        event_split.update({e.clip_id: by_file[e.source_id] for e in library})
    event_pools = {s: [e for e in events if event_split[e.clip_id] == s] for s in SPLITS}
    return event_pools, split_backgrounds(backgrounds, p, needed, seed)


def check_pools(
    event_pools: dict[str, list[EventClip]],
    bg_pools: dict[str, list[BackgroundSegment]],
    events: list[EventClip],
    backgrounds: list[BackgroundSegment],
    p: MixParams,
    spec: MixSpec,
) -> None:
    """Raise :class:`MixError` if a split that makes mixtures has no background, or fewer event
    clips than the smallest draw of ``events_per_mixture`` can use (``distinct_clips``: each
    clip at most once per mixture), or none. A split with fewer clips than the largest draw is
    served: its mixtures hold at most that many events (:func:`capped_splits`).
    """
    needed = needed_splits(p)
    by_fsd50k = events_by_fsd50k(events, p)
    library = any(e.source_dataset == LIBRARY_DATASET for e in events)
    least, most = (int(x) for x in spec.events_per_mixture.bounds())
    if needed and not backgrounds:
        raise MixError("mix: no background segments are left to mix over")
    for s in needed:
        if not bg_pools[s]:
            raise _no_background(s, backgrounds, p, needed)
        have = len(event_pools[s])
        need = (max(least, 1) if spec.distinct_clips else 1) if most > 0 else 0
        if have < need:
            source = (
                f" (the clips of FSD50K's '{MIX_TO_FSD50K_SPLIT[s]}' split; mix.event_split: random splits by source clip instead)"
                if by_fsd50k and not library
                else ""
            )
            if spec.distinct_clips and have > 0:
                wanted = (
                    f"a mixture draws up to {most} distinct clips"
                    + (f" and at least {least}" if least < most else "")
                    + ": mix.spec.distinct_clips: true uses a clip at most once in a mixture (its repeats aside), so no "
                    "mixture could hold as many events as the spec asks"
                )
            else:
                wanted = f"a mixture draws up to {most} distinct clips" if spec.distinct_clips else "a mixture needs at least one"
            raise MixError(
                f"mix: split '{s}' has {have} event clips{source} but {wanted}; add source clips, set mix.mixtures.{s}: 0"
                + (
                    ", lower mix.spec.events_per_mixture, or set mix.spec.distinct_clips: false to let one mixture use a clip "
                    "more than once"
                    if spec.distinct_clips and have > 0
                    else ""
                )
            )


def capped_splits(event_pools: dict[str, list[EventClip]], spec: MixSpec, needed: list[str]) -> dict[str, int]:
    """Split -> its clip count, for the splits whose mixtures hold fewer events than the spec may draw.

    With ``distinct_clips`` a mixture uses each clip at most once, so a split of 3 clips makes
    mixtures of at most 3 events where ``events_per_mixture`` goes up to 5.
    """
    most = int(spec.events_per_mixture.bounds()[1])
    if not spec.distinct_clips:
        return {}
    return {s: len(event_pools[s]) for s in needed if 0 < len(event_pools[s]) < most}


def label_coverage(event_pools: dict[str, list[EventClip]]) -> dict[str, dict[str, int]]:
    """Label -> split -> event clips of that label in the split's pool (every split listed, 0 included), labels sorted."""
    labels = sorted({e.label for pool in event_pools.values() for e in pool})
    counts = {label: {s: 0 for s in SPLITS} for label in labels}
    for s in SPLITS:
        for e in event_pools[s]:
            counts[e.label][s] += 1
    return counts
