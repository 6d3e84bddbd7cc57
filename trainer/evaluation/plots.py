"""Pictures of what the model detects.

- :func:`detection_figure`: a clip's spectrogram over one row per query with its frame
  probabilities, the ground-truth segments shaded (when known) and detected events as bars
  (FineLAP Fig. 4/5); optionally, below them, rows for classes absent from the clip, in grey,
  so wrong classes firing show. The spectrogram is a :class:`Spectrogram`, built block by block
  in bounded memory, so audio of any length (one sample to hours) gets a picture.
  :func:`top_absent` picks those classes.
- :func:`confusion_figure`: a class-by-class matrix (true class x query class) as a heatmap.
- :func:`write_curve`: an ROC or PSD-ROC curve as a two-column CSV for ``dvc plots``.
- :func:`curves_figure`: ROC and PSD-ROC curves of several models in one PNG.

Every text a figure draws (titles, row labels, tick labels, legends) goes through :func:`drawn`:
at most :data:`TEXT_MAX_CHARS` characters on a line, control characters as spaces, ``$`` shown
as itself. A caption or label is untrusted shard data: one of 100 MB stalls matplotlib's text
layout, and one with ``$\\frac{1}$`` fails the figure in matplotlib's mathtext parser.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from pipeline.figures import save_png
from pipeline.schema import CONTROL_CHARACTERS

TEXT_MAX_CHARS = 120  # of one line of drawn text: a title's width at the sizes used here


def drawn(text: object, limit: int = TEXT_MAX_CHARS, lines: int = 1) -> str:
    """``text`` as a figure draws it: its first ``lines`` lines (one: line breaks become spaces), each
    cut to ``limit`` characters ending in an ellipsis when longer, tabs and other control
    characters as spaces, and ``$`` escaped so matplotlib draws it as written, never as mathtext.
    Only the first ``lines * (limit + 1)`` characters of ``text`` are looked at."""
    head = str(text)[: lines * (limit + 1)]
    parts = head.split("\n", lines - 1) if lines > 1 else [head]
    cut = [p if len(p) <= limit else p[: limit - 1] + "\u2026" for p in parts]
    return "\n".join(CONTROL_CHARACTERS.sub(" ", p).replace("$", r"\$") for p in cut)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


class Spectrogram:
    """A power spectrogram of mono audio fed block by block, in bounded memory.

    Input: consecutive float32 blocks (:meth:`push`, any sizes). Output (:meth:`columns`):
    column edges in seconds ``(T+1,)``, frequency bin edges in Hz ``(F+1,)`` and power
    ``(F, T)``. Hann frames of ``nfft`` samples every ``nfft // 4``, each centred on its hop
    (zero-padded at both ends, so even one sample gives one frame), are averaged into at most
    ``max_columns`` columns: when the columns fill up, neighbours merge pairwise, so hours
    of audio cost what a minute does.
    """

    def __init__(self, sample_rate_hz: int, max_columns: int = 2048):
        self.sample_rate_hz = sample_rate_hz
        self.nfft = 512 if sample_rate_hz >= 16000 else 256
        self.hop = self.nfft // 4
        self.max_columns = max_columns - max_columns % 2
        self.window = np.hanning(self.nfft + 1)[:-1].astype(np.float32)  # periodic Hann
        self.lead = (self.nfft - self.hop) // 2  # zeros before the first sample: frame k centred on hop k
        self.buffer = np.zeros(self.lead, np.float32)
        self.buffer_start = 0  # padded index of buffer[0]
        self.num_samples = 0
        self.frames = 0  # frames computed so far
        self.group = 1  # frames per column
        self.done: list[np.ndarray] = []  # finished columns, mean power (F,)
        self.partial = np.zeros(self.nfft // 2 + 1)
        self.partial_frames = 0

    def push(self, block: np.ndarray) -> None:
        block = np.asarray(block, dtype=np.float32)
        self.buffer = np.concatenate([self.buffer, block])
        self.num_samples += len(block)
        ready = (self.buffer_start + len(self.buffer) - self.nfft) // self.hop + 1  # frames whose samples have all arrived
        self._frames(min(ready, self._needed()))

    def _needed(self) -> int:
        return -(-self.num_samples // self.hop)  # one frame per started hop

    def _frames(self, upto: int) -> None:
        if upto <= self.frames:
            return
        first = self.frames * self.hop - self.buffer_start
        span = self.buffer[first : first + (upto - self.frames - 1) * self.hop + self.nfft]
        frames = np.lib.stride_tricks.sliding_window_view(span, self.nfft)[:: self.hop]  # (m, nfft), views
        power = np.abs(np.fft.rfft(frames * self.window, axis=1)) ** 2 / np.sum(self.window) ** 2  # (m, F)
        self._add(power)
        self.frames = upto
        drop = self.frames * self.hop - self.buffer_start
        self.buffer, self.buffer_start = self.buffer[drop:], self.buffer_start + drop

    def _add(self, power: np.ndarray) -> None:
        while len(power):
            take = self.group - self.partial_frames
            self.partial += power[:take].sum(axis=0)
            self.partial_frames += len(power[:take])
            power = power[take:]
            if self.partial_frames == self.group:
                self.done.append(self.partial / self.group)
                self.partial, self.partial_frames = np.zeros_like(self.partial), 0
                if len(self.done) == self.max_columns:  # merge neighbours: half the columns, twice the frames each
                    self.done = [(a + b) / 2 for a, b in zip(self.done[::2], self.done[1::2])]
                    self.group *= 2

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(time edges (T+1,) s, frequency edges (F+1,) Hz, power (F, T))`` of everything pushed; call after the last push."""
        needed = self._needed()
        if needed > self.frames:  # the last frames reach past the end: zero-pad them
            self.buffer = np.pad(
                self.buffer, (0, max(0, (needed - 1) * self.hop + self.nfft - self.buffer_start - len(self.buffer)))
            )
            self._frames(needed)
        cols = self.done + ([self.partial / self.partial_frames] if self.partial_frames else [])
        power = np.stack(cols, axis=1) if cols else np.zeros((len(self.partial), 0))
        edges = np.minimum(np.arange(power.shape[1] + 1) * self.group * self.hop, self.num_samples) / self.sample_rate_hz
        bins = (np.arange(len(self.partial) + 1) - 0.5) * self.sample_rate_hz / self.nfft
        return edges, np.clip(bins, 0, self.sample_rate_hz / 2), power


def frame_envelope(
    timestamps_s: np.ndarray, probs: np.ndarray, max_steps: int = 2000
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Frames ``(L, Q)`` on edges ``(L+1,)`` -> at most ``max_steps`` steps: edges, lowest and highest frame of each.

    A picture is about 1000 pixels wide: hours of 80 ms frames are drawn as groups of frames,
    each shown by its range (peaks, hence events, stay visible). Up to ``max_steps`` frames
    come back as they are (``low is high``).
    """
    L = len(probs)
    if L <= max_steps:
        return timestamps_s, probs, probs
    group = -(-L // max_steps)
    pad = -L % group
    padded = np.concatenate([probs, np.repeat(probs[-1:], pad, axis=0)]).reshape(-1, group, probs.shape[1])
    return np.r_[timestamps_s[:-1:group], timestamps_s[-1]], padded.min(axis=1), padded.max(axis=1)


def top_absent(probs: np.ndarray, classes, present, n: int = 3) -> list[int]:
    """Columns of ``probs (L, C)`` (one per class of ``classes``) of the ``n`` classes not in
    ``present`` whose peak probability is highest, highest first (ties: the earlier column)."""
    peaks = probs.max(axis=0) if len(probs) else np.zeros(len(classes))
    return [int(c) for c in np.argsort(-peaks, kind="stable") if classes[c] not in present][:n]


def detection_figure(
    path: Path,
    wave: np.ndarray | Spectrogram,
    sample_rate_hz: int,
    timestamps_s: np.ndarray,
    probs: np.ndarray,
    queries: list[str],
    *,
    truth: dict[str, list[tuple[float, float]]] | None = None,
    events: dict[str, list[tuple[float, float, float]]] | None = None,
    title: str = "",
    threshold: float = 0.5,
    absent: int = 0,
) -> None:
    """``probs (L, Q)`` on the frame grid ``timestamps_s (L+1,)``; ``truth``/``events`` per query.

    ``wave`` is the clip's mono samples or a :class:`Spectrogram` already fed with them (long
    audio: the samples need not be held). The last ``absent`` rows of ``probs``/``queries`` are
    classes absent from the clip: drawn in grey on a grey ground, labelled "(absent)", without
    ground truth or event bars.
    """
    if not isinstance(wave, Spectrogram):
        sketch = Spectrogram(sample_rate_hz)
        sketch.push(wave)
        wave = sketch
    t_edges, f_edges, power = wave.columns()
    plt = _pyplot()
    n = len(queries)
    fig, axes = plt.subplots(
        n + 1, 1, figsize=(10, 2.2 + 0.9 * n), sharex=True, gridspec_kw={"height_ratios": [2.2] + [0.9] * n}, squeeze=False
    )
    axes = axes[:, 0]
    if power.shape[1] and t_edges[-1] > t_edges[0]:
        axes[0].pcolorfast(t_edges, f_edges / 1000, 10 * np.log10(power + 1e-10), cmap="magma")  # an image, not 500k patches
    axes[0].set_ylabel("kHz")
    axes[0].set_title(drawn(title), fontsize=9, loc="left")
    edges, low, high = frame_envelope(timestamps_s, probs)
    colors = plt.get_cmap("tab10")
    for q, (ax, text) in enumerate(zip(axes[1:], queries)):
        gone = q >= n - absent
        c = "0.4" if gone else colors(q % 10)
        if gone:
            ax.set_facecolor("0.93")
        else:
            for on, off in (truth or {}).get(text, []):
                ax.axvspan(on, off, color=c, alpha=0.18, lw=0)
            for on, off, _ in (events or {}).get(text, []):
                ax.plot([on, off], [1.04, 1.04], color=c, lw=4, solid_capstyle="butt")
        if high is not low:
            ax.stairs(high[:, q], edges, baseline=low[:, q], fill=True, color=c, alpha=0.3, lw=0)
        ax.stairs(
            high[:, q], edges, baseline=None, color=c, lw=1.4
        )  # one level per frame (or its group's peak), even for one frame
        ax.axhline(threshold, color="0.6", lw=0.6, ls="--")
        ax.set_ylim(0, 1.1)
        ax.set_yticks([0, 1])
        label, ink = (f"{drawn(text)} (absent)", c) if gone else (drawn(text), "0.1")
        ax.text(0.005, 0.92, label, transform=ax.transAxes, fontsize=8, va="top", color=ink)
    axes[-1].set_xlabel("time (s)")
    if timestamps_s[-1] > timestamps_s[0]:
        axes[-1].set_xlim(0, float(timestamps_s[-1]))
    if truth is not None and n:
        axes[1].text(
            0.995, 0.92, "shaded: ground truth", transform=axes[1].transAxes, fontsize=7, ha="right", va="top", color="0.3"
        )
    fig.tight_layout()
    save_png(fig, path, dpi=110)


CONFUSION_TITLE = (
    "cell: mean, over the row class's ground-truth events, of the column query's\n"
    "peak probability (median-filtered) on the frames overlapping the event"
)


def confusion_figure(path: Path, matrix: np.ndarray, classes: list[str], title: str = CONFUSION_TITLE) -> None:
    """``matrix (C, C)`` (rows: true class, columns: query class, values in [0, 1]; NaN rows, classes
    without events, stay blank) -> a heatmap PNG at ``path``: class names on both axes, a colour
    bar, ``title``, and each cell's value written in it when there are at most 20 classes."""
    plt = _pyplot()
    n = len(classes)
    side = min(3.5 + 0.3 * n, 24)
    fig, ax = plt.subplots(figsize=(side + 1.5, side))
    image = ax.imshow(np.ma.masked_invalid(np.asarray(matrix, dtype=float).reshape(n, n)), cmap="viridis", vmin=0, vmax=1)
    names = [drawn(c) for c in classes]
    ax.set_xticks(range(n), names, rotation=90, fontsize=7)
    ax.set_yticks(range(n), names, fontsize=7)
    ax.set(xlabel="query class", ylabel="true class")
    ax.set_title(drawn(title, lines=3), fontsize=8)
    fig.colorbar(image, ax=ax, label="mean peak probability")
    if n <= 20:
        for (r, q), v in np.ndenumerate(matrix):
            if np.isfinite(v):
                ax.text(q, r, f"{v:.2f}", ha="center", va="center", fontsize=6, color="w" if v < 0.5 else "k")
    fig.tight_layout()
    save_png(fig, path, dpi=110)


def write_curve(path: Path, x_name: str, y_name: str, x: np.ndarray, y: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow([x_name, y_name])
        w.writerows([f"{a:.6g}", f"{b:.6g}"] for a, b in zip(x, y))


def curves_figure(path: Path, curves: dict[str, dict]) -> None:
    """``{model: {"roc": (tpr, fpr), "psd_1_roc": (etpr, efpr), "psd_2_roc": ..., "psd_1_class_mean": ...}}`` -> one PNG.

    The solid PSD-ROC is the one PSDS integrates (with the stability penalty alpha_st); the
    dashed one is the plain mean over classes, which stays readable when few classes score.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for model, c in curves.items():
        tpr, fpr = c["roc"]
        axes[0].plot(fpr, tpr, label=drawn(model))
        for ax, key in ((axes[1], "psd_1"), (axes[2], "psd_2")):
            etpr, efpr = c[f"{key}_roc"]
            line = ax.step(efpr, etpr, where="post", label=drawn(model))[0]
            if f"{key}_class_mean" in c:
                etpr, efpr = c[f"{key}_class_mean"]
                ax.step(
                    efpr,
                    etpr,
                    where="post",
                    color=line.get_color(),
                    ls="--",
                    lw=1,
                    label=f"{drawn(model)}, class mean (alpha_st 0)",
                )
    axes[0].plot([0, 1], [0, 1], color="0.7", lw=0.8, ls="--")
    axes[0].set(xlabel="FPR (1 s segments)", ylabel="TPR", title="Segment ROC (macro)")
    axes[1].set(xlabel="eFPR (per hour)", ylabel="eTPR", title="PSD-ROC, PSDS1 setting", xlim=(0, 100))
    axes[2].set(xlabel="eFPR (per hour)", ylabel="eTPR", title="PSD-ROC, PSDS2 setting", xlim=(0, 100))
    for ax in axes:
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=110)
