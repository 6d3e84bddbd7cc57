"""Atomic training checkpoints with everything a resume needs.

A checkpoint is one ``torch.save`` file: the trainable model weights (a frozen text encoder is
left out; it is rebuilt from its name), the optimizer, the scheduler, the step, the epoch and
the batches done in it, torch's RNG state, and the resolved ``train`` config. It is written to
a temporary name and renamed, so a crash never leaves a half-written ``latest.pt``.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn


def frozen_prefixes(model: nn.Module) -> tuple[str, ...]:
    """State-dict prefixes of frozen text encoders (rebuilt from their names, never saved)."""
    return tuple(f"{name}.model." if name else "model." for name, m in model.named_modules() if getattr(m, "frozen", False))


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state without a frozen text encoder's weights (they never change)."""
    skip = frozen_prefixes(model)
    return {k: v for k, v in model.state_dict().items() if not (skip and k.startswith(skip))}


def save(path: Path, model: nn.Module, optimizer, scheduler, step: int, epoch: int, batches_in_epoch: int, config: dict, metrics: dict | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "model": trainable_state(model),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "step": step,
        "epoch": epoch,
        "batches_in_epoch": batches_in_epoch,
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "config": config,
        "metrics": metrics or {},
    }
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load(path: Path, model: nn.Module, optimizer=None, scheduler=None, restore_rng: bool = True) -> dict:
    """Load ``path`` into the given objects; returns the checkpoint dict (step, epoch, config...)."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    missing, unexpected = model.load_state_dict(state["model"], strict=False)
    skip = frozen_prefixes(model)
    missing = [k for k in missing if not (skip and k.startswith(skip))]
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not fit this model (missing {missing[:5]}, unexpected {unexpected[:5]}); "
                         "was it trained with other train.model settings?")
    if optimizer is not None and state.get("optimizer"):
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state.get("scheduler"):
        scheduler.load_state_dict(state["scheduler"])
    if restore_rng:
        torch.set_rng_state(state["torch_rng"])
        if state.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
    return state
