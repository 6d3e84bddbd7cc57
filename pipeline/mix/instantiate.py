"""Instantiation: draw one mixture's recipe from the spec, render it, relabel it.

Input: a :class:`MixContext` (spec, source pools of one split, source reader, envelopes) and
the mixture's split and index. Output: a :class:`Mixture` (recipe, occurrences, label
segments, int16 audio). :func:`instantiate` runs three steps: :func:`draw_mixture` (every
random choice, as a recipe and its :class:`~pipeline.schema.EventOccurrence` rows),
:func:`render_mixture` (samples, realised SNRs, normalisation) and :func:`relabel_mixture`
(audible label segments). All randomness comes from one generator seeded by
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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from pipeline.audio import FULL_SCALE_INT16, int16_to_float, quantize_int16
from pipeline.config.distributions import Distribution
from pipeline.config.mix_spec import MixSpec
from pipeline.config.params import RelabelParams
from pipeline.licenses import license_name, most_restrictive
from pipeline.loudness import a_weighted_envelope, integrated_lufs, power_db
from pipeline.mix.augment import (
    brownian_noise,
    brownian_segment,
    draw_room,
    is_brownian,
    stretch,
    stretched_length,
    tail_samples,
    usable_rooms,
    varispeed_semitones,
)
from pipeline.mix.relabel import Envelope, occurrence_envelopes, relabel
from pipeline.mix.render import (
    Sources,
    add_occurrence,
    apply_fades,
    apply_gain,
    decoded_samples,
    heard_background,
    is_augmented,
    occurrence_signal,
    stored_samples,
    sum_buffer,
)
from pipeline.schema import (
    SPLITS,
    BackgroundSegment,
    EventClip,
    EventOccurrence,
    LabelSegment,
    MixtureRecipe,
)

if TYPE_CHECKING:
    from pipeline.mix.sources import StoredEnvelopes

T = TypeVar("T")
SCAPER_TILE_BELOW_S = 0.5
ROOM_STREAM = 7  # the simulated rooms' generators: (seed, ROOM_STREAM, room index), apart from every mixture's
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
    stored_envelopes: tuple[StoredEnvelopes, StoredEnvelopes] | None = None  # (events, backgrounds); None: the records' own
    _envelopes: dict[str, Envelope] = field(default_factory=dict)
    _levels: dict[tuple, float] = field(default_factory=dict)
    _rooms: list[str] | None = None
    _pools: dict[str, list[tuple[float, list[EventClip]]]] = field(default_factory=dict)
    _balanced: dict[int, np.ndarray] = field(default_factory=dict)

    def rooms(self) -> list[str]:
        """The run's rooms: the usable files of ``reverb.rirs`` (:func:`~pipeline.mix.augment.usable_rooms`),
        or ``reverb.rooms`` simulated rooms drawn from the seed."""
        if self._rooms is None:
            rev = self.spec.reverb
            self._rooms = (
                usable_rooms(rev.rirs, self.sources.sample_rate_hz)[0]
                if rev.rirs
                else [
                    draw_room(np.random.default_rng([self.seed, ROOM_STREAM, k]), rev.room_size_m, rev.rt60_s)
                    for k in range(rev.rooms)
                ]
            )
        return self._rooms

    def event_pools(self, split: str) -> list[tuple[float, list[EventClip]]]:
        """``spec.pools`` in ``split``: (share, clips) of each pool with clips, shares renormalised to 1."""
        if split not in self._pools:
            clips = self.events[split]
            found = [
                (p.share, [c for c in clips if c.source_dataset.lower() in {d.lower() for d in p.datasets}])
                for p in self.spec.pools
            ]
            found = [(share, pool) for share, pool in found if pool and share > 0]
            if not found:
                names = ", ".join(f"{p.name} ({', '.join(p.datasets)})" for p in self.spec.pools)
                have = ", ".join(sorted({c.source_dataset for c in clips}))
                raise ValueError(
                    f"mix: no clip of split '{split}' is in a pool of mix.spec.pools ({names}); its clips come from {have}"
                )
            total = sum(share for share, _ in found)
            self._pools[split] = [(share / total, pool) for share, pool in found]
        return self._pools[split]

    def label_balanced(self, pool: list[EventClip]) -> np.ndarray:
        """Each clip's probability in ``pool`` when every label is drawn alike, then a clip of it
        (``1 / (labels x the label's clips)``), kept per pool."""
        key = id(pool)
        if key not in self._balanced:
            counts = Counter(c.label for c in pool)
            w = np.array([1.0 / counts[c.label] for c in pool])
            self._balanced[key] = w / math.fsum(w)  # an exact sum: the same weights whatever numpy's kernels
        return self._balanced[key]

    def envelope(self, item: EventClip | BackgroundSegment) -> Envelope:
        """``item``'s stored envelope (from :attr:`stored_envelopes` when given, else its record)."""
        clip_id = getattr(item, "clip_id", None)
        key = clip_id or item.segment_id
        env = self._envelopes.get(key)
        if env is None:
            db = item.envelope_db if self.stored_envelopes is None else self.stored_envelopes[clip_id is None].db(key)
            env = remember(self._envelopes, key, Envelope.from_db(item.envelope_frame_s, item.envelope_hop_s, db))
        return env

    def level(self, key: tuple, measure: Callable[[], float]) -> float:
        """A level measurement of a source window, made once while it stays in the cache."""
        level = self._levels.get(key)
        return remember(self._levels, key, measure()) if level is None else level


MAX_CACHED = (
    4096  # entries per cache of a context (envelopes: about 6.5 KB each): a worker does not grow with the corpus or the mixtures
)


def remember(cache: dict, key: object, value: T) -> T:
    """``cache[key] = value``, the cache emptied first when it holds :data:`MAX_CACHED` entries
    (it holds pure measurements: emptying it changes no value, only what is computed again)."""
    if len(cache) >= MAX_CACHED:
        cache.clear()
    cache[key] = value
    return value


@dataclass(frozen=True)
class Mixture:
    recipe: MixtureRecipe
    occurrences: list[EventOccurrence]
    segments: list[LabelSegment]
    audio: np.ndarray  # int16 (float32 as decoded, from instantiate(decoded=True))
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


def _place(
    spec: MixSpec,
    rng: np.random.Generator,
    length: int,
    num_samples: int,
    placed: list[tuple[int, int]],
    own: list[tuple[int, int]],
    sr: int,
) -> int | None:
    """An onset (samples) for an occurrence of ``length``, or None if none fits.

    The spec's onset distribution is tried ``placement_tries`` times; if every draw breaks a
    rule, the onset is drawn uniformly from the onsets that keep every rule, so crowded
    mixtures lose an occurrence only when there is truly no room for it.
    """
    fit = (num_samples - length) / sr
    blocked = _blocked(placed, own, spec)
    for _ in range(spec.placement_tries):
        onset = _draw_position(spec.onset_s, rng, fit, sr)
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


def instantiate(ctx: MixContext, split: str, index: int, mixture_id: str, audio_path: str, decoded: bool = False) -> Mixture:
    """Mixture ``index`` of ``split``: drawn, rendered, then relabeled (see the module docstring).
    ``decoded``: its audio as the float32 samples the stored int16 decode to, instead of the int16."""
    drawn = draw_mixture(ctx, split, index, mixture_id, audio_path)
    recipe, occurrences, audio, heard = _render(ctx, drawn, decoded)
    segments = relabel_mixture(ctx, recipe, occurrences, drawn.background, drawn.clips, heard)
    return Mixture(recipe, occurrences, segments, audio, drawn.dropped_occurrences)


@dataclass(frozen=True)
class Draw:
    """A drawn mixture, not yet rendered: what :func:`draw_mixture` hands to :func:`render_mixture`."""

    recipe: MixtureRecipe  # mixture_gain_db and peak_dbfs still 0: rendering sets them
    occurrences: list[EventOccurrence]  # in time order; realised_snr_db still NaN
    background: BackgroundSegment
    clips: dict[str, EventClip]  # clip_id -> clip, for every clip with a placed occurrence
    dropped_occurrences: int  # occurrences placement found no room for


@dataclass(frozen=True)
class _Background:
    """The drawn background: its window under the mixture and its level."""

    segment: BackgroundSegment
    start: int  # first sample of the window in the segment
    window: np.ndarray  # int16, shorter than the mixture if the segment is
    level_db: float  # of the window zero-padded to the mixture, in the spec's level mode
    gain_db: float  # 0, or what brings the level to ref_db
    rir_id: str = ""  # the room it is heard in ("" dry)
    wet_db: float = 0.0
    dry_db: float = 0.0


def draw_mixture(ctx: MixContext, split: str, index: int, mixture_id: str, audio_path: str) -> Draw:
    """Every random choice of one mixture, from its own generator.

    Input: the context (spec, the split's pools, sources, level caches), the split and index
    (which seed the generator) and the ids the recipe records. Output: a :class:`Draw`:
    duration, background window and gain, and each event's clip span, SNR, fades, role,
    onsets and gain as :class:`~pipeline.schema.EventOccurrence` rows in time order.
    """
    spec, sr = ctx.spec, ctx.sources.sample_rate_hz
    rng = mixture_rng(ctx.seed, split, index)
    num_samples = max(1, int(round(float(spec.duration_s.sample(rng)) * sr)))
    bg = _draw_background(ctx, rng, ctx.backgrounds[split], num_samples)
    pool = ctx.events[split]
    n_events = int(spec.events_per_mixture.sample(rng))
    if spec.pools:  # FLAM: one pool per mixture, by its share
        shares = ctx.event_pools(split)
        k = int(np.searchsorted(np.cumsum([share for share, _ in shares]), rng.random(), side="right"))
        pool = shares[min(k, len(shares) - 1)][1]
    weights = ctx.label_balanced(pool) if spec.clip_sampling == "label-balanced" else None
    if spec.distinct_clips:
        picks = rng.choice(len(pool), size=min(n_events, len(pool)), replace=False, p=weights)
    elif weights is None:
        picks = rng.integers(len(pool), size=n_events)
    else:
        picks = rng.choice(len(pool), size=n_events, replace=True, p=weights)

    placed: list[tuple[int, int]] = []  # (onset, end) of every placed occurrence, in samples
    drawn: list[dict] = []
    dropped = 0
    clips: dict[str, EventClip] = {}
    for event_index, pick in enumerate(picks):
        clip = pool[int(pick)]
        mine, lost = _draw_event(ctx, rng, mixture_id, event_index, clip, bg, num_samples, placed)
        drawn += mine
        dropped += lost
        if mine:
            clips[clip.clip_id] = clip
    drawn.sort(key=lambda o: (o["onset_s"], o["event_index"], o["source_in_s"]))
    occurrences = [EventOccurrence(occurrence_index=i, **o) for i, o in enumerate(drawn)]
    recipe = _recipe(
        split,
        index,
        mixture_id,
        audio_path,
        num_samples=num_samples,
        sr=sr,
        mode=spec.level_mode,
        bg=bg,
        occurrences=occurrences,
        clips=clips,
        placed=placed,
    )
    return Draw(recipe, occurrences, bg.segment, clips, dropped)


def _draw_position(d: Distribution, rng: np.random.Generator, fit_s: float, sr: int) -> int:
    """A placement tuple drawn with ``fit`` = ``fit_s`` and clamped to ``[0, fit_s]`` (as Scaper does), in samples."""
    return int(round(min(max(float(d.sample(rng, fit=fit_s)), 0.0), fit_s) * sr))


def _draw_background(
    ctx: MixContext, rng: np.random.Generator, backgrounds: list[BackgroundSegment], num_samples: int
) -> _Background:
    spec, sr, mode = ctx.spec, ctx.sources.sample_rate_hz, ctx.spec.level_mode
    if spec.brownian_background > 0 and rng.random() < spec.brownian_background:
        bg = brownian_segment(int(rng.integers(2**31)), num_samples, sr)
        start, window = 0, brownian_noise(bg.segment_id, num_samples)
        level = level_db(window, mode, sr)
    else:
        bg = backgrounds[int(rng.integers(len(backgrounds)))]
        q = ctx.sources.background(bg.segment_id)
        start = _draw_position(spec.background_offset_s, rng, max(q.shape[0] - num_samples, 0) / sr, sr)
        window = q[start : start + num_samples]

        def measure() -> float:  # as mixed: zero-padded when the background is short
            padded = (
                window
                if window.shape[0] == num_samples
                else np.concatenate([window, np.zeros(num_samples - window.shape[0], np.int16)])
            )
            return level_db(padded, mode, sr)

        level = ctx.level(("bg", bg.segment_id, start, num_samples, mode), measure)
    room = _draw_room(ctx, rng, spec.reverb.background_probability)
    return _Background(bg, start, window, level, 0.0 if spec.ref_db is None else spec.ref_db - level, *room)


def _draw_room(ctx: MixContext, rng: np.random.Generator, probability: float) -> tuple[str, float, float]:
    """(room id, wet dB, dry dB): a room with ``probability`` (drawn only when it is above 0), else dry."""
    if probability <= 0 or rng.random() >= probability:
        return "", 0.0, 0.0
    rooms, rev = ctx.rooms(), ctx.spec.reverb
    return rooms[int(rng.integers(len(rooms)))], float(rev.wet_db.sample(rng)), float(rev.dry_db.sample(rng))


@dataclass(frozen=True)
class _Augmentation:
    """How every occurrence of one event is changed: pitch and stretch, then a room (none: as recorded)."""

    pitch_shift_semitones: float = 0.0
    time_stretch_factor: float = 1.0
    stretch_method: str = ""
    rir_id: str = ""
    reverb_wet_db: float = 0.0
    reverb_dry_db: float = 0.0


DRY = _Augmentation()


def _draw_augmentation(ctx: MixContext, rng: np.random.Generator) -> _Augmentation:
    """One event's pitch shift, stretch factor and room (varispeed: one factor sets both)."""
    spec = ctx.spec
    pitch = float(spec.pitch_shift_semitones.sample(rng)) if spec.pitch_shift_semitones is not None else 0.0
    factor = float(spec.time_stretch_factor.sample(rng)) if spec.time_stretch_factor is not None else 1.0
    if spec.stretch_method == "varispeed":
        factor, pitch = (
            (2.0 ** (-pitch / 12.0), pitch) if spec.pitch_shift_semitones is not None else (factor, varispeed_semitones(factor))
        )
    method = spec.stretch_method if (pitch != 0.0 or factor != 1.0) else ""
    return _Augmentation(pitch, factor, method, *_draw_room(ctx, rng, spec.reverb.probability))


def _event_level_db(span: np.ndarray, fades: tuple[int, int], aug: _Augmentation, mode: str, sr: int) -> float:
    """An event span's level as the SNR means it: after pitch, stretch and fades, before its room."""
    if not aug.stretch_method:
        return _faded_level_db(span, *fades, mode, sr)
    x = stretch(int16_to_float(span), sr, aug.time_stretch_factor, aug.pitch_shift_semitones, aug.stretch_method)
    return _signal_level_db(apply_fades(x, *fades), mode, sr)


def _draw_event(
    ctx: MixContext,
    rng: np.random.Generator,
    mixture_id: str,
    event_index: int,
    clip: EventClip,
    bg: _Background,
    num_samples: int,
    placed: list[tuple[int, int]],
) -> tuple[list[dict], int]:
    """One event's occurrences (:class:`~pipeline.schema.EventOccurrence` fields but ``occurrence_index``,
    set once the mixture's occurrences are in time order) and how many found no room.

    Draws, in this order: the span of the clip, SNR, fades, the role (whole, repeat, pieces)
    and an onset per occurrence; ``placed`` gains every placed occurrence.
    """
    spec, sr, mode = ctx.spec, ctx.sources.sample_rate_hz, ctx.spec.level_mode
    aug = _draw_augmentation(ctx, rng) if spec.augments_events else DRY
    q = ctx.sources.event(clip.clip_id)
    length = q.shape[0]
    if spec.event_duration_s is not None:
        length = min(length, max(1, int(round(float(spec.event_duration_s.sample(rng)) * sr))))
    length = min(length, num_samples if aug.time_stretch_factor <= 1.0 else int(num_samples / aug.time_stretch_factor))
    src_start = _draw_position(spec.source_time_s, rng, (q.shape[0] - length) / sr, sr)
    snr = float(spec.snr_db.sample(rng))
    fade_in = int(round(float(spec.fade_in_s.sample(rng)) * sr))
    fade_out = int(round(float(spec.fade_out_s.sample(rng)) * sr))
    role, spans = _spans(spec, rng, src_start, length, sr)
    gain = None
    if mode != "local":
        fades = (0, 0) if role == "piece" else (fade_in, fade_out)  # a split event is levelled whole
        key = (
            clip.clip_id,
            src_start,
            length,
            *fades,
            mode,
            aug.pitch_shift_semitones,
            aug.time_stretch_factor,
            aug.stretch_method,
        )
        gain = (
            bg.level_db
            + bg.gain_db
            + snr
            - ctx.level(key, lambda: _event_level_db(q[src_start : src_start + length], fades, aug, mode, sr))
        )
    own: list[tuple[int, int]] = []
    out: list[dict] = []
    tail = tail_samples(aug.rir_id, sr)
    for s_start, s_len in spans:
        placed_len = stretched_length(s_len, aug.time_stretch_factor) if aug.stretch_method else s_len
        onset = _place(spec, rng, placed_len, num_samples, placed, own, sr)
        if onset is None:
            continue
        end = onset + placed_len
        own.append((onset, end))
        placed.append((onset, end))
        occ_gain = gain
        if occ_gain is None:  # local: the background in this occurrence's own window
            window = bg.window[onset:end]
            level = level_db(window, "rms", sr) if window.shape[0] else -120.0
            occ_gain = (
                level + bg.gain_db + snr - _event_level_db(q[s_start : s_start + s_len], (fade_in, fade_out), aug, "rms", sr)
            )
        out.append(
            dict(
                mixture_id=mixture_id,
                event_index=event_index,
                role=role,
                clip_id=clip.clip_id,
                label=clip.label,
                mid=clip.mid,
                source_in_s=s_start / sr,
                source_out_s=(s_start + s_len) / sr,
                onset_s=onset / sr,
                offset_s=min(end + tail, num_samples) / sr,
                fade_in_s=fade_in / sr,
                fade_out_s=fade_out / sr,
                gain_db=float(occ_gain),
                snr_db=snr,
                realised_snr_db=float("nan"),
                license=clip.license,
                **aug.__dict__,
            )
        )
    return out, len(spans) - len(out)


def _recipe(
    split: str,
    index: int,
    mixture_id: str,
    audio_path: str,
    *,
    num_samples: int,
    sr: int,
    mode: str,
    bg: _Background,
    occurrences: list[EventOccurrence],
    clips: dict[str, EventClip],
    placed: list[tuple[int, int]],
) -> MixtureRecipe:
    """The drawn mixture's recipe row, before rendering sets its mixture gain and peak."""
    segment = bg.segment
    licenses = sorted({c.license for c in clips.values()} | {license_name(segment.license)})
    attribution = sorted(
        {f"'{c.title}' by {c.uploader} ({c.source_dataset} {c.source_id}, {c.license})" for c in clips.values()}
        | {f"{segment.source_id} by {segment.author} (ambience, {license_name(segment.license)})"}
    )
    return MixtureRecipe(
        mixture_id=mixture_id,
        split=split,
        index=index,
        audio_path=audio_path,
        duration_s=num_samples / sr,
        num_samples=num_samples,
        sample_rate_hz=sr,
        level_mode=mode,
        background_id=segment.segment_id,
        background_offset_s=bg.start / sr,
        background_gain_db=float(bg.gain_db),
        background_level_db=float(bg.level_db),
        mixture_gain_db=0.0,
        peak_dbfs=0.0,
        num_events=len({o.event_index for o in occurrences}),
        num_occurrences=len(occurrences),
        max_polyphony=_max_depth(placed, 0, num_samples),
        labels=tuple(sorted({o.label for o in occurrences})),
        license=most_restrictive(licenses),
        licenses=tuple(licenses),
        attribution=tuple(attribution),
        background_rir_id=bg.rir_id,
        background_wet_db=bg.wet_db,
        background_dry_db=bg.dry_db,
    )


def render_mixture(ctx: MixContext, drawn: Draw) -> tuple[MixtureRecipe, list[EventOccurrence], np.ndarray]:
    """Render a drawn mixture through :mod:`pipeline.mix.render` and normalise it.

    Input: the context (spec, sources) and a :class:`Draw`. Output: ``(recipe, occurrences,
    audio)``: the recipe with its mixture gain and stored peak, the occurrences with their
    realised SNR (measured on the rendered signals), and the int16 samples.
    """
    recipe, occurrences, audio, _ = _render(ctx, drawn)
    return recipe, occurrences, audio


def _render(
    ctx: MixContext, drawn: Draw, decoded: bool = False
) -> tuple[MixtureRecipe, list[EventOccurrence], np.ndarray, tuple[np.ndarray | None, list[np.ndarray | None]]]:
    """:func:`render_mixture` (``decoded``: float32 samples as the stored int16 decode to), and the
    background and augmented occurrences as heard, for relabeling (None where nothing reads them).

    Each occurrence's level is measured as it is added, while its samples are still in the cache.
    """
    spec, sr, mode, r = ctx.spec, ctx.sources.sample_rate_hz, ctx.spec.level_mode, drawn.recipe
    # read again once the occurrences are in the sum: by local levels, and by relabeling (a room, generated noise)
    keep = mode == "local" or bool(r.background_rir_id) or is_brownian(r.background_id)
    background = heard_background(r, ctx.sources)
    mix = sum_buffer(background, keep)
    bg_mixed_level = None if mode == "local" else _mixed_background_level(r, background, mode, sr)
    occurrences, parts = [], []
    for o in drawn.occurrences:  # in occurrence_index order
        x = add_occurrence(mix, o, ctx.sources)
        # the constructor, not dataclasses.replace: the same record at a third of the cost
        occurrences.append(
            EventOccurrence(**{**vars(o), "realised_snr_db": _realised_snr(x, o, background, bg_mixed_level, mode, sr)})
        )
        parts.append(x if is_augmented(o) else None)
    ends = np.array([mix.max(), mix.min()], dtype=np.float32) if mix.size else None
    mixture_gain = _normalisation_db(mix, spec, sr, ends)
    audio = (decoded_samples if decoded else stored_samples)(
        mix, mixture_gain, ends
    )  # mix is spent here: scaled in its own buffer
    peak = _stored_peak(ends, mixture_gain)
    recipe = MixtureRecipe(
        **{
            **vars(r),
            "mixture_gain_db": mixture_gain,  # the constructor: 2 us less than replace
            "peak_dbfs": float(20.0 * math.log10(max(peak, 1.0) / FULL_SCALE_INT16)),
        }
    )
    return recipe, occurrences, audio, (background if keep else None, parts)


def _mixed_background_level(recipe: MixtureRecipe, background: np.ndarray, mode: str, sr: int) -> float:
    """The level of the background as mixed. At 0 dB and dry, its samples are the very window
    drawing measured (int16 scaled to float, zero-padded), so that measurement is reused."""
    if recipe.background_gain_db == 0.0 and not recipe.background_rir_id:
        return recipe.background_level_db
    return _signal_level_db(background, mode, sr)


def _stored_peak(ends: np.ndarray | None, gain_db: float) -> float:
    """The largest magnitude of the stored samples, ``quantize_int16(apply_gain(mix, gain_db))``, from
    the sum's ``ends`` (its max and min; None: no samples) without a pass over them: the gain
    (positive) and quantizing never decrease, so they map the sum's extremes to the stored ones."""
    if ends is None:
        return 0.0
    q = quantize_int16(apply_gain(ends, gain_db))
    return float(max(int(q[0]), -int(q[1])))


def relabel_mixture(
    ctx: MixContext,
    recipe: MixtureRecipe,
    occurrences: list[EventOccurrence],
    background: BackgroundSegment | None,
    clips: dict[str, EventClip],
    heard: tuple[np.ndarray, list[np.ndarray]] | None = None,
) -> list[LabelSegment]:
    """When each placed event is audible: :func:`pipeline.mix.relabel.relabel` on the sources' envelopes.

    Input: the context (envelope cache, sources, relabel params), the rendered recipe (its
    background offset and gain and mixture gain scale the envelopes), its occurrences, the
    background segment and the clips used (None for generated noise). Output: merged label
    segments. No audio is read but that of spans cut from inside a clip and of augmented
    occurrences and backgrounds, which are judged on their samples as heard (rendered
    again, as :func:`pipeline.mix.render.occurrence_signal` renders them, unless ``heard`` gives
    the background and the occurrences, in order, as rendering made them; None where it kept none).
    """
    if not occurrences:
        return []
    sr = ctx.sources.sample_rate_hz
    clip_envelopes = {clip_id: ctx.envelope(c) for clip_id, c in clips.items()}
    as_recorded = iter(occurrence_envelopes([o for o in occurrences if not is_augmented(o)], clip_envelopes, ctx.sources))
    judged, envelopes = [], []
    measured: dict[tuple[int, int], Envelope] = {}  # repeats of an augmented event share their kept samples: measured once
    for i, o in enumerate(occurrences):  # an augmented occurrence is judged on its samples as heard, its reverb tail included
        if is_augmented(o):
            x = heard[1][i] if heard is not None else occurrence_signal(ctx.sources, o)
            if x.flags.writeable:  # not a kept signal: its own samples
                envelopes.append(_heard_envelope(x, sr, clip_envelopes[o.clip_id]))
            else:
                same = (x.__array_interface__["data"][0], x.shape[0])
                if same not in measured:
                    measured[same] = _heard_envelope(x, sr, clip_envelopes[o.clip_id])
                envelopes.append(measured[same])
            judged.append(replace(o, source_in_s=0.0, source_out_s=x.shape[0] / sr, gain_db=0.0))
        else:
            envelopes.append(next(as_recorded))
            judged.append(o)
    if recipe.background_rir_id or is_brownian(recipe.background_id) or background is None:
        x = heard[0] if heard is not None and heard[0] is not None else heard_background(recipe, ctx.sources)
        background_placement = (0.0, 0.0, _heard_envelope(x, sr, envelopes[0]))
    else:
        background_placement = (recipe.background_offset_s, recipe.background_gain_db, ctx.envelope(background))
    return relabel(
        recipe.mixture_id, recipe.duration_s, judged, envelopes, background_placement, recipe.mixture_gain_db, ctx.relabel
    )


def _heard_envelope(x: np.ndarray, sr: int, like: Envelope) -> Envelope:
    """The envelope of float32 samples as heard (gain included), on ``like``'s frame geometry (float32 transforms)."""
    env = a_weighted_envelope(x, sr, like.frame_s, like.hop_s, single=True)
    return Envelope.from_db(env.frame_s, env.hop_s, env.energy_db)


def _realised_snr(
    x: np.ndarray, occ: EventOccurrence, background: np.ndarray, background_level: float | None, mode: str, sr: int
) -> float:
    """The occurrence's level against the background as mixed (its window in ``local`` mode)."""
    if mode == "local":
        start = int(round(occ.onset_s * sr))
        reference = background[start : start + x.shape[0]]
        return _signal_level_db(x, "rms", sr) - _signal_level_db(reference, "rms", sr)
    return _signal_level_db(x, mode, sr) - background_level


def _normalisation_db(mix: np.ndarray, spec: MixSpec, sr: int, ends: np.ndarray | None) -> float:
    """The mixture gain: optional loudness target, then the peak policy (``ends``: the max and min of ``mix``)."""
    norm = spec.normalize
    gain = 0.0
    if norm.loudness_lufs is not None:
        gain = norm.loudness_lufs - integrated_lufs(mix, sr)
    peak = max(float(ends[0]), -float(ends[1])) if ends is not None else 0.0
    peak_db = 20.0 * math.log10(max(peak, 1e-9)) + gain
    if norm.peak == "always" or (norm.peak == "if-clipping" and peak_db > FULL_SCALE_PEAK_DB):
        gain += norm.peak_dbfs - peak_db
    return float(gain)
