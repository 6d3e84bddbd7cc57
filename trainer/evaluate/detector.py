"""A trained (or untrained) FineLAP model as a detector: audio of any length, rate and channel
count in, clip embeddings and per-frame query probabilities out.

Inputs: a checkpoint written by the trainer (its ``config`` rebuilds the model) or ``train``
params plus a seed (the untrained model), and audio as file paths, encoded bytes or arrays.
Outputs (:class:`ClipScores`): the clip embedding ``(d,)``, frame boundaries in seconds
``(L+1,)`` and, per vocabulary, frame probabilities ``(L, C)`` = sigmoid(t' cos + b') with the
checkpoint's frame temperature and bias (FLAM's per-text ones when the model has them).

Audio longer than the model's window (``train.data.crop_s``) is cut into windows that overlap
by ``overlap`` of their length, each aligned to the encoder's column grid; a column seen by
several windows gets the mean of their probabilities, and the clip embedding is the normalised
mean of the windows' clip embeddings. Windows of all clips are batched together, so a 10 s
test clip costs one forward pass however many vocabularies are scored on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline.audio import decode_mono as read_audio  # noqa: F401  (re-exported for stage and detect)
from pipeline.params import TrainParams, build
from trainer import checkpoint
from trainer.model import build_model
from trainer.objective import Objective
from trainer.train import autocast_for

ZERO_SHOT_TEMPLATE = "The sound of {}"


@dataclass(frozen=True)
class Vocabulary:
    """Query texts and their heads: unit embeddings ``(C, d)``, frame scale and bias ``(C,)``."""

    texts: tuple[str, ...]
    embeddings: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor


@dataclass
class ClipScores:
    """One clip: its embedding ``(d,)``, frame boundaries ``(L+1,)`` s and probabilities per vocabulary ``(L, C)``."""

    clip: np.ndarray
    timestamps_s: np.ndarray
    probs: list[np.ndarray]


class Detector:
    """A FineLAP model (with its loss heads) ready to score audio against text queries."""

    def __init__(self, objective: Objective, train: TrainParams, device: str = "auto", overlap: float = 0.5, batch_size: int = 16):
        if not 0 <= overlap < 1:
            raise ValueError(f"detector: overlap is {overlap}; use a fraction in [0, 1)")
        self.device = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device))
        self.objective = objective.to(self.device).eval()
        self.model, self.train_params = objective.model, train
        self.autocast = autocast_for(train.precision, self.device)
        enc = self.model.encoder
        self.sample_rate_hz = enc.sample_rate_hz
        self.window_samples = enc.input_samples(train.data.crop_s)
        self.column_samples = enc.time_stride_frames * enc.fbank.params.shift_samples
        spans = enc.frame_spans_s()
        self.columns = int(np.searchsorted(spans[:, 0], train.data.crop_s))  # columns that start inside the window
        self.column_s = self.column_samples / self.sample_rate_hz
        hop = round(self.window_samples * (1 - overlap) / self.column_samples) * self.column_samples
        self.hop_samples = max(self.column_samples, min(hop, self.columns * self.column_samples))
        self.batch_size = batch_size
        self.seed: int | None = None  # set by from_checkpoint

    @classmethod
    def from_checkpoint(cls, path: str | Path, **kwargs) -> Detector:
        """The model a trainer checkpoint describes, with its weights."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"detector: no checkpoint at {path}; train first (sedsynth train) or pass --checkpoint")
        state = torch.load(path, map_location="cpu", weights_only=False)
        train = build(TrainParams, state["config"]["train"], "train")
        objective = Objective(build_model(train.model), train.loss)
        checkpoint.load(path, objective, restore_rng=False)
        detector = cls(objective, train, **kwargs)
        detector.seed = state["config"].get("seed")  # the trainer's seed: its untrained twin starts from it
        return detector

    @classmethod
    def untrained(cls, train: TrainParams, seed: int, **kwargs) -> Detector:
        """The model ``train`` describes with the initial weights the trainer starts from."""
        torch.manual_seed(seed)
        return cls(Objective(build_model(train.model), train.loss), train, **kwargs)

    @torch.no_grad()
    def vocabulary(self, texts: Sequence[str]) -> Vocabulary:
        texts = tuple(texts)
        if not texts:
            d = self.model.text_proj[-1].out_features
            empty = torch.zeros(0, device=self.device)
            return Vocabulary(texts, torch.zeros(0, d, device=self.device), empty, empty)
        with self.autocast():
            emb, feature = self.model.encode_text(list(texts))
        emb = emb.float()
        if self.model.per_text is not None:
            scale, bias = self.model.per_text(feature.float())
        else:
            head = self.objective.frame_loss
            p = self.train_params.loss
            scale = (head.log_scale.exp() if head is not None else torch.tensor(p.init_scale)).to(self.device).expand(len(texts))
            bias = (head.bias if head is not None else torch.tensor(p.init_bias)).to(self.device).expand(len(texts))
        return Vocabulary(texts, emb, scale.float(), bias.float())

    def windows(self, num_samples: int) -> list[int]:
        """Start samples of the windows covering ``num_samples`` (multiples of the column hop)."""
        covered = self.columns * self.column_samples
        if num_samples <= covered:
            return [0]
        last = -(-(num_samples - covered) // self.column_samples) * self.column_samples
        starts = list(range(0, last, self.hop_samples))
        return starts + [last]

    def timestamps_s(self, num_samples: int) -> np.ndarray:
        """Frame boundaries ``(L+1,)`` of a clip: columns every ``column_s`` up to the clip's end."""
        duration = num_samples / self.sample_rate_hz
        n = max(1, int(np.ceil(duration / self.column_s - 1e-9)))
        edges = np.arange(n + 1) * self.column_s
        edges[-1] = duration
        return edges

    @torch.no_grad()
    def score(self, waves: Iterable[np.ndarray], vocabularies: Sequence[Vocabulary] | Iterable[Sequence[Vocabulary]]) -> Iterator[ClipScores]:
        """Mono waves at ``sample_rate_hz`` -> :class:`ClipScores`, in order.

        ``vocabularies`` is the same list of vocabularies for every clip, or (per clip) an
        iterable yielding each clip's own list (open-vocabulary: a clip's own phrases).
        """
        shared = isinstance(vocabularies, (list, tuple)) and all(isinstance(v, Vocabulary) for v in vocabularies)
        per_clip = iter(()) if shared else iter(vocabularies)
        pending: list[tuple[np.ndarray, list[Vocabulary]]] = []
        windows = 0
        for wave in waves:
            pending.append((wave, list(vocabularies) if shared else list(next(per_clip))))
            windows += len(self.windows(len(wave)))
            if windows >= self.batch_size:
                yield from self._score_batch(pending)
                pending, windows = [], 0
        if pending:
            yield from self._score_batch(pending)

    def _score_batch(self, clips: list[tuple[np.ndarray, list[Vocabulary]]]) -> list[ClipScores]:
        starts = [self.windows(len(w)) for w, _ in clips]
        cut = []
        for (wave, _), ss in zip(clips, starts):
            for s in ss:
                piece = wave[s:s + self.window_samples]
                cut.append(np.pad(piece, (0, self.window_samples - len(piece))))
        clip_emb, frames = [], []
        for i in range(0, len(cut), self.batch_size):
            batch = torch.from_numpy(np.stack(cut[i:i + self.batch_size])).to(self.device)
            with self.autocast():
                c, f = self.model.encode_audio(batch)
            clip_emb.append(c.float())
            frames.append(f.float()[:, :self.columns])
        clip_all, frames_all = torch.cat(clip_emb), torch.cat(frames)
        out, k = [], 0
        for (wave, vocabs), ss in zip(clips, starts):
            n = len(ss)
            edges = self.timestamps_s(len(wave))
            L = len(edges) - 1
            clip = torch.nn.functional.normalize(clip_all[k:k + n].mean(0), dim=-1)
            probs = []
            for v in vocabs:
                total = torch.zeros(L, len(v.texts), device=self.device)
                count = torch.zeros(L, 1, device=self.device)
                for j, s in enumerate(ss):
                    first = s // self.column_samples
                    take = min(self.columns, L - first)
                    logit = v.scale * (frames_all[k + j, :take] @ v.embeddings.T) + v.bias
                    total[first:first + take] += torch.sigmoid(logit)
                    count[first:first + take] += 1
                probs.append((total / count.clamp(min=1)).cpu().numpy())
            out.append(ClipScores(clip.cpu().numpy(), edges, probs))
            k += n
        return out
