"""DDP set-up through torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK), and the device.

``torchrun --nproc_per_node=8 -m sedsynth train`` starts one process per GPU; every process calls
:func:`setup`, which joins the process group (NCCL on CUDA, gloo on CPU) and picks the device, and
:func:`teardown` on the way out, also when it is interrupted. A plain ``sedsynth train`` is a world
of one.

A rank blocked in a collective runs no Python, so it cannot act on SIGTERM until the collective
returns. Two things end such a wait: a peer that exits (gloo sees its connection close; every rank
gets the signal from torchrun or the scheduler, and the ranks doing Python work exit at once), and
the process group's timeout, :data:`COLLECTIVE_TIMEOUT`, for a peer that hangs or dies unseen (NCCL).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

# Longer than anything one rank does while the others wait for it (rank 0 scoring the held-out split
# and writing three checkpoints of a large model at the end of an epoch), so only a hung or dead peer trips it.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int
    device: torch.device
    joined: bool = False  # whether setup joined the process group (teardown leaves only a group it joined)

    @property
    def main(self) -> bool:
        return self.rank == 0


def pick_device(setting: str, local_rank: int = 0) -> torch.device:
    if setting == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    if setting.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"train: device {setting!r} asked for but CUDA is not available; set train.device to auto or cpu")
    return torch.device(setting)


def setup(device: str = "auto", timeout: datetime.timedelta = COLLECTIVE_TIMEOUT) -> World:
    """This process's place in the run (from torchrun's environment) and its device; with several
    ranks it joins the process group, whose collectives give up after ``timeout``, unless the
    caller joined one already (several runs in one process: torch cannot join a second group)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device, local)
    joined = size > 1 and not dist.is_initialized()
    if joined:
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", timeout=timeout)
    return World(rank, size, local, dev, joined)


def wrap(module: torch.nn.Module, world: World, find_unused_parameters: bool = False) -> torch.nn.Module:
    """``module`` as a training loop calls it: itself in a world of one; with several ranks, wrapped in
    DDP, whose backward averages the gradients across ranks. ``find_unused_parameters``: some trainable
    weights get no gradient (an ablation's idle head), so DDP must not wait for theirs."""
    if world.size == 1:
        return module
    return torch.nn.parallel.DistributedDataParallel(module, find_unused_parameters=find_unused_parameters)


def gradients_kept_local(module: torch.nn.Module, world: World, sync: bool) -> contextlib.AbstractContextManager:
    """The context of a backward whose gradient stays on this rank (DDP's ``no_sync``, for the
    micro-batches before the last of an optimizer step) unless ``sync`` or in a world of one."""
    return contextlib.nullcontext() if sync or world.size == 1 else module.no_sync()


def all_have(flag: bool, world: World) -> bool:
    """True when every rank has ``flag`` (ranks stop an epoch together)."""
    if world.size == 1:
        return flag
    t = torch.tensor([1 if flag else 0], device=world.device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def barrier(world: World) -> None:
    if world.size > 1:
        dist.barrier()


def teardown(world: World) -> None:
    """Leave the process group :func:`setup` joined (a no-op otherwise, or when it is gone already).
    Called however a run ends: over gloo the other ranks' collectives then fail at once instead of
    waiting for this process (over NCCL they give up after :data:`COLLECTIVE_TIMEOUT`)."""
    if world.joined and dist.is_initialized():
        dist.destroy_process_group()
