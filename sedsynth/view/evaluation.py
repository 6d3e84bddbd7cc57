"""An evaluation folder as ``sedsynth view`` shows it: the figures, the per-class table and the worst errors.

Input: the folder ``sedsynth evaluate`` writes (``evaluate.out_dir``): ``metrics.json`` (the
figures and the ``protocol`` they were computed under) and ``details/<split>/`` with
``per_class_<model>.csv``, ``ground_truth.tsv``, ``durations.tsv`` and the median-filtered
sed_scores_eval score files ``scores/<model>/<clip>.tsv`` (onset, offset, one column per class).
Output: :class:`Evaluation`, whose :meth:`Evaluation.summary` gives the headline figures and the
per-class tables, :meth:`Evaluation.errors` the worst false alarms and misses of a model, and
:meth:`Evaluation.scores` one clip's stored probabilities of one class.

Errors are read from the stored score files at collar F1's threshold (``protocol.collar_f1.threshold``):
a false alarm is a run of frames at or above it that overlaps no ground-truth segment of its
class, ranked by its peak; a miss is a ground-truth segment whose frames all stay below it,
ranked by the highest probability inside (lowest first).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.files import read_regular
from trainer.evaluation.detect_files import events as runs_above

MAX_TABLE_BYTES = 64 << 20  # a details file larger than this is not a table the evaluate stage wrote
MODEL = re.compile(r"^per_class_(\w+)\.csv$")


def _table(path: Path) -> list[dict]:
    """A CSV/TSV file's rows as dicts (the delimiter from the suffix)."""
    text = read_regular(path, str(path.name), max_bytes=MAX_TABLE_BYTES).decode("utf-8")
    return list(csv.DictReader(io.StringIO(text), delimiter="\t" if path.suffix == ".tsv" else ","))


def _number(text: str):
    """A CSV cell as a float where it is one (NaN and infinities as None, for JSON), else the text."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return text
    return value if math.isfinite(value) else None


def _plain(value):
    """``value`` with every non-finite float as None, so the result is valid JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@dataclass
class Evaluation:
    """One evaluation folder, read once; the score files are read when first asked for and kept."""

    folder: Path
    split: str
    metrics: dict
    truth: dict[str, list[tuple[float, float, str]]]  # clip -> [(onset_s, offset_s, label)]
    durations: dict[str, float]
    models: tuple[str, ...]
    _scores: dict = field(default_factory=dict)

    @property
    def threshold(self) -> float | None:
        """Collar F1's threshold, the one the errors are counted at."""
        value = self.metrics.get("protocol", {}).get("collar_f1", {}).get("threshold")
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def classes(self) -> list[str]:
        return list(
            self.metrics.get("protocol", {}).get("classes") or sorted({lab for evs in self.truth.values() for *_, lab in evs})
        )

    def summary(self, queries: dict[str, str] | None = None) -> dict:
        """The headline figures per model, the per-class table per model (with each class's query where known),
        the protocol's main settings and the split's size."""
        split_metrics = self.metrics.get(self.split, {})
        headline = {
            m: {k: v for k, v in values.items() if isinstance(v, (int, float))}
            for m, values in split_metrics.items()
            if isinstance(values, dict)
        }
        per_class = {}
        for model in self.models:
            rows = [
                {k: (_number(v) if k != "class" else v) for k, v in r.items()}
                for r in _table(self._details / f"per_class_{model}.csv")
            ]
            for r in rows:
                r["query"] = (queries or {}).get(r.get("class"), r.get("class"))
            per_class[model] = rows
        protocol = self.metrics.get("protocol", {})
        return _plain(
            {
                "folder": str(self.folder),
                "split": self.split,
                "models": list(self.models),
                "headline": headline,
                "per_class": per_class,
                "threshold": self.threshold,
                "threshold_source": protocol.get("collar_f1", {}).get("threshold_source"),
                "clips": len(self.durations),
                "events": sum(len(v) for v in self.truth.values()),
                "frame_hop_s": protocol.get("frame_hop_s"),
            }
        )

    @property
    def _details(self) -> Path:
        return self.folder / "details" / self.split

    def _model_scores(self, model: str) -> dict[str, tuple[np.ndarray, list[str], np.ndarray]]:
        """Clip -> (frame edges ``(L+1,)``, classes, probabilities ``(L, C)``) of ``model``'s score files."""
        if model not in self._scores:
            folder = self._details / "scores" / model
            out = {}
            for clip in self.durations:
                path = folder / f"{clip}.tsv"
                if path.is_file():
                    out[clip] = _score_file(path)
            self._scores[model] = out
        return self._scores[model]

    def scores(self, model: str, clip: str, label: str) -> dict | None:
        """One clip's stored probabilities of one class and its ground truth: ``{"timestamps_s": (L+1,), "probs": (L,),
        "truth": [[onset_s, offset_s], ...]}``; None when not stored."""
        if model not in self.models or clip not in self.durations:
            return None
        found = self._model_scores(model).get(clip)
        if found is None or label not in found[1]:
            return None
        edges, classes, probs = found
        return {
            "timestamps_s": edges.tolist(),
            "probs": probs[:, classes.index(label)].tolist(),
            "truth": [[a, b] for a, b, lab in self.truth.get(clip, []) if lab == label],
        }

    def errors(self, model: str, limit: int = 25) -> dict:
        """``model``'s worst false alarms (highest peak first) and misses (lowest peak first), at most ``limit``
        of each: ``{"false_alarms": [...], "misses": [...], "threshold": t}``, each error a clip, class,
        onset, offset and peak probability."""
        t = self.threshold
        if t is None or model not in self.models:
            return {"false_alarms": [], "misses": [], "threshold": t}
        alarms, misses = [], []
        for clip, (edges, classes, probs) in self._model_scores(model).items():
            truth = self.truth.get(clip, [])
            for c, label in enumerate(classes):
                segments = [(a, b) for a, b, lab in truth if lab == label]
                for on, off, peak in runs_above(edges, probs[:, c], t):
                    if not any(on < b and a < off for a, b in segments):
                        alarms.append({"clip": clip, "class": label, "onset_s": on, "offset_s": off, "peak": peak})
                for a, b in segments:
                    inside = (edges[:-1] < b) & (edges[1:] > a)
                    peak = float(probs[inside, c].max()) if inside.any() else 0.0
                    if peak < t:
                        misses.append({"clip": clip, "class": label, "onset_s": a, "offset_s": b, "peak": peak})
        alarms.sort(key=lambda e: (-e["peak"], e["clip"], e["onset_s"]))
        misses.sort(key=lambda e: (e["peak"], e["clip"], e["onset_s"]))
        return _plain(
            {
                "false_alarms": alarms[:limit],
                "misses": misses[:limit],
                "threshold": t,
                "false_alarm_count": len(alarms),
                "miss_count": len(misses),
            }
        )


def _score_file(path: Path) -> tuple[np.ndarray, list[str], np.ndarray]:
    """A sed_scores_eval score TSV -> (frame edges ``(L+1,)``, class columns, probabilities ``(L, C)``)."""
    rows = _table(path)
    if not rows:
        return np.zeros(1), [], np.zeros((0, 0))
    classes = [c for c in rows[0] if c not in ("onset", "offset")]
    onsets = np.array([float(r["onset"]) for r in rows])
    edges = np.append(onsets, float(rows[-1]["offset"]))
    probs = np.array([[float(r[c]) for c in classes] for r in rows], dtype=np.float64)
    return edges, classes, probs


def is_evaluation(folder: str | Path) -> bool:
    p = Path(folder)
    return (p / "metrics.json").is_file() and (p / "details").is_dir()


def open_evaluation(folder: str | Path) -> Evaluation:
    """The evaluation folder ``folder`` (``metrics.json``, ``details/<split>/``); raises ValueError naming what it lacks."""
    folder = Path(folder)
    if not is_evaluation(folder):
        raise ValueError(
            f"{folder} is not an evaluation folder: expected metrics.json and details/ (what sedsynth evaluate writes)"
        )
    metrics = json.loads(read_regular(folder / "metrics.json", "metrics.json", max_bytes=MAX_TABLE_BYTES))
    # the scored split: the details folder holding ground truth (details/benchmarks/ holds the public sets)
    splits = sorted(p.name for p in (folder / "details").iterdir() if p.is_dir() and (p / "ground_truth.tsv").is_file())
    split = "test" if "test" in splits else (splits[0] if splits else None)
    if split is None:
        raise ValueError(
            f"{folder}/details has no split folder with ground_truth.tsv (details/test/ as sedsynth evaluate writes it)"
        )
    details = folder / "details" / split
    truth: dict[str, list[tuple[float, float, str]]] = {}
    for r in _table(details / "ground_truth.tsv"):
        truth.setdefault(Path(r["filename"]).stem, []).append((float(r["onset"]), float(r["offset"]), r["event_label"]))
    durations = (
        {Path(r["filename"]).stem: float(r["duration"]) for r in _table(details / "durations.tsv")}
        if (details / "durations.tsv").is_file()
        else {c: max(b for _, b, _ in evs) for c, evs in truth.items()}
    )
    models = tuple(
        sorted((m.group(1) for p in details.iterdir() if (m := MODEL.match(p.name))), key=lambda m: (m != "trained", m))
    )
    return Evaluation(folder, split, metrics, {k: sorted(v) for k, v in truth.items()}, durations, models)
