"""Invariants of instantiated mixtures over seeds, indices and presets, with an in-memory bank;
spec validation; distribution sampling."""

from __future__ import annotations

import dataclasses
import math
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.audio import FULL_SCALE_INT16, quantize_int16
from pipeline.config.distributions import SpecError, parse
from pipeline.config.mix_spec import MixSpec, resolve_spec
from pipeline.config.params import RelabelParams
from pipeline.loudness import a_weighted_envelope, integrated_lufs, peak_dbfs, rms_dbfs
from pipeline.mix.instantiate import MixContext, Mixture, draw_mixture, instantiate, relabel_mixture, render_mixture
from pipeline.mix.render import render
from pipeline.schema import SPLITS, BackgroundSegment, EventClip

SR = 16000
FRAME_S, HOP_S = 0.04, 0.02
LABELS = (("Bark", "/m/05tny_"), ("Meow", "/m/07qrkrw"), ("Knock", "/m/07r4wb8"), ("Speech", "/m/09x0r"))
PRESETS = ("finelap", "finelap-code", "flam", "desed", "urban-sed")
CAPS = {"flam": 3, "desed": 2}


# --- an in-memory source bank ------------------------------------------------------------------


class MemorySources:
    """The bank's interface over dicts of int16 arrays."""

    def __init__(self, sample_rate_hz: int, events: dict[str, np.ndarray], backgrounds: dict[str, np.ndarray]):
        self.sample_rate_hz = sample_rate_hz
        self._events = events
        self._backgrounds = backgrounds

    def event(self, clip_id: str) -> np.ndarray:
        return self._events[clip_id]

    def background(self, segment_id: str) -> np.ndarray:
        return self._backgrounds[segment_id]


def _levels(q: np.ndarray) -> tuple[np.ndarray, float, float, float, tuple[float, ...]]:
    x = q.astype(np.float32) / np.float32(FULL_SCALE_INT16)
    env = a_weighted_envelope(x, SR, FRAME_S, HOP_S)
    return x, rms_dbfs(x), peak_dbfs(x), integrated_lufs(x, SR), env.energy_db


def event_clip(clip_id: str, q: np.ndarray, label: str, mid: str) -> EventClip:
    _, rms, peak, lufs, env = _levels(q)
    n = int(q.shape[0])
    return EventClip(
        clip_id=clip_id,
        audio_path=f"{clip_id}.flac",
        source_dataset="FSD50K",
        source_id=clip_id,
        source_split="train",
        source_path=f"{clip_id}.wav",
        label=label,
        mid=mid,
        audioset_name=label,
        onset_in_source_s=0.0,
        offset_in_source_s=n / SR,
        duration_s=n / SR,
        num_samples=n,
        sample_rate_hz=SR,
        source_sample_rate_hz=SR,
        source_channels=1,
        rms_dbfs=rms,
        peak_dbfs=peak,
        loudness_lufs=lufs,
        envelope_frame_s=FRAME_S,
        envelope_hop_s=HOP_S,
        envelope_db=env,
        license_url="http://creativecommons.org/publicdomain/zero/1.0/",
        license="CC0",
        uploader="tester",
        title=f"clip {clip_id}",
    )


def background_segment(segment_id: str, q: np.ndarray) -> BackgroundSegment:
    _, rms, peak, lufs, env = _levels(q)
    n = int(q.shape[0])
    return BackgroundSegment(
        segment_id=segment_id,
        audio_path=f"{segment_id}.flac",
        source_id=segment_id,
        source_path=f"{segment_id}.wav",
        category="park",
        offset_in_source_s=0.0,
        duration_s=n / SR,
        num_samples=n,
        sample_rate_hz=SR,
        source_sample_rate_hz=SR,
        source_channels=1,
        rms_dbfs=rms,
        peak_dbfs=peak,
        loudness_lufs=lufs,
        peak_to_median_db=3.0,
        envelope_frame_s=FRAME_S,
        envelope_hop_s=HOP_S,
        envelope_db=env,
        license="CC0",
        author="tester",
    )


def _event_audio(i: int, rng: np.random.Generator) -> np.ndarray:
    """0.6-6 s: noise or tone bursts (with silent gaps and quiet floors) at -40..-12 dBFS."""
    seconds = 0.6 + i * (5.4 / 11)
    n = int(round(seconds * SR))
    level = -12.0 - (i * 7) % 29
    t = np.arange(n) / SR
    x = rng.standard_normal(n) * 10 ** (-75 / 20)
    bursts = [(0.0, seconds)] if i % 3 == 0 else [(0.05 * seconds, 0.45 * seconds), (0.55 * seconds, 0.95 * seconds)]
    for a, b in bursts:
        sa, sb = int(a * SR), int(b * SR)
        if i % 2:
            x[sa:sb] += np.sqrt(2) * 10 ** (level / 20) * np.sin(2 * np.pi * (300 + 150 * i) * t[sa:sb])
        else:
            x[sa:sb] += np.clip(rng.standard_normal(sb - sa), -3, 3) * 10 ** (level / 20)
    return quantize_int16(x.astype(np.float32))


@lru_cache(maxsize=None)
def bank() -> tuple[MemorySources, tuple[EventClip, ...], tuple[BackgroundSegment, ...]]:
    rng = np.random.default_rng(1234)
    events, clips = {}, []
    for i in range(12):
        cid = f"ev{i:02d}"
        events[cid] = _event_audio(i, rng)
        label, mid = LABELS[i % len(LABELS)]
        clips.append(event_clip(cid, events[cid], label, mid))
    backgrounds, segments = {}, []
    for j, level in enumerate((-50.0, -45.0, -40.0)):
        sid = f"bg{j}"
        backgrounds[sid] = quantize_int16((rng.standard_normal(10 * SR) * 10 ** (level / 20)).astype(np.float32))
        segments.append(background_segment(sid, backgrounds[sid]))
    return MemorySources(SR, events, backgrounds), tuple(clips), tuple(segments)


@lru_cache(maxsize=None)
def spec_for(preset: str) -> MixSpec:
    return resolve_spec(preset, sample_rate_hz=SR)


def context(spec: MixSpec, seed: int = 0) -> MixContext:
    sources, clips, segments = bank()
    return MixContext(
        spec,
        seed,
        RelabelParams(),
        sources,
        events={s: list(clips) for s in SPLITS},
        backgrounds={s: list(segments) for s in SPLITS},
    )


@lru_cache(maxsize=None)
def shared_context(preset: str, seed: int) -> MixContext:
    """One context per (preset, seed), kept between examples as a worker keeps its own."""
    return context(spec_for(preset), seed)


def make(preset: str, seed: int, split: str, index: int) -> Mixture:
    return instantiate(
        shared_context(preset, seed), split, index, f"{split}_{index:06d}", f"audio/{split}/{split}_{index:06d}.flac"
    )


def _samples(t_s: float) -> int:
    return int(round(t_s * SR))


def max_depth(intervals: list[tuple[int, int]]) -> int:
    """Most half-open intervals covering one instant (an end and a start at the same sample do not overlap)."""
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    depth = best = 0
    for _, step in points:
        depth += step
        best = max(best, depth)
    return best


mixture_args = dict(seed=st.integers(0, 3), split=st.sampled_from(SPLITS), index=st.integers(0, 10_000))


# --- B1-B5: structure of one mixture ---------------------------------------------------------


@pytest.mark.parametrize("preset", PRESETS)
@settings(max_examples=25, deadline=None)
@given(**mixture_args)
def test_mixture_invariants(preset: str, seed: int, split: str, index: int) -> None:
    m = make(preset, seed, split, index)
    r, occs, segs = m.recipe, m.occurrences, m.segments
    sources, clips, _ = bank()
    clip_len = {c.clip_id: c.num_samples for c in clips}
    duration = r.duration_s
    assert r.num_samples == m.audio.shape[0] and m.audio.dtype == np.int16
    assert r.sample_rate_hz == SR and r.duration_s == pytest.approx(r.num_samples / SR)

    # B4: occurrences inside the mixture; counts and ids agree
    assert r.num_occurrences == len(occs)
    assert r.num_events == len({o.event_index for o in occs})
    assert [o.occurrence_index for o in occs] == list(range(len(occs)))
    for o in occs:
        assert o.mixture_id == r.mixture_id
        assert 0.0 <= o.onset_s < o.offset_s <= duration + 1e-9
        assert 0.0 <= o.source_in_s < o.source_out_s <= clip_len[o.clip_id] / SR + 1e-9
        assert _samples(o.offset_s) - _samples(o.onset_s) == _samples(o.source_out_s) - _samples(o.source_in_s)
        assert o.role in ("whole", "repeat", "piece")
        assert math.isfinite(o.gain_db) and math.isfinite(o.realised_snr_db)
    assert r.labels == tuple(sorted({o.label for o in occs}))
    # occurrences of one event share role and gain, never overlap each other (overlap: false)
    by_event: dict[int, list] = {}
    for o in occs:
        by_event.setdefault(o.event_index, []).append(o)
    for group in by_event.values():
        assert len({o.role for o in group}) == 1 and len({o.clip_id for o in group}) == 1
        if r.level_mode != "local":
            assert len({o.gain_db for o in group}) == 1
        assert max_depth([(_samples(o.onset_s), _samples(o.offset_s)) for o in group]) <= 1
        if group[0].role == "whole":
            assert len(group) == 1
        if group[0].role == "piece":  # disjoint pieces of one span, each at least min_piece_s
            spans = sorted((_samples(o.source_in_s), _samples(o.source_out_s)) for o in group)
            assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
            assert all(b - a >= _samples(spec_for(preset).splitting.min_piece_s) for a, b in spans)

    # B1: label segments inside the mixture, positive length, same label never overlapping or touching
    for s in segs:
        assert s.mixture_id == r.mixture_id
        assert 0.0 <= s.onset_s < s.offset_s <= duration
        assert s.label in r.labels
    for label in {s.label for s in segs}:
        mine = sorted((s for s in segs if s.label == label), key=lambda s: s.onset_s)
        assert all(a.offset_s < b.onset_s for a, b in zip(mine, mine[1:]))
        # a segment lies within the union of its label's occurrences
        spans = [(o.onset_s, o.offset_s) for o in occs if o.label == label]
        for s in mine:
            assert any(a - 1e-9 <= s.onset_s < b for a, b in spans)

    # B3: polyphony cap (and the recipe's own count)
    depth = max_depth([(_samples(o.onset_s), _samples(o.offset_s)) for o in occs])
    assert r.max_polyphony == depth
    if preset in CAPS:
        assert spec_for(preset).max_polyphony == CAPS[preset]
        assert depth <= CAPS[preset]

    # B2: realised SNR in rms mode (pieces are levelled as a whole event, so they may differ)
    if r.level_mode == "rms":
        for o in occs:
            if o.role != "piece":
                assert abs(o.realised_snr_db - o.snr_db) <= 0.5, o

    # B5: re-rendering gives the stored samples bit for bit
    assert np.array_equal(render(r, occs, sources), m.audio)


VARIANTS = {
    "loudness-target": ("finelap", {"normalize": {"loudness_lufs": -20.0}}),
    "peak-always": ("flam", {"normalize": {"peak": "always", "peak_dbfs": -3.0}}),
    "saturating": ("finelap", {"normalize": {"peak": "never", "peak_dbfs": -0.45, "loudness_lufs": 0.0}}),
    "local-mode": ("flam", {"level_mode": "local", "fade_in_s": ["uniform", 0.0, 0.3]}),
    "ref-db-rms": (
        "finelap",
        {
            "ref_db": -30.0,
            "duration_s": ["uniform", 4.0, 10.0],
            "source_time_s": ["uniform", 0.0, "fit"],
            "event_duration_s": ["uniform", 0.3, 3.0],
        },
    ),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@settings(max_examples=10, deadline=None)
@given(index=st.integers(0, 10_000))
def test_rerender_and_levels_in_variants(variant: str, index: int) -> None:
    """Normalisation, local levelling, ref_db and partial spans: still bit-exact re-rendering,
    occurrences and segments inside the mixture, and the level rules of each mode."""
    preset, overrides = VARIANTS[variant]
    spec = resolve_spec(preset, overrides, sample_rate_hz=SR)
    ctx = context(spec, seed=11)
    m = instantiate(ctx, "valid", index, "m", "x.flac")
    r = m.recipe
    assert np.array_equal(render(r, m.occurrences, ctx.sources), m.audio)
    for o in m.occurrences:
        assert 0.0 <= o.onset_s < o.offset_s <= r.duration_s + 1e-9
    for s in m.segments:
        assert 0.0 <= s.onset_s < s.offset_s <= r.duration_s
    peak = float(np.max(np.abs(m.audio.astype(np.int32))))
    assert r.peak_dbfs == pytest.approx(20 * math.log10(max(peak, 1.0) / FULL_SCALE_INT16))
    if spec.normalize.peak == "always":
        assert r.peak_dbfs == pytest.approx(spec.normalize.peak_dbfs, abs=0.01)
    elif spec.normalize.peak == "if-clipping" and m.audio.size:
        assert np.min(m.audio) > -32768  # if-clipping: never saturates
    if spec.ref_db is not None and r.level_mode == "rms":
        assert r.background_level_db + r.background_gain_db == pytest.approx(spec.ref_db, abs=1e-6)
    if r.level_mode in ("rms", "local"):
        for o in m.occurrences:
            if o.role != "piece":
                assert abs(o.realised_snr_db - o.snr_db) <= 0.5, o


@pytest.mark.parametrize("preset", ["flam", "desed"])
def test_polyphony_cap_under_crowding(preset: str) -> None:
    """Many long events: the cap holds and crowded mixtures drop occurrences rather than stack them."""
    cap = CAPS[preset]
    spec = resolve_spec(preset, {"events_per_mixture": ["const", 10], "distinct_clips": False}, sample_rate_hz=SR)
    ctx = context(spec, seed=5)
    dropped = 0
    for index in range(6):
        m = instantiate(ctx, "train", index, f"m{index}", "x.flac")
        assert max_depth([(_samples(o.onset_s), _samples(o.offset_s)) for o in m.occurrences]) <= cap
        dropped += m.dropped_occurrences
        assert np.array_equal(render(m.recipe, m.occurrences, ctx.sources), m.audio)
    assert dropped > 0  # 10 events of up to 6 s cannot all fit under the cap in 10 s


def test_render_rejects_other_sample_rate() -> None:
    m = make("finelap", 0, "train", 0)
    sources, _, _ = bank()
    other = MemorySources(22050, sources._events, sources._backgrounds)
    with pytest.raises(ValueError, match="Hz"):
        render(m.recipe, m.occurrences, other)


@settings(max_examples=5, deadline=None)
@given(index=st.integers(0, 1000))
def test_realised_snr_with_background_shorter_than_mixture(index: int) -> None:
    spec = resolve_spec("finelap", {"duration_s": ["const", 12.0]}, sample_rate_hz=SR)
    m = instantiate(context(spec), "train", index, "m", "x.flac")
    for o in m.occurrences:
        assert abs(o.realised_snr_db - o.snr_db) <= 0.5, o


def test_instantiate_is_draw_then_render_then_relabel() -> None:
    """The draw fixes every choice (time-ordered occurrences, nothing measured on the mix yet);
    rendering and relabeling it give exactly what instantiate gives."""
    ctx = context(spec_for("flam"), seed=2)
    drawn = draw_mixture(ctx, "train", 7, "m", "x.flac")
    assert drawn.recipe.mixture_gain_db == 0.0 and all(math.isnan(o.realised_snr_db) for o in drawn.occurrences)
    assert [o.occurrence_index for o in drawn.occurrences] == list(range(len(drawn.occurrences)))
    assert [o.onset_s for o in drawn.occurrences] == sorted(o.onset_s for o in drawn.occurrences)
    assert (
        set(drawn.clips) == {o.clip_id for o in drawn.occurrences} and drawn.background.segment_id == drawn.recipe.background_id
    )
    recipe, occurrences, audio = render_mixture(ctx, drawn)
    segments = relabel_mixture(ctx, recipe, occurrences, drawn.background, drawn.clips)
    m = instantiate(context(spec_for("flam"), seed=2), "train", 7, "m", "x.flac")
    assert (recipe, occurrences, segments) == (m.recipe, m.occurrences, m.segments) and np.array_equal(audio, m.audio)


# --- B6: determinism ---------------------------------------------------------------------------


@pytest.mark.parametrize("preset", PRESETS)
@settings(max_examples=10, deadline=None)
@given(**mixture_args)
def test_determinism(preset: str, seed: int, split: str, index: int) -> None:
    a = make(preset, seed, split, index)  # from the shared (warm-cache) context
    b = instantiate(context(spec_for(preset), seed), split, index, a.recipe.mixture_id, a.recipe.audio_path)  # a fresh one
    assert a.recipe == b.recipe
    assert a.occurrences == b.occurrences
    assert a.segments == b.segments
    assert a.dropped_occurrences == b.dropped_occurrences
    assert np.array_equal(a.audio, b.audio)
    c = instantiate(context(spec_for(preset), seed), split, index + 1, a.recipe.mixture_id, a.recipe.audio_path)
    assert c.recipe != a.recipe or c.occurrences != a.occurrences
    assert c.audio.shape != a.audio.shape or not np.array_equal(c.audio, a.audio)


def test_mixture_depends_on_seed_and_split() -> None:
    base = make("finelap", 0, "train", 3)
    for other in (make("finelap", 1, "train", 3), make("finelap", 0, "valid", 3)):
        assert not np.array_equal(other.audio, base.audio)


# --- B7: spec validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preset", "overrides", "match"),
    [
        ("finelap", {"max_polyphonyy": 2}, r"unknown key 'max_polyphonyy'; did you mean 'max_polyphony'\?"),
        (
            "finelap",
            {"repetition": {"probabilty": 0.5}},
            r"unknown key 'repetition.probabilty'; did you mean 'repetition.probability'\?",
        ),
        ("finelap", {"snr_db": ["uniform", 30, 6]}, r"'snr_db'.*lo <= hi"),
        ("finelap", {"onset_s": ["truncnorm", 5.0, 2.0, 10.0, 0.0]}, r"'onset_s'.*lo <= hi"),
        ("finelap", {"events_per_mixture": ["uniform", 1, 5]}, r"'events_per_mixture' draws a count"),
        ("finelap", {"events_per_mixture": ["choose", [1, 2.5]]}, r"'events_per_mixture' values must be whole numbers"),
        ("finelap", {"repetition": {"count": ["choose", [0, 1]]}}, r"'repetition.count' values must be whole numbers >= 1"),
        ("finelap", {"fade_in_s": ["const", -0.01]}, r"'fade_in_s' must not produce negative values"),
        ("finelap", {"fade_out_s": ["uniform", -0.01, 0.01]}, r"'fade_out_s' must not produce negative values"),
        ("finelap", {"fade_out_s": ["normal", 0.01, 0.005]}, r"'fade_out_s' must not produce negative values"),
        (
            "finelap",
            {"repetition": {"probability": 0.7}, "splitting": {"probability": 0.5}},
            r"'repetition.probability' plus splitting.probability",
        ),
        ("flam", {"splitting": {"probability": 0.95}}, r"'repetition.probability' plus splitting.probability"),
        ("finelap", {"repetition": {"probability": 1.5}}, r"'repetition.probability' must be a probability"),
        ("finelap", {"sample_rate_hz": ["const", 48000]}, r"'sample_rate_hz' is not a knob.*top-level sample_rate_hz"),
        ("finelap", {"duration_s": ["uniform", 0.0, 10.0]}, r"'duration_s' must produce positive"),
        ("finelap", {"max_polyphony": 0}, r"'max_polyphony'"),
        ("finelap", {"level_mode": "peak"}, r"'level_mode'"),
        ("finelap", {"normalize": {"peak": "sometimes"}}, r"'normalize.peak'"),
        ("finelap", {"normalize": 3}, r"'normalize' must be a mapping"),
        ("finelap", {"snr_db": ["gauss", 1, 2]}, r"'snr_db' must be a distribution tuple"),
        ("finelap", {"snr_db": ["uniform", 6, "fit"]}, r"'snr_db' needs a finite number"),
    ],
)
def test_bad_spec_names_the_key(preset: str, overrides: dict, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        resolve_spec(preset, overrides, sample_rate_hz=SR)


def test_unknown_preset() -> None:
    with pytest.raises(SpecError, match=r"unknown preset 'finelapp'; did you mean 'finelap'\?"):
        resolve_spec("finelapp", sample_rate_hz=SR)
    with pytest.raises(SpecError, match=r"unknown preset 'zzz'; use one of finelap, finelap-code, flam, urban-sed, desed"):
        resolve_spec("zzz", sample_rate_hz=SR)


@pytest.mark.parametrize("preset", ["finelap", "finelap-code", "flam", "urban-sed", "desed"])
def test_presets_resolve_and_round_trip(preset: str) -> None:
    spec = resolve_spec(preset, sample_rate_hz=SR)
    assert spec.preset == preset
    again = resolve_spec(
        preset, {k: v for k, v in spec.to_dict().items() if k not in ("preset", "sample_rate_hz")}, sample_rate_hz=SR
    )
    assert again == spec


@pytest.mark.parametrize("preset", ["finelap", "finelap-code", "flam", "urban-sed", "desed"])
def test_every_preset_mixes_at_the_rate_it_is_given(preset: str) -> None:
    """No preset carries a rate: the top-level sample_rate_hz is the spec's, and spec.json records it."""
    for rate in (16000, 22050, 48000):
        spec = resolve_spec(preset, sample_rate_hz=rate)
        assert spec.sample_rate_hz == rate and spec.to_dict()["sample_rate_hz"] == rate
    with pytest.raises(SpecError, match="top-level rate"):
        resolve_spec(preset, sample_rate_hz=4000)


def test_resolution_is_cached_by_canonical_overrides() -> None:
    """Equal overrides in any key order share one resolved spec; another rate or knob is another spec."""
    a = resolve_spec(
        "flam", {"snr_db": ["uniform", 6, 30], "repetition": {"probability": 0.2, "overlap": True}}, sample_rate_hz=SR
    )
    b = resolve_spec(
        "flam", {"repetition": {"overlap": True, "probability": 0.2}, "snr_db": ("uniform", 6, 30)}, sample_rate_hz=SR
    )
    assert a is b
    assert resolve_spec("flam", {"snr_db": ["uniform", 6, 30]}, sample_rate_hz=SR) is not a
    assert (
        resolve_spec(
            "flam", {"snr_db": ["uniform", 6, 30], "repetition": {"probability": 0.2, "overlap": True}}, sample_rate_hz=22050
        ).sample_rate_hz
        == 22050
    )
    with pytest.raises(SpecError, match="must map knob names"):  # YAML allows a number as a key
        resolve_spec("flam", {1: 2, "snr_db": 3}, sample_rate_hz=SR)


def test_params_yaml_lists_the_finelap_knobs() -> None:
    """The commented knob list under mix.spec in params.yaml is the finelap preset, knob by knob."""
    import re

    import yaml

    from pipeline.config.mix_spec import PRESETS
    from tests.conftest import ROOT

    text = (ROOT / "params.yaml").read_text(encoding="utf-8")
    block = text.split("\nmix:", 1)[1].split("\n  mixtures:", 1)[0]
    lines = [m.group(1) for m in re.finditer(r"^  #   (\w+: .*)$", block, re.M)]
    listed = {k: v for line in lines for k, v in yaml.safe_load(line).items()}
    assert listed == PRESETS["finelap"]


def test_overrides_apply() -> None:
    spec = resolve_spec(
        "flam", {"max_polyphony": 2, "snr_db": ["uniform", 6, 30], "repetition": {"probability": 0.2}}, sample_rate_hz=8000
    )
    assert spec.max_polyphony == 2 and spec.sample_rate_hz == 8000
    assert spec.snr_db.bounds() == (6, 30)
    assert spec.repetition.probability == 0.2 and spec.repetition.count.values == (2, 3)  # siblings kept


# --- B8: distribution sampling -----------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(mu=st.floats(-20, 20), sd=st.floats(0, 10), lo=st.floats(-15, 15), width=st.floats(0, 10), seed=st.integers(0, 2**32 - 1))
def test_truncnorm_within_bounds(mu: float, sd: float, lo: float, width: float, seed: int) -> None:
    hi = lo + width
    d = parse(["truncnorm", mu, sd, lo, hi], "x")
    assert d.bounds() == (lo, hi)
    rng = np.random.default_rng(seed)
    draws = np.array([d.sample(rng) for _ in range(200)])
    assert np.all(np.isfinite(draws)) and np.all(draws >= lo) and np.all(draws <= hi)


def test_truncnorm_shape() -> None:
    """URBAN-SED's onset tuple: mean near 5 and the normal's spread, inside [0, 10]."""
    d = parse(["truncnorm", 5.0, 2.0, 0.0, 10.0], "onset_s")
    rng = np.random.default_rng(0)
    draws = np.array([d.sample(rng) for _ in range(2000)])
    assert draws.min() >= 0.0 and draws.max() <= 10.0
    assert abs(draws.mean() - 5.0) < 0.15 and 1.7 < draws.std() < 2.1


@pytest.mark.parametrize("weights", [[0.5, 0.3, 0.2], [1, 0, 3], [2, 2, 2, 2]])
def test_choose_weighted_frequencies(weights: list[float]) -> None:
    values = list(range(10, 10 + len(weights)))
    d = parse(["choose_weighted", values, weights], "x")
    rng = np.random.default_rng(42)
    draws = np.array([d.sample(rng) for _ in range(2000)])
    w = np.asarray(weights, dtype=float) / sum(weights)
    for v, p in zip(values, w):
        assert abs(np.mean(draws == v) - p) <= 0.05
        if p == 0:
            assert not np.any(draws == v)


def test_uniform_and_choose_sampling() -> None:
    rng = np.random.default_rng(7)
    u = parse(["uniform", 6.0, 30.0], "snr_db")
    draws = np.array([u.sample(rng) for _ in range(2000)])
    assert draws.min() >= 6.0 and draws.max() < 30.0 and abs(draws.mean() - 18.0) < 0.6
    c = parse(["choose", [1, 2, 3]], "n")
    counts = np.bincount([c.sample(rng) for _ in range(2000)], minlength=4)[1:] / 2000
    assert np.all(np.abs(counts - 1 / 3) <= 0.05)
    assert parse(5, "x").sample(rng) == 5 and parse(["const", 2.5], "x").sample(rng) == 2.5


@settings(max_examples=30, deadline=None)
@given(fit=st.floats(0, 20), seed=st.integers(0, 2**32 - 1))
def test_fit_bound_resolves_to_fit(fit: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    assert parse("fit", "onset_s", allow_fit=True).sample(rng, fit=fit) == fit
    assert parse(["const", "fit"], "onset_s", allow_fit=True).sample(rng, fit=fit) == fit
    uniform = parse(["uniform", 0.0, "fit"], "onset_s", allow_fit=True)
    assert uniform.bounds(fit=fit) == (0.0, fit)
    assert 0.0 <= uniform.sample(rng, fit=fit) <= fit
    tn = parse(["truncnorm", 5.0, 2.0, 0.0, "fit"], "onset_s", allow_fit=True)
    assert tn.bounds(fit=fit) == (0.0, fit)
    assert 0.0 <= tn.sample(rng, fit=fit) <= fit
    assert parse(["choose", [0.0, "fit"]], "onset_s", allow_fit=True).bounds(fit=fit) == (0.0, fit)


def test_fit_only_where_allowed() -> None:
    with pytest.raises(SpecError, match="'snr_db' needs a finite number, got 'fit'"):
        parse(["uniform", 0.0, "fit"], "snr_db")
    with pytest.raises(SpecError, match="'x'.*takes 2 argument"):
        parse(["uniform", 0.0], "x")
    with pytest.raises(SpecError, match="one weight per value"):
        parse(["choose_weighted", [1, 2], [1]], "x")
    with pytest.raises(SpecError, match="non-negative and not all zero"):
        parse(["choose_weighted", [1, 2], [0, 0]], "x")
    with pytest.raises(SpecError, match="standard deviation"):
        parse(["normal", 0.0, -1.0], "x")


def test_label_balanced_sampling_draws_every_label_alike_whatever_its_clips() -> None:
    """8 clips of Bark and 1 each of Meow, Knock and Speech: uniform draws favour Bark 8 to 1, label-balanced
    draws each label about a quarter of the time; the draws repeat for the same seed."""
    sources, clips, segments = bank()
    skewed = [dataclasses.replace(c, label="Bark") for c in clips[:8]] + [c for c in clips[8:] if c.label != "Bark"][:3]
    counts = {}
    for sampling in ("uniform", "label-balanced"):
        spec = resolve_spec("finelap", {"events_per_mixture": ["const", 1], "clip_sampling": sampling}, sample_rate_hz=SR)
        ctx = MixContext(spec, 0, RelabelParams(), sources, {s: skewed for s in SPLITS}, {s: list(segments) for s in SPLITS})
        drawn = [draw_mixture(ctx, "train", i, f"m{i}", "x.flac") for i in range(400)]
        labels = [next(iter(d.clips.values())).label for d in drawn]
        counts[sampling] = {label: labels.count(label) / len(labels) for label in ("Bark", "Meow", "Knock", "Speech")}
        again = draw_mixture(ctx, "train", 7, "m7", "x.flac")
        assert list(again.clips) == list(drawn[7].clips)
    assert counts["uniform"]["Bark"] > 0.6
    assert all(0.17 < share < 0.33 for share in counts["label-balanced"].values()), counts
    with pytest.raises(SpecError, match="clip_sampling"):
        resolve_spec("finelap", {"clip_sampling": "balanced"}, sample_rate_hz=SR)
