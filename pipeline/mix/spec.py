"""The mixing spec: every knob of a soundscape as a Scaper-style distribution tuple.

Input: a preset name and a mapping of knobs that override it (``mix.preset`` and ``mix.spec``
in ``params.yaml``). Output: a frozen, validated :class:`MixSpec`. Validation happens before any
audio is touched; a bad knob fails with a :class:`SpecError` that names the key and the fix.

Presets (each cites where its numbers come from; pitch shift, time stretch and reverb are not
part of this engine):

- ``finelap``: FineLAP section 4.2 (the paper). M ~ U{1..5} events; events shorter than 3 s
  repeat R ~ U{1..3} times; random placement on a 10 s timeline; SNR ~ U(12, 20) dB, event RMS
  against background RMS. The paper states no fades and no output level; this preset uses
  10 ms fades (against clicks) and scales a mixture down only if it would clip.
- ``finelap-code``: the FineLAP authors' simulation script: the same sampling, no fades,
  22,050 Hz, every mixture peak-normalised to 0.95.
- ``flam``: FLAM section 4.2 and appendix C.4. N ~ U{1..10} events; 10% split into U{2,3}
  pieces of at least 0.5 s, 10% repeated U{2,3} times; at most 3 concurrent events; offset
  ~ U(6, 30) dB against the background; 10 ms fades; 48 kHz.
- ``urban-sed``: URBAN-SED's Scaper script: 1-9 events, onset ~ truncnorm(5, 2, 0, 10),
  event duration ~ U(0.5, 4) s from the start of the clip, SNR ~ U(6, 30) dB in Scaper's
  LUFS semantics with ref_db -50; 44.1 kHz.
- ``desed``: DESED synthetic soundscapes (DCASE task 4): ref_db -55 LUFS, SNR ~ U(6, 30) dB,
  whole events placed to fit, sources may repeat, polyphony at most 2 (DESED removes
  soundscapes above it; here placement respects it); 16 kHz.
"""

from __future__ import annotations

import copy
import difflib
import math
from dataclasses import dataclass
from typing import Literal

from pipeline.mix.distributions import Distribution, SpecError, parse

LevelMode = Literal["rms", "lufs", "local"]
LEVEL_MODES = ("rms", "lufs", "local")
PEAK_POLICIES = ("if-clipping", "always", "never")

_FINELAP: dict = {
    "duration_s": ["const", 10.0],
    "sample_rate_hz": ["const", 16000],
    "events_per_mixture": ["choose", [1, 2, 3, 4, 5]],
    "distinct_clips": True,
    "event_duration_s": None,
    "source_time_s": ["const", 0.0],
    "repetition": {"probability": 1.0, "max_clip_s": 3.0, "count": ["choose", [1, 2, 3]], "overlap": False},
    "splitting": {"probability": 0.0, "pieces": ["choose", [2, 3]], "min_piece_s": 0.5},
    "onset_s": ["uniform", 0.0, "fit"],
    "max_polyphony": None,
    "placement_tries": 100,
    "level_mode": "rms",
    "snr_db": ["uniform", 12.0, 20.0],
    "ref_db": None,
    "background_offset_s": ["uniform", 0.0, "fit"],
    "fade_in_s": ["const", 0.01],
    "fade_out_s": ["const", 0.01],
    "normalize": {"peak": "if-clipping", "peak_dbfs": -0.45, "loudness_lufs": None},
}


def _preset(base: dict, **changes) -> dict:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        out[key] = {**out[key], **value} if isinstance(value, dict) else value
    return out


PRESETS: dict[str, dict] = {
    "finelap": _FINELAP,
    "finelap-code": _preset(
        _FINELAP,
        sample_rate_hz=["const", 22050],
        fade_in_s=["const", 0.0],
        fade_out_s=["const", 0.0],
        normalize={"peak": "always", "peak_dbfs": -0.45},  # 0.95 of full scale
    ),
    "flam": _preset(
        _FINELAP,
        sample_rate_hz=["const", 48000],
        events_per_mixture=["choose", list(range(1, 11))],
        repetition={"probability": 0.1, "max_clip_s": None, "count": ["choose", [2, 3]]},
        splitting={"probability": 0.1, "pieces": ["choose", [2, 3]], "min_piece_s": 0.5},
        max_polyphony=3,
        snr_db=["uniform", 6.0, 30.0],
    ),
    "urban-sed": _preset(
        _FINELAP,
        sample_rate_hz=["const", 44100],
        events_per_mixture=["choose", list(range(1, 10))],
        distinct_clips=False,
        event_duration_s=["uniform", 0.5, 4.0],
        repetition={"probability": 0.0},
        onset_s=["truncnorm", 5.0, 2.0, 0.0, 10.0],
        level_mode="lufs",
        snr_db=["uniform", 6.0, 30.0],
        ref_db=-50.0,
    ),
    "desed": _preset(
        _FINELAP,
        sample_rate_hz=["const", 16000],
        distinct_clips=False,
        repetition={"probability": 0.0},
        max_polyphony=2,
        level_mode="lufs",
        snr_db=["uniform", 6.0, 30.0],
        ref_db=-55.0,
    ),
}


@dataclass(frozen=True)
class RepetitionSpec:
    probability: float  # of an event being repeated (after the splitting draw)
    max_clip_s: float | None  # only clips shorter than this repeat; None: any clip
    count: Distribution  # occurrences of a repeated event (1 = no repeat)
    overlap: bool  # may occurrences of one event overlap each other


@dataclass(frozen=True)
class SplittingSpec:
    probability: float  # of an event being split into pieces placed independently
    pieces: Distribution
    min_piece_s: float


@dataclass(frozen=True)
class NormalizeSpec:
    peak: str  # if-clipping | always | never
    peak_dbfs: float
    loudness_lufs: float | None  # mixture loudness target applied before the peak rule


@dataclass(frozen=True)
class MixSpec:
    """A validated spec. Distributions are sampled per mixture; see :mod:`pipeline.mix.instantiate`."""

    preset: str
    duration_s: Distribution
    sample_rate_hz: int
    events_per_mixture: Distribution
    distinct_clips: bool
    event_duration_s: Distribution | None
    source_time_s: Distribution
    repetition: RepetitionSpec
    splitting: SplittingSpec
    onset_s: Distribution
    max_polyphony: int | None
    placement_tries: int
    level_mode: str
    snr_db: Distribution
    ref_db: float | None
    background_offset_s: Distribution
    fade_in_s: Distribution
    fade_out_s: Distribution
    normalize: NormalizeSpec

    def max_duration_s(self) -> float:
        return self.duration_s.bounds()[1]

    def to_dict(self) -> dict:
        """The spec in its YAML form (what ``spec.json`` and the JAMS sandbox record)."""
        def plain(v):
            if isinstance(v, Distribution):
                return v.to_list()
            if isinstance(v, (RepetitionSpec, SplittingSpec, NormalizeSpec)):
                return {k: plain(x) for k, x in v.__dict__.items()}
            return v
        return {k: plain(v) for k, v in self.__dict__.items()}


def _merge(base: dict, top: dict, prefix: str = "") -> dict:
    out = copy.deepcopy(base)
    for key, value in top.items():
        dotted = f"{prefix}{key}"
        if key not in base:
            close = difflib.get_close_matches(key, list(base), n=1)
            hint = f"did you mean '{prefix}{close[0]}'?" if close else f"known keys: {', '.join(prefix + k for k in base)}"
            raise SpecError(f"mix spec: unknown key '{dotted}'; {hint}")
        if isinstance(base[key], dict):
            if not isinstance(value, dict):
                raise SpecError(f"mix spec: '{dotted}' must be a mapping with keys {', '.join(base[key])}, got {value!r}")
            out[key] = _merge(base[key], value, f"{dotted}.")
        else:
            out[key] = value
    return out


def _need(ok: bool, key: str, what: str) -> None:
    if not ok:
        raise SpecError(f"mix spec: '{key}' {what}")


def _positive_ints(d: Distribution, key: str, minimum: int) -> None:
    _need(d.kind in ("const", "choose", "choose_weighted"), key,
          f"draws a count, so it must be [const, n], [choose, [...]] or [choose_weighted, [...], [...]], got {d.to_list()!r}")
    _need(all(float(v).is_integer() and v >= minimum for v in d.values), key, f"values must be whole numbers >= {minimum}, got {d.to_list()!r}")


def _non_negative(d: Distribution, key: str) -> None:
    lo, _ = d.bounds(fit=0.0)
    _need(lo >= 0, key, f"must not produce negative values (use [uniform, lo, hi] with lo >= 0 or truncnorm bounds), got {d.to_list()!r}")


def _probability(value: object, key: str) -> float:
    _need(isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0, key, f"must be a probability in [0, 1], got {value!r}")
    return float(value)


def _optional_number(value: object, key: str) -> float | None:
    if value is None:
        return None
    _need(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value), key, f"must be a number or null, got {value!r}")
    return float(value)


def resolve_spec(preset: str, overrides: dict | None = None) -> MixSpec:
    """Preset + overrides -> a validated :class:`MixSpec` (raises :class:`SpecError`)."""
    if preset not in PRESETS:
        close = difflib.get_close_matches(preset, list(PRESETS), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise SpecError(f"mix: unknown preset {preset!r}; {hint}use one of {', '.join(PRESETS)}")
    raw = _merge(PRESETS[preset], overrides or {})

    duration = parse(raw["duration_s"], "duration_s")
    _need(duration.bounds()[0] > 0 and math.isfinite(duration.bounds()[1]), "duration_s",
          f"must produce positive, bounded durations ([const, 10.0] or [uniform, lo, hi]), got {duration.to_list()!r}")

    rate = parse(raw["sample_rate_hz"], "sample_rate_hz")
    _need(rate.kind == "const" and float(rate.args[0]).is_integer() and rate.args[0] >= 8000, "sample_rate_hz",
          f"is one rate for the whole dataset: [const, 16000] (8000 or more), got {rate.to_list()!r}")

    events = parse(raw["events_per_mixture"], "events_per_mixture")
    _positive_ints(events, "events_per_mixture", 0)
    _need(isinstance(raw["distinct_clips"], bool), "distinct_clips", "must be true or false")

    event_duration = None
    if raw["event_duration_s"] is not None:
        event_duration = parse(raw["event_duration_s"], "event_duration_s")
        _need(event_duration.bounds()[0] > 0, "event_duration_s", f"must produce positive durations, or be null for whole clips; got {event_duration.to_list()!r}")
    source_time = parse(raw["source_time_s"], "source_time_s", allow_fit=True)
    _non_negative(source_time, "source_time_s")

    rep = raw["repetition"]
    count = parse(rep["count"], "repetition.count")
    _positive_ints(count, "repetition.count", 1)
    _need(isinstance(rep["overlap"], bool), "repetition.overlap", "must be true or false")
    max_clip = _optional_number(rep["max_clip_s"], "repetition.max_clip_s")
    repetition = RepetitionSpec(_probability(rep["probability"], "repetition.probability"), max_clip, count, rep["overlap"])

    spl = raw["splitting"]
    pieces = parse(spl["pieces"], "splitting.pieces")
    _positive_ints(pieces, "splitting.pieces", 2)
    min_piece = _optional_number(spl["min_piece_s"], "splitting.min_piece_s")
    _need(min_piece is not None and min_piece > 0, "splitting.min_piece_s", "must be a positive number of seconds")
    splitting = SplittingSpec(_probability(spl["probability"], "splitting.probability"), pieces, min_piece)
    _need(repetition.probability + splitting.probability <= 1.0 + 1e-9, "repetition.probability",
          f"plus splitting.probability must not exceed 1 (one draw picks split, repeat or neither); got {repetition.probability} + {splitting.probability}")

    onset = parse(raw["onset_s"], "onset_s", allow_fit=True)
    bg_offset = parse(raw["background_offset_s"], "background_offset_s", allow_fit=True)
    poly = raw["max_polyphony"]
    _need(poly is None or (isinstance(poly, int) and not isinstance(poly, bool) and poly >= 1), "max_polyphony",
          f"must be a whole number >= 1, or null for no cap; got {poly!r}")
    tries = raw["placement_tries"]
    _need(isinstance(tries, int) and not isinstance(tries, bool) and tries >= 1, "placement_tries", f"must be a whole number >= 1, got {tries!r}")

    _need(raw["level_mode"] in LEVEL_MODES, "level_mode", f"is {raw['level_mode']!r}; use one of {', '.join(LEVEL_MODES)}")
    snr = parse(raw["snr_db"], "snr_db")
    ref_db = _optional_number(raw["ref_db"], "ref_db")
    fade_in = parse(raw["fade_in_s"], "fade_in_s")
    fade_out = parse(raw["fade_out_s"], "fade_out_s")
    _non_negative(fade_in, "fade_in_s")
    _non_negative(fade_out, "fade_out_s")

    norm = raw["normalize"]
    _need(norm["peak"] in PEAK_POLICIES, "normalize.peak", f"is {norm['peak']!r}; use one of {', '.join(PEAK_POLICIES)}")
    peak_dbfs = _optional_number(norm["peak_dbfs"], "normalize.peak_dbfs")
    _need(peak_dbfs is not None and peak_dbfs <= 0, "normalize.peak_dbfs", f"must be a level at or below 0 dBFS, got {norm['peak_dbfs']!r}")
    normalize = NormalizeSpec(norm["peak"], peak_dbfs, _optional_number(norm["loudness_lufs"], "normalize.loudness_lufs"))

    return MixSpec(
        preset=preset,
        duration_s=duration,
        sample_rate_hz=int(rate.args[0]),
        events_per_mixture=events,
        distinct_clips=raw["distinct_clips"],
        event_duration_s=event_duration,
        source_time_s=source_time,
        repetition=repetition,
        splitting=splitting,
        onset_s=onset,
        max_polyphony=poly,
        placement_tries=tries,
        level_mode=raw["level_mode"],
        snr_db=snr,
        ref_db=ref_db,
        background_offset_s=bg_offset,
        fade_in_s=fade_in,
        fade_out_s=fade_out,
        normalize=normalize,
    )
