"""Augmentations recorded in recipes: pitch shift and time stretch, reverb, Brownian noise, event
pools. Each re-renders bit for bit from its recipe, and relabeling judges the signal as heard."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import soundfile as sf

from pipeline.audio import quantize_int16
from pipeline.config.distributions import SpecError
from pipeline.config.mix_spec import resolve_spec
from pipeline.config.params import RelabelParams
from pipeline.loudness import a_weighted_envelope
from pipeline.mix import augment
from pipeline.mix.instantiate import MixContext, instantiate, relabel_mixture
from pipeline.mix.render import occurrence_signal, render
from pipeline.schema import SPLITS, EventOccurrence, MixtureRecipe
from tests.pipeline.mix.test_instantiate import SR, MemorySources, background_segment, bank, event_clip

HOP_S = 0.02


def _context(overrides: dict, preset: str = "finelap", seed: int = 0, clips=None) -> MixContext:
    sources, default_clips, segments = bank()
    clips = list(default_clips if clips is None else clips)
    return MixContext(
        resolve_spec(preset, overrides, sample_rate_hz=SR),
        seed,
        RelabelParams(),
        sources,
        events={s: clips for s in SPLITS},
        backgrounds={s: list(segments) for s in SPLITS},
    )


def _peak_hz(x: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(x.shape[0])))
    return float(np.argmax(spectrum) * SR / x.shape[0])


def _tone(hz: float, seconds: float, amplitude: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    return (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.float32)


# --- the signal operations ---------------------------------------------------------------------


def test_varispeed_moves_pitch_with_duration() -> None:
    x = _tone(440.0, 1.0)
    y = augment.stretch(x, SR, 2.0, augment.varispeed_semitones(2.0), "varispeed")
    assert y.shape[0] == 2 * SR
    assert abs(_peak_hz(y) - 220.0) < 3.0
    assert augment.varispeed_semitones(2.0) == pytest.approx(-12.0)


def test_rubberband_shifts_pitch_and_stretches_independently() -> None:
    x = _tone(440.0, 1.0)
    up = augment.stretch(x, SR, 1.0, 12.0, "rubberband")
    assert up.shape[0] == SR and abs(_peak_hz(up[2000:-2000]) - 880.0) < 6.0
    longer = augment.stretch(x, SR, 1.5, 0.0, "rubberband")
    assert longer.shape[0] == int(1.5 * SR) and abs(_peak_hz(longer[2000:-2000]) - 440.0) < 4.0
    assert np.array_equal(longer, augment.stretch(x, SR, 1.5, 0.0, "rubberband"))  # the kept result is a copy, unchanged
    assert augment.stretch(x, SR, 1.0, 0.0, "rubberband") is x


def test_reverberate_is_dry_plus_convolution() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal(4000).astype(np.float32) * 0.1
    h = np.exp(-np.arange(800) / 150.0) * rng.standard_normal(800)
    y = augment.reverberate(x, augment.Room(h), wet_db=-6.0, dry_db=-3.0)
    expected = np.convolve(x.astype(np.float64), h) * 10 ** (-6 / 20)
    expected[:4000] += x * 10 ** (-3 / 20)
    assert y.shape[0] == 4000 + 800 - 1 and y.dtype == np.float32
    np.testing.assert_allclose(y, expected, atol=2e-5)


def test_fft_sizes_are_fast_and_at_most_a_quarter_above_the_length() -> None:
    lengths = [
        1,
        2,
        7,
        8,
        9,
        17,
        1000,
        4097,
        60000,
        61441,
        160000 + 15000,
        *np.random.default_rng(0).integers(1, 10**6, 500).tolist(),
    ]
    for n in lengths:
        size = augment.fft_size(n)
        m = size
        while m % 2 == 0:
            m //= 2
        assert size >= n and (size <= 1.25 * n or size <= 8), (n, size)
        assert m in (1, 3, 5, 9, 15), (n, size)  # 2, 3 and 5 only
    sizes = {augment.fft_size(n) for n in range(16000, 128000)}  # 1-8 s at 16 kHz: a room keeps few spectra
    assert len(sizes) <= 16


def test_a_rooms_kept_spectrum_convolves_as_a_fresh_room_does() -> None:
    rng = np.random.default_rng(5)
    h = np.exp(-np.arange(3000) / 400.0) * rng.standard_normal(3000)
    room = augment.Room(h)
    x, y = (rng.standard_normal(n).astype(np.float32) * 0.1 for n in (20000, 21000))  # one FFT size for both
    assert augment.fft_size(x.shape[0] + 2999) == augment.fft_size(y.shape[0] + 2999)
    first = augment.reverberate(x, room, 0.0, 0.0)
    assert room.spectrum(augment.fft_size(x.shape[0] + 2999)) is room.spectrum(augment.fft_size(y.shape[0] + 2999))
    assert np.array_equal(augment.reverberate(y, room, 0.0, 0.0), augment.reverberate(y, augment.Room(h), 0.0, 0.0))
    assert np.array_equal(first, augment.reverberate(x, augment.Room(h), 0.0, 0.0))


def test_room_files_are_unit_energy_and_cut_at_the_inaudible_tail(tmp_path) -> None:
    n = SR
    h = np.concatenate([np.zeros(37), np.exp(-np.arange(n) * 3 * math.log(10) / (0.5 * SR))])  # 60 dB in 0.5 s
    sf.write(tmp_path / "room.wav", (0.5 * h).astype(np.float32), SR, subtype="FLOAT")
    [rid] = augment.room_files(str(tmp_path))
    r = augment.rir_samples(rid, SR)
    assert r[0] == pytest.approx(r.max()) and r[0] > 0  # the direct sound is not delayed
    full = h[37:] / np.sqrt(np.sum(h**2))
    assert np.sum(r**2) == pytest.approx(1.0, abs=1e-6)
    remaining_db = 10 * np.log10(np.sum(full[r.shape[0] :] ** 2))
    assert -71.0 < remaining_db <= -70.0 + 1e-6
    with pytest.raises(augment.AugmentError, match="not a folder"):
        augment.room_files(str(tmp_path / "missing"))


def test_simulated_rooms_reverberate_for_about_their_rt60() -> None:
    rid = augment.shoebox_id((6.0, 4.5, 3.0), 0.5, (2.0, 1.5, 1.5), (4.0, 3.0, 1.2))
    h = augment.rir_samples(rid, SR)
    energy_db = 10 * np.log10(np.maximum(np.cumsum((h**2)[::-1])[::-1], 1e-30))
    t20 = (np.argmax(energy_db < -25.0) - np.argmax(energy_db < -5.0)) / SR * 3  # T20, scaled to 60 dB
    assert 0.3 < t20 < 0.8
    assert augment.draw_room(np.random.default_rng(1), *_room_dists()) == augment.draw_room(
        np.random.default_rng(1), *_room_dists()
    )


def _room_dists():
    rev = resolve_spec("finelap", sample_rate_hz=SR).reverb
    return rev.room_size_m, rev.rt60_s


def test_brownian_noise_is_seeded_quiet_and_falls_6_db_per_octave() -> None:
    q = augment.brownian_noise("brownian-5", 10 * SR)
    assert np.array_equal(q, augment.brownian_noise.__wrapped__("brownian-5", 10 * SR))
    assert not np.array_equal(q, augment.brownian_noise("brownian-6", 10 * SR))
    x = q.astype(np.float64) / 32768
    assert 10 * np.log10(np.mean(x**2)) == pytest.approx(augment.BROWNIAN_RMS_DBFS, abs=0.1)
    power = np.abs(np.fft.rfft(x)) ** 2
    freqs = np.fft.rfftfreq(x.shape[0], 1 / SR)
    band = lambda lo: power[(freqs >= lo) & (freqs < 2 * lo)].mean()  # noqa: E731
    slope = 10 * np.log10(band(1600) / band(100)) / 4  # dB per octave over 4 octaves
    assert -7.0 < slope < -5.0


# --- recipes --------------------------------------------------------------------------------------

AUGMENTED = {
    "rubberband": {"pitch_shift_semitones": ["uniform", -3, 3], "time_stretch_factor": ["uniform", 0.8, 1.25]},
    "varispeed": {"time_stretch_factor": ["uniform", 0.8, 1.25], "stretch_method": "varispeed"},
    "reverb": {"reverb": {"probability": 1.0, "background_probability": 1.0, "rooms": 3, "rt60_s": ["uniform", 0.2, 0.4]}},
}


@pytest.mark.parametrize("name", sorted(AUGMENTED))
def test_augmented_recipes_re_render_identically(name: str) -> None:
    first = [instantiate(_context(AUGMENTED[name]), "train", i, f"m{i}", "x") for i in range(3)]
    augment._stretch.kept.clear()
    augment.load_room.cache_clear()
    ctx = _context(AUGMENTED[name])
    for i, m in enumerate(first):
        assert any(augment.is_brownian(m.recipe.background_id) or o.stretch_method or o.rir_id for o in m.occurrences)
        assert np.array_equal(render(m.recipe, m.occurrences, ctx.sources), m.audio)
        again = instantiate(ctx, "train", i, f"m{i}", "x")  # a fresh worker: the same recipe and samples
        assert again.recipe == m.recipe and again.occurrences == m.occurrences and again.segments == m.segments
        assert np.array_equal(again.audio, m.audio)


def test_repeats_of_a_reverberated_event_are_made_once_and_judged_as_a_fresh_render_judges_them() -> None:
    ctx = _context({**AUGMENTED["reverb"], "repetition": {"probability": 1.0, "count": ["const", 3]}})
    m = next(
        m
        for m in (instantiate(ctx, "train", i, f"m{i}", "x") for i in range(8))
        if any(o.role == "repeat" for o in m.occurrences)
    )
    repeats = [o for o in m.occurrences if o.role == "repeat" and o.rir_id]
    parts = [occurrence_signal(ctx.sources, o) for o in repeats]
    assert all(not x.flags.writeable for x in parts)  # kept samples cannot be changed by a caller
    assert len({x.__array_interface__["data"][0] for x in parts}) == 1  # one event, one convolution
    # a fresh worker without the kept signals (replay: relabeling renders again) judges the same labels
    fresh = _context({**AUGMENTED["reverb"], "repetition": {"probability": 1.0, "count": ["const", 3]}})
    clips = {o.clip_id: c for c in bank()[1] for o in m.occurrences if c.clip_id == o.clip_id}
    segment = next(b for b in bank()[2] if b.segment_id == m.recipe.background_id)
    assert relabel_mixture(fresh, m.recipe, m.occurrences, segment, clips) == m.segments


def test_stretched_occurrences_sound_for_their_stretched_length() -> None:
    ctx = _context(AUGMENTED["rubberband"])
    occ = [o for i in range(4) for o in instantiate(ctx, "train", i, f"m{i}", "x").occurrences]
    for o in occ:
        stretched = augment.stretched_length(round((o.source_out_s - o.source_in_s) * SR), o.time_stretch_factor)
        assert round(o.offset_s * SR) - round(o.onset_s * SR) == min(stretched, 10 * SR - round(o.onset_s * SR))
    assert {o.stretch_method for o in occ} == {"rubberband"}
    assert len({o.pitch_shift_semitones for o in occ}) > 1


def test_varispeed_records_the_pitch_its_speed_implies() -> None:
    occ = [o for i in range(3) for o in instantiate(_context(AUGMENTED["varispeed"]), "train", i, f"m{i}", "x").occurrences]
    for o in occ:
        assert o.pitch_shift_semitones == pytest.approx(-12 * math.log2(o.time_stretch_factor))


def test_no_augmentation_draws_nothing_new() -> None:
    """Knobs left at their defaults change neither the draws nor the recipe (stored datasets stay as they were)."""
    m = instantiate(_context({}), "train", 4, "m", "x")
    assert m.recipe.background_rir_id == "" and not augment.is_brownian(m.recipe.background_id)
    assert all(o.stretch_method == "" and o.rir_id == "" and o.time_stretch_factor == 1.0 for o in m.occurrences)


def test_urban_sed_mixes_on_brownian_noise() -> None:
    ctx = _context({}, preset="urban-sed")
    mixtures = [instantiate(ctx, "train", i, f"m{i}", "x") for i in range(4)]
    assert all(augment.is_brownian(m.recipe.background_id) for m in mixtures)
    assert len({m.recipe.background_id for m in mixtures}) == 4
    assert all("Brownian noise" in " ".join(m.recipe.attribution) for m in mixtures)
    assert sum(len(m.segments) for m in mixtures) > 0
    for m in mixtures:
        assert np.array_equal(render(m.recipe, m.occurrences, ctx.sources), m.audio)


def test_flam_pools_draw_each_mixture_from_one_pool_by_its_share() -> None:
    _, clips, _ = bank()
    library = [dataclasses.replace(c, clip_id=f"lib-{c.clip_id}", source_dataset="library") for c in clips]
    sources = bank()[0]
    for c in clips:
        sources._events[f"lib-{c.clip_id}"] = sources.event(c.clip_id)
    ctx = _context({}, preset="flam", clips=[*clips, *library])
    counts = {"library": 0, "FSD50K": 0}
    for i in range(200):
        m = instantiate(ctx, "train", i, f"m{i}", "x")
        kinds = {"library" if o.clip_id.startswith("lib-") else "FSD50K" for o in m.occurrences}
        assert len(kinds) <= 1
        for k in kinds:
            counts[k] += 1
    assert 0.72 < counts["library"] / sum(counts.values()) < 0.88
    only_fsd = _context({}, preset="flam")  # no sound-effect library: the general pool serves every mixture
    assert instantiate(only_fsd, "train", 0, "m", "x").occurrences


def test_spec_refuses_contradictory_augmentation_knobs() -> None:
    with pytest.raises(SpecError, match="varispeed"):
        resolve_spec(
            "finelap",
            {"stretch_method": "varispeed", "pitch_shift_semitones": ["const", 1], "time_stretch_factor": ["const", 1.1]},
            sample_rate_hz=SR,
        )
    with pytest.raises(SpecError, match="add up to 1"):
        resolve_spec("finelap", {"pools": {"a": {"share": 0.5, "datasets": ["fsd50k"]}}}, sample_rate_hz=SR)
    with pytest.raises(SpecError, match="stretch_method"):
        resolve_spec("finelap", {"stretch_method": "tape"}, sample_rate_hz=SR)
    with pytest.raises(SpecError, match="rt60_s"):
        resolve_spec("finelap", {"reverb": {"rt60_s": ["const", 9.0]}}, sample_rate_hz=SR)


# --- relabeling a reverberated burst ---------------------------------------------------------------


def _burst_labels(tmp_path, level_dbfs: float, rt60_s: float | None) -> tuple[float, float, float]:
    """(onset, offset) of the label of a white-noise burst at [1, 2) s on silence, dry or heard in a
    diffuse exponential room with ``rt60_s`` (wet only); the loudest 40 ms frame as heard (dBFS),
    and the centre of the last frame above the relabeling floors."""
    rng = np.random.default_rng(11)
    burst = quantize_int16((rng.standard_normal(SR) * 10 ** (level_dbfs / 20)).astype(np.float32))
    silence = np.zeros(4 * SR, np.int16)
    sources = MemorySources(SR, {"burst": burst}, {"quiet": silence})
    clip, segment = event_clip("burst", burst, "Hiss", "/m/07rjwbb"), background_segment("quiet", silence)
    rid = ""
    if rt60_s is not None:  # random signs under an energy decay of 60 dB per rt60_s: a diffuse tail
        n = np.arange(int(2 * rt60_s * SR))
        h = np.exp(-n * 3 * math.log(10) / (rt60_s * SR)) * rng.choice([-1.0, 1.0], n.shape[0])
        sf.write(tmp_path / f"exp{rt60_s}.wav", h.astype(np.float32), SR, subtype="FLOAT")
        [rid] = augment.room_files(str(tmp_path))
    tail = augment.tail_samples(rid, SR)
    occ = EventOccurrence(
        mixture_id="m",
        occurrence_index=0,
        event_index=0,
        role="whole",
        clip_id="burst",
        label="Hiss",
        mid="/m/07rjwbb",
        source_in_s=0.0,
        source_out_s=1.0,
        onset_s=1.0,
        offset_s=min(2 * SR + tail, 4 * SR) / SR,
        fade_in_s=0.0,
        fade_out_s=0.0,
        gain_db=0.0,
        snr_db=0.0,
        realised_snr_db=0.0,
        license="CC0",
        rir_id=rid,
        reverb_wet_db=0.0,
        reverb_dry_db=-120.0,
    )
    recipe = MixtureRecipe(
        mixture_id="m",
        split="train",
        index=0,
        audio_path="x",
        duration_s=4.0,
        num_samples=4 * SR,
        sample_rate_hz=SR,
        level_mode="rms",
        background_id="quiet",
        background_offset_s=0.0,
        background_gain_db=0.0,
        background_level_db=-120.0,
        mixture_gain_db=0.0,
        peak_dbfs=0.0,
        num_events=1,
        num_occurrences=1,
        max_polyphony=1,
        labels=("Hiss",),
        license="CC0",
        licenses=("CC0",),
        attribution=(),
    )
    ctx = MixContext(resolve_spec("finelap", sample_rate_hz=SR), 0, RelabelParams(), sources, {}, {})
    [label] = relabel_mixture(ctx, recipe, [occ], segment, {"burst": clip})
    heard = render(recipe, [occ], sources).astype(np.float32) / 32768
    env = np.array(a_weighted_envelope(heard, SR, 0.04, HOP_S).energy_db)
    threshold = max(env.max() + RelabelParams().relative_floor_db, RelabelParams().absolute_floor_db)
    last_centre = (np.flatnonzero(env >= threshold)[-1] * HOP_S) + 0.02
    return label.onset_s, label.offset_s, float(env.max()), float(last_centre)


@pytest.mark.parametrize("level_dbfs", [-20.0, -52.0])
def test_reverb_tail_extends_the_label_by_its_audible_part(tmp_path, level_dbfs: float) -> None:
    """The label ends where the tail decays below the relabeling floors (30 dB under the loudest
    frame, or -70 dB A-weighted): a tail falls 60 dB per RT60, so ``rt60 * min(30, level + 70) / 60``
    after the burst. Labels end at the centre of the last frame above the floors (so up to one hop
    before the crossing); the dry burst's label ends with the burst."""
    p = RelabelParams()
    dry_on, dry_off, _, _ = _burst_labels(tmp_path, level_dbfs, None)
    assert abs(dry_on - 1.0) <= HOP_S and abs(dry_off - 2.0) <= HOP_S
    rt60 = 0.4
    on, off, level, last_centre = _burst_labels(tmp_path, level_dbfs, rt60)
    audible_db = min(-p.relative_floor_db, level - p.absolute_floor_db)
    assert audible_db < 25 if level_dbfs < -40 else audible_db == 30  # each floor binds once
    crossing = 2.0 + rt60 * audible_db / 60.0
    assert crossing - HOP_S <= last_centre <= crossing + 0.005  # the frames see the analytic tail
    assert abs(off - last_centre) <= 0.002, (off, last_centre)  # and the label ends there: no further
    assert abs(on - 1.0) <= HOP_S


def test_jams_export_is_refused_for_augmented_mixtures() -> None:
    """Scaper cannot describe per-event rooms, generated backgrounds or our stretch: say so before mixing."""
    from pipeline.config.params import ParamsError, load_params
    from sedsynth.cli import TRAINER_SECTIONS as SKIP
    from tests.conftest import ROOT

    with pytest.raises(ParamsError, match=r"mix.export.jams.*\(reverb\).*set mix.export.jams: false"):
        load_params(
            ROOT / "params.yaml",
            {"mix": {"export": {"jams": True}, "spec": {"reverb": {"probability": 0.5}}}},
            skip_sections=SKIP,
        )
    assert load_params(ROOT / "params.yaml", {"mix": {"export": {"jams": True}}}, skip_sections=SKIP).mix.export.jams
