"""Instantiation: draw one mixture's recipe from the spec, render it, relabel it.

Input: a :class:`MixContext` (spec, source pools of one split, source reader, envelopes) and
the mixture's split and index. Output: a :class:`Mixture` (recipe, occurrences, label
segments, int16 audio). All randomness comes from one generator seeded by
``(seed, split, index)``, so a mixture does not depend on which worker makes it, on the
order mixtures finish in, or on how many mixtures the other splits have.

Levels (``spec.level_mode``), measured on the exact samples that are placed:

- ``rms`` (FineLAP): event RMS over its placed span against the background's RMS over the
  whole mixture;
- ``lufs`` (Scaper): BS.1770 integrated loudness, spans shorter than 0.5 s self-tiled;
  the background is set to ``ref_db`` LUFS and each event to ``ref_db + snr``;
- ``local``: event RMS against the background's RMS over the event's own window.

``ref_db`` (if set) fixes the background level in the same measure; otherwise the
background keeps its own level. Occurrences of one event share its gain, except in
``local`` mode, where each occurrence is levelled against its own window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from pipeline.audio import FULL_SCALE_INT16, int16_to_float, quantize_int16
from pipeline.licenses import license_name, most_restrictive
from pipeline.loudness import integrated_lufs, power_db
from pipeline.mix.relabel import Envelope, RelabelParams, occurrence_envelopes, relabel
from pipeline.mix.render import Sources, apply_fades, apply_gain, mix_components
from pipeline.mix.spec import MixSpec
from pipeline.schema import (
    BackgroundSegment,
    EventClip,
    EventOccurrence,
    LabelSegment,
    MixtureRecipe,
)

SPLITS = ("train", "valid", "test")
SCAPER_TILE_BELOW_S = 0.5
FULL_SCALE_PEAK_DB = 20.0 * math.log10(32767.0 / FULL_SCALE_INT16)

@dataclass
class MixContext:
    """Everything a worker needs to make mixtures of one run (built once per worker)."""

    spec: MixSpec
    seed: int
    relabel: RelabelParams
    sources: Sources
    events: dict[str, list[EventClip]]  # split -> pool
    backgrounds: dict[str, list[BackgroundSegment]]
    _envelopes: dict[str, Envelope] = field(default_factory=dict)
    _levels: dict[tuple, float] = field(default_factory=dict)

    def envelope(self, item: EventClip | BackgroundSegment) -> Envelope:
        key = getattr(item, "clip_id", None) or item.segment_id
        env = self._envelopes.get(key)
        if env is None:
            env = self._envelopes[key] = Envelope.from_db(item.envelope_frame_s, item.envelope_hop_s, item.envelope_db)
        return env


@dataclass(frozen=True)
class Mixture:
    recipe: MixtureRecipe
    occurrences: list[EventOccurrence]
    segments: list[LabelSegment]
    audio: np.ndarray  # int16
    dropped_occurrences: int


def mixture_rng(seed: int, split: str, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, SPLITS.index(split), index])


def level_db(q: np.ndarray, mode: str, sample_rate_hz: int) -> float:
    """Level of int16 samples in dB re full scale: RMS, or LUFS (Scaper's tiling) in ``lufs`` mode."""
    return _signal_level_db(int16_to_float(q), mode, sample_rate_hz)


def _faded_level_db(q: np.ndarray, fade_in: int, fade_out: int, mode: str, sample_rate_hz: int) -> float:
    """Level of int16 samples as they sound after its fades (what the SNR refers to)."""
    if not (fade_in or fade_out):
        return level_db(q, mode, sample_rate_hz)
    x = apply_fades(int16_to_float(q), fade_in, fade_out)
    return _signal_level_db(x, mode, sample_rate_hz)


def _signal_level_db(x: np.ndarray, mode: str, sample_rate_hz: int) -> float:
    if mode == "lufs":
        return integrated_lufs(x, sample_rate_hz, tile_below_s=SCAPER_TILE_BELOW_S)
    return float(power_db(float(np.einsum("i,i->", x, x)) / max(x.shape[0], 1)))  # einsum: no CPU-chosen BLAS kernel


def _max_depth(intervals: list[tuple[int, int]], start: int, end: int) -> int:
    """Most intervals that overlap at any one instant of ``[start, end)``."""
    inside = [(max(s, start), min(e, end)) for s, e in intervals if s < end and e > start]
    if not inside:
        return 0
    points = sorted([(s, 1) for s, _ in inside] + [(e, -1) for _, e in inside], key=lambda p: (p[0], p[1]))
    depth = best = 0
    for _, step in points:
        depth += step
        best = max(best, depth)
    return best


def _blocked(placed: list[tuple[int, int]], own: list[tuple[int, int]], spec: MixSpec) -> list[tuple[int, int]]:
    """Intervals a new occurrence may not touch: its own event's other occurrences (unless
    they may overlap) and every instant where the polyphony cap is already reached."""
    out = [] if spec.repetition.overlap else list(own)
    cap = spec.max_polyphony
    if cap is not None and len(placed) >= cap:
        points = sorted([(s, 1) for s, _ in placed] + [(e, -1) for _, e in placed], key=lambda p: (p[0], p[1]))
        depth, start = 0, None
        for t, step in points:
            depth += step
            if depth >= cap and start is None:
                start = t
            elif depth < cap and start is not None:
                out.append((start, t))
                start = None
    return out


def _place(spec: MixSpec, rng: np.random.Generator, length: int, num_samples: int,
           placed: list[tuple[int, int]], own: list[tuple[int, int]], sr: int) -> int | None:
    """An onset (samples) for an occurrence of ``length``, or None if none fits.

    The spec's onset distribution is tried ``placement_tries`` times; if every draw breaks a
    rule, the onset is drawn uniformly from the onsets that keep every rule, so crowded
    mixtures lose an occurrence only when there is truly no room for it.
    """
    fit = (num_samples - length) / sr
    blocked = _blocked(placed, own, spec)
    for _ in range(spec.placement_tries):
        onset = int(round(min(max(float(spec.onset_s.sample(rng, fit=fit)), 0.0), fit) * sr))
        if not any(s < onset + length and e > onset for s, e in blocked):
            return onset
    ranges, lo = [], 0  # free onset ranges [lo, hi] between blocked intervals
    for s, e in sorted(blocked):
        if s - length >= lo:
            ranges.append((lo, s - length))
        lo = max(lo, e)
    if num_samples - length >= lo:
        ranges.append((lo, num_samples - length))
    if not ranges:
        return None
    sizes = np.array([hi - lo + 1 for lo, hi in ranges], dtype=np.float64)
    k = int(np.searchsorted(np.cumsum(sizes) / sizes.sum(), rng.random(), side="right"))
    lo, hi = ranges[min(k, len(ranges) - 1)]
    return int(lo + rng.integers(hi - lo + 1))


def _spans(spec: MixSpec, rng: np.random.Generator, start: int, length: int, sr: int) -> tuple[str, list[tuple[int, int]]]:
    """How one event is used: ``(role, [(source_start, length), ...])`` in samples."""
    u = rng.random()
    split, rep = spec.splitting, spec.repetition
    if u < split.probability:
        k = int(split.pieces.sample(rng))
        min_piece = int(round(split.min_piece_s * sr))
        k = min(k, length // max(min_piece, 1))
        if k >= 2:
            spare = length - k * min_piece
            cuts = np.sort(rng.integers(0, spare + 1, size=k - 1))
            sizes = np.diff(np.concatenate(([0], cuts, [spare]))) + min_piece
            starts = start + np.concatenate(([0], np.cumsum(sizes)[:-1]))
            return "piece", [(int(s), int(n)) for s, n in zip(starts, sizes)]
    elif u < split.probability + rep.probability and (rep.max_clip_s is None or length < rep.max_clip_s * sr):
        count = int(rep.count.sample(rng))
        if count > 1:
            return "repeat", [(start, length)] * count
    return "whole", [(start, length)]


def instantiate(ctx: MixContext, split: str, index: int, mixture_id: str, audio_path: str) -> Mixture:
    """Draw, render and relabel mixture ``index`` of ``split`` (see the module docstring)."""
    spec, sources = ctx.spec, ctx.sources
    sr = sources.sample_rate_hz
    rng = mixture_rng(ctx.seed, split, index)
    pool, backgrounds = ctx.events[split], ctx.backgrounds[split]
    mode = spec.level_mode

    num_samples = max(1, int(round(float(spec.duration_s.sample(rng)) * sr)))
    duration_s = num_samples / sr

    bg = backgrounds[int(rng.integers(len(backgrounds)))]
    bg_q = sources.background(bg.segment_id)
    fit = max(bg_q.shape[0] - num_samples, 0) / sr
    bg_start = int(round(min(max(float(spec.background_offset_s.sample(rng, fit=fit)), 0.0), fit) * sr))
    bg_window = bg_q[bg_start : bg_start + num_samples]
    key = ("bg", bg.segment_id, bg_start, num_samples, mode)
    if key not in ctx._levels:  # measured as mixed: zero-padded when the background is short
        padded = bg_window if bg_window.shape[0] == num_samples else np.concatenate([bg_window, np.zeros(num_samples - bg_window.shape[0], np.int16)])
        ctx._levels[key] = level_db(padded, mode, sr)
    bg_level = ctx._levels[key]
    bg_gain = 0.0 if spec.ref_db is None else spec.ref_db - bg_level

    n_events = int(spec.events_per_mixture.sample(rng))
    if spec.distinct_clips:
        picks = rng.choice(len(pool), size=min(n_events, len(pool)), replace=False)
    else:
        picks = rng.integers(len(pool), size=n_events)

    placed: list[tuple[int, int]] = []  # (onset, end) of every placed occurrence, in samples
    drafts = []  # (event_index, role, clip, src_start, length, onset, fade_in, fade_out, snr, gain)
    dropped = 0
    for event_index, pick in enumerate(picks):
        clip = pool[int(pick)]
        q = sources.event(clip.clip_id)
        clip_len = q.shape[0]
        if spec.event_duration_s is not None:
            length = min(clip_len, max(1, int(round(float(spec.event_duration_s.sample(rng)) * sr))))
        else:
            length = clip_len
        length = min(length, num_samples)
        room = (clip_len - length) / sr
        src_start = int(round(min(max(float(spec.source_time_s.sample(rng, fit=room)), 0.0), room) * sr))
        snr = float(spec.snr_db.sample(rng))
        fade_in = int(round(float(spec.fade_in_s.sample(rng)) * sr))
        fade_out = int(round(float(spec.fade_out_s.sample(rng)) * sr))
        role, spans = _spans(spec, rng, src_start, length, sr)
        fades = (0, 0) if role == "piece" else (fade_in, fade_out)  # a split event is levelled whole
        gain = None
        if mode != "local":
            lkey = (clip.clip_id, src_start, length, *fades, mode)
            if lkey not in ctx._levels:
                ctx._levels[lkey] = _faded_level_db(q[src_start : src_start + length], *fades, mode, sr)
            gain = bg_level + bg_gain + snr - ctx._levels[lkey]
        own: list[tuple[int, int]] = []
        for s_start, s_len in spans:
            onset = _place(spec, rng, s_len, num_samples, placed, own, sr)
            if onset is None:
                dropped += 1
                continue
            end = onset + s_len
            own.append((onset, end))
            placed.append((onset, end))
            occ_gain = gain
            if occ_gain is None:  # local: the background in this occurrence's own window
                window = bg_window[onset:end]
                level = level_db(window, "rms", sr) if window.shape[0] else -120.0
                occ_gain = level + bg_gain + snr - _faded_level_db(q[s_start : s_start + s_len], fade_in, fade_out, "rms", sr)
            drafts.append((event_index, role, clip, s_start, s_len, onset, fade_in, fade_out, snr, occ_gain))

    drafts.sort(key=lambda d: (d[5], d[0], d[3]))
    occurrences = [
        EventOccurrence(
            mixture_id=mixture_id, occurrence_index=i, event_index=ev, role=role, clip_id=clip.clip_id,
            label=clip.label, mid=clip.mid, source_in_s=s_start / sr, source_out_s=(s_start + s_len) / sr,
            onset_s=onset / sr, offset_s=(onset + s_len) / sr,
            fade_in_s=fade_in / sr, fade_out_s=fade_out / sr,
            gain_db=float(g), snr_db=snr, realised_snr_db=float("nan"), license=clip.license,
        )
        for i, (ev, role, clip, s_start, s_len, onset, fade_in, fade_out, snr, g) in enumerate(drafts)
    ]
    sources_used = [d[2] for d in drafts]
    licenses = sorted({c.license for c in sources_used} | {license_name(bg.license)})
    attribution = sorted(
        {f"'{c.title}' by {c.uploader} ({c.source_dataset} {c.source_id}, {c.license})" for c in sources_used}
        | {f"{bg.source_id} by {bg.author} (ambience, {license_name(bg.license)})"}
    )
    recipe = MixtureRecipe(
        mixture_id=mixture_id, split=split, index=index, audio_path=audio_path, duration_s=duration_s,
        num_samples=num_samples, sample_rate_hz=sr, level_mode=mode, background_id=bg.segment_id,
        background_offset_s=bg_start / sr, background_gain_db=float(bg_gain), background_level_db=float(bg_level),
        mixture_gain_db=0.0, peak_dbfs=0.0, num_events=len({o.event_index for o in occurrences}),
        num_occurrences=len(occurrences), max_polyphony=_max_depth(placed, 0, num_samples),
        labels=tuple(sorted({o.label for o in occurrences})), license=most_restrictive(licenses),
        licenses=tuple(licenses), attribution=tuple(attribution),
    )

    mix, background, parts = mix_components(recipe, occurrences, sources)
    bg_mixed_level = None if mode == "local" else _signal_level_db(background, mode, sr)
    occurrences = [
        replace(o, realised_snr_db=_realised_snr(x, o, background, bg_mixed_level, mode, sr)) for o, x in zip(occurrences, parts)
    ]
    mixture_gain = _normalisation_db(mix, spec, sr)
    audio = quantize_int16(apply_gain(mix, mixture_gain))
    peak = float(max(int(audio.max()), -int(audio.min()))) if audio.size else 0.0
    recipe = replace(recipe, mixture_gain_db=mixture_gain, peak_dbfs=float(20.0 * math.log10(max(peak, 1.0) / FULL_SCALE_INT16)))

    bg_env = ctx.envelope(bg)
    envelopes = occurrence_envelopes(occurrences, {c.clip_id: ctx.envelope(c) for c in sources_used}, sources)
    segments = relabel(mixture_id, duration_s, occurrences, envelopes, (recipe.background_offset_s, bg_gain, bg_env), mixture_gain, ctx.relabel)
    return Mixture(recipe, occurrences, segments, audio, dropped)


def _realised_snr(x: np.ndarray, occ: EventOccurrence, background: np.ndarray, background_level: float | None, mode: str, sr: int) -> float:
    """The occurrence's level against the background as mixed (its window in ``local`` mode)."""
    if mode == "local":
        start = int(round(occ.onset_s * sr))
        reference = background[start : start + x.shape[0]]
        return _signal_level_db(x, "rms", sr) - _signal_level_db(reference, "rms", sr)
    return _signal_level_db(x, mode, sr) - background_level


def _normalisation_db(mix: np.ndarray, spec: MixSpec, sr: int) -> float:
    """The mixture gain: optional loudness target, then the peak policy."""
    norm = spec.normalize
    gain = 0.0
    if norm.loudness_lufs is not None:
        gain = norm.loudness_lufs - integrated_lufs(mix, sr)
    peak = max(float(mix.max()), -float(mix.min())) if mix.size else 0.0
    peak_db = 20.0 * math.log10(max(peak, 1e-9)) + gain
    if norm.peak == "always" or (norm.peak == "if-clipping" and peak_db > FULL_SCALE_PEAK_DB):
        gain += norm.peak_dbfs - peak_db
    return float(gain)
