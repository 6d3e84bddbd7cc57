"""Source selection for the mix stage: the licence filter counts what it drops, and split pools share no source."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pipeline.config.mix_spec import resolve_spec
from pipeline.config.params import MixParams, MixtureCounts
from pipeline.mix.selection import assign_splits, filter_licenses
from pipeline.mix.sources import MixError
from pipeline.schema import SPLITS
from tests.pipeline.mix.test_instantiate import background_segment, event_clip

QUIET = np.full(1600, 100, dtype=np.int16)  # 0.1 s: the selection never looks at the audio


def sources(n_events: int = 40, n_recordings: int = 10):
    """Events from n_events / 2 source clips (two cuts each), backgrounds from recordings of three segments each."""
    events = [
        replace(
            event_clip(f"e{i}", QUIET, "Bark", "/m/05tny_"), source_id=f"clip{i // 2}", license=("CC0", "CC-BY-NC")[i % 5 == 0]
        )
        for i in range(n_events)
    ]
    backgrounds = [
        replace(background_segment(f"r{r}-{k}", QUIET), source_id=f"rec{r}", license=("CC-BY", "")[r == 0])
        for r in range(n_recordings)
        for k in range(3)
    ]
    return events, backgrounds


def test_the_licence_filter_keeps_the_allowed_and_counts_the_rest_per_kind_and_licence() -> None:
    events, backgrounds = sources()
    kept_events, kept_backgrounds, skips, dropped = filter_licenses(events, backgrounds, ("CC0", "CC-BY"))
    assert {e.license for e in kept_events} == {"CC0"} and len(kept_events) == 32
    assert len(kept_backgrounds) == 27, "a background without licence metadata is 'unknown'"
    assert dropped == {"events": {"CC-BY-NC": 8}, "backgrounds": {"unknown": 3}}
    assert len(skips) == 11 and {s.reason for s in skips} == {"license-not-allowed"}


def test_split_pools_share_no_source_and_do_not_depend_on_the_listing_order() -> None:
    events, backgrounds = sources()
    p = replace(MixParams(), event_split="random", mixtures=MixtureCounts(train=8, valid=2, test=2))
    spec = resolve_spec(p.preset, {**p.spec, "events_per_mixture": ["const", 1]}, sample_rate_hz=16000)
    event_pools, bg_pools = assign_splits(events, backgrounds, p, spec, seed=3)
    for pools, key in ((event_pools, "clip_id"), (bg_pools, "segment_id")):
        assert sorted(getattr(x, key) for s in SPLITS for x in pools[s]) == sorted(
            getattr(x, key) for x in (events if key == "clip_id" else backgrounds)
        ), "every source in exactly one split"
        owners = [{x.source_id for x in pools[s]} for s in SPLITS]
        assert all(not (owners[i] & owners[j]) for i in range(3) for j in range(i + 1, 3)), "no source feeds two splits"
        assert all(owners), "every split gets sources"
    again = assign_splits(events[::-1], backgrounds[::-1], p, spec, seed=3)
    assert {s: sorted(e.clip_id for e in again[0][s]) for s in SPLITS} == {
        s: sorted(e.clip_id for e in event_pools[s]) for s in SPLITS
    }
    assert {s: sorted(b.segment_id for b in again[1][s]) for s in SPLITS} == {
        s: sorted(b.segment_id for b in bg_pools[s]) for s in SPLITS
    }


def test_a_split_its_pool_cannot_serve_is_refused_with_the_counts() -> None:
    events, backgrounds = sources(n_events=4)
    p = replace(MixParams(), event_split="random", mixtures=MixtureCounts(train=8, valid=2, test=2))
    spec = resolve_spec(p.preset, p.spec, sample_rate_hz=16000)  # up to 5 distinct clips per mixture
    with pytest.raises(MixError, match=r"split '\w+' has \d event clips but a mixture draws up to 5 distinct clips"):
        assign_splits(events, backgrounds, p, spec, seed=3)
