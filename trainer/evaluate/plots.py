"""Pictures of what the model detects.

- :func:`detection_figure`: a clip's spectrogram over one row per query with its frame
  probabilities, the ground-truth segments shaded (when known) and detected events as bars
  (FineLAP Fig. 4/5).
- :func:`write_curve`: an ROC or PSD-ROC curve as a two-column CSV for ``dvc plots``.
- :func:`curves_figure`: ROC and PSD-ROC curves of several models in one PNG.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)


def detection_figure(path: Path, wave: np.ndarray, sample_rate_hz: int, timestamps_s: np.ndarray, probs: np.ndarray,
                     queries: list[str], truth: dict[str, list[tuple[float, float]]] | None = None,
                     events: dict[str, list[tuple[float, float, float]]] | None = None, title: str = "", threshold: float = 0.5) -> None:
    """``probs (L, Q)`` on the frame grid ``timestamps_s (L+1,)``; ``truth``/``events`` per query."""
    from scipy.signal import spectrogram

    plt = _pyplot()
    n = len(queries)
    fig, axes = plt.subplots(n + 1, 1, figsize=(10, 2.2 + 0.9 * n), sharex=True,
                             gridspec_kw={"height_ratios": [2.2] + [0.9] * n}, squeeze=False)
    axes = axes[:, 0]
    nfft = 512 if sample_rate_hz >= 16000 else 256
    f, t, s = spectrogram(wave, fs=sample_rate_hz, nperseg=nfft, noverlap=nfft * 3 // 4)
    axes[0].pcolormesh(t, f / 1000, 10 * np.log10(s + 1e-10), shading="auto", cmap="magma")
    axes[0].set_ylabel("kHz")
    axes[0].set_title(title, fontsize=9, loc="left")
    centres = (timestamps_s[:-1] + timestamps_s[1:]) / 2
    colors = plt.get_cmap("tab10")
    for q, (ax, text) in enumerate(zip(axes[1:], queries)):
        c = colors(q % 10)
        for on, off in (truth or {}).get(text, []):
            ax.axvspan(on, off, color=c, alpha=0.18, lw=0)
        for on, off, _ in (events or {}).get(text, []):
            ax.plot([on, off], [1.04, 1.04], color=c, lw=4, solid_capstyle="butt")
        ax.plot(centres, probs[:, q], color=c, lw=1.4)
        ax.axhline(threshold, color="0.6", lw=0.6, ls="--")
        ax.set_ylim(0, 1.1)
        ax.set_yticks([0, 1])
        ax.text(0.005, 0.92, text, transform=ax.transAxes, fontsize=8, va="top", color="0.1")
    axes[-1].set_xlabel("time (s)")
    axes[-1].set_xlim(0, float(timestamps_s[-1]))
    if truth is not None:
        axes[1].text(0.995, 0.92, "shaded: ground truth", transform=axes[1].transAxes, fontsize=7, ha="right", va="top", color="0.3")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


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
        axes[0].plot(fpr, tpr, label=model)
        for ax, key in ((axes[1], "psd_1"), (axes[2], "psd_2")):
            etpr, efpr = c[f"{key}_roc"]
            line = ax.step(efpr, etpr, where="post", label=model)[0]
            if f"{key}_class_mean" in c:
                etpr, efpr = c[f"{key}_class_mean"]
                ax.step(efpr, etpr, where="post", color=line.get_color(), ls="--", lw=1, label=f"{model}, class mean (alpha_st 0)")
    axes[0].plot([0, 1], [0, 1], color="0.7", lw=0.8, ls="--")
    axes[0].set(xlabel="FPR (1 s segments)", ylabel="TPR", title="Segment ROC (macro)")
    axes[1].set(xlabel="eFPR (per hour)", ylabel="eTPR", title="PSD-ROC, PSDS1 setting", xlim=(0, 100))
    axes[2].set(xlabel="eFPR (per hour)", ylabel="eTPR", title="PSD-ROC, PSDS2 setting", xlim=(0, 100))
    for ax in axes:
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
