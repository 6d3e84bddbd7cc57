"""Mixed precision: the autocast context a ``precision`` setting asks for on a device.

Input: ``train.precision`` (``auto``, ``bf16`` or ``fp32``) and the torch device the model runs
on. Output: a function returning a fresh context manager per use, so one object serves the
training step, the held-out scoring and the detector alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch


def autocast_for(precision: str, device: torch.device) -> Callable[[], AbstractContextManager]:
    """bf16 autocast for ``bf16``, and for ``auto`` on CUDA; otherwise a context that changes nothing (fp32)."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext
