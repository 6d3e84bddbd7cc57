"""Splitting sources for small libraries: a library's files per label, backgrounds by recording,
segment or shared, a split of fewer clips than a mixture may draw, and the licence filter's report
of library files; the clip stage's events and the default backgrounds split as before."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import numpy as np
import pytest

from pipeline.config.mix_spec import resolve_spec
from pipeline.config.params import HoldoutFractions, MixParams, MixtureCounts
from pipeline.mix.scaper_library import LIBRARY_DATASET, segment_spans
from pipeline.mix.selection import (
    FSD50K_TO_MIX_SPLIT,
    allocate_groups,
    assign_splits,
    capped_splits,
    filter_licenses,
    label_counts,
    label_coverage,
)
from pipeline.mix.sources import MixError
from pipeline.schema import SPLITS
from tests.pipeline.mix.test_instantiate import background_segment, event_clip

QUIET = np.full(1600, 100, dtype=np.int16)  # 0.1 s: the selection never looks at the audio
HOLDOUT = HoldoutFractions(train=0.8, valid=0.1, test=0.1)  # the shares these cases were worked out for
DEFAULT = dataclasses.asdict(HOLDOUT)
ALL = list(SPLITS)


def library_events(files_per_label: dict[str, int]) -> list:
    """Library event records: ``<label>/<label><i>.wav`` for each label's file count."""
    return [
        replace(
            event_clip(f"{label}-{i}", QUIET, label, ""),
            source_dataset=LIBRARY_DATASET,
            source_split="",
            source_id=f"{label}/{label}{i}.wav",
            source_path=f"{label}/{label}{i}.wav",
            license="CC-BY",
        )
        for label, n in files_per_label.items()
        for i in range(n)
    ]


def backgrounds_of(recordings: int, segments: int) -> list:
    return [
        replace(background_segment(f"r{r}-{k}", QUIET), source_id=f"rec{r}", source_path=f"amb/rec{r}.wav", license="CC-BY")
        for r in range(recordings)
        for k in range(segments)
    ]


def pools_by_id(pools: dict) -> dict[str, list[str]]:
    return {s: sorted(getattr(x, "clip_id", None) or x.segment_id for x in pools[s]) for s in SPLITS}


def params(**mix) -> MixParams:
    return replace(MixParams(), mixtures=MixtureCounts(train=8, valid=2, test=2), **{"holdout": HOLDOUT, **mix})


def spec_for(p: MixParams, **knobs):
    return resolve_spec(p.preset, {**p.spec, **knobs}, sample_rate_hz=16000)


@pytest.mark.parametrize(
    ("n", "needed", "expected"),
    [
        (1, ALL, (1, 0, 0)),
        (2, ALL, (1, 0, 1)),  # train and test: a label is learnt and scored before it is calibrated
        (3, ALL, (1, 1, 1)),
        (5, ALL, (3, 1, 1)),
        (10, ALL, (8, 1, 1)),
        (20, ALL, (16, 2, 2)),
        (3, ["train", "test"], (2, 0, 1)),  # no valid mixtures: no file is held for them
        (2, ["valid", "test"], (0, 1, 1)),
    ],
)
def test_a_labels_files_follow_the_holdout_and_reach_every_split_they_can(n, needed, expected) -> None:
    counts = label_counts(n, DEFAULT, needed)
    assert tuple(counts[s] for s in SPLITS) == expected and sum(counts.values()) == n


def test_every_label_of_a_library_reaches_every_split_and_small_labels_go_where_they_can() -> None:
    sizes = {f"label{k}": 5 for k in range(8)} | {"pair": 2, "single": 1}
    events = library_events(sizes)
    p = params(background_split="shared")
    event_pools, _ = assign_splits(events, backgrounds_of(1, 1), p, spec_for(p, events_per_mixture=["const", 1]), seed=3)
    coverage = label_coverage(event_pools)
    assert {label: tuple(c[s] for s in SPLITS) for label, c in coverage.items()} == {
        **{f"label{k}": (3, 1, 1) for k in range(8)},
        "pair": (1, 0, 1),
        "single": (1, 0, 0),
    }
    assert {e.clip_id for s in SPLITS for e in event_pools[s]} == {e.clip_id for e in events}, "every file in one split"

    again, _ = assign_splits(events[::-1], backgrounds_of(1, 1), p, spec_for(p, events_per_mixture=["const", 1]), seed=3)
    assert pools_by_id(again) == pools_by_id(event_pools), "the listing order does not matter"


def test_a_file_added_to_one_label_moves_no_file_of_another() -> None:
    p = params(background_split="shared")
    spec = spec_for(p, events_per_mixture=["const", 1])

    def split_of(events):
        pools, _ = assign_splits(events, backgrounds_of(1, 1), p, spec, seed=11)
        return {e.source_id: s for s in SPLITS for e in pools[s]}

    before = split_of(library_events({"a": 9, "b": 7}))
    after = split_of(library_events({"a": 10, "b": 7}))
    assert {k: v for k, v in after.items() if k.startswith("b/")} == {k: v for k, v in before.items() if k.startswith("b/")}
    moved = [k for k in before if k.startswith("a/") and before[k] != after[k]]
    assert len(moved) <= 2, moved


def test_the_clip_stages_events_and_recordings_split_as_before() -> None:
    """FSD50K's split (the default), event_split: random and whole recordings: the same pools as the rule they always had."""
    events = [
        replace(
            event_clip(f"e{i}", QUIET, ("Bark", "Siren", "Knock")[i % 3], ""),
            source_id=f"clip{i // 2}",
            source_split=("train", "val", "eval")[i % 4 % 3],
        )
        for i in range(60)
    ]
    backgrounds = backgrounds_of(12, 3)
    fractions = DEFAULT
    by_recording = allocate_groups([b.source_id for b in backgrounds], fractions, ALL, 7, "backgrounds")
    expected_backgrounds = {s: sorted(b.segment_id for b in backgrounds if by_recording[b.source_id] == s) for s in SPLITS}
    for event_split in ("fsd50k", "random"):
        p = params(event_split=event_split)
        event_pools, bg_pools = assign_splits(events, backgrounds, p, spec_for(p, events_per_mixture=["const", 1]), seed=7)
        if event_split == "fsd50k":
            split_of = {e.clip_id: FSD50K_TO_MIX_SPLIT[e.source_split] for e in events}
        else:
            by_source = allocate_groups([e.source_id for e in events], fractions, ALL, 7, "events")
            split_of = {e.clip_id: by_source[e.source_id] for e in events}
        assert pools_by_id(event_pools) == {s: sorted(c for c, x in split_of.items() if x == s) for s in SPLITS}
        assert pools_by_id(bg_pools) == expected_backgrounds


def test_background_split_segment_and_shared() -> None:
    events = library_events({"a": 5, "b": 5})
    backgrounds = backgrounds_of(2, 10)
    p = params(background_split="segment")
    spec = spec_for(p, events_per_mixture=["const", 1])
    _, pools = assign_splits(events, backgrounds, p, spec, seed=3)
    assert sorted(len(pools[s]) for s in SPLITS) == [2, 2, 16] and pools_by_id(pools)["train"]
    assert sorted(sum((pools_by_id(pools)[s] for s in SPLITS), [])) == sorted(b.segment_id for b in backgrounds), (
        "each segment once"
    )
    owners: dict[str, set[str]] = {}
    for s in SPLITS:
        for b in pools[s]:
            owners.setdefault(b.source_id, set()).add(s)
    assert any(len(o) > 1 for o in owners.values()), "a recording's segments serve several splits"

    _, shared = assign_splits(events, backgrounds, replace(p, background_split="shared"), spec, seed=3)
    assert all(pools_by_id(shared)[s] == sorted(b.segment_id for b in backgrounds) for s in SPLITS)


def test_too_few_recordings_name_background_split_and_too_few_segments_name_shared() -> None:
    events = library_events({"a": 5})
    p = params()
    spec = spec_for(p, events_per_mixture=["const", 1])
    with pytest.raises(
        MixError,
        match=r"2 recordings cannot give each of the 3 splits .* whatever mix.holdout says; "
        r"set mix.background_split: segment .* or shared",
    ):
        assign_splits(events, backgrounds_of(2, 1), p, spec, seed=3)
    with pytest.raises(MixError, match=r"2 segments cannot give each of the 3 splits .*; set mix.background_split: shared"):
        assign_splits(events, backgrounds_of(2, 1), replace(p, background_split="segment"), spec, seed=3)


def test_a_split_of_fewer_clips_than_a_mixture_may_draw_is_served_and_one_that_no_draw_fits_is_explained() -> None:
    events = library_events({"a": 5, "b": 5, "c": 5})  # 3/1/1 each: valid and test hold 3 clips
    p = params(background_split="shared")
    spec = spec_for(p)  # finelap: 1 to 5 distinct clips
    event_pools, _ = assign_splits(events, backgrounds_of(1, 1), p, spec, seed=3)
    assert capped_splits(event_pools, spec, ALL) == {"valid": 3, "test": 3}
    with pytest.raises(MixError) as caught:
        assign_splits(events, backgrounds_of(1, 1), p, spec_for(p, events_per_mixture=["choose", [4, 5]]), seed=3)
    text = str(caught.value)
    assert "split 'valid' has 3 event clips but a mixture draws up to 5 distinct clips and at least 4" in text
    assert "mix.spec.distinct_clips: true uses a clip at most once in a mixture" in text
    assert "set mix.spec.distinct_clips: false to let one mixture use a clip more than once" in text


def test_licence_skips_of_a_library_name_the_users_files() -> None:
    events = library_events({"dog_bark": 2})
    backgrounds = [replace(b, source_path="park/park.wav") for b in backgrounds_of(1, 2)]
    *_, skips, _ = filter_licenses(events, backgrounds, ("CC0",), from_library=("events", "backgrounds"))
    assert sorted(s.path for s in skips) == ["dog_bark/dog_bark0.wav", "dog_bark/dog_bark1.wav", "park/park.wav", "park/park.wav"]
    *_, stage_skips, _ = filter_licenses(events, backgrounds, ("CC0",))
    assert sorted(s.path for s in stage_skips) == sorted(x.audio_path for x in [*events, *backgrounds]), (
        "a stage output's own files"
    )


def test_background_segments_cover_the_file_and_none_is_shorter_than_a_mixture() -> None:
    assert segment_spans(100, 40) == [(0, 40), (40, 100)]
    assert segment_spans(40, 40) == [(0, 40)] and segment_spans(79, 40) == [(0, 79)]
    assert segment_spans(120, 40) == [(0, 40), (40, 80), (80, 120)]
