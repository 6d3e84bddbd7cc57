"""The training loop: ``run(params)`` trains FineLAP on the ``train.data`` sources.

Input: ``params.train`` (data, model, loss, optim) and the shard folders it names. Output, in
``train.out_dir``: ``checkpoints/latest.pt`` and ``checkpoints/best.pt`` (lowest held-out loss),
``train_log.csv`` (every ``log_every_steps``: loss terms, temperatures, biases, lr, clips/s),
``valid_log.csv`` (held-out scores after every epoch, epoch 0 being the untrained model),
``metrics.json`` (final and best held-out scores), ``curves.png``, ``config.json`` and
``skipped.csv``. Start it with ``sedsynth train`` or, on several GPUs, with
``torchrun --nproc_per_node=8 -m sedsynth train``; a rerun resumes from ``latest.pt`` when its config
matches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from pipeline.outputs import write_json
from trainer import checkpoint, distributed
from trainer.config import current_train_section
from trainer.data.stream import TrainStream, collate, make_stream
from trainer.heldout import score
from trainer.logs import CsvLog, plot_curves, write_skips
from trainer.model import build_model
from trainer.objective import Objective
from trainer.optim import lr_lambda, optimizer_for
from trainer.precision import autocast_for

# Settings that may change between a run and its resume without invalidating the checkpoint.
RESUMABLE_CHANGES = ("resume", "out_dir", "log_every_steps", "checkpoint_every_steps", "optim.epochs", "optim.max_steps",
                     "data.num_workers", "threads", "device", "compile")
NO_SCORES = {"valid_loss": float("inf")}  # the best held-out scores before any epoch


def run(params, out_dir: Path | None = None) -> dict:
    """Train as ``params.train`` says, into ``out_dir`` (default ``train.out_dir``); returns the
    summary written to ``metrics.json`` (``{}`` on DDP ranks other than 0)."""
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
    stream = make_stream(params, model.encoder, t.data.sources, shuffle=True, rank=world.rank, world_size=world.size)
    batch_size, grad_accum = t.data.batch_size, t.optim.grad_accum
    loader = DataLoader(stream, batch_size=batch_size, num_workers=t.data.num_workers, collate_fn=collate, drop_last=True,
                        pin_memory=world.device.type == "cuda", persistent_workers=False)
    steps_per_epoch = optimizer_steps_per_epoch(stream, world.size, t.data.num_workers, batch_size, grad_accum)
    total = t.optim.max_steps or steps_per_epoch * t.optim.epochs
    optimizer = optimizer_for(objective, t.optim)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(t.optim.warmup_steps, total))
    valid_loader = None
    if t.data.valid is not None and world.main:
        valid_loader = DataLoader(make_stream(params, model.encoder, [t.data.valid], shuffle=False), batch_size=batch_size,
                                  num_workers=0, collate_fn=collate)
    config = config_of(params, data_fingerprint(stream))
    latest, best_path = out / "checkpoints" / "latest.pt", out / "checkpoints" / "best.pt"

    # start, or resume where latest.pt stopped
    step, epoch, micro_batches_done, best = start_or_resume(latest, t.resume, config, objective, optimizer, scheduler)
    train_log, valid_log = open_logs(out, step)
    ddp = torch.nn.parallel.DistributedDataParallel(objective) if world.size > 1 else objective
    autocast = autocast_for(t.precision, world.device)
    if world.main:
        write_json(out / "config.json", config)
        write_skips(out / "skipped.csv", stream.skips)
        if step == 0 and valid_loader is not None:
            valid_log.add({"epoch": 0, "step": 0, **score(objective, valid_loader, world.device, autocast)})
    skipped_items = list(stream.skips)  # rows that could not be decoded, with their reasons
    progress = _progress(world, total, step)
    clips_seen, started = 0, time.perf_counter()  # by this rank in this process, for clips/s

    # the epoch loop: micro-batches of batch_size clips, an optimizer step every grad_accum of them
    while step < total:
        stream.set_epoch(epoch, micro_batches_done, batch_size)  # a resume skips the micro-batches done
        batches = iter(loader)
        data_ended = False
        while step < total:
            b = next(batches, None)
            if not distributed.all_have(b is not None, world):
                data_ended = True
                break
            skipped_items += b.skips
            b = b.to(world.device)
            torch.manual_seed(params.seed + 1000 * world.rank + 7919 * step + micro_batches_done)  # dropout: fixed per rank and step
            sync = (micro_batches_done + 1) % grad_accum == 0
            with (contextlib.nullcontext() if sync or world.size == 1 else ddp.no_sync()), autocast():
                terms = ddp(b)
            (terms["loss"] / grad_accum).backward()
            micro_batches_done, clips_seen = micro_batches_done + 1, clips_seen + len(b.ids)
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
                checkpoint.save(latest, objective, optimizer, scheduler, step, epoch, micro_batches_done, config, {"best": best})
                train_log.flush()
            if world.main and (step % t.log_every_steps == 0 or step == total):
                rate = clips_seen * world.size / (time.perf_counter() - started)
                train_log.add({"step": step, "epoch": epoch, "lr": scheduler.get_last_lr()[0], "clips_per_s": rate,
                               **{k: float(v.detach()) for k, v in terms.items()}})

        # the end of an epoch (or of max_steps, which can stop mid-epoch: latest.pt then keeps this
        # epoch and its micro-batches done, so a resume goes on from there)
        epoch_finished = data_ended or micro_batches_done >= steps_per_epoch * grad_accum
        resume_at = (epoch + 1, 0) if epoch_finished else (epoch, micro_batches_done)
        epoch, micro_batches_done = epoch + 1, 0
        if world.main:
            scores = score(objective, valid_loader, world.device, autocast) if valid_loader is not None else {}
            valid_log.add({"epoch": epoch, "step": step, **scores})
            if scores.get("valid_loss", float("inf")) < best["valid_loss"]:
                best = {"epoch": epoch, "step": step, **scores}
                checkpoint.save(best_path, objective, None, None, step, epoch, 0, config, {"best": best})
            checkpoint.save(latest, objective, optimizer, scheduler, step, *resume_at, config, {"best": best})
            train_log.flush(), valid_log.flush()
            write_skips(out / "skipped.csv", skipped_items)
        distributed.barrier(world)
    progress.close()
    summary = {}
    if world.main:
        summary = {"steps": step, "epochs": epoch, "train_clips_per_s": clips_seen * world.size / max(1e-9, time.perf_counter() - started),
                   "final": valid_log.rows[-1] if valid_log.rows else {}, "untrained": valid_log.rows[0] if valid_log.rows else {},
                   "best": best, "skipped": len(skipped_items)}
        write_json(out / "metrics.json", summary)
        plot_curves(train_log.rows, valid_log.rows, out / "curves.png")
    distributed.teardown(world)
    return summary


def start_or_resume(latest: Path, resume: bool, config: dict, objective, optimizer, scheduler) -> tuple[int, int, int, dict]:
    """Where the run starts: ``(optimizer step, epoch, micro-batches done in it, best held-out scores)``.

    With ``resume`` and a ``latest`` checkpoint whose config matches ``config`` (:func:`compatible`),
    its weights, optimizer, scheduler and RNG state are loaded into the given objects and its
    position is returned; otherwise (no checkpoint, or other settings: a message says which)
    the very start. A ``latest`` that cannot be read raises :class:`checkpoint.CheckpointError`
    rather than being overwritten: it may be the only copy of a long run.
    """
    start = (0, 0, 0, dict(NO_SCORES))
    if not (resume and latest.exists()):
        return start
    try:
        saved = checkpoint.read(latest, "train")
    except checkpoint.CheckpointError as e:
        raise checkpoint.CheckpointError(f"{e}; cannot resume: move it away or set train.resume=false to start over") from None
    saved_config = {**saved["config"], "train": current_train_section(saved["config"]["train"])}
    changed = compatible(saved_config, config)
    if changed:
        print(f"train: not resuming from {latest}: settings changed ({', '.join(changed[:6])}); starting over")
        return start
    state = checkpoint.restore(saved, objective, optimizer, scheduler, path=latest)
    print(f"train: resuming from {latest} at step {state['step']} (epoch {state['epoch']}, batch {state['batches_in_epoch']})")
    return state["step"], state["epoch"], state["batches_in_epoch"], state["metrics"].get("best", dict(NO_SCORES))


def open_logs(out: Path, step: int) -> tuple[CsvLog, CsvLog]:
    """``train_log.csv`` and ``valid_log.csv`` in ``out`` with their rows up to ``step``: none when
    starting over, so the curves never show a step twice."""
    logs = CsvLog(out / "train_log.csv"), CsvLog(out / "valid_log.csv")
    for log in logs:
        if step:
            log.keep_until(step)
        else:
            log.rows = []
    return logs


def optimizer_steps_per_epoch(stream: TrainStream, world_size: int, num_workers: int, batch_size: int, grad_accum: int) -> int:
    """Optimizer steps every rank takes in one epoch of ``stream`` (each DataLoader worker drops
    its last partial batch); raises ValueError when an epoch holds not even one."""
    workers = max(1, num_workers)
    steps = stream.rows_per_worker(world_size * workers) // batch_size * workers // grad_accum
    if steps == 0:
        raise ValueError(f"train: an epoch has fewer than batch_size x grad_accum = {batch_size * grad_accum} clips per rank; "
                         "lower train.data.batch_size or add data")
    return steps


def data_fingerprint(stream: TrainStream) -> str:
    """A digest of the training data: each source's files with their sizes and row groups (and
    their sha256 where the shard index lists them), so a resume never continues on other data."""
    h = hashlib.sha256()
    for source in stream.sources:
        h.update(repr(source.row_groups()).encode())
    return h.hexdigest()[:16]


def config_of(params, fingerprint: str = "") -> dict:
    """What a checkpoint records of the run: the seed, the ``train`` section and the data fingerprint."""
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


def _progress(world, total: int, initial: int):
    import sys

    from tqdm.auto import tqdm

    # In a log (DVC, a cluster job) redraw every 30 s instead of on every step.
    every = 0.1 if sys.stderr.isatty() else 30.0
    return tqdm(total=total, initial=initial, desc="train", unit="step", disable=not world.main, dynamic_ncols=True, mininterval=every)
