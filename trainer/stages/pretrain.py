"""Masked-autoencoder pretraining of the audio encoder (Cacophony stage 1): ``run(params)``.

Input: ``params.pretrain`` and the folders of audio it names: stage folders read through their
manifests (the clip stage's and the ambience stage's ``manifest.parquet``, the mix stage's
``mixtures.parquet``, each row's ``audio_path``) or any folder of audio files (an imported
corpus; every WAV, FLAC, OGG, AIFF or MP3 under it). With ``pretrain.heldout_mix`` (a mix stage
folder) its valid and test mixtures, and the event clips and background segments they use, are
left out: the held-out audio the trained model is scored on is never seen here.

Each step draws ``batch_size`` clips (every clip once per pass, in an order seeded by
``(seed, pass)``), decodes them to mono at the encoder's rate (resampling other rates), crops
``crop_s`` at a random offset seeded by ``(seed, pass, clip)`` or pads a shorter clip, and
trains :class:`~trainer.mae.MaskedAutoencoder` (masks from a generator seeded by ``seed``) with
AdamW, a linear warm-up and a cosine decay to ``final_lr``. The encoder's fbank is cut to the
whole 16-frame patches of ``crop_s``, and patches that hold only padding are not scored. A file
that does not decode is skipped (its batch is one clip short) and listed in ``skipped.csv``.
One seed gives the same weights on a CPU, whatever ``num_workers``.

Output, in ``pretrain.out_dir``: ``checkpoints/encoder.pt`` (the encoder's weights only,
:func:`~trainer.encoders.pretrained_file`; ``train.model.encoder_checkpoint`` loads it),
``pretrain_log.csv`` (step, loss, lr, clips/s), ``metrics.json`` (first and final loss, steps,
clips/s, FLOPs per step, MFU on CUDA), ``curves.png`` (the loss), ``config.json`` and
``skipped.csv``. A rerun starts over (the file holds no optimizer state to resume from).

Before anything is written, ``pretrain.out_dir`` is checked as the data stages check theirs
(:func:`~pipeline.outputs.check_out_dir`): not the filesystem root, the home folder or the project
root, and not one of the folders of :func:`kept_folders` (what it reads, the data stages' and the
other trainer stages' output folders), nor inside or around one. A run holds the folder's lock
(:func:`~pipeline.outputs.output_lock`) while it writes, so a second run into it is refused.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, Dataset

from pipeline.audio import AudioError, decode_mono
from pipeline.config.params import folders_besides
from pipeline.figures import pyplot, save_png
from pipeline.outputs import check_out_dir, output_lock, write_json
from pipeline.schema import Skip
from trainer import distributed
from trainer.checkpoint import write_torch_file
from trainer.config import PretrainParams
from trainer.encoders import AudioEncoder, build_encoder, pretrained_file
from trainer.features import Fbank
from trainer.logs import CsvLog, step_progress, write_skips
from trainer.mae import PATCH, MaskedAutoencoder, encoder_state, flops_per_step, masked_mse, model_flops_utilisation
from trainer.optim import lr_lambda
from trainer.precision import autocast_for, peak_bf16_flops

AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".aif", ".aiff", ".mp3")
# stage manifests that list a folder's audio (``audio_path`` relative to the folder), and their id column
MANIFESTS = (("manifest.parquet", ("clip_id", "segment_id")), ("mixtures.parquet", ("mixture_id",)))
HELDOUT_SPLITS = ("valid", "test")


@dataclass(frozen=True)
class Clip:
    id: str  # the manifest's id, or the file's path inside its folder
    path: str


def run(params, out_dir: Path | None = None) -> dict:
    """Pretrain ``params.pretrain.encoder`` as the section says, into ``out_dir`` (default
    ``pretrain.out_dir``); returns the summary written to ``metrics.json``. Raises
    :class:`~pipeline.outputs.OutDirError` for a folder it must not write into and
    :class:`~pipeline.outputs.OutputBusyError` while another run writes it, before writing anything."""
    out = Path(out_dir or params.pretrain.out_dir)
    check_out_dir(out, "pretrain.out_dir", kept_folders(params))
    with output_lock(out):
        return pretrain(params, out)


def kept_folders(params) -> dict[str, str | None]:
    """The folders ``pretrain.out_dir`` must not be, lie inside or hold, by setting: the audio
    folders it reads and the held-out mix folder, every data stage's folder, and the train and
    evaluate stages' output folders (whose ``config.json``, ``metrics.json`` and ``curves.png`` it
    would overwrite)."""
    m = params.pretrain
    return {
        **folders_besides(params, "pretrain.out_dir"),
        **{f"pretrain.audio[{i}]": a for i, a in enumerate(m.audio)},
        "pretrain.heldout_mix": m.heldout_mix,
        "train.out_dir": params.train.out_dir,
        "evaluate.out_dir": params.evaluate.out_dir,
    }


def pretrain(params, out: Path) -> dict:
    """:func:`run`'s work, into ``out`` (checked and locked)."""
    m: PretrainParams = params.pretrain
    device = distributed.pick_device(m.device)
    if m.threads:
        torch.set_num_threads(m.threads)
    clips, left_out = list_clips(m.audio, m.heldout_mix)
    torch.manual_seed(params.seed)  # the initial weights
    model = MaskedAutoencoder(
        cropped_encoder(build_encoder(m.encoder), m.crop_s), m.decoder_dim, m.decoder_depth, m.decoder_heads, m.mask_ratio
    ).to(device)
    data = CropDataset(clips, params.seed, model.encoder.sample_rate_hz, model.encoder.input_samples(m.crop_s))
    loader = DataLoader(
        data,
        batch_sampler=endless_batches(m.batch_size),
        num_workers=m.num_workers,
        collate_fn=collate,
        pin_memory=device.type == "cuda",
    )
    optimizer = adamw(model, m)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(m))
    masks = torch.Generator().manual_seed(params.seed)
    autocast = autocast_for(m.precision, device)

    out.mkdir(parents=True, exist_ok=True)
    write_json(
        out / "config.json",
        {"seed": params.seed, "pretrain": dataclasses.asdict(m), "clips": len(clips), "heldout_left_out": left_out},
    )
    log, skips = CsvLog(out / "pretrain_log.csv"), {}  # skips: path -> Skip, each file once
    log.rows = []
    progress = step_progress("pretrain", m.steps)
    step, clips_seen, first_loss, loss = 0, 0, None, float("nan")
    started = time.perf_counter()
    # the loop: one optimizer step per batch of decodable clips, until pretrain.steps
    for batch in loader:
        for s in batch["skips"]:
            skips.setdefault(s.path, s)
        if len(skips) == len(clips):
            raise ValueError(
                f"pretrain: none of the {len(clips)} audio files decodes; each one and why is in {out / 'skipped.csv'}"
            )
        if batch["wave"] is None:
            write_skips(out / "skipped.csv", list(skips.values()))
            continue
        wave, lengths = batch["wave"].to(device, non_blocking=True), batch["lengths"].to(device)  # (B, S), (B,)
        with autocast():
            result = model(wave, masks)
        scored = result.mask & audio_patches(model, lengths)  # (B, N): masked patches holding audio
        loss_t = masked_mse(result.prediction, result.target, scored)
        loss_t.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step, clips_seen, loss = step + 1, clips_seen + len(lengths), float(loss_t.detach())
        first_loss = loss if first_loss is None else first_loss
        progress.update(1)
        progress.set_postfix({"loss": f"{loss:.3f}"}, refresh=False)
        if step % m.log_every_steps == 0 or step == m.steps:
            log.add(
                {
                    "step": step,
                    "loss": loss,
                    "lr": scheduler.get_last_lr()[0],
                    "clips_per_s": clips_seen / max(1e-9, time.perf_counter() - started),
                }
            )
            log.flush()
        if step == m.steps:
            break
    wall_s = time.perf_counter() - started
    progress.close()

    # the outputs: the encoder's weights, the logs, metrics.json and curves.png
    write_torch_file(
        out / "checkpoints" / "encoder.pt",
        pretrained_file(
            m.encoder, encoder_state(model), steps=step, loss=loss, seed=params.seed, mask_ratio=m.mask_ratio, crop_s=m.crop_s
        ),
    )
    write_skips(out / "skipped.csv", list(skips.values()))
    flops = flops_per_step(model, m.batch_size, m.crop_s)
    summary = {
        "encoder": m.encoder,
        "steps": step,
        "first_loss": first_loss,
        "final_loss": loss,
        "clips": len(clips),
        "clips_seen": clips_seen,
        "clips_per_s": round(clips_seen / wall_s, 3),
        "wall_s": round(wall_s, 1),
        "skipped": len(skips),
        "heldout_left_out": left_out,
        "flops_per_step": flops,
        "device": str(device),
        "mfu": mfu(flops, wall_s / max(1, step), device),
    }
    write_json(out / "metrics.json", summary)
    plot_loss(log.rows, out / "curves.png")
    print(
        f"pretrain: {step} steps of {m.encoder} on {len(clips)} clips ({len(skips)} skipped), loss {first_loss:.3f} -> {loss:.3f}, "
        f"{summary['clips_per_s']:.1f} clips/s; encoder weights in {out / 'checkpoints' / 'encoder.pt'}"
    )
    return summary


# --------------------------------------------------------------------------- the audio


def list_clips(folders: tuple[str, ...], heldout_mix: str | None) -> tuple[list[Clip], int]:
    """Every clip of ``folders`` (stage manifests' rows, else the audio files under the folder),
    less the held-out audio of mix folder ``heldout_mix``; returns ``(clips, how many were left out)``."""
    heldout = heldout_ids(Path(heldout_mix)) if heldout_mix else set()
    clips, left_out = [], 0
    for folder in map(Path, folders):
        if not folder.is_dir():
            raise FileNotFoundError(f"pretrain: no folder {folder}; make it (dvc repro) or change pretrain.audio")
        for clip in folder_clips(folder):
            if clip.id in heldout:
                left_out += 1
            else:
                clips.append(clip)
    if not clips:
        raise ValueError(
            f"pretrain: no audio files in {', '.join(folders)}"
            + (f" outside {heldout_mix}'s held-out splits" if left_out else "")
        )
    return clips, left_out


def folder_clips(folder: Path) -> list[Clip]:
    """A folder's clips: the rows of its stage manifest (:data:`MANIFESTS`), or every audio file under it."""
    for name, id_columns in MANIFESTS:
        manifest = folder / name
        if not manifest.exists():
            continue
        columns = pq.read_schema(manifest).names
        id_column = next((c for c in id_columns if c in columns), None)
        if id_column and "audio_path" in columns:
            rows = pq.read_table(manifest, columns=[id_column, "audio_path"]).to_pylist()
            return [Clip(str(r[id_column]), str(folder / r["audio_path"])) for r in rows]
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in AUDIO_EXTENSIONS and p.is_file())
    return [Clip(p.relative_to(folder).as_posix(), str(p)) for p in files]


def heldout_ids(mix_dir: Path) -> set[str]:
    """Ids of the held-out audio of a mix stage folder: its valid and test mixtures, and the event
    clips (``occurrences.parquet``) and background segments they use."""
    mixtures, occurrences = mix_dir / "mixtures.parquet", mix_dir / "occurrences.parquet"
    if not (mixtures.exists() and occurrences.exists()):
        raise FileNotFoundError(
            f"pretrain: {mix_dir} holds no mixtures.parquet and occurrences.parquet; point pretrain.heldout_mix "
            "at the mix stage's folder, or set it to null to use every file"
        )
    rows = pq.read_table(mixtures, columns=["mixture_id", "split", "background_id"]).to_pylist()
    held = {r["mixture_id"] for r in rows if r["split"] in HELDOUT_SPLITS}
    backgrounds = {r["background_id"] for r in rows if r["mixture_id"] in held and r["background_id"]}
    events = {
        r["clip_id"] for r in pq.read_table(occurrences, columns=["mixture_id", "clip_id"]).to_pylist() if r["mixture_id"] in held
    }
    return held | backgrounds | events


class CropDataset(Dataset):
    """Index ``k`` (the ``k``-th clip drawn since the start) -> ``{"wave": (S,) float32, "length": n, "skip": None}``
    or ``{"skip": Skip}`` for a file that does not decode. Pass ``k // len(clips)`` visits every clip
    once, in an order seeded by ``(seed, pass)``; the crop offset is seeded by ``(seed, pass, clip)``."""

    def __init__(self, clips: list[Clip], seed: int, sample_rate_hz: int, input_samples: int):
        self.clips, self.seed, self.sample_rate_hz, self.input_samples = clips, seed, sample_rate_hz, input_samples

    def __len__(self) -> int:
        return len(self.clips)

    def clip_at(self, k: int) -> tuple[int, int]:
        """``(pass, clip index)`` of draw ``k``."""
        n = len(self.clips)
        epoch = k // n
        return epoch, int(np.random.default_rng([self.seed, epoch]).permutation(n)[k % n])

    def __getitem__(self, k: int) -> dict:
        epoch, i = self.clip_at(k)
        clip = self.clips[i]
        try:
            x = decode_mono(clip.path, self.sample_rate_hz)
        except AudioError as e:
            return {"skip": Skip(clip.id, clip.path, e.reason, e.detail)}
        n = self.input_samples
        if len(x) > n:
            start = int(np.random.default_rng([self.seed, epoch, i]).integers(0, len(x) - n + 1))
            x = x[start : start + n]
        length = len(x)
        return {"wave": np.pad(x, (0, n - length)), "length": length, "skip": None}


def endless_batches(batch_size: int) -> Iterator[list[int]]:
    """Batches of draw indices ``[0..B), [B..2B), ...`` without end: the loop stops at ``pretrain.steps``."""
    for start in itertools.count(0, batch_size):
        yield list(range(start, start + batch_size))


def collate(items: list[dict]) -> dict:
    """Items -> ``{"wave": (B, S) or None, "lengths": (B,), "skips": [...]}``; skipped files drop out."""
    good = [it for it in items if it["skip"] is None]
    return {
        "wave": torch.from_numpy(np.stack([it["wave"] for it in good])) if good else None,
        "lengths": torch.tensor([it["length"] for it in good], dtype=torch.long),
        "skips": [it["skip"] for it in items if it["skip"] is not None],
    }


# --------------------------------------------------------------------------- the model


def cropped_encoder(encoder: AudioEncoder, crop_s: float) -> AudioEncoder:
    """``encoder`` with its fbank cut to the whole :data:`~trainer.mae.PATCH`-frame patches of
    ``crop_s`` (at most its own frames), so no patch is padding for a full-length clip. The fbank
    has no weights: the encoder's state dict, and what loads it later, are unchanged."""
    p = encoder.fbank.params
    samples = encoder.input_samples(crop_s)
    frames = (1 + (samples - p.window_samples) // p.shift_samples if samples >= p.window_samples else 0) // PATCH * PATCH
    if frames < PATCH:
        raise ValueError(
            f"pretrain: crop_s {crop_s} s gives fewer fbank frames than one {PATCH}-frame patch; raise pretrain.crop_s"
        )
    encoder.fbank = Fbank(dataclasses.replace(p, target_frames=min(frames, p.target_frames)))
    return encoder


def audio_patches(model: MaskedAutoencoder, lengths: torch.Tensor) -> torch.Tensor:
    """``(B, N)`` bool: patches whose first frame starts inside the clip's ``lengths`` (B,) samples,
    not in its padding (patches are time-major, ``freq_patches`` per time step)."""
    shift = model.encoder.fbank.params.shift_samples
    frames_with_audio = (lengths + shift - 1) // shift  # frames starting before the clip's end
    time_patches = (frames_with_audio + model.patch - 1) // model.patch  # (B,)
    t = torch.arange(model.num_patches, device=lengths.device) // model.freq_patches  # (N,) time index of each patch
    return t.unsqueeze(0) < time_patches.unsqueeze(1)


def adamw(model: torch.nn.Module, m: PretrainParams) -> torch.optim.AdamW:
    """AdamW over the encoder and decoder; weight decay on matrices only (not on biases, norms,
    the CLS and mask tokens), as MAE does."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    plain = [p for n, p in named if p.dim() < 2 or n.endswith(("cls_token", "mask_token"))]
    groups = [
        {"params": [p for _, p in named if not any(p is q for q in plain)], "weight_decay": m.weight_decay},
        {"params": plain, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=m.lr, betas=tuple(m.betas))


def schedule(m: PretrainParams):
    """Step -> learning-rate multiplier: linear warm-up over ``warmup_steps``, then a cosine from 1
    down to ``final_lr / lr`` at ``steps`` (Cacophony: to 1e-6)."""
    floor, warm_cosine = m.final_lr / m.lr, lr_lambda(m.warmup_steps, m.steps)
    return lambda step: warm_cosine(step) if step < m.warmup_steps else floor + (1 - floor) * warm_cosine(step)


def mfu(flops: int, step_s: float, device: torch.device) -> float | None:
    """Model FLOPs utilisation against the GPU's dense bf16 peak (:func:`~trainer.precision.peak_bf16_flops`);
    None on a CPU or an unlisted GPU."""
    if device.type != "cuda":
        return None
    peak = peak_bf16_flops(torch.cuda.get_device_name(device))
    return round(model_flops_utilisation(flops, step_s, peak), 4) if peak else None


def plot_loss(rows: list[dict], path: Path) -> None:
    """The masked-patch reconstruction loss over steps."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label="masked-patch MSE")
    ax.set(xlabel="step", ylabel="loss (normalised patches)", title="MAE pretraining")
    if rows and all(r["loss"] > 0 and math.isfinite(r["loss"]) for r in rows):
        ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    save_png(fig, path, dpi=100)
