"""Cross-rank negatives: two gloo ranks with half a batch each give the single-process loss and gradients."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainer.losses import SigmoidClipLoss

WORLD = 2
B, D = 3, 4


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    audio = torch.nn.functional.normalize(torch.randn(WORLD * B, D, generator=g, dtype=torch.float64), dim=-1)
    text = torch.nn.functional.normalize(torch.randn(WORLD * B, D, generator=g, dtype=torch.float64), dim=-1)
    return audio, text


def _rank(rank: int, folder: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=WORLD)
    audio, text = _batch()
    a = audio[rank * B:(rank + 1) * B].clone().requires_grad_()
    t = text[rank * B:(rank + 1) * B].clone().requires_grad_()
    loss = SigmoidClipLoss().double()(a, t)["clip"]
    loss.backward()
    torch.save({"loss": loss.detach(), "audio_grad": a.grad, "text_grad": t.grad}, f"{folder}/rank{rank}.pt")
    dist.destroy_process_group()


def test_two_ranks_equal_one_process_over_the_global_batch(tmp_path: Path) -> None:
    mp.spawn(_rank, args=(str(tmp_path),), nprocs=WORLD, join=True)
    audio, text = _batch()
    audio.requires_grad_(), text.requires_grad_()
    reference = SigmoidClipLoss().double()(audio, text)["clip"]
    reference.backward()
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    # DDP averages over ranks: the mean of the ranks' losses is the global loss ...
    assert torch.allclose(sum(r["loss"] for r in ranks) / WORLD, reference.detach())
    # ... and each rank's gradient, averaged, is the global gradient of its slice.
    for r, got in enumerate(ranks):
        part = slice(r * B, (r + 1) * B)
        assert torch.allclose(got["audio_grad"] / WORLD, audio.grad[part])
        assert torch.allclose(got["text_grad"] / WORLD, text.grad[part])
