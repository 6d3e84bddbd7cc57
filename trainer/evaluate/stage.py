"""The ``evaluate`` stage: a trained FineLAP checkpoint (and the same model untrained) on the
held-out split of our shards, the held-out event clips and any public benchmark configured.

Input: ``evaluate`` params (checkpoint, shard folder and split, clip folder, benchmarks).
Output, under ``evaluate.out_dir``:

- ``metrics.json``: per model (``trained``, ``untrained``) and the ``gain``: PSDS1, PSDS2,
  segment AUROC/pAUROC, collar F1, alignment, retrieval R@1/5/10 both ways and zero-shot
  accuracy; per benchmark the same keys or ``{"skipped": reason}``; the time split.
- ``details/test/``: ``ground_truth.tsv`` and ``durations.tsv`` (DCASE layout),
  ``scores/<model>/<clip>.tsv`` (sed_scores_eval's layout; the median-filtered scores PSDS was
  computed on, so ``sed_scores_eval`` recomputes every number from these files), and
  ``per_class_<model>.csv``; ``details/benchmarks/<name>/`` the same per benchmark;
  ``details/pictures/<clip>.png``; ``details/skipped.csv``.
- ``plots/``: ROC and PSD-ROC curves as CSVs for ``dvc plots`` and ``curves.png``.

Every clip is scored once per model (one forward pass over its windows); every metric reads
those scores.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from pipeline.audio import AudioError
from pipeline.outputs import staged_dir, write_json, write_skips
from pipeline.schema import Skip
from trainer.evaluate import metrics as M
from trainer.evaluate import plots
from trainer.evaluate.detector import (
    ZERO_SHOT_TEMPLATE,
    Detector,
    Vocabulary,
    read_audio,
)
from trainer.evaluate.testset import ShardSplit, event_clips, read_split

HEADLINE = ("psds1", "psds2", "auroc", "pauroc", "f1", "alignment", "a2t_r1", "a2t_r5", "a2t_r10",
            "t2a_r1", "t2a_r5", "t2a_r10", "zero_shot_accuracy")


@dataclass
class Scored:
    """One model's scores on one set, in clip order (skipped clips left out)."""

    ids: list[str] = field(default_factory=list)
    clips: list[np.ndarray] = field(default_factory=list)
    timestamps_s: list[np.ndarray] = field(default_factory=list)
    probs: list[list[np.ndarray]] = field(default_factory=list)
    waves: dict[str, np.ndarray] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def clip_matrix(self) -> np.ndarray:
        return np.stack(self.clips) if self.clips else np.zeros((0, 0), np.float32)


def subset(v: Vocabulary, rows: list[int]) -> Vocabulary:
    index = torch.tensor(rows, dtype=torch.long, device=v.embeddings.device)
    return Vocabulary(tuple(v.texts[i] for i in rows), v.embeddings[index], v.scale[index], v.bias[index])


def score_all(det: Detector, audio: Iterable[tuple[str, str | bytes]], vocabs: Callable[[str], list[Vocabulary]],
              skips: list[Skip], keep_waves: int = 0, desc: str = "score", total: int | None = None) -> Scored:
    """Decode and score each ``(id, path or bytes)``; unreadable audio becomes a :class:`Skip`."""
    from tqdm.auto import tqdm

    out = Scored()
    order: list[str] = []

    def waves() -> Iterator[np.ndarray]:
        for i, src in audio:
            try:
                w = read_audio(src, det.sample_rate_hz)
            except AudioError as e:
                skips.append(Skip(i, src if isinstance(src, str) else "", e.reason, e.detail))
                continue
            order.append(i)
            if len(out.waves) < keep_waves:
                out.waves[i] = w
            yield w

    def per_clip() -> Iterator[list[Vocabulary]]:
        k = 0
        while True:
            yield vocabs(order[k])
            k += 1

    start = time.perf_counter()
    for k, s in enumerate(tqdm(det.score(waves(), per_clip()), desc=desc, unit="clip", total=total, mininterval=5.0, leave=False)):
        out.ids.append(order[k])
        out.clips.append(s.clip)
        out.timestamps_s.append(s.timestamps_s)
        out.probs.append(s.probs)
    out.seconds = time.perf_counter() - start
    return out


@torch.no_grad()
def text_matrix(det: Detector, texts: list[str], batch: int = 256) -> np.ndarray:
    rows = [det.vocabulary(texts[i:i + batch]).embeddings.cpu().numpy() for i in range(0, len(texts), batch)]
    return np.concatenate(rows) if rows else np.zeros((0, 0), np.float32)


def write_truth(folder: Path, ground_truth: dict, durations_s: dict) -> None:
    """DCASE ``ground_truth.tsv`` (filename onset offset event_label) and ``durations.tsv``."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "ground_truth.tsv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(["filename", "onset", "offset", "event_label"])
        for i in sorted(ground_truth):
            for on, off, label in ground_truth[i]:
                w.writerow([f"{i}.wav", repr(float(on)), repr(float(off)), label])
            if not ground_truth[i]:  # a clip without events: an empty row, as DCASE files have
                w.writerow([f"{i}.wav", "", "", ""])
    with open(folder / "durations.tsv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(["filename", "duration"])
        for i in sorted(durations_s):
            w.writerow([f"{i}.wav", repr(float(durations_s[i]))])


def detection(scored: Scored, column: int, ground_truth: dict, durations_s: dict, classes, e, timer: M.Timer,
              folder: Path | None, model: str, alpha_st: float = 1.0) -> dict:
    """SED metrics of vocabulary ``column`` of ``scored``; writes the score files and per-class CSV."""
    from sed_scores_eval.base_modules.io import write_sed_scores

    ids = scored.ids
    with timer("median_filter"):
        probs = [M.smooth(p[column], e.median_filter_frames) for p in scored.probs]
    with timer("score_tables", library=True):
        tables = M.score_dataframes(ids, scored.timestamps_s, probs, classes)
    truth = {i: ground_truth[i] for i in ids}
    durations = {i: min(durations_s[i], float(t[-1])) for i, t in zip(ids, scored.timestamps_s)}
    result = M.sed_metrics(tables, truth, durations, classes, timer, alpha_st=alpha_st, segment_s=e.segment_s,
                           max_fpr=e.max_fpr, threshold=e.f1_threshold)
    if folder is not None:
        with timer("write_scores", library=True):
            write_sed_scores(tables, folder / "scores" / model)
        with timer("write_tables"):
            result["per_class"].to_csv(folder / f"per_class_{model}.csv", index=False, float_format="%.6g")
    return result


def grounding(scored: Scored, column: int, phrases: Callable[[str], list[tuple[str, list]]], timer: M.Timer) -> dict:
    """Alignment (FLAM's Spearman) and frame AUROC of each clip's own phrases (FLAM: only the
    events present in the clip)."""
    with timer("alignment"):
        ps, ys = [], []
        for i, t, p in zip(scored.ids, scored.timestamps_s, scored.probs):
            for q, (_, segments) in enumerate(phrases(i)):
                ps.append(p[column][:, q])
                ys.append(M.labels_on_grid(segments, t))
        aligned = M.alignment(ps, ys)
        from trainer.heldout import auroc

        frame_auc = auroc(np.concatenate(ps), np.concatenate(ys)) if ps else float("nan")
    return {"alignment": aligned, "frame_auroc": frame_auc}


def retrieval_metrics(det: Detector, scored: Scored, captions: dict[str, Iterable[str]], timer: M.Timer) -> dict:
    texts = sorted({c for i in scored.ids for c in captions[i]})
    where = {t: k for k, t in enumerate(texts)}
    pairs = [(a, where[c]) for a, i in enumerate(scored.ids) for c in captions[i]]
    with timer("model_scoring_text"):  # a model forward pass, like the audio scoring
        t = text_matrix(det, texts)
    with timer("retrieval"):
        return M.retrieval(scored.clip_matrix, t, pairs)


def classification_metrics(det: Detector, scored: Scored, labels: dict[str, str], queries: dict[str, str], timer: M.Timer) -> dict:
    classes = sorted({labels[i] for i in scored.ids})
    with timer("model_scoring_text"):  # a model forward pass, like the audio scoring
        t = text_matrix(det, [ZERO_SHOT_TEMPLATE.format(queries.get(c, c.replace("_", " ").lower())) for c in classes])
    with timer("classification"):
        y = np.array([classes.index(labels[i]) for i in scored.ids])
        return M.classification(scored.clip_matrix, t, y)


def evaluate_split(det: Detector, split: ShardSplit, clips, e, details: Path, model: str, timer: M.Timer, skips: list[Skip]) -> tuple[dict, dict]:
    classes, queries = split.classes, split.queries()
    class_vocab = det.vocabulary([queries[c] for c in classes])
    texts = sorted({p["phrase"] for ps in split.phrases.values() for p in ps})
    phrase_vocab = det.vocabulary(texts)
    where = {t: k for k, t in enumerate(texts)}
    own = {i: subset(phrase_vocab, [where[p["phrase"]] for p in split.phrases[i]]) for i in split.ids}
    scored = score_all(det, split.audio(), lambda i: [class_vocab, own[i]], skips,
                       keep_waves=e.pictures if model == "trained" else 0, desc=f"evaluate {model}", total=len(split.ids))
    timer.seconds[f"model_scoring_{model}"] += scored.seconds
    folder = details / "test"
    result = detection(scored, 0, split.ground_truth(), split.durations_s, classes, e, timer, folder, model)
    segments = {i: [(p["phrase"], [(s["start_s"], s["end_s"]) for s in p["segments"]]) for p in split.phrases[i]] for i in split.ids}
    out = {k: result[k] for k in ("psds1", "psds2", "auroc", "pauroc", "f1", "precision", "recall", "f1_micro")}
    out |= grounding(scored, 1, lambda i: segments[i], timer)
    out |= retrieval_metrics(det, scored, {i: [split.captions[i]] for i in split.ids}, timer)
    if clips is not None and clips.audio:
        clip_scored = score_all(det, clips.audio.items(), lambda i: [], skips, desc=f"event clips {model}", total=len(clips.audio))
        timer.seconds[f"model_scoring_{model}"] += clip_scored.seconds
        out["zero_shot_accuracy"] = classification_metrics(det, clip_scored, clips.labels, queries, timer)["accuracy"]
        out["zero_shot_clips"] = len(clip_scored.ids)
    out["clips"] = len(scored.ids)
    out["clips_per_s"] = len(scored.ids) / max(scored.seconds, 1e-9)
    if model == "trained":
        for i, w in scored.waves.items():
            k = scored.ids.index(i)
            truth = {phrase: segs for phrase, segs in segments[i]}
            plots.detection_figure(details / "pictures" / f"{i}.png", w, det.sample_rate_hz, scored.timestamps_s[k],
                                   scored.probs[k][1], list(own[i].texts), truth, title=f"{i}: {split.captions[i]}")
    curves = {k: result[k] for k in ("roc", "psd_1_roc", "psd_2_roc", "psd_1_class_mean", "psd_2_class_mean")}
    return out, curves


def evaluate_benchmark(det: Detector, name: str, data, e, details: Path, model: str, timer: M.Timer, skips: list[Skip]) -> dict:
    from trainer.evaluate.readers import (
        ClassificationSet,
        GroundingSet,
        RetrievalSet,
        SedSet,
    )

    audio, n = data.audio.items(), len(data.audio)
    if isinstance(data, SedSet):
        vocab = det.vocabulary([data.queries[c] for c in data.classes])
        scored = score_all(det, audio, lambda i: [vocab], skips, desc=f"{name} {model}", total=n)
        r = detection(scored, 0, data.ground_truth, data.durations_s, data.classes, e, timer, details / "benchmarks" / name, model, data.alpha_st)
        out = {k: r[k] for k in ("psds1", "psds2", "auroc", "pauroc", "f1")}
    elif isinstance(data, GroundingSet):
        texts = sorted({p for ps in data.phrases.values() for p, _ in ps})
        vocab, where = det.vocabulary(texts), {t: k for k, t in enumerate(texts)}
        scored = score_all(det, audio, lambda i: [subset(vocab, [where[p] for p, _ in data.phrases[i]])], skips, desc=f"{name} {model}", total=n)
        out = grounding(scored, 0, lambda i: data.phrases[i], timer)
    elif isinstance(data, RetrievalSet):
        scored = score_all(det, audio, lambda i: [], skips, desc=f"{name} {model}", total=n)
        out = retrieval_metrics(det, scored, data.captions, timer)
    elif isinstance(data, ClassificationSet):
        scored = score_all(det, audio, lambda i: [], skips, desc=f"{name} {model}", total=n)
        out = classification_metrics(det, scored, data.labels, data.queries, timer)
    else:
        raise TypeError(f"evaluate: benchmark {name} gave {type(data).__name__}")
    timer.seconds[f"model_scoring_{model}"] += scored.seconds
    return out | {"clips": len(scored.ids)}


def detectors(e, seed_fallback: int) -> dict[str, Detector]:
    kwargs = {"device": e.device, "overlap": e.window_overlap, "batch_size": e.batch_size}
    trained = Detector.from_checkpoint(e.checkpoint, **kwargs)
    models = {"trained": trained}
    if e.untrained:
        seed = trained.seed if trained.seed is not None else seed_fallback
        models["untrained"] = Detector.untrained(trained.train_params, seed, **kwargs)
    return models


def run(params) -> dict:
    from trainer.evaluate.readers import BenchmarkMissing, read_benchmark

    e = params.evaluate
    out = Path(e.out_dir)
    timer = M.Timer()
    with timer("read_split"):
        split = read_split(e.shards, e.split)
        clips = event_clips(e.event_clips, split) if e.event_clips else None
    models = detectors(e, params.seed)
    skips: list[Skip] = []
    summary: dict = {"test": {}, "benchmarks": {}}
    curves: dict = {}
    with staged_dir(out / "details") as details, staged_dir(out / "plots") as plot_dir:
        write_truth(details / "test", split.ground_truth(), split.durations_s)
        for name, det in models.items():
            summary["test"][name], curves[name] = evaluate_split(det, split, clips, e, details, name, timer, skips)
        for name, cfg in sorted(e.benchmarks.items()):
            cfg = dict(cfg)
            kind = cfg.pop("kind")
            try:
                with timer("read_benchmarks"):
                    data = read_benchmark(kind, **cfg)
            except BenchmarkMissing as x:
                print(f"evaluate: skipping benchmark {name}: {x}")
                summary["benchmarks"][name] = {"skipped": str(x)}
                continue
            summary["benchmarks"][name] = {m: evaluate_benchmark(det, name, data, e, details, m, timer, skips) for m, det in models.items()}
        if "untrained" in summary["test"]:
            a, b = summary["test"]["trained"], summary["test"]["untrained"]
            summary["test"]["gain"] = {k: a[k] - b[k] for k in HEADLINE if k in a and k in b}
        for name, c in curves.items():
            tpr, fpr = c["roc"]
            plots.write_curve(plot_dir / f"roc_{name}.csv", "fpr", "tpr", fpr, tpr)
            for key, file in (("psd_1_roc", "psds1_roc"), ("psd_2_roc", "psds2_roc")):
                etpr, efpr = c[key]
                plots.write_curve(plot_dir / f"{file}_{name}.csv", "efpr", "etpr", efpr, etpr)
        plots.curves_figure(plot_dir / "curves.png", curves)
        write_skips(details / "skipped.csv", skips)
    summary["skipped"] = len(skips)
    summary["time"] = timer.summary()
    write_json(out / "metrics.json", summary)
    print(report(summary))
    return summary


def report(summary: dict) -> str:
    lines = ["evaluate: held-out split"]
    test = summary["test"]
    names = [n for n in ("trained", "untrained", "gain") if n in test]
    lines.append(f"  {'metric':<20}" + "".join(f"{n:>11}" for n in names))
    for k in HEADLINE:
        if any(k in test[n] for n in names):
            lines.append(f"  {k:<20}" + "".join(f"{test[n].get(k, float('nan')):>11.3f}" for n in names))
    for name, b in summary["benchmarks"].items():
        lines.append(f"  benchmark {name}: " + (b["skipped"] if "skipped" in b else
                     ", ".join(f"{k} {v:.3f}" for k, v in b.get("trained", {}).items() if k != "clips")))
    t = summary["time"]
    scoring = {k: v for k, v in t.items() if k.startswith("model_scoring")}
    rates = [f"{m} {test[m]['clips_per_s']:.1f} clips/s" for m in ("trained", "untrained") if m in test]
    lines.append(f"  time: model scoring {sum(scoring.values()):.1f} s ({', '.join(rates)})")
    metric_keys = [k for k in t if k.endswith("_s") and not k.startswith(("model_scoring", "total", "metrics", "sed_scores_eval"))]
    lines.append("  steps: " + ", ".join(f"{k.removesuffix('_s')} {t[k]:.2f} s" for k in metric_keys))
    lines.append(f"  metrics {t['metrics_s']:.2f} s, of which sed_scores_eval {t['sed_scores_eval_s']:.2f} s "
                 f"({100 * t['outside_sed_scores_eval_share']:.1f}% outside it); {t['total_s']:.2f} s in all")
    return "\n".join(lines)
