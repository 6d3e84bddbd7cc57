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


# Dense bf16 tensor-core peak FLOP/s by GPU name (vendor data sheets, SXM parts), for MFU; a name
# matches the first key it contains, so longer names come before their prefixes (L40S before L4).
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12, "A10G": 70e12, "A10": 125e12}


def peak_bf16_flops(device_name: str) -> float | None:
    """The dense bf16 peak FLOP/s of the GPU called ``device_name``; None for one not in :data:`PEAK_BF16_FLOPS`."""
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in device_name), None)
