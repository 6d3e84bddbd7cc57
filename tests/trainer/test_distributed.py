"""Cross-rank terms: two gloo ranks with half a batch each give the single-process loss and gradients
(contrastive negatives, the frame loss's pair count, region texts and the prior's phrase statistics)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainer.losses import FrameSigmoidLoss, PhraseClipLoss, PriorLoss, RegionContrastiveLoss, SigmoidClipLoss

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
    a = audio[rank * B : (rank + 1) * B].clone().requires_grad_()
    t = text[rank * B : (rank + 1) * B].clone().requires_grad_()
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


# Frame, region and prior terms: uneven ranks (rank 1 has fewer real phrases, fewer regions and a
# clip without frame labels), phrases shared across ranks, so per-rank counts and statistics differ.
N, L = 3, 5
NAMES = ("dog barking", "door knock", "cat meowing", "rain", "speech")


def _frame_batch() -> dict:
    g = torch.Generator().manual_seed(1)
    frames = torch.nn.functional.normalize(torch.randn(WORLD * B, L, D, generator=g, dtype=torch.float64), dim=-1)
    phrases = torch.nn.functional.normalize(torch.randn(WORLD * B, N, D, generator=g, dtype=torch.float64), dim=-1)
    labels = torch.rand(WORLD * B, N, L, generator=g) > 0.5
    mask = torch.ones(WORLD * B, N, dtype=torch.bool)
    mask[B:, 2] = False  # rank 1: two real phrases per clip
    labels[B + 1] = False  # rank 1: a clip with no labelled frame (no region)
    has_frames = torch.ones(WORLD * B, dtype=torch.bool)
    has_frames[B + 2] = False
    bias = torch.randn(WORLD * B, N, generator=g, dtype=torch.float64)
    names = [[NAMES[(i + j) % len(NAMES)] for j in range(N)] for i in range(WORLD * B)]
    return {
        "frames": frames,
        "phrases": phrases,
        "labels": labels,
        "mask": mask,
        "has_frames": has_frames,
        "bias": bias,
        "names": names,
    }


def _frame_terms(batch: dict, part: slice) -> tuple[dict, dict]:
    """The frame, region and prior terms over clips ``part`` of ``batch``, and the gradients of their sum."""
    frames, phrases, bias = (batch[k][part].clone().requires_grad_() for k in ("frames", "phrases", "bias"))
    labels, mask, has_frames, names = batch["labels"][part], batch["mask"][part], batch["has_frames"][part], batch["names"][part]
    frame, region = FrameSigmoidLoss().double(), RegionContrastiveLoss(init_scale=5.0).double()
    phrase_clip = PhraseClipLoss(init_scale=5.0, init_bias=-2.0).double()
    terms = {
        "frame": frame(frames, phrases, labels, mask)["frame"],
        "phrase_clip": phrase_clip(frames[:, 0], phrases, labels, mask)["phrase_clip"],
        "region": region(frames, phrases, labels, mask)["region"],
        "prior": PriorLoss()(names, labels, mask, bias, has_frames)["prior"],
    }
    sum(terms.values()).backward()
    grads = {
        "frames": frames.grad,
        "phrases": phrases.grad,
        "bias": bias.grad,
        "frame_t": frame.log_scale.grad,
        "frame_b": frame.bias.grad,
        "region_t": region.log_scale.grad,
        "phrase_clip_t": phrase_clip.log_scale.grad,
        "phrase_clip_b": phrase_clip.bias.grad,
    }
    return {k: v.detach() for k, v in terms.items()}, grads


def _frame_rank(rank: int, folder: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=WORLD)
    terms, grads = _frame_terms(_frame_batch(), slice(rank * B, (rank + 1) * B))
    torch.save({"terms": terms, "grads": grads}, f"{folder}/rank{rank}.pt")
    dist.destroy_process_group()


def test_frame_region_and_prior_terms_over_two_ranks_equal_one_process(tmp_path: Path) -> None:
    mp.spawn(_frame_rank, args=(str(tmp_path),), nprocs=WORLD, join=True)
    reference, expected = _frame_terms(_frame_batch(), slice(None))
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    # DDP averages over ranks: the ranks' mean is the one-process term
    wrong = [name for name, value in reference.items() if not torch.allclose(sum(r["terms"][name] for r in ranks) / WORLD, value)]
    # a loss's own parameters: DDP averages their gradients
    wrong += [
        f"{name} gradient"
        for name in ("frame_t", "frame_b", "region_t", "phrase_clip_t", "phrase_clip_b")
        if not torch.allclose(sum(r["grads"][name] for r in ranks) / WORLD, expected[name])
    ]
    # each rank's inputs: its gradient, averaged, is the global gradient of its slice
    wrong += [
        f"rank {r} {name} gradient"
        for r, got in enumerate(ranks)
        for name in ("frames", "phrases", "bias")
        if not torch.allclose(got["grads"][name] / WORLD, expected[name][r * B : (r + 1) * B])
    ]
    assert wrong == []


def _waiting_rank(rank: int, folder: str, port: int) -> None:
    import datetime
    import os
    import time

    from trainer import distributed

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    world = distributed.setup("cpu", timeout=datetime.timedelta(seconds=1))
    try:
        if rank == 0:
            time.sleep(4)  # a peer that never reaches the collective in time (hung on I/O, stopped)
            return
        started = time.perf_counter()
        try:
            distributed.all_have(True, world)
            outcome = "returned"
        except RuntimeError:
            outcome = "raised"
        Path(folder, "waiting.txt").write_text(f"{outcome} {time.perf_counter() - started:.1f}")
    finally:
        distributed.teardown(world)


def test_a_rank_waiting_for_a_peer_gives_up_after_the_collective_timeout(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_waiting_rank, args=(str(tmp_path), port), nprocs=WORLD, join=True)
    outcome, seconds = (tmp_path / "waiting.txt").read_text().split()
    assert outcome == "raised" and float(seconds) < 3.5, (outcome, seconds)
