"""The optimizer and learning-rate schedule of a training run.

Input: the objective (model and loss heads) and ``train.optim`` (lr, weight_decay, betas,
warmup_steps, sam_rho, sam_adaptive). Output: an AdamW optimizer over the trainable parameters
(wrapped in :class:`~trainer.sam.SAM` when ``sam_rho > 0``: its ``step`` then takes a closure that
recomputes the loss, see :func:`trainer.stages.train.optimizer_step`) and the multiplier of the
learning rate at each optimizer step, for ``torch.optim.lr_scheduler.LambdaLR``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from trainer.sam import SAM


def optimizer_for(objective: nn.Module, optim_params) -> torch.optim.Optimizer:
    """AdamW over ``objective``'s trainable parameters; weight decay only on matrices (not on
    biases, norms, temperatures). With ``sam_rho > 0`` it is the base of a :class:`SAM` (whose
    state dict is AdamW's, so a checkpoint reads the same either way). Parameters on CUDA get the
    fused kernel (one launch for every tensor's update); on the CPU it is torch's default."""
    o = optim_params
    params = [p for p in objective.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    other = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": o.weight_decay}, {"params": other, "weight_decay": 0.0}]
    fused = bool(params) and all(p.is_cuda for p in params)
    adamw = torch.optim.AdamW(groups, lr=o.lr, betas=tuple(o.betas), fused=fused or None)
    return SAM(adamw, o.sam_rho, o.sam_adaptive) if o.sam_rho > 0 else adamw


def passes_per_step(optimizer: torch.optim.Optimizer) -> int:
    """Forward/backward passes over each batch per optimizer step: 2 with SAM, else 1."""
    return 2 if isinstance(optimizer, SAM) else 1


def lr_lambda(warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """Step -> learning-rate multiplier: linear warm-up to 1 over ``warmup_steps``, then cosine to 0 at ``total_steps``."""

    def multiplier(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))))

    return multiplier
