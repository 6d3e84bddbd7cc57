"""Masked-autoencoder pretraining of an audio encoder on audio alone (Cacophony stage 1).

Cacophony (Zhu et al., Sec. III-A, following AudioMAE, Huang et al. 2022, and MAE, He et al.
2022): the log-mel spectrogram is cut into non-overlapping 16x16 patches, 80% of them are masked
at random per example, the transformer encoder sees the visible patches only, a light decoder
fills the masked positions with a learned mask token and reconstructs every patch, and the loss
is the MSE on the masked patches against per-patch normalised targets (``norm_pix_loss``; the
paper: "per-patch normalization achieves better performance in downstream tasks"). The decoder
is discarded afterwards; :func:`encoder_state` gives the encoder's weights for the next stage.

Two encoder families:

- :class:`~trainer.encoders.EATEncoder` (``eat-base``, ``tiny-vit``): the encoder's own fbank
  front end, patch embedding (applied as the linear map it is, to the visible patches only),
  fixed 2-D sin-cos position table, CLS token, pre-norm and blocks. Token sequence into the
  blocks: ``(B, 1 + K, D)`` with ``K = N - round(mask_ratio * N)`` visible patches.
- :class:`~trainer.encoders.SmallEncoder` (a CNN: it has no tokens to drop): the SimMIM form
  (Xie et al., 2022). Masked input patches are set to zero, the whole CNN runs on the full
  spectrogram, and a linear head maps each output cell ``(B, L, Fg, C)`` to the
  ``stride_t x stride_f`` spectrogram values under it, which are reassembled to the full
  spectrogram and cut into the same patches. Same targets and the same masked-only loss.

Inputs: waveforms ``(B, S)`` at the encoder's rate (or log-mel ``(B, T, F)`` through
:meth:`MaskedAutoencoder.reconstruct`) and an optional ``torch.Generator`` for the masks
(same seed, same masks, on any device). Output: :class:`MaeOutput` (loss, prediction, target,
mask). :func:`flops_per_step` counts one training step's forward and backward FLOPs.

Paper settings (Cacophony Sec. IV-A): AdamW, lr 2e-4, weight decay 0.01, batch 512, 200k steps,
10k warm-up steps, cosine decay to 1e-6; encoder ViT-B, and a 12-layer decoder of the same size.
The decoder default here is MAE's lighter one (8 blocks, 512-d, 16 heads; He et al., Sec. 4).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from trainer.encoders import Attention, AudioEncoder, EATEncoder, Mlp, SmallEncoder, sincos_2d

MASK_RATIO = 0.8  # Cacophony / AudioMAE: 80% of unstructured patches masked
PATCH = 16  # Cacophony: 16 x 16 patches without overlap


@dataclass
class MaeOutput:
    loss: torch.Tensor  # () MSE over masked patches
    prediction: torch.Tensor  # (B, N, P) reconstructed patches, P = patch * patch
    target: torch.Tensor  # (B, N, P) per-patch normalised input patches
    mask: torch.Tensor  # (B, N) bool, True where the patch was masked


def patchify(spec: torch.Tensor, patch: int) -> torch.Tensor:
    """Log-mel ``(B, T, F)`` -> patches ``(B, N, patch * patch)``, N = (T // patch) * (F // patch).

    Patches are time-major (patch ``l * Fp + f`` covers frames ``l*p..`` and bins ``f*p..``) and
    each is flattened (time, frequency) row-major: the order of ``Conv2d(1, D, p, stride=p)``
    followed by ``flatten(2)``, so a patch times the flattened kernel equals the convolution.
    Frames or bins past a whole number of patches are dropped, as the convolution drops them.
    """
    b, t, f = spec.shape
    lt, fp = t // patch, f // patch
    x = spec[:, : lt * patch, : fp * patch].reshape(b, lt, patch, fp, patch)
    return x.permute(0, 1, 3, 2, 4).reshape(b, lt * fp, patch * patch)


def unpatchify(patches: torch.Tensor, time_patches: int, patch: int) -> torch.Tensor:
    """The inverse of :func:`patchify`: ``(B, N, p * p)`` -> ``(B, time_patches * p, (N // time_patches) * p)``."""
    b, n, _ = patches.shape
    fp = n // time_patches
    x = patches.reshape(b, time_patches, fp, patch, patch).permute(0, 1, 3, 2, 4)
    return x.reshape(b, time_patches * patch, fp * patch)


def random_mask(
    batch: int,
    num_patches: int,
    mask_ratio: float,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example random masks with exactly ``round(mask_ratio * num_patches)`` masked patches.

    Returns ``keep (B, K)`` (indices of the visible patches, ascending) and ``mask (B, N)`` bool
    (True = masked). The noise is drawn on the CPU from ``generator`` (the global generator when
    None) and moved to ``device``, so one seed gives the same masks on every device.
    """
    masked = round(mask_ratio * num_patches)
    if not 0 <= masked < num_patches:
        raise ValueError(f"mae: mask_ratio {mask_ratio} leaves no visible patch out of {num_patches}")
    noise = torch.rand(batch, num_patches, generator=generator)
    order = noise.argsort(dim=1)
    keep = order[:, : num_patches - masked].sort(dim=1).values
    mask = torch.ones(batch, num_patches, dtype=torch.bool)
    mask.scatter_(1, keep, False)
    return keep.to(device), mask.to(device)


def normalised_targets(patches: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Per-patch normalisation (MAE's ``norm_pix_loss``): ``(x - mean) / sqrt(var + eps)`` over
    each patch's values, var unbiased as in MAE's code. ``(B, N, P)`` -> ``(B, N, P)``, float32."""
    x = patches.float()
    mean, var = x.mean(dim=-1, keepdim=True), x.var(dim=-1, keepdim=True)
    return (x - mean) / (var + eps).sqrt()


def masked_mse(prediction: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the masked patches only: per-patch mean over ``P``, then the mean
    over the ``mask`` (B, N) True entries. Visible patches contribute nothing (and no gradient)."""
    per_patch = (prediction.float() - target).pow(2).mean(dim=-1)  # (B, N)
    weight = mask.to(per_patch.dtype)
    return (per_patch * weight).sum() / weight.sum().clamp(min=1.0)


def _init_linear(m: nn.Module) -> None:
    """MAE's initialisation of the decoder's linear layers (truncated normal, std 0.02, zero bias)."""
    if isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=0.02)
        nn.init.zeros_(m.bias)


class PreNormBlock(nn.Module):
    """MAE's decoder block (timm ``Block``): ``x = x + attn(norm1(x)); x = x + mlp(norm2(x))``."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float = 4.0, eps: float = 1e-6):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim, eps=eps), Attention(dim, heads)
        self.norm2, self.mlp = nn.LayerNorm(dim, eps=eps), Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class MaskedAutoencoder(nn.Module):
    """An :class:`~trainer.encoders.EATEncoder` or :class:`~trainer.encoders.SmallEncoder` with a
    reconstruction decoder (module docstring). ``forward(wave, generator)`` -> :class:`MaeOutput`.

    ``decoder_dim`` / ``decoder_depth`` / ``decoder_heads`` size the ViT path's decoder
    (``decoder_dim`` a multiple of 4 and of ``decoder_heads``); the SimMIM path's decoder is one
    linear layer and ignores them. ``patch`` is the masking (and target) patch: the ViT's own
    patch size for an EATEncoder (any other value is refused); for the CNN 16 by default, a
    multiple of its stride (8). ``norm_targets=False`` reconstructs the raw patches instead.
    """

    def __init__(
        self,
        encoder: AudioEncoder,
        decoder_dim: int = 512,
        decoder_depth: int = 8,
        decoder_heads: int = 16,
        mask_ratio: float = MASK_RATIO,
        patch: int | None = None,
        norm_targets: bool = True,
    ):
        super().__init__()
        if not 0.0 <= mask_ratio < 1.0:
            raise ValueError(f"mae: mask_ratio must be in [0, 1), got {mask_ratio}")
        self.encoder, self.mask_ratio, self.norm_targets = encoder, mask_ratio, norm_targets
        bins, frames = encoder.fbank.params.num_mel_bins, encoder.fbank.params.target_frames
        if isinstance(encoder, EATEncoder):
            if patch not in (None, encoder.patch):
                raise ValueError(f"mae: an EATEncoder masks its own {encoder.patch}x{encoder.patch} patches, not {patch}")
            self.kind, self.patch = "vit", encoder.patch
            self.time_patches, self.freq_patches = frames // self.patch, encoder.freq_patches
            self.decoder_embed = nn.Linear(encoder.width, decoder_dim)
            self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_dim))
            self.register_buffer(
                "decoder_positions", sincos_2d(self.time_patches, self.freq_patches, decoder_dim).unsqueeze(0), persistent=False
            )
            self.decoder_blocks = nn.ModuleList(PreNormBlock(decoder_dim, decoder_heads) for _ in range(decoder_depth))
            self.decoder_norm = nn.LayerNorm(decoder_dim, eps=1e-6)
            self.decoder_pred = nn.Linear(decoder_dim, self.patch * self.patch)
            for module in (self.decoder_embed, self.decoder_blocks, self.decoder_pred):
                module.apply(_init_linear)
            nn.init.normal_(self.mask_token, std=0.02)
        elif isinstance(encoder, SmallEncoder):
            self.kind, self.patch = "simmim", patch or PATCH
            self.time_patches, self.freq_patches = frames // self.patch, bins // self.patch
            self.stride_t, self.stride_f = encoder.time_stride_frames, encoder.time_stride_frames  # the CNN pools both axes alike
            if self.patch % self.stride_t:
                raise ValueError(f"mae: the masking patch {self.patch} must be a multiple of the CNN's stride {self.stride_t}")
            self.decoder_pred = nn.Linear(encoder.width, self.stride_t * self.stride_f)
        else:
            raise ValueError(f"mae: no masked-autoencoder form for {type(encoder).__name__}; use an EATEncoder or SmallEncoder")
        if self.time_patches * self.freq_patches < 2:
            raise ValueError(f"mae: {frames} frames x {bins} bins give fewer than 2 patches of {self.patch}")

    @property
    def num_patches(self) -> int:
        return self.time_patches * self.freq_patches

    def forward(self, wave: torch.Tensor, generator: torch.Generator | None = None) -> MaeOutput:
        """Waveforms ``(B, S)`` -> :class:`MaeOutput`, masks drawn from ``generator``."""
        return self.reconstruct(self.encoder.features(wave), generator)

    def reconstruct(self, spec: torch.Tensor, generator: torch.Generator | None = None) -> MaeOutput:
        """Log-mel ``(B, T, F)`` (the encoder's front end's output) -> :class:`MaeOutput`."""
        patches = patchify(spec, self.patch)  # (B, N, P)
        keep, mask = random_mask(spec.shape[0], patches.shape[1], self.mask_ratio, generator, spec.device)
        if self.kind == "vit":
            prediction = self._decode(self.encode_visible(patches, keep), keep)
        else:
            prediction = self._simmim(spec, mask)
        target = normalised_targets(patches) if self.norm_targets else patches.float()
        return MaeOutput(masked_mse(prediction, target, mask), prediction, target, mask)

    def encode_visible(self, patches: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """ViT path: the visible patches ``keep (B, K)`` of ``patches (B, N, P)`` through the
        encoder's patch embedding, positions, CLS token, pre-norm and blocks -> ``(B, 1 + K, D)``."""
        enc = self.encoder
        weight = enc.patch_embed.weight.flatten(1)  # (D, P): the convolution as a linear map
        visible = torch.gather(patches, 1, keep.unsqueeze(-1).expand(-1, -1, patches.shape[-1]))  # (B, K, P)
        x = nn.functional.linear(visible.to(weight.dtype), weight, enc.patch_embed.bias)  # (B, K, D)
        positions = enc.positions[:, : self.num_patches].expand(x.shape[0], -1, -1)
        x = x + torch.gather(positions, 1, keep.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        x = torch.cat([enc.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = enc.pre_norm(x)
        for block in enc.blocks:
            x = block(x)
        return x

    def _decode(self, encoded: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """``(B, 1 + K, D)`` -> predicted patches ``(B, N, P)``: mask tokens everywhere, the
        encoded visible tokens put back at their places, positions added, CLS kept in front."""
        x = self.decoder_embed(encoded)  # (B, 1 + K, d)
        b, _, d = x.shape
        full = self.mask_token.to(x.dtype).expand(b, self.num_patches, d).clone()
        full.scatter_(1, keep.unsqueeze(-1).expand(-1, -1, d), x[:, 1:])
        x = torch.cat([x[:, :1], full + self.decoder_positions], dim=1)
        for block in self.decoder_blocks:
            x = block(x)
        return self.decoder_pred(self.decoder_norm(x))[:, 1:]

    def _simmim(self, spec: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """CNN path: zero the masked patches, run the whole CNN, predict every spectrogram value
        from the output cell above it -> patches ``(B, N, P)``."""
        t, f = self.time_patches * self.patch, self.freq_patches * self.patch
        spec = spec[:, :t, :f]
        keep_values = unpatchify(
            (~mask).unsqueeze(-1).to(spec.dtype).expand(-1, -1, self.patch**2), self.time_patches, self.patch
        )
        grid = self.encoder.blocks((spec * keep_values).unsqueeze(1))  # (B, C, L, Fg)
        cells = self.decoder_pred(grid.permute(0, 2, 3, 1))  # (B, L, Fg, st * sf)
        b, lt, fg, _ = cells.shape
        full = (
            cells.reshape(b, lt, fg, self.stride_t, self.stride_f)
            .permute(0, 1, 3, 2, 4)
            .reshape(b, lt * self.stride_t, fg * self.stride_f)
        )
        return patchify(full[:, :t, :f], self.patch)


def encoder_state(mae: MaskedAutoencoder) -> dict[str, torch.Tensor]:
    """The encoder's weights alone (decoder, mask token and head dropped), detached copies on the
    CPU, keyed as ``build_encoder(name).state_dict()`` is: ``load_state_dict(..., strict=True)``
    on a fresh encoder of the same name accepts it."""
    return {k: v.detach().cpu().clone() for k, v in mae.encoder.state_dict().items()}


def flops_per_step(model: MaskedAutoencoder, batch: int, seconds: float, device: torch.device | str = "meta") -> int:
    """FLOPs of one pretraining step (forward and backward, no optimizer) on ``batch`` clips of
    ``seconds`` of audio, counted by ``torch.utils.flop_counter.FlopCounterMode`` (matrix
    products, convolutions and attention; the fbank's FFT is not counted).

    A copy of ``model`` runs on ``device``: ``meta`` (default) computes shapes only, so eat-base
    at GPU batch sizes counts in a second on a CPU; ``model`` itself is left untouched.
    """
    work = copy.deepcopy(model).to(device).train()
    samples = round(seconds * model.encoder.sample_rate_hz)
    wave = torch.zeros(batch, samples, device=device)
    params = [p for p in work.parameters() if p.requires_grad]
    with FlopCounterMode(display=False) as counter:
        # the fbank module directly: ``features`` opens an autocast region, which meta tensors refuse
        loss = work.reconstruct(work.encoder.fbank(wave), torch.Generator().manual_seed(0)).loss
        torch.autograd.grad(loss, params, allow_unused=True)
    return int(counter.get_total_flops())


def model_flops_utilisation(flops: int, step_s: float, peak_flops_per_s: float) -> float:
    """MFU: achieved FLOP/s (``flops`` per step over ``step_s`` seconds) as a share of the peak."""
    return flops / step_s / peak_flops_per_s
