"""A trained (or untrained) FineLAP model as a detector: audio of any length, rate and channel
count in, clip embeddings and per-frame query probabilities out.

Inputs: a checkpoint written by the trainer (its ``config`` rebuilds the model, with its
captioning decoder's word vocabulary when it has one) or ``train``
params plus a seed (the untrained model), and audio as whole mono arrays or as a stream of
blocks (:func:`pipeline.audio.read_blocks` reads a file that way). Outputs (:class:`ClipScores`): the clip
embedding ``(d,)``, frame boundaries in seconds ``(L+1,)`` and, per vocabulary, frame
probabilities ``(L, C)`` = sigmoid(t' cos + b') with the checkpoint's frame temperature and
bias (FLAM's per-text ones when the model has them).

Audio longer than the model's window (``train.data.crop_s``) is cut into windows that overlap
by ``overlap`` of their length, each aligned to the encoder's column grid; a column seen by
several windows gets the mean of their probabilities, and the clip embedding is the normalised
mean of the windows' clip embeddings. Windows are cut as the samples arrive and a clip keeps
only running per-column sums, so memory stays bounded for audio of any length; whole arrays
and streams give the same scores. Windows of all clips are batched together, so a 10 s test
clip costs one forward pass however many vocabularies are scored on it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline.config.params import build
from trainer import checkpoint
from trainer.config import TrainParams, current_train_section
from trainer.model import build_model
from trainer.objective import Objective
from trainer.precision import autocast_for

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

    def __init__(
        self, objective: Objective, train: TrainParams, device: str = "auto", overlap: float = 0.5, batch_size: int = 16
    ):
        if not 0 <= overlap < 1:
            raise ValueError(f"detector: overlap is {overlap}; use a fraction in [0, 1)")
        self.device = torch.device(
            "cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device)
        )
        self.objective = objective.to(self.device).eval()
        self.model, self.train_params = objective.model, train
        self.autocast = autocast_for(train.precision, self.device)
        enc = self.model.encoder
        enc.keep_residual_low_precision(train.bf16_residual)  # scored with the stream it was trained with
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
        state = checkpoint.read(path, "detector")
        train = build(TrainParams, current_train_section(state["config"]["train"]), "train")
        objective = Objective(build_model(train.model), train.loss)
        checkpoint.restore(state, objective, restore_rng=False, path=path)
        vocabulary = state["config"].get("caption_vocabulary")  # the captioning decoder's trained words, when it has some
        if vocabulary is not None and getattr(objective, "captioner", None) is not None:
            from trainer.captioner import WordVocabulary

            objective.use_caption_vocabulary(WordVocabulary.from_dict(vocabulary, f"{path}'s caption_vocabulary"))
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

    def timestamps_s(self, num_samples: int) -> np.ndarray:
        """Frame boundaries ``(L+1,)`` of a clip: columns every ``column_s`` up to the clip's end."""
        duration = num_samples / self.sample_rate_hz
        n = max(1, int(np.ceil(duration / self.column_s - 1e-9)))
        edges = np.arange(n + 1) * self.column_s
        edges[-1] = duration
        return edges

    def score(
        self, waves: Iterable[np.ndarray], vocabularies: Sequence[Vocabulary] | Iterable[Sequence[Vocabulary]]
    ) -> Iterator[ClipScores]:
        """Mono waves at ``sample_rate_hz`` -> :class:`ClipScores`, in order.

        ``vocabularies`` is the same list of vocabularies for every clip, or (per clip) an
        iterable yielding each clip's own list (open-vocabulary: a clip's own phrases).
        """
        return self.score_streams(([wave] for wave in waves), vocabularies)

    def score_stream(self, blocks: Iterable[np.ndarray], vocabularies: Sequence[Vocabulary]) -> ClipScores:
        """One clip given as consecutive mono blocks at ``sample_rate_hz`` (any sizes) -> its :class:`ClipScores`.

        Holds at most about one window of audio plus one block and one batch of windows,
        whatever the clip's length (see :func:`pipeline.audio.read_blocks` for a file read that way).
        """
        (scores,) = self.score_streams([blocks], [vocabularies])
        return scores

    @torch.no_grad()
    def score_streams(
        self, clips: Iterable[Iterable[np.ndarray]], vocabularies: Sequence[Vocabulary] | Iterable[Sequence[Vocabulary]]
    ) -> Iterator[ClipScores]:
        """Clips, each an iterable of mono blocks at ``sample_rate_hz`` -> :class:`ClipScores`, in order.

        Windows are cut as their samples arrive and scored ``batch_size`` at a time across
        clips; a clip keeps only running per-column sums, so its scores come out when its
        last window is scored. ``vocabularies`` as in :meth:`score`.
        """
        shared = isinstance(vocabularies, (list, tuple)) and all(isinstance(v, Vocabulary) for v in vocabularies)
        per_clip = iter(()) if shared else iter(vocabularies)
        queue: list[tuple[_RunningScores, _Window]] = []
        waiting: deque[_RunningScores] = deque()  # clips in order, until their last window is scored

        def enqueue(sums: _RunningScores, windows: list[_Window]) -> None:
            for w in windows:
                queue.append((sums, w))
                sums.pending += 1
                if len(queue) == self.batch_size:
                    self._score_windows(queue)
                    queue.clear()

        for blocks in clips:
            sums = _RunningScores(self, list(vocabularies) if shared else list(next(per_clip)))
            waiting.append(sums)
            cutter = _WindowCutter(self)
            for block in blocks:
                enqueue(sums, cutter.push(block))
            enqueue(sums, cutter.close())
            sums.num_samples = cutter.num_samples
            while waiting and waiting[0].done:
                yield waiting.popleft().result()
        if queue:
            self._score_windows(queue)
        while waiting:
            yield waiting.popleft().result()

    def _score_windows(self, queue: list[tuple[_RunningScores, _Window]]) -> None:
        """One forward pass over up to ``batch_size`` windows; each clip adds its windows' scores."""
        batch = torch.from_numpy(np.stack([w.samples for _, w in queue])).to(self.device)  # (B, window_samples)
        with self.autocast():
            clip, frames = self.model.encode_audio(batch)
        clip, frames = clip.float(), frames.float()[:, : self.columns]  # (B, d), (B, columns, d)
        for j, (sums, window) in enumerate(queue):
            sums.add(window, clip[j], frames[j, : window.columns])


@dataclass(frozen=True)
class _Window:
    """One window of a clip: its first sample, ``window_samples`` samples (zero-padded past the
    end) and how many of its columns lie inside the clip."""

    start: int
    samples: np.ndarray
    columns: int


class _WindowCutter:
    """Consecutive mono blocks in, the detector's windows out as soon as each is known and full.

    The windows of a clip of ``n`` samples start at 0, ``hop``, ``2 hop``, ... below
    ``n - covered`` (``covered``: the samples of a window's ``columns``), then one last window at
    ``n - covered`` rounded up to a whole column (0 when the clip fits one window). A window on
    the hop grid at ``s`` exists when a sample lies past ``s + covered``, so it is cut once that
    sample and its own ``window_samples`` have arrived; the last one when the clip ends. Keeps
    only the samples a later window can still need: from the next window's start, or the last
    ``max(window, covered)`` samples.
    """

    def __init__(self, det: Detector):
        self.det = det
        self.covered = det.columns * det.column_samples
        self.keep = max(det.window_samples, self.covered)
        self.buffer = np.zeros(0, np.float32)
        self.buffer_start = 0  # clip sample index of buffer[0]
        self.arrived: list[np.ndarray] = []  # blocks after the buffer, not yet joined to it
        self.num_samples = 0
        self.next_start = 0  # the next window on the hop grid

    def _cut(self, start: int, columns: int) -> _Window:
        piece = self.buffer[start - self.buffer_start : start - self.buffer_start + self.det.window_samples]
        return _Window(start, np.pad(piece, (0, self.det.window_samples - len(piece))), columns)  # a copy: the buffer moves on

    def _ready(self) -> bool:
        return self.next_start + self.covered < self.num_samples and self.next_start + self.det.window_samples <= self.num_samples

    def _join(self) -> None:
        if self.arrived:
            self.buffer = (
                np.concatenate([self.buffer, *self.arrived]) if len(self.buffer) or len(self.arrived) > 1 else self.arrived[0]
            )
            self.arrived = []

    def push(self, block: np.ndarray) -> list[_Window]:
        block = np.asarray(block, dtype=np.float32)
        self.arrived.append(block)  # joined only when a window can be cut: small blocks cost no copying
        self.num_samples += len(block)
        if not self._ready():
            return []
        self._join()
        out = []
        while self._ready():
            out.append(self._cut(self.next_start, self.det.columns))
            self.next_start += self.det.hop_samples
        keep_from = max(self.buffer_start, min(self.next_start, self.num_samples - self.keep))
        self.buffer, self.buffer_start = self.buffer[keep_from - self.buffer_start :], keep_from
        return out

    def close(self) -> list[_Window]:
        """The clip has ended: windows still waiting for samples (zero-padded) and the last one."""
        self._join()
        n, col = self.num_samples, self.det.column_samples
        frames = len(self.det.timestamps_s(n)) - 1
        out = []
        while self.next_start + self.covered < n:  # known to exist, short of samples
            out.append(self._cut(self.next_start, self.det.columns))
            self.next_start += self.det.hop_samples
        last = 0 if n <= self.covered else -(-(n - self.covered) // col) * col
        out.append(self._cut(last, min(self.det.columns, frames - last // col)))
        self.buffer = np.zeros(0, np.float32)
        return out


class _RunningScores:
    """One clip's running sums: clip embeddings ``(d,)`` and, per vocabulary, frame
    probabilities ``(L, C)`` and how many windows saw each column ``(L,)``."""

    def __init__(self, det: Detector, vocabularies: list[Vocabulary]):
        self.det, self.vocabularies = det, vocabularies
        self.clip_sum: torch.Tensor | None = None
        self.windows = 0
        self.totals = [np.zeros((0, len(v.texts)), np.float32) for v in vocabularies]
        self.count = np.zeros(0, np.float32)
        self.pending = 0  # windows queued, not yet scored
        self.num_samples: int | None = None  # set when the clip has ended

    @property
    def done(self) -> bool:
        return self.num_samples is not None and self.pending == 0

    def _reserve(self, columns: int) -> None:
        if columns > len(self.count):
            size = max(columns, 2 * len(self.count))  # doubling: appends stay linear in the clip's length
            self.count = np.concatenate([self.count, np.zeros(size - len(self.count), np.float32)])
            self.totals = [np.concatenate([t, np.zeros((size - len(t), t.shape[1]), np.float32)]) for t in self.totals]

    def add(self, window: _Window, clip: torch.Tensor, frames: torch.Tensor) -> None:
        """A scored window: its clip embedding ``(d,)`` and its in-clip columns' frame embeddings ``(take, d)``."""
        self.clip_sum = clip if self.clip_sum is None else self.clip_sum + clip
        self.windows += 1
        first, take = window.start // self.det.column_samples, window.columns
        self._reserve(first + take)
        for total, v in zip(self.totals, self.vocabularies):
            logit = v.scale * (frames @ v.embeddings.T) + v.bias  # (take, C)
            total[first : first + take] += torch.sigmoid(logit).cpu().numpy()
        self.count[first : first + take] += 1
        self.pending -= 1

    def result(self) -> ClipScores:
        edges = self.det.timestamps_s(self.num_samples)
        L = len(edges) - 1
        clip = torch.nn.functional.normalize(self.clip_sum / self.windows, dim=-1)
        count = np.maximum(self.count[:L], 1)[:, None]
        return ClipScores(clip.cpu().numpy(), edges, [t[:L] / count for t in self.totals])
