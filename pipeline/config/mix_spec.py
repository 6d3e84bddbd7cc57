"""The mixing spec: every knob of a soundscape as a Scaper-style distribution tuple.

Input: a preset name, a mapping of knobs that override it (``mix.preset`` and ``mix.spec`` in
``params.yaml``) and the top-level ``sample_rate_hz`` (the rate of every file the pipeline
writes, mixtures included). Output: a frozen, validated :class:`MixSpec`. Validation happens
before any audio is touched; a bad knob fails with a :class:`SpecError` that names the key
and the fix. :func:`resolve_spec` resolves each (preset, overrides, rate) once per process:
the params check and the mix stage share the result, and the stage hands it to its workers.

Presets (each cites where its numbers come from). A preset has no rate of its own: it mixes at ``sample_rate_hz``; where
its source used another rate, set ``sample_rate_hz`` to that rate to match it.

- ``finelap``: FineLAP section 4.2 (the paper), 16 kHz. M ~ U{1..5} events; events shorter
  than 3 s repeat R ~ U{1..3} times; random placement on a 10 s timeline; SNR ~ U(12, 20) dB,
  event RMS against background RMS. The paper states no fades and no output level; this
  preset uses 10 ms fades (against clicks) and scales a mixture down only if it would clip.
- ``finelap-code``: the FineLAP authors' simulation script: the same sampling, no fades,
  every mixture peak-normalised to 0.95. The script writes 22,050 Hz.
- ``flam``: FLAM section 4.2 and appendix C.4. N ~ U{1..10} events; 10% split into U{2,3}
  pieces of at least 0.5 s, 10% repeated U{2,3} times; at most 3 concurrent events; offset
  ~ U(6, 30) dB against the background; 10 ms fades. FLAM mixes at 48 kHz.
- ``urban-sed``: URBAN-SED's Scaper script: 1-9 events, onset ~ truncnorm(5, 2, 0, 10),
  event duration ~ U(0.5, 4) s from the start of the clip, SNR ~ U(6, 30) dB in Scaper's
  LUFS semantics with ref_db -50. URBAN-SED is 44.1 kHz.
- ``desed``: DESED synthetic soundscapes (DCASE task 4), 16 kHz: ref_db -55 LUFS, SNR ~
  U(6, 30) dB, whole events placed to fit, sources may repeat, polyphony at most 2 (DESED
  removes soundscapes above it; here placement respects it).

The urban-sed preset mixes on URBAN-SED's Brownian-noise background; the flam preset draws 80%
of mixtures' events from sound-effect libraries (``library``) and 20% from general datasets
(``fsd50k``), FLAM section 4.2 (a pool no clip belongs to is left out and the others share its
part). Every preset can add, per event, pitch shift and time stretch (Scaper's
``pitch_shift`` and ``time_stretch``) and reverb with a simulated or recorded room, and reverb
on the background: the knobs under ``pitch_shift_semitones``, ``time_stretch_factor``,
``stretch_method`` and ``reverb`` (see :mod:`pipeline.mix.augment`).
"""

from __future__ import annotations

import copy
import difflib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from pipeline.config.distributions import Distribution, SpecError, parse
from pipeline.config.loading import need

STRETCH_METHODS = ("rubberband", "varispeed")

LEVEL_MODES = ("rms", "lufs", "local")
PEAK_POLICIES = ("if-clipping", "always", "never")
MIN_SAMPLE_RATE_HZ = 8000
# Upper bounds of knobs whose cost grows with their value, far above any published recipe's: a typo
# (placement_tries: 1000000000) is refused when params load instead of running for hours.
MAX_DURATION_S = 3600.0  # one mixture's length
MAX_EVENTS = 1000  # events in one mixture (URBAN-SED draws up to 9, FLAM 10)
MAX_OCCURRENCES = 100  # repetition.count and splitting.pieces
MAX_PLACEMENT_TRIES = 10_000  # draws of an onset before the uniform draw over the free onsets takes over
CLIP_SAMPLING = ("uniform", "label-balanced")  # how a mixture's clips are drawn from its split

_FINELAP: dict = {
    "duration_s": ["const", 10.0],
    "events_per_mixture": ["choose", [1, 2, 3, 4, 5]],
    "distinct_clips": True,
    "clip_sampling": "uniform",
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
    "pitch_shift_semitones": None,
    "time_stretch_factor": None,
    "stretch_method": "rubberband",
    "reverb": {
        "probability": 0.0,
        "background_probability": 0.0,
        "rirs": None,
        "rooms": 16,
        "room_size_m": ["uniform", 3.0, 10.0],
        "rt60_s": ["uniform", 0.2, 0.8],
        "wet_db": ["const", 0.0],
        "dry_db": ["const", 0.0],
    },
    "brownian_background": 0.0,
    "pools": None,
}


def _preset(base: dict, **changes) -> dict:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        out[key] = {**out[key], **value} if isinstance(value, dict) and isinstance(out[key], dict) else value
    return out


PRESETS: dict[str, dict] = {
    "finelap": _FINELAP,
    "finelap-code": _preset(
        _FINELAP,
        fade_in_s=["const", 0.0],
        fade_out_s=["const", 0.0],
        normalize={"peak": "always", "peak_dbfs": -0.45},  # 0.95 of full scale
    ),
    "flam": _preset(
        _FINELAP,
        events_per_mixture=["choose", list(range(1, 11))],
        repetition={"probability": 0.1, "max_clip_s": None, "count": ["choose", [2, 3]]},
        splitting={"probability": 0.1, "pieces": ["choose", [2, 3]], "min_piece_s": 0.5},
        max_polyphony=3,
        snr_db=["uniform", 6.0, 30.0],
        pools={"sound-effects": {"share": 0.8, "datasets": ["library"]}, "general": {"share": 0.2, "datasets": ["fsd50k"]}},
    ),
    "urban-sed": _preset(
        _FINELAP,
        events_per_mixture=["choose", list(range(1, 10))],
        distinct_clips=False,
        event_duration_s=["uniform", 0.5, 4.0],
        repetition={"probability": 0.0},
        onset_s=["truncnorm", 5.0, 2.0, 0.0, 10.0],
        level_mode="lufs",
        snr_db=["uniform", 6.0, 30.0],
        ref_db=-50.0,
        brownian_background=1.0,
    ),
    "desed": _preset(
        _FINELAP,
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
class ReverbSpec:
    probability: float  # of an event being reverberated (all its occurrences, one room)
    background_probability: float  # of the background being reverberated
    rirs: str | None  # a folder of impulse-response files; None: simulated shoebox rooms
    rooms: int  # simulated rooms per run (drawn once from the seed, then picked per event)
    room_size_m: Distribution  # length and width of a simulated room (height: 2.5-4 m)
    rt60_s: Distribution  # reverberation time of a simulated room
    wet_db: Distribution  # level of the convolved signal
    dry_db: Distribution  # level of the direct signal beside it


@dataclass(frozen=True)
class PoolSpec:
    name: str
    share: float  # of mixtures whose events come from this pool
    datasets: tuple[str, ...]  # EventClip.source_dataset values in the pool


@dataclass(frozen=True)
class MixSpec:
    """A validated spec. Distributions are sampled per mixture; see :mod:`pipeline.mix.instantiate`.

    ``sample_rate_hz`` is the top-level ``sample_rate_hz`` of ``params.yaml``, not a knob.
    """

    preset: str
    duration_s: Distribution
    sample_rate_hz: int
    events_per_mixture: Distribution
    distinct_clips: bool
    clip_sampling: str  # uniform: every clip of the split alike; label-balanced: every label alike, then a clip of it
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
    pitch_shift_semitones: Distribution | None
    time_stretch_factor: Distribution | None
    stretch_method: str
    reverb: ReverbSpec
    brownian_background: float
    pools: tuple[PoolSpec, ...] | None

    @property
    def augments_events(self) -> bool:
        """Whether any event may be pitch-shifted, stretched or reverberated."""
        return self.pitch_shift_semitones is not None or self.time_stretch_factor is not None or self.reverb.probability > 0

    def to_dict(self) -> dict:
        """The spec in its YAML form, with its preset and rate (what ``spec.json`` records)."""

        def plain(v):
            if isinstance(v, Distribution):
                return v.to_list()
            if isinstance(v, (RepetitionSpec, SplittingSpec, NormalizeSpec, ReverbSpec)):
                return {k: plain(x) for k, x in v.__dict__.items()}
            if isinstance(v, tuple) and v and isinstance(v[0], PoolSpec):
                return {p.name: {"share": p.share, "datasets": list(p.datasets)} for p in v}
            return v

        return {k: plain(v) for k, v in self.__dict__.items()}


def resolve_spec(preset: str, overrides: Mapping | None = None, *, sample_rate_hz: int) -> MixSpec:
    """Preset + overrides at ``sample_rate_hz`` -> a validated :class:`MixSpec` (raises :class:`SpecError`).

    Resolved once per process for each (preset, overrides, rate): the key is the overrides'
    canonical JSON, so equal mappings share one spec whatever their key order.
    """
    return _resolve_once(preset, _canonical_json(overrides or {}), sample_rate_hz)


def _canonical_json(overrides: Mapping) -> str:
    try:
        return json.dumps(overrides, sort_keys=True)
    except (TypeError, ValueError):
        raise SpecError(f"mix spec: {overrides!r} must map knob names to numbers, words, lists or mappings") from None


@lru_cache(maxsize=32)
def _resolve_once(preset: str, overrides_json: str, sample_rate_hz: int) -> MixSpec:
    return build_spec(preset, json.loads(overrides_json), sample_rate_hz)


def build_spec(preset: str, overrides: Mapping, sample_rate_hz: int) -> MixSpec:
    """The uncached resolution behind :func:`resolve_spec`: preset, merge, validate each group of knobs."""
    _need(
        isinstance(sample_rate_hz, int) and not isinstance(sample_rate_hz, bool) and sample_rate_hz >= MIN_SAMPLE_RATE_HZ,
        "sample_rate_hz",
        f"(the top-level rate) must be a whole number of Hz >= {MIN_SAMPLE_RATE_HZ}, got {sample_rate_hz!r}",
    )
    raw = _merge(_preset_knobs(preset), overrides)
    return MixSpec(
        preset=preset,
        sample_rate_hz=sample_rate_hz,
        **_timeline(raw),
        **_events(raw),
        **_placement(raw),
        **_levels(raw),
        **_augmentations(raw),
    )


def _preset_knobs(preset: str) -> dict:
    if preset not in PRESETS:
        close = difflib.get_close_matches(preset, list(PRESETS), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise SpecError(f"mix: unknown preset {preset!r}; {hint}use one of {', '.join(PRESETS)}")
    return PRESETS[preset]


def _merge(base: dict, top: Mapping, prefix: str = "") -> dict:
    """``top`` over ``base``, key by key into nested mappings; an unknown key fails with a suggestion."""
    out = copy.deepcopy(base)
    for key, value in top.items():
        dotted = f"{prefix}{key}"
        if dotted == "sample_rate_hz":
            raise SpecError(
                "mix spec: 'sample_rate_hz' is not a knob: mixtures are written at the top-level sample_rate_hz "
                "of params.yaml, the rate every data stage writes; set that one instead (or --set sample_rate_hz=...)"
            )
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


def _timeline(raw: dict) -> dict:
    duration = parse(raw["duration_s"], "duration_s")
    _need(
        duration.bounds()[0] > 0 and duration.bounds()[1] <= MAX_DURATION_S,
        "duration_s",
        f"must produce positive durations of at most {MAX_DURATION_S:g} s ([const, 10.0] or [uniform, lo, hi]), "
        f"got {duration.to_list()!r}",
    )
    return {"duration_s": duration}


def _events(raw: dict) -> dict:
    """How many events, which clips, which span of each, and how an event repeats or splits."""
    events = parse(raw["events_per_mixture"], "events_per_mixture")
    _positive_ints(events, "events_per_mixture", 0, MAX_EVENTS)
    _need(isinstance(raw["distinct_clips"], bool), "distinct_clips", "must be true or false")
    _need(
        raw["clip_sampling"] in CLIP_SAMPLING,
        "clip_sampling",
        f"must be one of {', '.join(CLIP_SAMPLING)}, got {raw['clip_sampling']!r}",
    )
    event_duration = None
    if raw["event_duration_s"] is not None:
        event_duration = parse(raw["event_duration_s"], "event_duration_s")
        _need(
            event_duration.bounds()[0] > 0,
            "event_duration_s",
            f"must produce positive durations, or be null for whole clips; got {event_duration.to_list()!r}",
        )
    source_time = parse(raw["source_time_s"], "source_time_s", allow_fit=True)
    _non_negative(source_time, "source_time_s")
    repetition, splitting = _repetition(raw["repetition"]), _splitting(raw["splitting"])
    _need(
        repetition.probability + splitting.probability <= 1.0 + 1e-9,
        "repetition.probability",
        "plus splitting.probability must not exceed 1 (one draw picks split, repeat or neither); "
        f"got {repetition.probability} + {splitting.probability}",
    )
    return {
        "events_per_mixture": events,
        "distinct_clips": raw["distinct_clips"],
        "clip_sampling": raw["clip_sampling"],
        "event_duration_s": event_duration,
        "source_time_s": source_time,
        "repetition": repetition,
        "splitting": splitting,
    }


def _repetition(rep: dict) -> RepetitionSpec:
    count = parse(rep["count"], "repetition.count")
    _positive_ints(count, "repetition.count", 1, MAX_OCCURRENCES)
    _need(isinstance(rep["overlap"], bool), "repetition.overlap", "must be true or false")
    max_clip = _optional_number(rep["max_clip_s"], "repetition.max_clip_s")
    return RepetitionSpec(_probability(rep["probability"], "repetition.probability"), max_clip, count, rep["overlap"])


def _splitting(spl: dict) -> SplittingSpec:
    pieces = parse(spl["pieces"], "splitting.pieces")
    _positive_ints(pieces, "splitting.pieces", 2, MAX_OCCURRENCES)
    min_piece = _optional_number(spl["min_piece_s"], "splitting.min_piece_s")
    _need(min_piece is not None and min_piece > 0, "splitting.min_piece_s", "must be a positive number of seconds")
    return SplittingSpec(_probability(spl["probability"], "splitting.probability"), pieces, min_piece)


def _placement(raw: dict) -> dict:
    """Where events and the background window go, and the rules placement keeps."""
    poly = raw["max_polyphony"]
    _need(poly is None or _whole(poly, 1), "max_polyphony", f"must be a whole number >= 1, or null for no cap; got {poly!r}")
    tries = raw["placement_tries"]
    _need(
        _whole(tries, 1) and tries <= MAX_PLACEMENT_TRIES,
        "placement_tries",
        f"must be a whole number >= 1 and <= {MAX_PLACEMENT_TRIES}, got {tries!r}",
    )
    return {
        "onset_s": parse(raw["onset_s"], "onset_s", allow_fit=True),
        "max_polyphony": poly,
        "placement_tries": tries,
        "background_offset_s": parse(raw["background_offset_s"], "background_offset_s", allow_fit=True),
    }


def _levels(raw: dict) -> dict:
    """Level mode, SNR, background reference, fades and the mixture's normalisation."""
    _need(raw["level_mode"] in LEVEL_MODES, "level_mode", f"is {raw['level_mode']!r}; use one of {', '.join(LEVEL_MODES)}")
    fades = {key: parse(raw[key], key) for key in ("fade_in_s", "fade_out_s")}
    for key, fade in fades.items():
        _non_negative(fade, key)
    return {
        "level_mode": raw["level_mode"],
        "snr_db": parse(raw["snr_db"], "snr_db"),
        "ref_db": _optional_number(raw["ref_db"], "ref_db"),
        **fades,
        "normalize": _normalize(raw["normalize"]),
    }


def _normalize(norm: dict) -> NormalizeSpec:
    _need(norm["peak"] in PEAK_POLICIES, "normalize.peak", f"is {norm['peak']!r}; use one of {', '.join(PEAK_POLICIES)}")
    peak_dbfs = _optional_number(norm["peak_dbfs"], "normalize.peak_dbfs")
    _need(
        peak_dbfs is not None and peak_dbfs <= 0,
        "normalize.peak_dbfs",
        f"must be a level at or below 0 dBFS, got {norm['peak_dbfs']!r}",
    )
    return NormalizeSpec(norm["peak"], peak_dbfs, _optional_number(norm["loudness_lufs"], "normalize.loudness_lufs"))


def _augmentations(raw: dict) -> dict:
    """Pitch shift, time stretch, reverb, Brownian-noise backgrounds and event pools."""
    pitch = None if raw["pitch_shift_semitones"] is None else parse(raw["pitch_shift_semitones"], "pitch_shift_semitones")
    stretch = None if raw["time_stretch_factor"] is None else parse(raw["time_stretch_factor"], "time_stretch_factor")
    if stretch is not None:
        _need(
            stretch.bounds()[0] > 0 and math.isfinite(stretch.bounds()[1]),
            "time_stretch_factor",
            f"must produce positive, bounded factors (output duration / input duration), got {stretch.to_list()!r}",
        )
    method = raw["stretch_method"]
    _need(method in STRETCH_METHODS, "stretch_method", f"is {method!r}; use one of {', '.join(STRETCH_METHODS)}")
    _need(
        method != "varispeed" or pitch is None or stretch is None,
        "stretch_method",
        "varispeed changes pitch and duration together: set pitch_shift_semitones or time_stretch_factor, not both",
    )
    return {
        "pitch_shift_semitones": pitch,
        "time_stretch_factor": stretch,
        "stretch_method": method,
        "reverb": _reverb(raw["reverb"]),
        "brownian_background": _probability(raw["brownian_background"], "brownian_background"),
        "pools": _pools(raw["pools"]),
    }


def _reverb(rev: dict) -> ReverbSpec:
    rirs = rev["rirs"]
    _need(
        rirs is None or (isinstance(rirs, str) and rirs.strip()),
        "reverb.rirs",
        f"must be a folder of impulse-response files, or null for simulated rooms; got {rirs!r}",
    )
    _need(_whole(rev["rooms"], 1), "reverb.rooms", f"must be a whole number >= 1, got {rev['rooms']!r}")
    size, rt60 = parse(rev["room_size_m"], "reverb.room_size_m"), parse(rev["rt60_s"], "reverb.rt60_s")
    _need(
        size.bounds()[0] >= 1.5 and math.isfinite(size.bounds()[1]),
        "reverb.room_size_m",
        f"must produce sizes of at least 1.5 m (the source and microphone keep 0.5 m from the walls), got {size.to_list()!r}",
    )
    _need(
        rt60.bounds()[0] >= 0.05 and rt60.bounds()[1] <= 3.0,
        "reverb.rt60_s",
        f"must produce reverberation times in [0.05, 3] s, got {rt60.to_list()!r}",
    )
    return ReverbSpec(
        _probability(rev["probability"], "reverb.probability"),
        _probability(rev["background_probability"], "reverb.background_probability"),
        rirs,
        rev["rooms"],
        size,
        rt60,
        parse(rev["wet_db"], "reverb.wet_db"),
        parse(rev["dry_db"], "reverb.dry_db"),
    )


def _pools(pools: object) -> tuple[PoolSpec, ...] | None:
    if pools is None:
        return None
    _need(isinstance(pools, dict) and pools, "pools", f"must map pool names to {{share, datasets}}, or be null; got {pools!r}")
    out = []
    for name, pool in pools.items():
        _need(
            isinstance(pool, dict) and set(pool) == {"share", "datasets"},
            f"pools.{name}",
            f"must be {{share: 0.8, datasets: [fsd50k, library, ...]}}, got {pool!r}",
        )
        datasets = pool["datasets"]
        _need(
            isinstance(datasets, list) and datasets and all(isinstance(d, str) for d in datasets),
            f"pools.{name}.datasets",
            f"must list source datasets (an event clip's source_dataset: fsd50k, library, ...), got {datasets!r}",
        )
        out.append(PoolSpec(str(name), _probability(pool["share"], f"pools.{name}.share"), tuple(datasets)))
    total = sum(p.share for p in out)
    _need(abs(total - 1.0) < 1e-6, "pools", f"shares must add up to 1, got {total}")
    return tuple(out)


def _need(ok: bool, key: str, what: str) -> None:
    need(ok, key, what, error=SpecError, where="mix spec")


def _whole(value: object, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _positive_ints(d: Distribution, key: str, minimum: int, maximum: int) -> None:
    _need(
        d.kind in ("const", "choose", "choose_weighted"),
        key,
        f"draws a count, so it must be [const, n], [choose, [...]] or [choose_weighted, [...], [...]], got {d.to_list()!r}",
    )
    _need(
        all(float(v).is_integer() and minimum <= v <= maximum for v in d.values),
        key,
        f"values must be whole numbers >= {minimum} and <= {maximum}, got {d.to_list()!r}",
    )


def _non_negative(d: Distribution, key: str) -> None:
    lo, _ = d.bounds(fit=0.0)
    _need(
        lo >= 0,
        key,
        f"must not produce negative values (use [uniform, lo, hi] with lo >= 0 or truncnorm bounds), got {d.to_list()!r}",
    )


def _probability(value: object, key: str) -> float:
    _need(
        isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0,
        key,
        f"must be a probability in [0, 1], got {value!r}",
    )
    return float(value)


def _optional_number(value: object, key: str) -> float | None:
    if value is None:
        return None
    _need(
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
        key,
        f"must be a number or null, got {value!r}",
    )
    return float(value)
