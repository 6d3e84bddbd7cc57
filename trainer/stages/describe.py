"""``sedsynth describe``: one caption per audio file from a checkpoint's captioning decoder.

Input: audio files of any length, sample rate and channel count (anything libsndfile reads,
read a block at a time as ``sedsynth detect`` reads them) and a trainer checkpoint trained with
``train.loss.caption_weight > 0`` (its stored config rebuilds the model, its decoder and its
word vocabulary, so no ``params.yaml`` is needed). Output: a caption per file, decoded greedily
(autoregressive) or in one parallel pass (``decoding``; default: parallel for a decoder trained
in parallel mode, else greedy).

A file is cut into windows of the model's input length (``train.data.crop_s``), one after the
other; each window is encoded alone (a short file, or the last part of a long one, is padded
with silence as training padded short clips) and the decoder cross-attends to the encoder
frames of every window, in order (the padding's frames dropped after the first window), so a
long file gets one caption of all of it. A checkpoint without a decoder is refused with the
setting that adds one; a file that cannot be read is reported and the others are still captioned.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch

from pipeline.audio import AudioError, read_blocks
from pipeline.config.params import build
from trainer import checkpoint
from trainer.captioner import WordVocabulary
from trainer.config import TrainParams, current_train_section
from trainer.model import build_model
from trainer.objective import Objective
from trainer.precision import autocast_for

NO_DECODER = (
    "has no captioning decoder: it was trained with train.loss.caption_weight = 0; train one with "
    "--set train.loss.caption_weight=1.0 (Cacophony's lambda_cap)"
)


class Captioner:
    """A trained objective's encoder and captioning decoder, ready to caption audio."""

    def __init__(self, objective: Objective, train: TrainParams, device: str = "auto", batch_size: int = 16):
        if objective.captioner is None:
            raise ValueError(f"describe: the model {NO_DECODER}")
        self.device = torch.device(
            "cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device)
        )
        self.objective = objective.to(self.device).eval()
        self.model, self.decoder = objective.model, objective.captioner
        self.autocast = autocast_for(train.precision, self.device)
        enc = self.model.encoder
        self.sample_rate_hz = enc.sample_rate_hz
        self.window_samples = enc.input_samples(train.data.crop_s)
        self.column_samples = enc.time_stride_frames * enc.fbank.params.shift_samples
        self.batch_size = batch_size

    @classmethod
    def from_checkpoint(cls, path: str | Path, **kwargs) -> Captioner:
        """The objective a trainer checkpoint describes, with its weights and its decoder's vocabulary."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(
                f"describe: no checkpoint at {path}; train first (sedsynth train with "
                "--set train.loss.caption_weight=1.0) or pass --checkpoint"
            )
        state = checkpoint.read(path, "describe")
        train = build(TrainParams, current_train_section(state["config"]["train"]), "train")
        if train.loss.caption_weight <= 0:
            raise ValueError(f"describe: {path} {NO_DECODER}")
        objective = Objective(build_model(train.model), train.loss)
        checkpoint.restore(state, objective, restore_rng=False, path=path)
        vocabulary = state["config"].get("caption_vocabulary")
        if vocabulary is not None:
            objective.use_caption_vocabulary(WordVocabulary.from_dict(vocabulary, f"{path}'s caption_vocabulary"))
        return cls(objective, train, **kwargs)

    @torch.no_grad()
    def frames(self, blocks: Iterable[np.ndarray]) -> torch.Tensor:
        """One file as mono blocks at ``sample_rate_hz`` -> the encoder frames ``(1, T, D)`` of its windows, in order."""
        out, queue = [], []
        buffer, filled = np.zeros(self.window_samples, np.float32), 0

        def flush() -> None:
            batch = torch.from_numpy(np.stack([w for w, _ in queue])).to(self.device)  # (B, window_samples)
            with self.autocast():
                _, _, frames = self.model.encode_audio_frames(batch)  # (B, L, D)
            for (_, samples), f in zip(queue, frames.float()):
                keep = f.shape[0] if samples == self.window_samples or not out else -(-samples // self.column_samples)
                out.append(f[:keep])
            queue.clear()

        for block in blocks:
            while len(block):
                take = min(len(block), self.window_samples - filled)
                buffer[filled : filled + take], filled, block = block[:take], filled + take, block[take:]
                if filled == self.window_samples:
                    queue.append((buffer.copy(), filled))
                    buffer[:], filled = 0.0, 0
                    if len(queue) == self.batch_size:
                        flush()
        if filled:
            queue.append((buffer.copy(), filled))
        if queue:
            flush()
        return torch.cat(out).unsqueeze(0)

    @torch.no_grad()
    def caption(self, blocks: Iterable[np.ndarray], decoding: str | None = None) -> str:
        """One file as mono blocks -> its caption; ``decoding``: greedy, parallel or None (the decoder's own)."""
        features = self.frames(blocks)
        with self.autocast():
            return self.decoder.captions(features, method=decoding)[0]


def caption_files(captioner: Captioner, files: list[str], decoding: str | None = None) -> Iterator[tuple[str, str | None, str]]:
    """``(file, caption, "")`` per file that reads, ``(file, None, what went wrong)`` per file that does not, in order."""
    for file in files:
        try:
            yield file, captioner.caption(read_blocks(file, captioner.sample_rate_hz), decoding), ""
        except AudioError as e:
            yield file, None, f"cannot read it ({e.reason}: {e.detail})"


def main(args, params) -> int:
    """``sedsynth describe`` with its parsed ``args`` (audio, checkpoint, decoding, device) and ``params``
    (only ``evaluate.checkpoint``, ``evaluate.device`` and ``evaluate.batch_size`` are read): prints
    ``file<TAB>caption`` per file; 2 when a file is missing or unreadable."""
    e = params.evaluate
    captioner = Captioner.from_checkpoint(
        args.checkpoint or e.checkpoint, device=args.device or e.device, batch_size=e.batch_size
    )
    status = 0
    for file, text, why in caption_files(captioner, list(args.audio), args.decoding):
        if text is None:
            print(f"sedsynth describe: error: {file}: {why}", file=sys.stderr)
            status = 2
        else:
            print(f"{file}\t{text}", flush=True)
    return status
