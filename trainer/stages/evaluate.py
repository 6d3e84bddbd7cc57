"""The ``evaluate`` stage: a trained FineLAP checkpoint (and the same model untrained) on the
held-out split of our shards, the held-out event clips and any public benchmark configured.

Input: ``evaluate`` params (checkpoint, shard folder and split, clip folder, benchmarks).
Output, under ``evaluate.out_dir``:

- ``metrics.json``: per model (``trained``, ``untrained``) and the ``gain``: PSDS1 (``psds1``,
  alpha_st 1, and ``psds1_astat0``, alpha_st 0), PSDS2, segment AUROC/pAUROC, collar F1 (at the
  threshold and median filter chosen on the valid split), 1 s segment F1 (``segment_f1``, micro,
  at the same threshold), alignment, retrieval R@1/5/10 both ways and zero-shot accuracy on the
  event clips two ways (``zero_shot_accuracy``: the clip embedding against "The sound of
  {query}"; ``zero_shot_frame_accuracy``: the class whose frame probability peaks highest); per benchmark the same keys or
  ``{"skipped": reason}``; a ``protocol`` block at the top (the test split) and in each
  benchmark's entry that states how the numbers were computed (:func:`metrics.protocol`: library
  version, PSDS settings, median filter, collar F1 threshold and its source, classes, clips,
  events, frame hop). A benchmark whose files are absent, malformed or without a usable clip is
  skipped with its reason. ``skipped`` counts the rows of ``details/skipped.csv``. Nothing in it depends on
  timing: the same checkpoint and data give the same bytes.
- ``metrics.json`` also holds, with ``evaluate.probes``, ``probes``: linear probes on each model's
  frozen audio-encoder frames (:mod:`trainer.evaluation.encoder_probes`; event-clip classification
  with mean and attention pooling, frame-level detection on the mixtures), a ``protocol`` and the
  ``gain``; with ``evaluate.caption_metrics``, ``captions``: BLEU, ROUGE-L and CIDEr-D of the
  trained checkpoint's captioning decoder on the split (:mod:`trainer.evaluation.captioning`), or
  ``{"skipped": reason}`` when it has none (its captions in ``details/test/captions_trained.csv``).
- ``timing.json``: where the time went and the scoring throughput (clips/s) per model.
- ``details/test/``: ``ground_truth.tsv`` and ``durations.tsv`` (DCASE layout),
  ``scores/<model>/<clip>.tsv`` (sed_scores_eval's layout; the median-filtered scores PSDS and
  AUROC were computed on), ``scores_f1/<model>/<clip>.tsv`` when collar F1's median filter is
  another (the tables collar and segment F1 were computed on), ``protocol.json`` (the ``protocol``
  block, whose ``files`` names the folder each metric reads), so ``sed_scores_eval`` recomputes
  every detection number from these files, and ``per_class_<model>.csv``;
  ``details/benchmarks/<name>/`` the same per detection benchmark;
  ``details/pictures/<clip>.png`` (each phrase's median-filtered probabilities, its ground truth
  shaded, the events found at the F1 threshold as bars; below them, in grey and marked
  "(absent)", the 3 classes absent from the clip whose median-filtered class query peaks
  highest, so wrong classes firing show); ``details/skipped.csv`` (each clip, row or shard left out,
  with its reason, once; a benchmark's as ``<benchmark>/<id>``: the ground-truth rows and clips its
  reader left out and its audio that does not decode).
- ``details/test/confusion_trained.csv`` and ``details/test/confusion_trained.png``: the trained
  model's class-by-class confusion on the split (:func:`metrics.confusion`): row = true class
  (with its event count), column = query class, cell = the mean over the row class's events of
  the query's peak median-filtered probability on the frames overlapping the event; diagonal =
  each class on its own events.
- ``plots/``: ROC and PSD-ROC curves as CSVs for ``dvc plots`` and ``curves.png``.

Every clip is scored once per model (one forward pass over its windows); every metric reads
those scores. Collar F1 uses one threshold for both models (``evaluate.f1_threshold``: a number,
or ``checkpoint`` for the one ``sedsynth train`` chose on the valid split and stored in the
trained checkpoint), so trained and untrained are compared at one operating point.

Before anything is read or written, ``evaluate.out_dir`` is checked as the data stages check
theirs (:func:`~pipeline.outputs.check_out_dir`): not the filesystem root, the home folder or the
project root, and not one of the folders of :func:`kept_folders` (what it reads, the data stages'
folders, the pretrain stage's and the train stage's checkpoints), nor inside or around one; inside
``train.out_dir`` (its ``evaluation/``) is where it belongs. A run holds the folder's lock
(:func:`~pipeline.outputs.output_lock`) while it writes, so a second run into it is refused.
"""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import numpy as np

from pipeline.config.params import folders_besides
from pipeline.outputs import check_out_dir, output_lock, staged_dir, write_json, write_skips
from pipeline.schema import Skip
from trainer.data.sources import SourceError
from trainer.evaluation import metrics as M
from trainer.evaluation import plots
from trainer.evaluation.calibration import f1_median_filter, threshold_setting
from trainer.evaluation.captioning import split_captions
from trainer.evaluation.detect_files import events
from trainer.evaluation.detector import ZERO_SHOT_TEMPLATE, Detector
from trainer.evaluation.encoder_probes import probe_data, protocol, run_probes
from trainer.evaluation.scoring import (
    classification_metrics,
    detection,
    frame_classification_metrics,
    grounding,
    retrieval_metrics,
    score_all,
    subset,
    zero_shot_classes,
)
from trainer.evaluation.testset import ShardSplit, event_clips, read_split
from trainer.memory import release_freed_heap

HEADLINE = (
    "psds1",
    "psds1_astat0",
    "psds2",
    "auroc",
    "pauroc",
    "f1",
    "segment_f1",
    "alignment",
    "a2t_r1",
    "a2t_r5",
    "a2t_r10",
    "t2a_r1",
    "t2a_r5",
    "t2a_r10",
    "zero_shot_accuracy",
    "zero_shot_frame_accuracy",
)
# the probe figures the report prints and the gain compares: (probe, figure)
PROBE_HEADLINE = (
    ("clip_mean", "top1_accuracy"),
    ("clip_mean", "mean_average_precision"),
    ("clip_attention", "top1_accuracy"),
    ("clip_attention", "mean_average_precision"),
    ("frame", "frame_auroc_macro"),
    ("frame", "segment_f1"),
)
NOT_TIMED_AS_METRICS = ("model_scoring", "read_", "probes", "captions_")  # timing.json: steps outside the metric work
ABSENT_SHOWN = 3  # absent classes drawn under each picture's own phrases


def write_truth(folder: Path, ground_truth: dict, durations_s: dict) -> None:
    """DCASE ``ground_truth.tsv`` (filename onset offset event_label) and ``durations.tsv``; a cell that
    would break a line-split reader's rows (a tab or line break) raises ``ValueError`` instead of being written."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "ground_truth.tsv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(["filename", "onset", "offset", "event_label"])
        for i in sorted(ground_truth):
            for on, off, label in ground_truth[i]:
                w.writerow([M.tsv_cell(f"{i}.wav", "clip"), repr(float(on)), repr(float(off)), M.tsv_cell(label, "label")])
            if not ground_truth[i]:  # a clip without events: an empty row, as DCASE files have
                w.writerow([M.tsv_cell(f"{i}.wav", "clip"), "", "", ""])
    with open(folder / "durations.tsv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(["filename", "duration"])
        for i in sorted(durations_s):
            w.writerow([M.tsv_cell(f"{i}.wav", "clip"), repr(float(durations_s[i]))])


def evaluate_split(
    det: Detector,
    split: ShardSplit,
    clips,
    e,
    *,
    details: Path,
    model: str,
    timer: M.Timer,
    skips: list[Skip],
    threshold_source: str = "evaluate.f1_threshold",
) -> tuple[dict, dict]:
    """One model on our held-out split (and the event clips, zero-shot) -> ``(metrics, extras)``, extras
    being ``{"curves", "protocol", "clips_per_s"}``; writes its score files, per-class table and,
    for the trained model, the pictures under ``details``."""
    classes, queries = split.classes, split.queries()
    class_vocab = det.vocabulary([queries[c] for c in classes])
    texts = sorted({p["phrase"] for ps in split.phrases.values() for p in ps})
    phrase_vocab = det.vocabulary(texts)
    where = {t: k for k, t in enumerate(texts)}
    own = {i: subset(phrase_vocab, [where[p["phrase"]] for p in split.phrases[i]]) for i in split.ids}
    scored = score_all(
        det,
        split.audio(),
        lambda i: [class_vocab, own[i]],
        skips,
        keep_waves=e.pictures if model == "trained" else 0,
        desc=f"evaluate {model}",
        total=len(split.ids),
    )
    timer.seconds[f"model_scoring_{model}"] += scored.seconds
    folder = details / "test"
    truth_events = split.ground_truth()
    result = detection(
        scored,
        0,
        truth_events,
        split.durations_s,
        classes,
        e,
        timer,
        folder=folder,
        model=model,
        threshold_source=threshold_source,
    )
    segments = {
        i: [(p["phrase"], [(s["start_s"], s["end_s"]) for s in p["segments"]]) for p in split.phrases[i]] for i in split.ids
    }
    out = {
        k: result[k]
        for k in (
            "psds1",
            "psds1_astat0",
            "psds2",
            "auroc",
            "pauroc",
            "f1",
            "precision",
            "recall",
            "f1_micro",
            "segment_f1",
            "segment_f1_macro",
        )
    }
    out |= grounding(scored, 1, lambda i: segments[i], timer)
    out |= retrieval_metrics(det, scored, {i: [split.captions[i]] for i in split.ids}, timer)
    if clips is not None and clips.audio:
        zs_classes, zs_queries = zero_shot_classes(clips.labels, queries)
        zs_vocab = det.vocabulary(zs_queries)
        clip_scored = score_all(
            det, clips.audio.items(), lambda i: [zs_vocab], skips, desc=f"event clips {model}", total=len(clips.audio)
        )
        timer.seconds[f"model_scoring_{model}"] += clip_scored.seconds
        out["zero_shot_accuracy"] = classification_metrics(det, clip_scored, clips.labels, queries, timer)["accuracy"]
        out["zero_shot_frame_accuracy"] = frame_classification_metrics(clip_scored, 0, clips.labels, zs_classes, timer)[
            "accuracy"
        ]
        out["zero_shot_clips"] = len(clip_scored.ids)
    out["clips"] = len(scored.ids)
    if model == "trained":
        pictures(det, split, scored, own, segments, truth_events, e, details)
        write_confusion(split.classes, scored, truth_events, e, details)
    curves = {k: result[k] for k in ("roc", "psd_1_roc", "psd_2_roc", "psd_1_class_mean", "psd_2_class_mean")}
    return out, {"curves": curves, "protocol": result["protocol"], "clips_per_s": len(scored.ids) / max(scored.seconds, 1e-9)}


def pictures(det: Detector, split: ShardSplit, scored, own: dict, segments: dict, truth_events: dict, e, details: Path) -> None:
    """``details/pictures/<clip>.png`` for each clip whose wave ``scored`` kept: its own phrases
    (vocabulary 1, ``own[clip]``; ground truth ``segments[clip]``, events at the F1 threshold) and
    below them the :data:`ABSENT_SHOWN` classes (vocabulary 0) absent from ``truth_events[clip]``
    whose peak is highest, all median-filtered as the metrics see them."""
    classes, queries = split.classes, split.queries()
    for i, w in scored.waves.items():
        k = scored.ids.index(i)
        truth = {phrase: segs for phrase, segs in segments[i]}
        probs, texts = M.smooth(scored.probs[k][1], e.median_filter_frames), list(own[i].texts)
        found_in = M.smooth(scored.probs[k][1], e.f1_median_filter_frames)  # the events collar F1 counts
        found = {t: events(scored.timestamps_s[k], found_in[:, q], e.f1_threshold) for q, t in enumerate(texts)}
        class_probs = M.smooth(scored.probs[k][0], e.median_filter_frames)
        gone = plots.top_absent(class_probs, classes, {c for *_, c in truth_events[i]}, ABSENT_SHOWN)
        rows = np.concatenate([probs, class_probs[:, gone]], axis=1)
        plots.detection_figure(
            details / "pictures" / f"{i}.png",
            w,
            det.sample_rate_hz,
            scored.timestamps_s[k],
            rows,
            texts + [queries[classes[c]] for c in gone],
            truth=truth,
            events=found,
            title=f"{i}: {split.captions[i]}",
            threshold=e.f1_threshold,
            absent=len(gone),
        )


def write_confusion(classes, scored, truth_events: dict, e, details: Path) -> None:
    """The class-by-class confusion of vocabulary 0 of ``scored`` (one query per class of ``classes``,
    median-filtered) on ``truth_events`` (:func:`metrics.confusion`) -> ``details/test/confusion_trained.csv``
    (``true_class``, ``events``, one column per query class) and ``details/test/confusion_trained.png``."""
    classes = list(classes)
    smoothed = (M.smooth(p[0], e.median_filter_frames) for p in scored.probs)
    matrix, counts = M.confusion(scored.ids, scored.timestamps_s, smoothed, truth_events, classes)
    folder = details / "test"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "confusion_trained.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["true_class", "events", *classes])
        w.writerows([c, int(n), *(f"{v:.6g}" for v in row)] for c, n, row in zip(classes, counts, matrix))
    plots.confusion_figure(folder / "confusion_trained.png", matrix, classes)


def evaluate_benchmark(
    det: Detector,
    name: str,
    data,
    e,
    *,
    details: Path,
    model: str,
    timer: M.Timer,
    skips: list[Skip],
    threshold_source: str = "evaluate.f1_threshold",
) -> tuple[dict, dict]:
    """One model on a public benchmark read by :mod:`trainer.evaluation.readers` -> ``(metrics, protocol)``:
    the metrics its kind has and how they were computed (for SED sets :func:`metrics.protocol`)."""
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
        r = detection(
            scored,
            0,
            data.ground_truth,
            data.durations_s,
            data.classes,
            e,
            timer,
            folder=details / "benchmarks" / name,
            model=model,
            threshold_source=threshold_source,
        )
        out = {k: r[k] for k in ("psds1", "psds1_astat0", "psds2", "auroc", "pauroc", "f1")}
        # the PSDS1 a published number on this set compares with (FineLAP: alpha_st 0 on AudioSet-Strong)
        protocol = r["protocol"] | {"published_psds1": "psds1" if data.alpha_st == 1.0 else "psds1_astat0"}
        # the scored clips' ground truth and durations (as scored) beside their score files, as for the test split
        write_truth(
            details / "benchmarks" / name,
            {i: data.ground_truth[i] for i in scored.ids},
            {i: min(data.durations_s[i], float(t[-1])) for i, t in zip(scored.ids, scored.timestamps_s)},
        )
        write_json(details / "benchmarks" / name / "protocol.json", protocol)
    elif isinstance(data, GroundingSet):
        texts = sorted({p for ps in data.phrases.values() for p, _ in ps})
        vocab, where = det.vocabulary(texts), {t: k for k, t in enumerate(texts)}
        scored = score_all(
            det, audio, lambda i: [subset(vocab, [where[p] for p, _ in data.phrases[i]])], skips, desc=f"{name} {model}", total=n
        )
        out = grounding(scored, 0, lambda i: data.phrases[i], timer)
        protocol = {
            "phrases": sum(len(data.phrases[i]) for i in scored.ids),
            "frame_hop_s": max((float(t[1] - t[0]) for t in scored.timestamps_s), default=float("nan")),
        }
    elif isinstance(data, RetrievalSet):
        scored = score_all(det, audio, lambda i: [], skips, desc=f"{name} {model}", total=n)
        out = retrieval_metrics(det, scored, data.captions, timer)
        protocol = {"captions": sum(len(tuple(data.captions[i])) for i in scored.ids)}
    elif isinstance(data, ClassificationSet):
        scored = score_all(det, audio, lambda i: [], skips, desc=f"{name} {model}", total=n)
        out = classification_metrics(det, scored, data.labels, data.queries, timer)
        protocol = {"template": ZERO_SHOT_TEMPLATE, "num_classes": len({data.labels[i] for i in scored.ids})}
    else:
        raise TypeError(f"evaluate: benchmark {name} gave {type(data).__name__}")
    timer.seconds[f"model_scoring_{model}"] += scored.seconds
    return out | {"clips": len(scored.ids)}, {"kind": type(data).__name__, "clips": len(scored.ids), **protocol}


def detectors(e, seed_fallback: int) -> dict[str, Detector]:
    """``trained`` (``evaluate.checkpoint``) and, with ``evaluate.untrained``, the same model at the trainer's initial weights."""
    kwargs = {"device": e.device, "overlap": e.window_overlap, "batch_size": e.batch_size}
    trained = Detector.from_checkpoint(e.checkpoint, **kwargs)
    models = {"trained": trained}
    if e.untrained:
        seed = trained.seed if trained.seed is not None else seed_fallback
        models["untrained"] = Detector.untrained(trained.train_params, seed, **kwargs)
    return models


def probes(models: dict[str, Detector], e, split: ShardSplit, clips, seed: int, timer: M.Timer) -> dict:
    """Every probe of :func:`run_probes` on each model's frozen encoder, trained on ``evaluate.probe_split``
    and scored on ``split`` -> ``{"protocol", <model>: figures, "gain": trained minus untrained}``, or
    ``{"skipped": why}`` when the probe split cannot be read."""
    try:
        with timer("read_probe_split"):
            train_split = read_split(e.shards, e.probe_split, first=e.probe_clips)
            train_clips = event_clips(e.event_clips, train_split) if clips is not None else None
    except (SourceError, FileNotFoundError) as x:
        print(f"evaluate: skipping the probes: {x}")
        return {"skipped": str(x)}
    data = probe_data(train_split, split, train_clips, clips, e.probe_clips, seed)
    out: dict = {"protocol": protocol(models["trained"], data, e, seed)}
    with timer("probes"):
        out |= run_probes(models, data, e, seed)
    if "untrained" in out:
        a, b = out["trained"], out["untrained"]
        out["gain"] = {
            f"{probe}_{k}": a[probe][k] - b[probe][k]
            for probe, k in PROBE_HEADLINE
            if k in a.get(probe, {}) and k in b.get(probe, {})
        }
    return out


def captions(det: Detector, split: ShardSplit, folder: Path, e, timer: M.Timer) -> dict:
    """Caption scores of ``det``'s captioning decoder on ``split`` (:func:`split_captions`); writes
    ``captions_trained.csv`` (id, prediction, reference) under ``folder``."""
    with timer("captions_trained"):
        scores, rows = split_captions(det, split, e.batch_size)
    if rows:
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "captions_trained.csv", "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(["id", "prediction", "reference"])
            w.writerows(rows)
    return scores


def collar_threshold(e) -> tuple[float, str, dict | None]:
    """``evaluate.f1_threshold`` resolved against the trained checkpoint (:func:`threshold_setting`):
    ``(threshold, its source, the stored calibration or None)``; both models use it."""
    threshold, source, stored = threshold_setting(e.f1_threshold, e.checkpoint)
    return threshold, f"{source}; every model at this threshold", stored


def run(params) -> dict:
    """Evaluate as ``params.evaluate`` says; writes ``metrics.json``, ``timing.json``, ``details/`` and
    ``plots/`` under ``evaluate.out_dir`` and returns what ``metrics.json`` holds. Raises
    :class:`~pipeline.outputs.OutDirError` for a folder it must not write into and
    :class:`~pipeline.outputs.OutputBusyError` while another run writes it, before writing anything."""
    out = Path(params.evaluate.out_dir)
    check_out_dir(out, "evaluate.out_dir", kept_folders(params))
    with output_lock(out):
        return evaluate(params, out)


def kept_folders(params) -> dict[str, str | None]:
    """The folders (and files) ``evaluate.out_dir`` must not be, lie inside or hold, by setting: what
    it reads (``evaluate.shards``, ``evaluate.event_clips``, ``evaluate.checkpoint``, each benchmark's
    files and folders), every data stage's folder, the pretrain stage's output folder and the train
    stage's ``checkpoints`` (so not ``train.out_dir`` itself, whose ``metrics.json`` it would
    overwrite). URLs (``hf://...``) are left out."""
    from trainer.evaluation.readers import _PATH_HELP as BENCHMARK_PATHS

    e = params.evaluate
    kept: dict[str, str | None] = {
        **folders_besides(params, "evaluate.out_dir"),
        "pretrain.out_dir": params.pretrain.out_dir,
        "train.out_dir's checkpoints": str(Path(params.train.out_dir) / "checkpoints"),
        "evaluate.shards": e.shards,
        "evaluate.event_clips": e.event_clips,
        "evaluate.checkpoint": e.checkpoint,
    }
    for name, cfg in e.benchmarks.items():
        if isinstance(cfg, dict):
            kept |= {f"evaluate.benchmarks.{name}.{key}": cfg.get(key) for key in BENCHMARK_PATHS.get(cfg.get("kind"), {})}
    return {key: folder for key, folder in kept.items() if isinstance(folder, (str, Path)) and "://" not in str(folder)}


def evaluate(params, out: Path) -> dict:
    """:func:`run`'s work, into ``out`` (checked and locked)."""
    from trainer.evaluation.readers import BenchmarkError, BenchmarkMissing, read_benchmark

    e = params.evaluate
    timer = M.Timer()
    with timer("read_split"):
        split = read_split(e.shards, e.split)
        clips = event_clips(e.event_clips, split) if e.event_clips else None
    models = detectors(e, params.seed)
    threshold, source, stored = collar_threshold(e)
    e = replace(
        e,
        f1_threshold=threshold,
        f1_median_filter_frames=f1_median_filter(e.f1_median_filter_frames, stored, e.median_filter_frames),
    )
    skips: list[Skip] = list(split.skips)  # the split's bad rows and shards, each with its reason
    summary: dict = {"test": {}, "benchmarks": {}}
    extras: dict = {}
    with staged_dir(out / "details") as details, staged_dir(out / "plots") as plot_dir:
        write_truth(details / "test", split.ground_truth(), split.durations_s)
        for name, det in models.items():
            summary["test"][name], extras[name] = evaluate_split(
                det, split, clips, e, details=details, model=name, timer=timer, skips=skips, threshold_source=source
            )
            release_freed_heap()  # its scores and metric tables are gone; what comes next (probes' frames) is mapped anew
        summary["protocol"] = extras["trained"]["protocol"]
        if stored is not None:
            summary["protocol"]["collar_f1"]["calibration"] = stored
        write_json(details / "test" / "protocol.json", summary["protocol"])  # beside the files it names
        if e.probes:
            summary["probes"] = probes(models, e, split, clips, params.seed, timer)
        if e.caption_metrics:
            summary["captions"] = captions(models["trained"], split, details / "test", e, timer)
        for name, cfg in sorted(e.benchmarks.items()):
            cfg = dict(cfg)
            kind = cfg.pop("kind")
            try:
                with timer("read_benchmarks"):
                    data = read_benchmark(kind, **cfg)
            except (BenchmarkMissing, BenchmarkError) as x:  # absent, malformed or no usable clip: this benchmark alone
                print(f"evaluate: skipping benchmark {name}: {x}")
                summary["benchmarks"][name] = {"skipped": str(x)}
                continue
            left_out: list[Skip] = list(getattr(data, "skips", ()))  # the rows and clips its reader left out (SED sets keep them)
            entry = {}
            for m, det in models.items():
                entry[m], entry["protocol"] = evaluate_benchmark(
                    det, name, data, e, details=details, model=m, timer=timer, skips=left_out, threshold_source=source
                )
            summary["benchmarks"][name] = entry
            skips += [replace(s, item_id=f"{name}/{s.item_id}") for s in left_out]  # its ids apart from the split's
        if "untrained" in summary["test"]:
            a, b = summary["test"]["trained"], summary["test"]["untrained"]
            summary["test"]["gain"] = {k: a[k] - b[k] for k in HEADLINE if k in a and k in b}
        for name, x in extras.items():
            c = x["curves"]
            tpr, fpr = c["roc"]
            plots.write_curve(plot_dir / f"roc_{name}.csv", "fpr", "tpr", fpr, tpr)
            for key, file in (("psd_1_roc", "psds1_roc"), ("psd_2_roc", "psds2_roc")):
                etpr, efpr = c[key]
                plots.write_curve(plot_dir / f"{file}_{name}.csv", "efpr", "etpr", efpr, etpr)
        plots.curves_figure(plot_dir / "curves.png", {name: x["curves"] for name, x in extras.items()})
        skips = list(dict.fromkeys(skips))  # a clip that does not decode is one skip, not one per model
        write_skips(details / "skipped.csv", skips)
    summary["skipped"] = len(skips)
    timing = {"time": timer.summary(NOT_TIMED_AS_METRICS), "clips_per_s": {name: x["clips_per_s"] for name, x in extras.items()}}
    write_json(out / "metrics.json", summary)
    write_json(out / "timing.json", timing)
    print(report(summary, timing))
    return summary


def report(summary: dict, timing: dict) -> str:
    """The printed summary: headline metrics per model and the gain, the collar F1 threshold,
    benchmarks, where the time went (``timing``)."""
    lines = ["evaluate: held-out split"]
    test = summary["test"]
    names = [n for n in ("trained", "untrained", "gain") if n in test]
    lines.append(f"  {'metric':<25}" + "".join(f"{n:>11}" for n in names))
    for k in HEADLINE:
        if any(k in test[n] for n in names):
            lines.append(f"  {k:<25}" + "".join(f"{test[n].get(k, float('nan')):>11.3f}" for n in names))
    f1 = summary["protocol"]["collar_f1"]
    lines.append(
        f"  collar F1 at threshold {f1['threshold']:.4g} after a {f1.get('median_filter_frames', '?')}-frame median filter ({f1['threshold_source']})"
    )
    lines += probe_lines(summary.get("probes"), summary.get("captions"))
    for name, b in summary["benchmarks"].items():
        lines.append(
            f"  benchmark {name}: "
            + (
                b["skipped"]
                if "skipped" in b
                else ", ".join(f"{k} {v:.3f}" for k, v in b.get("trained", {}).items() if k != "clips")
            )
        )
    t = timing["time"]
    scoring = {k: v for k, v in t.items() if k.startswith("model_scoring")}
    rates = [f"{m} {r:.1f} clips/s" for m, r in timing["clips_per_s"].items()]
    lines.append(f"  time: model scoring {sum(scoring.values()):.1f} s ({', '.join(rates)})")
    metric_keys = [
        k for k in t if k.endswith("_s") and not k.startswith(("model_scoring", "total", "metrics", "sed_scores_eval"))
    ]
    lines.append("  steps: " + ", ".join(f"{k.removesuffix('_s')} {t[k]:.2f} s" for k in metric_keys))
    lines.append(
        f"  metrics {t['metrics_s']:.2f} s, of which sed_scores_eval {t['sed_scores_eval_s']:.2f} s "
        f"({100 * t['outside_sed_scores_eval_share']:.1f}% outside it); {t['total_s']:.2f} s in all"
    )
    return "\n".join(lines)


def probe_lines(probed: dict | None, captioned: dict | None) -> list[str]:
    """The report's lines for the probes (headline figures per model) and the caption scores."""
    lines = []
    if probed is not None and "skipped" in probed:
        lines.append(f"  probes: skipped ({probed['skipped']})")
    elif probed is not None:
        names = [n for n in ("trained", "untrained") if n in probed]
        lines.append(
            f"  probes on the frozen encoder ({probed['protocol']['train_split']} -> {probed['protocol']['test_split']})"
            + "".join(f"{n:>11}" for n in names)
        )
        for probe, k in PROBE_HEADLINE:
            if any(k in probed[n].get(probe, {}) for n in names):
                lines.append(
                    f"    {probe + ' ' + k:<40}"
                    + "".join(f"{probed[n].get(probe, {}).get(k, float('nan')):>11.3f}" for n in names)
                )
    if captioned is not None:
        lines.append(
            "  captions: "
            + (
                f"skipped ({captioned['skipped']})"
                if "skipped" in captioned
                else ", ".join(f"{k} {captioned[k]:.3f}" for k in ("bleu_4", "rouge_l", "cider_d"))
            )
        )
    return lines
