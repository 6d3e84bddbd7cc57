"""DDP set-up through torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK), and the device.

``torchrun --nproc_per_node=8 -m sedsynth train`` starts one process per GPU; every process calls
:func:`setup`, which joins the process group (NCCL on CUDA, gloo on CPU) and picks the device.
A plain ``sedsynth train`` is a world of one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int
    device: torch.device

    @property
    def main(self) -> bool:
        return self.rank == 0


def pick_device(setting: str, local_rank: int = 0) -> torch.device:
    if setting == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    if setting.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"train: device {setting!r} asked for but CUDA is not available; set train.device to auto or cpu")
    return torch.device(setting)


def setup(device: str = "auto") -> World:
    size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device, local)
    if size > 1 and not dist.is_initialized():
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return World(rank, size, local, dev)


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
    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
