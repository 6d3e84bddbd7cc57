"""Rendering: a recipe and its sources -> the mixture's samples. A pure function.

Input: a :class:`~pipeline.schema.MixtureRecipe`, its
:class:`~pipeline.schema.EventOccurrence` rows and a source reader (a
:class:`~pipeline.mix.bank.SourceBank` or :class:`~pipeline.mix.bank.FileSources`). Output:
float32 samples. The mixing stage renders through exactly these functions, so re-rendering
a stored recipe gives the stored audio bit for bit.

Order of operations (fixed, because float addition is not associative): background slice x
background gain (and its room, if it has one), then each occurrence in ``occurrence_index``
order (int16 -> float32 times gain, quarter-sine fades; an augmented one: int16 -> float32,
pitch shift and stretch, gain, fades, its room)
added in place, then the whole sum times the mixture gain. The augmentations are those of
:mod:`pipeline.mix.augment`; an occurrence without them is its source span as it is.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Protocol
from weakref import WeakKeyDictionary

import numpy as np

from pipeline.audio import FULL_SCALE_INT16, int16_to_float, int16_values, quantize_int16
from pipeline.mix.augment import brownian_noise, is_brownian, load_room, reverberate, stretch
from pipeline.schema import EventOccurrence, MixtureRecipe

KEPT_HEARD = 32  # augmented signals kept per source reader (repeats of one event, re-rendering for relabeling)
_heard: WeakKeyDictionary = WeakKeyDictionary()  # source reader -> OrderedDict(recipe values -> read-only float32 samples)


class Sources(Protocol):
    sample_rate_hz: int

    def event(self, clip_id: str) -> np.ndarray: ...

    def background(self, segment_id: str) -> np.ndarray: ...


def samples(t_s: float, sample_rate_hz: int) -> int:
    """Seconds -> a sample index (recipes store seconds that are whole samples)."""
    return int(round(t_s * sample_rate_hz))


def db_to_gain(db: float) -> float:
    return float(10.0 ** (db / 20.0))


@lru_cache(maxsize=256)
def fade_ramp(n: int) -> np.ndarray:
    """A quarter-sine fade-in of ``n`` samples, 0 to 1 (Scaper's shape); reversed for fade-outs."""
    return np.sin(np.linspace(0.0, np.pi / 2, n)).astype(np.float32)


def background_signal(sources: Sources, segment_id: str, offset_s: float, gain_db: float, num_samples: int) -> np.ndarray:
    """The background's part of a mixture: ``num_samples`` from the offset, zero-padded."""
    sr = sources.sample_rate_hz
    q = brownian_noise(segment_id, num_samples) if is_brownian(segment_id) else sources.background(segment_id)
    start = samples(offset_s, sr)
    part = q[start : start + num_samples]
    out = int16_to_float(part, db_to_gain(gain_db))
    if out.shape[0] < num_samples:
        out = np.concatenate([out, np.zeros(num_samples - out.shape[0], np.float32)])
    return out


def kept_heard(sources: Sources, key: tuple, make: Callable[[], np.ndarray]) -> np.ndarray:
    """``make()``, kept for the source reader under ``key`` (the recipe values that fix the samples):
    an augmented signal is made once however often it is placed or judged. Read-only."""
    kept = _heard.setdefault(sources, OrderedDict())
    if key in kept:
        kept.move_to_end(key)
    else:
        x = make()
        x.setflags(write=False)
        kept[key] = x
        if len(kept) > KEPT_HEARD:
            kept.popitem(last=False)
    return kept[key]


def heard_background(recipe: MixtureRecipe, sources: Sources) -> np.ndarray:
    """The background as it sounds in the mixture: its window at its gain, in its room if it has one
    (then read-only)."""

    def dry() -> np.ndarray:
        return background_signal(
            sources, recipe.background_id, recipe.background_offset_s, recipe.background_gain_db, recipe.num_samples
        )

    if not recipe.background_rir_id:
        return dry()
    key = (
        "background",
        recipe.background_id,
        recipe.background_offset_s,
        recipe.background_gain_db,
        recipe.num_samples,
        recipe.background_rir_id,
        recipe.background_wet_db,
        recipe.background_dry_db,
    )
    room = load_room(recipe.background_rir_id, sources.sample_rate_hz)
    return kept_heard(
        sources, key, lambda: reverberate(dry(), room, recipe.background_wet_db, recipe.background_dry_db)[: recipe.num_samples]
    )


def is_augmented(occ: EventOccurrence) -> bool:
    """Whether an occurrence is pitch-shifted, stretched or reverberated (not its source span as it is)."""
    return bool(occ.stretch_method or occ.rir_id)


def occurrence_signal(sources: Sources, occ: EventOccurrence) -> np.ndarray:
    """One occurrence as it sounds in the mixture: the source span, gain, pitch and stretch,
    fades (each at most half of it), room; ``offset_s - onset_s`` long (read-only if augmented)."""
    sr = sources.sample_rate_hz
    start = samples(occ.source_in_s, sr)
    length = samples(occ.offset_s, sr) - samples(occ.onset_s, sr)
    if not is_augmented(occ):
        x = int16_to_float(sources.event(occ.clip_id)[start : start + length], db_to_gain(occ.gain_db))
        return apply_fades(x, samples(occ.fade_in_s, sr), samples(occ.fade_out_s, sr))
    key = (
        "event",
        occ.clip_id,
        occ.source_in_s,
        occ.source_out_s,
        occ.stretch_method,
        occ.time_stretch_factor,
        occ.pitch_shift_semitones,
        occ.gain_db,
        occ.fade_in_s,
        occ.fade_out_s,
        occ.rir_id,
        occ.reverb_wet_db,
        occ.reverb_dry_db,
    )
    return kept_heard(sources, key, lambda: _augmented(sources, occ))[:length]


def _augmented(sources: Sources, occ: EventOccurrence) -> np.ndarray:
    """An augmented occurrence's whole signal: its span, pitch and stretch, gain, fades, room (with the whole tail)."""
    sr = sources.sample_rate_hz
    x = int16_to_float(sources.event(occ.clip_id)[samples(occ.source_in_s, sr) : samples(occ.source_out_s, sr)])
    if occ.stretch_method:
        x = stretch(x, sr, occ.time_stretch_factor, occ.pitch_shift_semitones, occ.stretch_method)
    x *= np.float32(db_to_gain(occ.gain_db))
    x = apply_fades(x, samples(occ.fade_in_s, sr), samples(occ.fade_out_s, sr))
    if occ.rir_id:
        x = reverberate(x, load_room(occ.rir_id, sr), occ.reverb_wet_db, occ.reverb_dry_db)
    return x


def apply_fades(x: np.ndarray, fade_in: int, fade_out: int) -> np.ndarray:
    """Fade float32 ``x`` in place over ``fade_in`` / ``fade_out`` samples (each at most half of it)."""
    fade_in, fade_out = min(fade_in, x.shape[0] // 2), min(fade_out, x.shape[0] // 2)
    if fade_in:
        x[:fade_in] *= fade_ramp(fade_in)
    if fade_out:
        x[x.shape[0] - fade_out :] *= fade_ramp(fade_out)[::-1]
    return x


def sum_buffer(background: np.ndarray, keep_background: bool) -> np.ndarray:
    """Where the occurrences are added: the background part itself, or a copy of it where it is
    kept (``keep_background``) or read-only (a kept signal in a room)."""
    return background.copy() if keep_background or not background.flags.writeable else background


def add_occurrence(mix: np.ndarray, occ: EventOccurrence, sources: Sources) -> np.ndarray:
    """Add one occurrence as heard into the sum ``mix`` (in place) at its onset; returns its part
    (:func:`occurrence_signal`). Occurrences are added in ``occurrence_index`` order."""
    x = occurrence_signal(sources, occ)
    start = samples(occ.onset_s, sources.sample_rate_hz)
    mix[start : start + x.shape[0]] += x
    return x


def apply_gain(mix: np.ndarray, gain_db: float, overwrite: bool = False) -> np.ndarray:
    """The mixture gain (normalisation); 0 dB returns the samples unchanged (``overwrite``: in ``mix``'s buffer)."""
    if gain_db == 0.0:
        return mix
    return np.multiply(mix, np.float32(db_to_gain(gain_db)), out=mix if overwrite else None)


def stored_samples(mix: np.ndarray, gain_db: float, ends: np.ndarray | None = None) -> np.ndarray:
    """The sum before the mixture gain -> the stored int16 samples, in ``mix``'s own buffer (which it
    overwrites); ``ends``: the sum's max and min when known (no saturating pass where nothing saturates).
    The same int16 as :func:`apply_gain` then :func:`~pipeline.audio.quantize_int16`, in one pass fewer."""
    return quantize_int16(mix, overwrite=True, gain=db_to_gain(gain_db), ends=ends)


def decoded_samples(mix: np.ndarray, gain_db: float, ends: np.ndarray | None = None) -> np.ndarray:
    """The sum before the mixture gain -> the float32 samples its stored int16 decode to
    (``int16_to_float(stored_samples(...))``, bit for bit), made in ``mix``'s own buffer without an int16 copy."""
    y = int16_values(mix, overwrite=True, gain=db_to_gain(gain_db), ends=ends)
    y += np.float32(0.0)  # rounding leaves -0.0 where the int16 is 0, which decodes to +0.0
    y *= np.float32(1.0 / FULL_SCALE_INT16)
    return y


def render(recipe: MixtureRecipe, occurrences: Sequence[EventOccurrence], sources: Sources) -> np.ndarray:
    """A recipe -> the stored int16 samples of its mixture."""
    if sources.sample_rate_hz != recipe.sample_rate_hz:
        raise ValueError(f"sources are at {sources.sample_rate_hz} Hz but the recipe at {recipe.sample_rate_hz} Hz")
    mix = sum_buffer(heard_background(recipe, sources), keep_background=False)
    for occ in sorted(occurrences, key=lambda o: o.occurrence_index):
        add_occurrence(mix, occ, sources)
    return stored_samples(mix, recipe.mixture_gain_db)
