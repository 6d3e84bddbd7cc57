"""Audio encoders, built by name: ``eat-base`` (ViT-B/16, EAT) and ``small`` (a CNN for CPUs).

Contract of every encoder: ``forward(wave)`` takes ``(B, input_samples)`` float audio at
``sample_rate_hz`` and returns ``(cls (B, D), dense (B, L, F, D))``: one clip token and a grid of
L time columns by F frequency rows. ``forward(wave, fbank)`` takes the wave's log-mel
``features(wave)`` too, when another encoder with the same front end (``fbank.params``) has
computed it. ``frame_spans_s()`` gives each time column's extent
``(L, 2)`` in seconds of the input: the fbank frames pooled into it, from the first window's
start to the last window's end, which is what frame labels are built against.

``eat-base`` follows EAT (Chen et al., 2024) as its public code builds it: 128-bin Kaldi fbank
(EAT's constants), 1024 frames, 16x16 patches -> 64 x 8 tokens with a fixed 2-D sin-cos
position table, a CLS token without position, a LayerNorm, then 12 post-norm blocks (768-d,
12 heads, MLP 3072, LayerNorm eps 1e-6). :func:`read_eat_checkpoint` reads an EAT checkpoint from
a local path (the fairseq ``.pt`` or the Hugging Face port's weights) and :func:`fit_eat_weights`
loads it; without one it trains from scratch.

Any encoder also starts from the weights ``sedsynth pretrain`` writes (``checkpoints/encoder.pt``:
``{"format": PRETRAINED_FORMAT, "encoder": name, "state": weights}``, :func:`pretrained_file`),
read by :func:`read_pretrained_encoder` and loaded strictly: every weight, nothing else.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from trainer.checkpoint import CheckpointError, read_torch_file
from trainer.features import Fbank, FbankParams


class EncoderError(ValueError):
    """An unknown encoder name or a checkpoint that does not fit; the message says what to do."""


class AudioEncoder(nn.Module):
    """Base class: the fbank front end and the time stride of the output columns."""

    width: int
    time_stride_frames: int

    def __init__(self, fbank: FbankParams):
        super().__init__()
        self.fbank = Fbank(fbank)

    @property
    def sample_rate_hz(self) -> int:
        return self.fbank.params.sample_rate_hz

    @property
    def num_frames(self) -> int:
        return self.fbank.params.target_frames // self.time_stride_frames

    def input_samples(self, crop_s: float) -> int:
        return round(crop_s * self.sample_rate_hz)

    def keep_residual_low_precision(self, on: bool = True) -> None:
        """Store the residual stream in the autocast dtype; only the ViT encoders have one."""
        if on:
            raise EncoderError(
                f"train.bf16_residual applies to the ViT encoders (eat-base, tiny-vit); {type(self).__name__} has no residual stream"
            )

    def features(self, wave: torch.Tensor) -> torch.Tensor:
        """``(B, S)`` -> log-mel ``(B, T, F)`` in float32 even under autocast: bf16 would round the
        mel energies before the log (errors of 0.01 on the normalised scale) and lose Kaldi parity."""
        with torch.autocast(wave.device.type, enabled=False):
            return self.fbank(wave.float())

    def audio_columns(self, wave: torch.Tensor) -> torch.Tensor:
        """``(B, S)`` -> ``(B,)`` how many of each row's output columns hold audio. A row whose
        samples run into its last ``column`` (the samples of one output column) holds audio in every
        column, as the model trains on full windows (the encoder's own padding of the fbank to
        ``target_frames`` included). A row that ends in zeros (a clip shorter than the window,
        padded by the loader or the detector) holds audio up to the column of its last non-zero
        sample; the zeros after it are padding, not sound. An all-zero row counts as full."""
        s = wave.shape[-1]
        column_samples = self.time_stride_frames * self.fbank.params.shift_samples
        nonzero = wave != 0
        last = s - 1 - nonzero.flip(-1).to(torch.uint8).argmax(dim=-1)
        ends = torch.div(last, column_samples, rounding_mode="floor") + 1
        full = (last >= s - column_samples) | ~nonzero.any(dim=-1)
        return torch.where(full, self.num_frames, ends.clamp(1, self.num_frames))

    def frame_spans_s(self) -> np.ndarray:
        """``(L, 2)`` start and end seconds of each output column."""
        first = torch.arange(self.num_frames) * self.time_stride_frames
        start, _ = self.fbank.params.frame_span_s(first)
        _, end = self.fbank.params.frame_span_s(first + self.time_stride_frames - 1)
        return torch.stack([start, end], dim=1).numpy()


# --------------------------------------------------------------------------- EAT (ViT-B/16)


def sincos_2d(time: int, freq: int, dim: int) -> torch.Tensor:
    """EAT's fixed position table ``(time * freq, dim)``, rows time-major: the first half of the
    channels encodes the frequency index, the second half the time index (sin then cos each)."""
    quarter = dim // 4
    omega = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    t, f = torch.meshgrid(torch.arange(time, dtype=torch.float64), torch.arange(freq, dtype=torch.float64), indexing="ij")
    f_out, t_out = f.reshape(-1, 1) * omega, t.reshape(-1, 1) * omega
    return torch.cat([f_out.sin(), f_out.cos(), t_out.sin(), t_out.cos()], dim=1).float()


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)  # 3 x (B, H, N, Dh)
        out = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class PostNormBlock(nn.Module):
    """data2vec 2.0's block with ``layer_norm_first=False``: ``x = norm1(x + attn(x)); x = norm2(x + mlp(x))``.

    With ``low_precision_residual`` set and autocast on, the norms' outputs (the residual stream)
    are stored in the autocast dtype; the norms still compute in float32. Off, autocast keeps the
    stream in float32, which doubles the bytes every block reads and writes around its norms."""

    low_precision_residual = False

    def __init__(self, dim: int, heads: int, mlp_ratio: float = 4.0, eps: float = 1e-6):
        super().__init__()
        self.attn, self.norm1 = Attention(dim, heads), nn.LayerNorm(dim, eps=eps)
        self.mlp, self.norm2 = Mlp(dim, int(dim * mlp_ratio)), nn.LayerNorm(dim, eps=eps)

    def _stream(self, x: torch.Tensor) -> torch.Tensor:
        kind = x.device.type
        if self.low_precision_residual and torch.is_autocast_enabled(kind):
            return x.to(torch.get_autocast_dtype(kind))
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._stream(self.norm1(x + self.attn(x)))
        return self._stream(self.norm2(x + self.mlp(x)))


class EATEncoder(AudioEncoder):
    """ViT on fbank patches; ``dense`` is ``(B, 64, 8, 768)`` for 1024 x 128 input."""

    def __init__(self, dim: int = 768, depth: int = 12, heads: int = 12, patch: int = 16, fbank: FbankParams | None = None):
        fbank = fbank or FbankParams()
        super().__init__(fbank)
        self.width, self.time_stride_frames, self.patch = dim, patch, patch
        self.freq_patches = fbank.num_mel_bins // patch
        self.patch_embed = nn.Conv2d(1, dim, kernel_size=patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.register_buffer("positions", sincos_2d(self.num_frames, self.freq_patches, dim).unsqueeze(0), persistent=False)
        self.pre_norm = nn.LayerNorm(dim, eps=1e-6)
        self.blocks = nn.ModuleList(PostNormBlock(dim, heads) for _ in range(depth))
        self.apply(_init_vit)

    def forward(self, wave: torch.Tensor, fbank: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        x = (self.features(wave) if fbank is None else fbank).unsqueeze(1)  # (B, 1, T, F)
        x = self.patch_embed(x.to(self.patch_embed.weight.dtype))  # (B, D, L, Fp)
        b, d, L, fp = x.shape
        x = x.flatten(2).transpose(1, 2) + self.positions[:, : L * fp]  # (B, L*Fp, D), time-major
        x = torch.cat([self.cls_token.expand(b, -1, -1), x], dim=1)
        x = self.pre_norm(x)
        for block in self.blocks:
            x = block(x)
        x = x.float()
        return x[:, 0], x[:, 1:].reshape(b, L, fp, d)

    def keep_residual_low_precision(self, on: bool = True) -> None:
        """Store the blocks' residual stream in the autocast dtype (``train.bf16_residual``)."""
        for block in self.blocks:
            block.low_precision_residual = on


def _init_vit(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=0.02)
        nn.init.zeros_(m.bias)


EAT_RENAMES = (
    # (prefix in an EAT checkpoint, prefix here); fairseq first, then the Hugging Face port.
    ("modality_encoders.IMAGE.local_encoder.proj.", "patch_embed."),
    ("modality_encoders.IMAGE.extra_tokens", "cls_token"),
    ("modality_encoders.IMAGE.context_encoder.norm.", "pre_norm."),
    ("model.local_encoder.proj.", "patch_embed."),
    ("model.extra_tokens", "cls_token"),
    ("model.pre_norm.", "pre_norm."),
    ("model.blocks.", "blocks."),
    ("blocks.", "blocks."),
)


def eat_state_dict(raw: dict) -> dict[str, torch.Tensor]:
    """Rename an EAT checkpoint's encoder weights to this module's names; drops the decoder,
    EMA teacher, position table (recomputed) and classification head."""
    if "model" in raw and isinstance(raw["model"], dict):
        raw = raw["model"]
    out = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor) or key.startswith("_ema"):
            continue
        for old, new in EAT_RENAMES:
            if key.startswith(old):
                out[new + key[len(old) :]] = value
                break
    return out


EAT_CHECKPOINT = "an EAT-base checkpoint (fairseq .pt or the Hugging Face port's weights)"


def eat_config_types() -> list:
    """The classes a fairseq EAT ``.pt`` holds besides tensors, allowed (and only these) when
    reading one: its ``args`` (argparse.Namespace), ``cfg`` (omegaconf containers and their
    nodes), meter states (numpy scalars and arrays) and the plain types those refer to."""
    import argparse
    import collections
    import typing

    core = np.core.multiarray if not hasattr(np, "_core") else np._core.multiarray
    types: list = [
        argparse.Namespace,
        collections.defaultdict,
        typing.Any,
        dict,
        list,
        tuple,
        int,
        float,
        str,
        bool,
        np.ndarray,
        np.dtype,
        *{type(np.dtype(c)) for c in "?bBhHiIlLqQefdgFDG"},
    ]
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):  # pickles name either, by the numpy that wrote them
        types += [(core.scalar, f"{module}.scalar"), (core._reconstruct, f"{module}._reconstruct")]
    try:
        from omegaconf import DictConfig, ListConfig, base, nodes
    except ImportError:  # without omegaconf a checkpoint holding its containers is refused (and says so)
        return types
    node_types = [
        getattr(nodes, n)
        for n in ("AnyNode", "StringNode", "IntegerNode", "FloatNode", "BooleanNode", "BytesNode", "PathNode")
        if hasattr(nodes, n)
    ]
    return types + [DictConfig, ListConfig, base.Metadata, base.ContainerMetadata, *node_types]


def read_eat_checkpoint(path: str) -> tuple[Path, dict[str, torch.Tensor]]:
    """The encoder weights (renamed) of the EAT checkpoint at ``path``: a ``.pt`` / ``.bin`` /
    ``.safetensors`` file or a folder holding one. Raises :class:`EncoderError` naming the file."""
    p = Path(path)
    if p.is_dir():
        candidates = sorted(p.glob("*.safetensors")) or sorted(p.glob("*.pt")) + sorted(p.glob("*.bin"))
        if not candidates:
            raise EncoderError(f"encoder: no .safetensors, .pt or .bin file in {p}")
        p = candidates[0]
    if not p.is_file():
        raise EncoderError(
            f"encoder: EAT checkpoint {p} not found; download EAT-base (fairseq .pt or the Hugging Face "
            "worstchan/EAT-base_epoch30_pretrain weights) and set train.model.encoder_checkpoint to its path"
        )
    if p.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            raw = load_file(str(p))
        except (SafetensorError, OSError) as e:
            raise EncoderError(f"encoder: {p} is not a readable safetensors file ({e}); expected {EAT_CHECKPOINT}") from None
    else:
        try:
            raw = read_torch_file(p, "encoder", EAT_CHECKPOINT, allow=eat_config_types())
        except CheckpointError as e:
            raise EncoderError(str(e)) from None
    if not isinstance(raw, dict):
        raise EncoderError(f"encoder: {p} holds a {type(raw).__name__}, not a dict of weights; expected {EAT_CHECKPOINT}")
    if raw.get("format") == PRETRAINED_FORMAT:
        raise EncoderError(
            f"encoder: {p} is a `sedsynth pretrain` encoder file, not an EAT checkpoint; "
            "set train.model.encoder_checkpoint to the file itself, not its folder"
        )
    return p, eat_state_dict(raw)


def fit_eat_weights(encoder: EATEncoder, state: dict[str, torch.Tensor], source: Path | str) -> dict:
    """Load renamed EAT weights into ``encoder``; returns ``{"loaded": n, "missing": [...]}``
    and raises :class:`EncoderError` when nothing fits or a shape differs."""
    own = encoder.state_dict()
    fitting = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    wrong = sorted(k for k in state if k in own and own[k].shape != state[k].shape)
    if not fitting or wrong:
        raise EncoderError(
            f"encoder: {source} does not fit eat-base ({len(fitting)} tensors fit; shape mismatches: {wrong[:5]}); "
            "is it an EAT-base checkpoint?"
        )
    missing = sorted(k for k in own if k not in fitting)
    encoder.load_state_dict(fitting, strict=False)
    return {"loaded": len(fitting), "missing": missing}


# --------------------------------------------------------------------------- small CNN


class ConvBlock(nn.Sequential):
    def __init__(self, cin: int, cout: int, pool: tuple[int, int], stride: int = 1):
        super().__init__(
            nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.GELU(),
            nn.AvgPool2d(pool) if pool != (1, 1) else nn.Identity(),
        )


class SmallEncoder(AudioEncoder):
    """A 4-block CNN (conv, batch norm, GELU, pooling) on 64-bin fbank that trains on a CPU;
    columns every 8 frames (80 ms).

    ``dense`` is ``(B, 128, 8, width)`` for 1024 frames; ``cls`` pools it as PANNs do (Kong et al.
    2020): mean over frequency, then the maximum plus the mean over time. The maximum keeps a
    short event's columns from being averaged away by the rest of the clip (other events or the
    background). Time pooling covers only the columns that hold audio (:meth:`audio_columns`):
    a 2.6 s clip zero-padded to a 10 s window would otherwise be three quarters padding, and its
    embedding would be mostly the padding's. A full window pools every column, bit for bit as a
    plain maximum and mean do.
    """

    def __init__(self, width: int = 128, fbank: FbankParams | None = None):
        fbank = fbank or FbankParams(num_mel_bins=64)
        super().__init__(fbank)
        self.width, self.time_stride_frames = width, 8
        c = [1, width // 8, width // 4, width // 2, width]
        # the first block strides its convolution instead of pooling a full-resolution map: half the time
        pools, strides = [(1, 1), (2, 2), (2, 2), (1, 1)], [2, 1, 1, 1]
        self.blocks = nn.Sequential(*(ConvBlock(c[i], c[i + 1], pools[i], strides[i]) for i in range(4)))

    def forward(self, wave: torch.Tensor, fbank: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        x = (self.features(wave) if fbank is None else fbank).unsqueeze(1)  # (B, 1, T, F)
        x = self.blocks(x)  # (B, C, T/8, F/8)
        dense = x.permute(0, 2, 3, 1)  # (B, L, F, C)
        frames = dense.mean(dim=2)  # (B, L, C)
        columns = torch.arange(frames.shape[1], device=frames.device)
        audio = (columns < self.audio_columns(wave).unsqueeze(1)).unsqueeze(2)  # (B, L, 1)
        peak = frames.masked_fill(~audio, float("-inf")).amax(dim=1)
        mean = frames.masked_fill(~audio, 0).sum(dim=1) / audio.sum(dim=1).to(frames.dtype)
        return peak + mean, dense


ENCODERS = {
    "eat-base": lambda: EATEncoder(),
    "small": lambda: SmallEncoder(),
    "tiny-vit": lambda: EATEncoder(dim=192, depth=4, heads=3, fbank=FbankParams(num_mel_bins=64)),
}


# --------------------------------------------------------------------------- pretrained encoders (sedsynth pretrain)

PRETRAINED_FORMAT = "sedsynth-pretrained-encoder/1"
PRETRAINED_CHECKPOINT = "the checkpoints/encoder.pt that `sedsynth pretrain` writes"


def pretrained_file(name: str, state: dict[str, torch.Tensor], **info) -> dict:
    """What ``sedsynth pretrain`` saves: encoder ``name``'s weights ``state`` (CPU tensors) and plain
    numbers or strings ``info`` (steps, loss...); it reads back under ``weights_only=True``."""
    return {"format": PRETRAINED_FORMAT, "encoder": name, "state": state, **info}


def is_pretrained_file(raw: object) -> bool:
    return isinstance(raw, dict) and raw.get("format") == PRETRAINED_FORMAT


def pretrained_state(raw: dict, name: str, source: Path | str) -> dict[str, torch.Tensor]:
    """The weights of a :func:`pretrained_file` dict for encoder ``name``; raises :class:`EncoderError`
    when it was pretrained for another encoder or holds no dict of tensors."""
    if raw.get("encoder") != name:
        raise EncoderError(
            f"encoder: {source} holds pretrained {raw.get('encoder')!r} weights, but train.model.encoder is {name!r}; "
            f"pretrain with pretrain.encoder={name} or set train.model.encoder={raw.get('encoder')}"
        )
    state = raw.get("state")
    if (
        not isinstance(state, dict)
        or not state
        or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items())
    ):
        raise EncoderError(f"encoder: {source} has no dict of weights under 'state'; expected {PRETRAINED_CHECKPOINT}")
    return state


def read_pretrained_encoder(path: str | Path, name: str) -> dict[str, torch.Tensor]:
    """Encoder ``name``'s weights from ``sedsynth pretrain``'s file at ``path``, read weights-only;
    raises :class:`EncoderError` naming the file when it is missing, unreadable, not such a file
    or pretrained for another encoder."""
    p = Path(path)
    if not p.is_file():
        raise EncoderError(
            f"encoder: encoder_checkpoint {p} not found; run `sedsynth pretrain` (pretrain.encoder={name}) "
            "or set train.model.encoder_checkpoint: null to train from scratch"
        )
    try:
        raw = read_torch_file(p, "encoder", PRETRAINED_CHECKPOINT)
    except CheckpointError as e:
        raise EncoderError(str(e)) from None
    if not is_pretrained_file(raw):
        what = f"a dict with keys {', '.join(map(str, list(raw)[:6]))}" if isinstance(raw, dict) else f"a {type(raw).__name__}"
        eat = " (an EAT checkpoint fits eat-base only)" if name != "eat-base" else ""
        raise EncoderError(
            f"encoder: {p} is not a `sedsynth pretrain` encoder checkpoint (it holds {what}){eat}; "
            f"expected {PRETRAINED_CHECKPOINT}"
        )
    return pretrained_state(raw, name, p)


def load_pretrained_weights(encoder: AudioEncoder, state: dict[str, torch.Tensor], name: str, source: Path | str) -> None:
    """Load ``state`` into ``encoder`` strictly (every weight, same shapes, nothing extra); raises
    :class:`EncoderError` saying what does not fit."""
    own = encoder.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    wrong = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unexpected or wrong:
        raise EncoderError(
            f"encoder: {source} does not fit {name!r} (missing {missing[:5]}, unexpected {unexpected[:5]}, "
            f"other shapes {wrong[:5]}); was it pretrained with another version of the encoder?"
        )
    encoder.load_state_dict(state, strict=True)


def _is_pretrained_path(path: str) -> bool:
    """Whether ``path`` (an eat-base encoder_checkpoint) is a ``sedsynth pretrain`` file: a torch file
    (not a folder or safetensors) whose weights-only contents say so; a file that does not read
    leaves the EAT reader to report it."""
    p = Path(path)
    if not p.is_file() or p.suffix == ".safetensors":
        return False
    try:
        return is_pretrained_file(read_torch_file(p, "encoder", PRETRAINED_CHECKPOINT, mmap=True))
    except (CheckpointError, OSError):
        return False


def build_encoder(name: str, checkpoint: str | None = None) -> AudioEncoder:
    """An encoder from :data:`ENCODERS`. ``checkpoint``: a ``sedsynth pretrain`` encoder file (any
    encoder, loaded strictly) or, for ``eat-base``, an EAT checkpoint."""
    if name not in ENCODERS:
        raise EncoderError(f"encoder: unknown {name!r}; choose one of {sorted(ENCODERS)}")
    # the file is read (and refused, when it must be) before 86 M parameters are initialised
    pretrained = eat = None
    if checkpoint and (name != "eat-base" or _is_pretrained_path(checkpoint)):
        pretrained = read_pretrained_encoder(checkpoint, name)
    elif checkpoint:
        eat = read_eat_checkpoint(checkpoint)
    encoder = ENCODERS[name]()
    if pretrained is not None:
        load_pretrained_weights(encoder, pretrained, name, checkpoint)
    if eat is not None:
        fit_eat_weights(encoder, eat[1], eat[0])
    return encoder
