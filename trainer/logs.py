"""Training logs as DVC reads them: CSV plot files written whole (atomically), and a picture.

``CsvLog`` keeps its rows in memory and rewrites the file on ``flush``; on resume it drops the
rows after the checkpoint (training rows by step, held-out rows by epoch), so the curves never
show a step or an epoch twice.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from pipeline.figures import save_png
from pipeline.outputs import write_atomic, write_skips

__all__ = ["CsvLog", "plot_curves", "write_skips"]


class CsvLog:
    def __init__(self, path: Path):
        self.path = path
        self.rows: list[dict] = []
        if path.exists():
            with path.open(newline="") as f:
                self.rows = [{k: _number(v) for k, v in r.items()} for r in csv.DictReader(f)]

    def add(self, row: dict) -> None:
        self.rows.append(row)

    def keep_until(self, value: int, key: str = "step") -> None:
        """Keep the rows whose ``key`` column is at most ``value`` (a row without it is kept)."""
        self.rows = [r for r in self.rows if r.get(key, 0) <= value]

    def flush(self) -> None:
        columns: list[str] = []
        for r in self.rows:
            columns += [k for k in r if k not in columns]
        buf = io.StringIO()
        w = csv.DictWriter(buf, columns, lineterminator="\n")
        w.writeheader()
        for r in self.rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, buf.getvalue().encode("utf-8"))


def step_progress(desc: str, total: int, initial: int = 0, disable: bool = False):
    """A tqdm bar over optimizer steps; in a log (DVC, a cluster job) it redraws every 30 s instead of on every step."""
    import sys

    from tqdm.auto import tqdm

    every = 0.1 if sys.stderr.isatty() else 30.0
    return tqdm(total=total, initial=initial, desc=desc, unit="step", disable=disable, dynamic_ncols=True, mininterval=every)


def _number(text: str):
    try:
        value = float(text)
    except (TypeError, ValueError):
        return text
    return int(value) if value.is_integer() and "." not in text and "e" not in text else value


def plot_curves(train_rows: list[dict], valid_rows: list[dict], path: Path) -> None:
    """Loss terms over steps, and held-out scores over epochs (epoch 0: untrained)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [r["step"] for r in train_rows]
    for key in ("loss", "clip", "frame", "prior", "region", "caption"):
        values = [r.get(key) for r in train_rows]
        if any(isinstance(v, (int, float)) and not math.isnan(v) for v in values if v is not None):
            left.plot(steps, values, label=key)
    left.set(xlabel="step", ylabel="training loss (log scale)", title="Training loss terms", yscale="log")
    if train_rows:
        left.legend()
    epochs = [r["epoch"] for r in valid_rows]
    for key in ("frame_auroc", "a2t_r1", "t2a_r1"):
        values = [r.get(key, float("nan")) for r in valid_rows]
        right.plot(epochs, values, marker="o", label=key)
    right.set(xlabel="epoch (0 = untrained)", ylabel="held-out score", title="Held-out split", ylim=(0, 1))
    right.legend()
    fig.tight_layout()
    save_png(fig, path, dpi=100)
