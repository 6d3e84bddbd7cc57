"""The same bytes on every x86-64 CPU: numpy's run-time kernels pinned to its baseline.

When numpy is imported it picks, per operation, the fastest kernel the CPU offers (AVX2,
AVX-512). Their ``sin``, ``exp``, ``log`` and some sums round differently from the baseline
kernels, so audio generated or measured on an AVX-512 machine differs in its last bits from
the same run on an AVX2 one, and every hash after it differs too. numpy reads
``NPY_ENABLE_CPU_FEATURES`` once, at import: set to its baseline group, no faster kernel is
used. :func:`pin_numpy_kernels` sets it for the ``sedsynth`` command before numpy is
imported; the worker processes it starts inherit it. Workers of a dask cluster are checked
against the calling process (:func:`numpy_kernels`) when the client connects and again by
every task, so a worker that joins later with other kernels makes nothing
(:mod:`pipeline.compute`).

Only x86-64 with numpy 2.4 or later (which names its baseline ``X86_V2``) is pinned; other
machines keep numpy's choice (and an ARM machine's bytes differ from an x86 one's anyway,
as their maths libraries do). This module does not import numpy.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

VARIABLE = "NPY_ENABLE_CPU_FEATURES"
BASELINE = {"x86_64": "X86_V2", "amd64": "X86_V2"}  # numpy's baseline feature group per machine
DISPATCHED = ("X86_V3", "X86_V4", "AVX512_ICL", "AVX512_SPR")  # numpy 2.4's x86 groups above its baseline


def baseline_group() -> str | None:
    """The baseline group numpy is pinned to on this machine, or None where it is not pinned."""
    group = BASELINE.get(platform.machine().lower())
    try:
        major, minor = (int(p) for p in metadata.version("numpy").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return None
    return group if (major, minor) >= (2, 4) else None


def pin_numpy_kernels() -> bool:
    """Set ``NPY_ENABLE_CPU_FEATURES`` to numpy's baseline unless numpy is already imported or
    the variable is set (a user's choice is kept). Returns whether it was set here."""
    group = baseline_group()
    if group is None or "numpy" in sys.modules or VARIABLE in os.environ:
        return False
    os.environ[VARIABLE] = group
    return True


def numpy_kernels() -> str:
    """The kernel groups above the baseline this process's numpy uses: ``"baseline"`` when pinned
    (or on a CPU without them), else their names, e.g. ``"X86_V3 X86_V4"``."""
    from numpy._core._multiarray_umath import __cpu_features__ as features

    used = [g for g in DISPATCHED if features.get(g)]
    return " ".join(used) or "baseline"
