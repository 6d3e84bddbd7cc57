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
from pathlib import Path

from pipeline.outputs import staged_dir, write_json, write_skips
from pipeline.schema import Skip
from trainer.evaluation import metrics as M
from trainer.evaluation import plots
from trainer.evaluation.detector import Detector
from trainer.evaluation.scoring import (
    classification_metrics,
    detection,
    grounding,
    retrieval_metrics,
    score_all,
    subset,
)
from trainer.evaluation.testset import ShardSplit, event_clips, read_split

HEADLINE = ("psds1", "psds2", "auroc", "pauroc", "f1", "alignment", "a2t_r1", "a2t_r5", "a2t_r10",
            "t2a_r1", "t2a_r5", "t2a_r10", "zero_shot_accuracy")


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


def evaluate_split(det: Detector, split: ShardSplit, clips, e, details: Path, model: str, timer: M.Timer, skips: list[Skip]) -> tuple[dict, dict]:
    """One model on our held-out split (and the event clips, zero-shot) -> ``(metrics, curves)``;
    writes its score files, per-class table and, for the trained model, the pictures under ``details``."""
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
    """One model on a public benchmark read by :mod:`trainer.evaluation.readers` -> the metrics its kind has."""
    from trainer.evaluation.readers import (
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
    """``trained`` (``evaluate.checkpoint``) and, with ``evaluate.untrained``, the same model at the trainer's initial weights."""
    kwargs = {"device": e.device, "overlap": e.window_overlap, "batch_size": e.batch_size}
    trained = Detector.from_checkpoint(e.checkpoint, **kwargs)
    models = {"trained": trained}
    if e.untrained:
        seed = trained.seed if trained.seed is not None else seed_fallback
        models["untrained"] = Detector.untrained(trained.train_params, seed, **kwargs)
    return models


def run(params) -> dict:
    from trainer.evaluation.readers import BenchmarkMissing, read_benchmark

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
    """The printed summary: headline metrics per model and the gain, benchmarks, where the time went."""
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
