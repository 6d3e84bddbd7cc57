"""The training loop: ``run(params)`` trains FineLAP on the ``train.data`` sources.

Input: ``params.train`` (data, model, loss, optim) and the shard folders it names. Output, in
``train.out_dir``: ``checkpoints/latest.pt`` and ``checkpoints/best.pt`` (lowest held-out loss),
``train_log.csv`` (every ``log_every_steps``: loss terms, temperatures, biases, lr, clips/s),
``valid_log.csv`` (held-out scores after every epoch, epoch 0 being the untrained model),
``metrics.json`` (final and best held-out scores), ``curves.png``, ``config.json`` and
``skipped.csv``. Start it with ``sedsynth train`` or, on several GPUs, with
``torchrun --nproc_per_node=8 -m trainer``; a rerun resumes from ``latest.pt`` when its config
matches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from pipeline.outputs import write_json
from trainer import checkpoint, distributed
from trainer.data.negatives import (
    ClusterTables,
    NegativeSampler,
    default_clusters_folder,
)
from trainer.data.stream import ItemBuilder, ItemParams, TrainStream, collate
from trainer.heldout import score
from trainer.logs import CsvLog, plot_curves, write_skips
from trainer.model import build_model
from trainer.objective import Objective

# Settings that may change between a run and its resume without invalidating the checkpoint.
RESUMABLE_CHANGES = ("resume", "out_dir", "log_every_steps", "checkpoint_every_steps", "optim.epochs", "optim.max_steps",
                     "data.num_workers", "threads", "device", "compile")


def make_stream(params, encoder, sources, shuffle: bool, world=None) -> TrainStream:
    t = params.train
    folder = t.data.clusters or default_clusters_folder(t.data.sources[0].path)
    sampler = NegativeSampler(ClusterTables.read(folder), t.data.negatives)
    items = ItemParams(encoder.sample_rate_hz, encoder.input_samples(t.data.crop_s), t.data.num_phrases,
                       random_crop=shuffle, tag_replacement_p=t.data.tag_replacement_p if shuffle else 0.0,
                       min_label_overlap=t.data.min_label_overlap)
    builder = ItemBuilder(items, encoder.frame_spans_s(), sampler, params.seed)
    rank, size = (world.rank, world.size) if world is not None else (0, 1)
    return TrainStream(list(sources), builder, params.seed, t.data.shuffle_buffer if shuffle else 1, t.data.piece_rows,
                       rank=rank, world_size=size, shuffle=shuffle)


def lr_lambda(warmup: int, total: int):
    """Linear warm-up to 1, then cosine to 0 at ``total`` steps."""
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))
    return f


def optimizer_for(objective, o) -> torch.optim.Optimizer:
    """AdamW; weight decay only on matrices (not on biases, norms, temperatures)."""
    params = [p for p in objective.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    other = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": o.weight_decay}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=o.lr, betas=tuple(o.betas))


def autocast_for(precision: str, device: torch.device):
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext


def data_fingerprint(stream: TrainStream) -> str:
    """A digest of the training data: each source's files with their sizes and row groups (and
    their sha256 where the shard index lists them), so a resume never continues on other data."""
    import hashlib

    h = hashlib.sha256()
    for source in stream.sources:
        h.update(repr(source.row_groups()).encode())
    return h.hexdigest()[:16]


def config_of(params, fingerprint: str = "") -> dict:
    return {"seed": params.seed, "train": dataclasses.asdict(params.train), "data_fingerprint": fingerprint}


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out |= _flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v}
    return out


def compatible(saved: dict, current: dict) -> list[str]:
    """Config keys that differ between a checkpoint and this run (beyond the resumable ones)."""
    a, b = _flat(saved), _flat(current)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and not k.removeprefix("train.").startswith(RESUMABLE_CHANGES))


def run(params, out_dir: Path | None = None) -> dict:
    t = params.train
    out = Path(out_dir or t.out_dir)
    world = distributed.setup(t.device)
    if t.threads:
        torch.set_num_threads(t.threads)
    torch.manual_seed(params.seed)  # the same initial weights on every rank
    model = build_model(t.model)
    objective = Objective(model, t.loss).to(world.device)
    if t.compile:
        model.encoder.compile()
    stream = make_stream(params, model.encoder, t.data.sources, shuffle=True, world=world)
    workers, batch = max(1, t.data.num_workers), t.data.batch_size
    loader = DataLoader(stream, batch_size=batch, num_workers=t.data.num_workers, collate_fn=collate, drop_last=True,
                        pin_memory=world.device.type == "cuda", persistent_workers=False)
    steps_per_epoch = stream.rows_per_worker(world.size * workers) // batch * workers // t.optim.grad_accum
    if steps_per_epoch == 0:
        raise ValueError(f"train: an epoch has fewer than batch_size x grad_accum = {batch * t.optim.grad_accum} clips per rank; "
                         "lower train.data.batch_size or add data")
    total = t.optim.max_steps or steps_per_epoch * t.optim.epochs
    optimizer = optimizer_for(objective, t.optim)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(t.optim.warmup_steps, total))
    valid_loader = None
    if t.data.valid is not None and world.main:
        valid = make_stream(params, model.encoder, [t.data.valid], shuffle=False)
        valid_loader = DataLoader(valid, batch_size=batch, num_workers=0, collate_fn=collate)
    config = config_of(params, data_fingerprint(stream))
    step, epoch, skip = 0, 0, 0
    train_log, valid_log = CsvLog(out / "train_log.csv"), CsvLog(out / "valid_log.csv")
    latest, best_path = out / "checkpoints" / "latest.pt", out / "checkpoints" / "best.pt"
    best = {"valid_loss": float("inf")}
    if t.resume and latest.exists():
        try:
            saved = checkpoint.read(latest, "train")
        except checkpoint.CheckpointError as e:  # never overwrite it silently: it may be the only copy of a long run
            raise checkpoint.CheckpointError(f"{e}; cannot resume: move it away or set train.resume=false to start over") from None
        changed = compatible(saved["config"], config)
        if changed:
            print(f"train: not resuming from {latest}: settings changed ({', '.join(changed[:6])}); starting over")
        else:
            state = checkpoint.restore(saved, objective, optimizer, scheduler, path=latest)
            step, epoch, skip = state["step"], state["epoch"], state["batches_in_epoch"]
            best = state["metrics"].get("best", best)
            train_log.keep_until(step), valid_log.keep_until(step)
            print(f"train: resuming from {latest} at step {step} (epoch {epoch}, batch {skip})")
    if step == 0:  # starting over: the logs hold no rows of an earlier run
        train_log.rows, valid_log.rows = [], []
    ddp = torch.nn.parallel.DistributedDataParallel(objective) if world.size > 1 else objective
    autocast = autocast_for(t.precision, world.device)
    if world.main:
        (out / "config.json").parent.mkdir(parents=True, exist_ok=True)
        write_json(out / "config.json", config)
        write_skips(out / "skipped.csv", stream.skips)
        if step == 0 and valid_loader is not None:
            valid_log.add({"epoch": 0, "step": 0, **score(objective, valid_loader, world.device, autocast)})
    skipped = list(stream.skips)
    progress = _progress(world, total, step)
    seen, started = 0, time.perf_counter()
    while step < total:
        stream.set_epoch(epoch, skip, batch)
        batches = iter(loader)
        micro, ended = skip, False  # micro-batches done in this epoch (a resume starts past them)
        while step < total:
            b = next(batches, None)
            if not distributed.all_have(b is not None, world):
                ended = True
                break
            skipped += b.skips
            b = b.to(world.device)
            torch.manual_seed(params.seed + 1000 * world.rank + 7919 * step + micro)  # dropout: fixed per rank and step
            sync = (micro + 1) % t.optim.grad_accum == 0
            with (contextlib.nullcontext() if sync or world.size == 1 else ddp.no_sync()), autocast():
                terms = ddp(b)
            (terms["loss"] / t.optim.grad_accum).backward()
            micro, seen, skip = micro + 1, seen + len(b.ids), skip + 1
            if not sync:
                continue
            if t.optim.clip_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(objective.parameters(), t.optim.clip_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            progress.update(1)
            progress.set_postfix({k: f"{float(v.detach()):.3f}" for k, v in terms.items() if k in ("loss", "clip", "frame")}, refresh=False)
            if world.main and t.checkpoint_every_steps and step % t.checkpoint_every_steps == 0:
                checkpoint.save(latest, objective, optimizer, scheduler, step, epoch, skip, config, {"best": best})
                train_log.flush()
            if world.main and (step % t.log_every_steps == 0 or step == total):
                rate = seen * world.size / (time.perf_counter() - started)
                train_log.add({"step": step, "epoch": epoch, "lr": scheduler.get_last_lr()[0], "clips_per_s": rate,
                               **{k: float(v.detach()) for k, v in terms.items()}})
        # max_steps can stop mid-epoch: latest.pt then keeps this epoch and its batches done, so a resume goes on from there
        resume_at = (epoch + 1, 0) if ended or skip >= steps_per_epoch * t.optim.grad_accum else (epoch, skip)
        epoch, skip = epoch + 1, 0
        if world.main:
            scores = score(objective, valid_loader, world.device, autocast) if valid_loader is not None else {}
            valid_log.add({"epoch": epoch, "step": step, **scores})
            if scores.get("valid_loss", float("inf")) < best["valid_loss"]:
                best = {"epoch": epoch, "step": step, **scores}
                checkpoint.save(best_path, objective, None, None, step, epoch, 0, config, {"best": best})
            checkpoint.save(latest, objective, optimizer, scheduler, step, *resume_at, config, {"best": best})
            train_log.flush(), valid_log.flush()
            write_skips(out / "skipped.csv", skipped)
        distributed.barrier(world)
    progress.close()
    summary = {}
    if world.main:
        summary = {"steps": step, "epochs": epoch, "train_clips_per_s": seen * world.size / max(1e-9, time.perf_counter() - started),
                   "final": valid_log.rows[-1] if valid_log.rows else {}, "untrained": valid_log.rows[0] if valid_log.rows else {},
                   "best": best, "skipped": len(skipped)}
        write_json(out / "metrics.json", summary)
        plot_curves(train_log.rows, valid_log.rows, out / "curves.png")
    distributed.teardown(world)
    return summary


def _progress(world, total: int, initial: int):
    import sys

    from tqdm.auto import tqdm

    # In a log (DVC, a cluster job) redraw every 30 s instead of on every step.
    every = 0.1 if sys.stderr.isatty() else 30.0
    return tqdm(total=total, initial=initial, desc="train", unit="step", disable=not world.main, dynamic_ncols=True, mininterval=every)

