"""Linear probes of a detector's frozen audio encoder on our own data (CaptionStew's protocol).

The probed features are the audio encoder's final-layer frames: ``encoder(wave)`` gives dense
tokens ``(B, L, F, D)``, and their mean over the F frequency rows, ``(L, D)`` per window, is what
FineLAP's local adapter reads (``D`` is the encoder width, 128 for ``small``, 768 for
``eat-base``). Neither the adapter nor the projections into the text space are probed, so the
figures judge the encoder alone. Audio longer than the model's window is cut into consecutive
windows on the detector's column grid (no overlap) and their frames are joined, so a clip of
``n`` samples has ``len(det.timestamps_s(n)) - 1`` frames, the grid the detection scores use.

Two probe sets, each trained on ``evaluate.probe_split`` and scored on ``evaluate.split``:

- clip classification of the held-out event clips: the clips the probe split's mixtures were
  built from train a probe, the clips the evaluated split's mixtures use are scored (the two
  are disjoint by construction; a clip in both is dropped from the training side); single-label,
  so top-1 accuracy and mAP, after mean pooling and after attention pooling;
- frame-level detection on the mixtures: each class of the evaluated split is a target, a frame
  active as in training (``train.data.min_label_overlap`` of the frame or of the event); the
  probe split's mixtures train it and the evaluated split's are scored: frame AUROC and segment
  F1 over ``evaluate.segment_s`` segments.

Each set holds at most ``evaluate.probe_clips`` clips per side: the first mixtures in shard order
(read no further), and event clips drawn with the seed. The audio is decoded once for every model
probed; on a CPU each head is fitted on one thread (several heads at once, one per core), so every
figure depends on the checkpoint, the data and the seed alone.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from itertools import islice

import numpy as np
import torch

from pipeline.audio import AudioError, decode_mono
from trainer.data.labels import frame_labels
from trainer.evaluation.detector import Detector
from trainer.evaluation.probes import ClipProbeSettings, clip_probe, frame_probe
from trainer.evaluation.scoring import RELEASE_EVERY_CLIPS, Packed
from trainer.evaluation.testset import EventClips, ShardSplit
from trainer.memory import release_freed_heap

FEATURES = "audio encoder's final-layer frames, mean over frequency (encoder width), before FineLAP's adapter and projections"


@dataclass(frozen=True)
class ProbeData:
    """What the probes read, the same for every model: event clips (id -> path, id -> label) and
    mixtures (a split and the ids used) for the training and the held-out side."""

    train_clips: EventClips | None
    test_clips: EventClips | None
    train_split: ShardSplit
    train_ids: tuple[str, ...]
    test_split: ShardSplit
    test_ids: tuple[str, ...]


def probe_data(
    train_split: ShardSplit,
    test_split: ShardSplit,
    train_clips: EventClips | None,
    test_clips: EventClips | None,
    max_clips: int,
    seed: int,
) -> ProbeData:
    """At most ``max_clips`` of each side: the first mixtures of each split, and event clips drawn
    with ``seed`` (training clips that the held-out side also uses are dropped first)."""
    if train_clips is not None and test_clips is not None:
        held_out = set(test_clips.audio)
        train_clips = _draw(
            EventClips(
                {i: a for i, a in train_clips.audio.items() if i not in held_out},
                {i: c for i, c in train_clips.labels.items() if i not in held_out},
            ),
            max_clips,
            seed,
        )
        test_clips = _draw(test_clips, max_clips, seed)
    return ProbeData(train_clips, test_clips, train_split, train_split.ids[:max_clips], test_split, test_split.ids[:max_clips])


def _draw(clips: EventClips, n: int, seed: int) -> EventClips:
    ids = sorted(clips.audio)
    if len(ids) > n:
        ids = sorted(ids[k] for k in np.random.default_rng(seed).choice(len(ids), n, replace=False))
    return EventClips({i: clips.audio[i] for i in ids}, {i: clips.labels[i] for i in ids})


@torch.no_grad()
def encoder_frames(dets: Sequence[Detector], waves: Iterable[np.ndarray]) -> list[list[np.ndarray]]:
    """Mono waves at the detectors' rate -> for each detector, per clip its frozen encoder frames
    ``(L, D)`` float32, ``L = len(det.timestamps_s(n)) - 1``: consecutive windows of ``det.columns``
    columns, each zero-padded to the model's window, ``det.batch_size`` windows per forward pass.
    The detectors share one grid (rate, columns, window, batch size): each wave is read once and
    every encoder gets the same batches (and, when their front ends are alike, one log-mel of
    each), so a model's frames are those it would give alone. As in scoring, the C heap's and
    Arrow's free pages go back to the system every ``RELEASE_EVERY_CLIPS`` clips
    (:func:`~trainer.memory.release_freed_heap`): the shards' audio pages are freed
    there but would stay resident under the frames kept."""
    det = dets[0]
    grid = (det.sample_rate_hz, det.columns, det.column_samples, det.window_samples, det.batch_size)
    if any((d.sample_rate_hz, d.columns, d.column_samples, d.window_samples, d.batch_size) != grid for d in dets):
        raise ValueError("encoder_frames: the detectors read audio on different grids; probe them one at a time")
    cols, col_samples, window = det.columns, det.column_samples, det.window_samples
    out: list[list[np.ndarray]] = [[] for _ in dets]
    kept = [Packed() for _ in dets]  # every clip's frames stay to the end: a few large chunks per model, not one allocation each
    queue: list[tuple[int, int, int, np.ndarray]] = []  # (clip, first column, columns kept, samples)

    fronts = {(d.model.encoder.fbank.params, d.device) if hasattr(d.model.encoder, "fbank") else None for d in dets}
    share_fbank = len(dets) > 1 and len(fronts) == 1 and None not in fronts  # one front end: its log-mel once

    def flush() -> None:
        batch = torch.from_numpy(np.stack([w for *_, w in queue])).to(det.device)
        fbank = (det.model.encoder.features(batch),) if share_fbank else ()
        for d, per_clip in zip(dets, out):
            with d.autocast():
                _, dense = d.model.encoder(batch.to(d.device), *fbank)
            frames = dense.float().mean(dim=2)[:, :cols].cpu().numpy()  # (B, cols, D)
            for j, (k, first, take, _) in enumerate(queue):
                per_clip[k][first : first + take] = frames[j, :take]
        queue.clear()

    for k, wave in enumerate(waves):
        wave = np.asarray(wave, dtype=np.float32)
        frames = len(det.timestamps_s(len(wave))) - 1
        for d, per_clip, store in zip(dets, out, kept):
            per_clip.append(store.zeros((frames, d.model.encoder.width), np.float32))
        for first in range(0, frames, cols):
            piece = wave[first * col_samples : first * col_samples + window]
            queue.append((k, first, min(cols, frames - first), np.pad(piece, (0, window - len(piece)))))
            if len(queue) == det.batch_size:
                flush()
        if (k + 1) % RELEASE_EVERY_CLIPS == 0:
            release_freed_heap()
    if queue:
        flush()
    release_freed_heap()  # the last pages of audio read
    return out


def padded(frames: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per-clip frames ``(L_i, D)`` -> ``(N, T, D)`` zero-padded to the longest and valid ``(N, T)``."""
    t = max(len(f) for f in frames)
    x = np.zeros((len(frames), t, frames[0].shape[1]), np.float32)
    valid = np.zeros((len(frames), t), bool)
    for i, f in enumerate(frames):
        x[i, : len(f)], valid[i, : len(f)] = f, True
    return x, valid


def on(det: Detector, arrays: tuple[np.ndarray, ...]) -> tuple[torch.Tensor, ...]:
    """Numpy arrays as tensors on the detector's device (the probes train where the model runs)."""
    return tuple(torch.from_numpy(a).to(det.device) for a in arrays)


def decoded(det: Detector, audio: Iterable[tuple[str, str | bytes]]) -> tuple[list[str], Iterator[np.ndarray], list[str]]:
    """``(id, path or bytes)`` -> ``(ids, waves, unreadable ids)``; the two lists fill as the waves are read."""
    ids: list[str] = []
    unreadable: list[str] = []

    def waves() -> Iterator[np.ndarray]:
        for i, src in audio:
            try:
                w = decode_mono(src, det.sample_rate_hz)
            except AudioError:
                unreadable.append(i)
                continue
            ids.append(i)
            yield w

    return ids, waves(), unreadable


def mixture_audio(split: ShardSplit, ids: tuple[str, ...]) -> Iterator[tuple[str, bytes]]:
    """The encoded audio of the first ``len(ids)`` rows of ``split`` (``ids`` is a prefix of its ids)."""
    return islice(split.audio(), len(ids))


def frame_targets(
    det: Detector, split: ShardSplit, ids: list[str], frames: list[np.ndarray], classes: tuple[str, ...], min_overlap: float
) -> np.ndarray:
    """Frame targets ``(N, T, C)`` bool on the detector's column grid (``T``: the longest clip),
    from each clip's segments of each class, as training labels frames."""
    t = max(len(f) for f in frames)
    where = {c: k for k, c in enumerate(classes)}
    out = np.zeros((len(ids), t, len(classes)), bool)
    for n, (i, f) in enumerate(zip(ids, frames)):
        edges = det.timestamps_s(round(split.durations_s[i] * det.sample_rate_hz))[: len(f) + 1]
        spans = np.stack([edges[:-1], edges[1:]], axis=1)
        for p in split.phrases[i]:
            if p["label"] in where:
                segs = [(s["start_s"], s["end_s"]) for s in p["segments"]]
                out[n, : len(spans), where[p["label"]]] |= frame_labels(segs, 0.0, spans, min_overlap)
    return out


def clip_features(dets: Sequence[Detector], clips: EventClips) -> tuple[list[str], list[list[np.ndarray]], list[str]]:
    """Event clips -> ``(ids, per detector the frames per clip, unreadable ids)``."""
    ids, waves, unreadable = decoded(dets[0], clips.audio.items())
    return ids, encoder_frames(dets, waves), unreadable


def mixture_features(
    dets: Sequence[Detector], split: ShardSplit, ids: tuple[str, ...]
) -> tuple[list[str], list[list[np.ndarray]], list[str]]:
    """The mixtures ``ids`` (a prefix of the split) -> ``(ids, per detector the frames per clip, unreadable ids)``."""
    read, waves, unreadable = decoded(dets[0], mixture_audio(split, ids))
    return read, encoder_frames(dets, waves), unreadable


@contextmanager
def one_cpu_thread(device: torch.device):
    """Torch on one CPU thread inside (nothing changes on a GPU): the probe heads are small, so a
    second thread buys little and costs a lot on a busy machine, and the figures then do not
    depend on how many cores the machine has."""
    if device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def fit_side_by_side(fits: dict, device: torch.device) -> dict:
    """``{key: a probe fit (no arguments) -> figures}`` -> ``{key: figures}``. On a CPU each fit runs
    on one torch thread, as many at once as this process has cores (in the dict's order: put the
    longest first), so the figures are those of fitting them one after another on any machine; on
    another device they run one after another."""
    if device.type != "cpu" or len(fits) < 2:
        with one_cpu_thread(device):
            return {key: fit() for key, fit in fits.items()}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # macOS has no affinity
    with one_cpu_thread(device), ThreadPoolExecutor(min(len(fits), cores)) as pool:
        running = {key: pool.submit(fit) for key, fit in fits.items()}
        return {key: job.result() for key, job in running.items()}


def run_probes(dets: dict[str, Detector], data: ProbeData, e, seed: int) -> dict[str, dict]:
    """Every probe on each detector's frozen encoder -> per detector name ``{"clip_<pooling>":
    clip_probe figures (per ``e.probe_pooling``), "frame": frame_probe figures, "unreadable": clips
    that did not decode}``; a probe without data is ``{"skipped": reason}``. ``e`` is the
    ``evaluate`` section (probe steps, lr, heads, pooling, segment_s). The frame probes, then the
    clip probes: each set's audio is decoded once for every detector (:func:`encoder_frames`), its
    heads are fitted side by side (:func:`fit_side_by_side`), and its features go before the next
    set's are read, so the two sets are never in memory together. A detector's figures are those it
    would get probed alone."""
    names = list(dets)
    out: dict[str, dict] = {name: {} for name in names}
    unreadable = 0
    for probe_set in (_frame_fits, _clip_fits):
        fits, extra, skipped, bad = probe_set(dets, data, e, {"steps": e.probe_steps, "lr": e.probe_lr, "seed": seed})
        unreadable += bad
        for name in names:
            out[name] |= skipped
        for (name, probe), found in fit_side_by_side(fits, next(iter(dets.values())).device).items():
            out[name][probe] = found | extra[name, probe]
        del fits  # the set's features
    for name in names:
        out[name] = {key: out[name][key] for key in [*(f"clip_{p}" for p in e.probe_pooling), "frame"]} | {
            "unreadable": unreadable
        }
    return out


Fits = dict[tuple[str, str], Callable[[], dict]]


def _frame_fits(dets: dict[str, Detector], data: ProbeData, e, settings: dict) -> tuple[Fits, dict, dict, int]:
    """The frame probes: ``(fits, extra figures per fit, {"frame": skipped} for every detector or {}, unreadable mixtures)``."""
    models = list(dets.values())
    det = models[0]
    train_ids, train_x, bad_train = mixture_features(models, data.train_split, data.train_ids)
    test_ids, test_x, bad_test = mixture_features(models, data.test_split, data.test_ids)
    bad = len(bad_train) + len(bad_test)
    if not train_ids or not test_ids:
        return {}, {}, {"frame": {"skipped": f"{len(train_ids)} training and {len(test_ids)} held-out mixtures read"}}, bad
    fits: Fits = {}
    extra: dict[tuple[str, str], dict] = {}
    classes = data.test_split.classes
    min_overlap = det.train_params.data.min_label_overlap
    ya = frame_targets(det, data.train_split, train_ids, train_x[0], classes, min_overlap)
    yb = frame_targets(det, data.test_split, test_ids, test_x[0], classes, min_overlap)
    segment_frames = max(1, round(e.segment_s / det.column_s))
    for name, d in dets.items():
        (xa, va), (xb, vb) = on(d, padded(train_x.pop(0))), on(d, padded(test_x.pop(0)))  # each model's frames, once
        fits[name, "frame"] = partial(
            frame_probe, xa, ya, xb, yb, train_valid=va, test_valid=vb, segment_frames=segment_frames, **settings
        )
        extra[name, "frame"] = {"classes": len(classes), "train_clips": len(train_ids), "test_clips": len(test_ids)}
    return fits, extra, {}, bad


def _clip_fits(dets: dict[str, Detector], data: ProbeData, e, settings: dict) -> tuple[Fits, dict, dict, int]:
    """The clip probes, one per pooling: ``(fits, extra figures per fit, {"clip_<pooling>": skipped}
    for every detector or {}, unreadable clips)``; attention before mean, so the longer fit starts first."""
    if data.train_clips is None or data.test_clips is None:
        return (
            {},
            {},
            {f"clip_{pooling}": {"skipped": "no event clips (evaluate.event_clips: null)"} for pooling in e.probe_pooling},
            0,
        )
    models = list(dets.values())
    train_ids, train_x, bad_train = clip_features(models, data.train_clips)
    test_ids, test_x, bad_test = clip_features(models, data.test_clips)
    bad = len(bad_train) + len(bad_test)
    classes = sorted({data.train_clips.labels[i] for i in train_ids})
    where = {c: k for k, c in enumerate(classes)}
    keep = [k for k, i in enumerate(test_ids) if data.test_clips.labels[i] in where]
    if len(classes) < 2 or not keep:
        why = {"skipped": f"{len(classes)} training classes, {len(keep)} held-out clips of them"}
        return {}, {}, {f"clip_{pooling}": why for pooling in e.probe_pooling}, bad
    fits: Fits = {}
    extra: dict[tuple[str, str], dict] = {}
    ya = np.array([where[data.train_clips.labels[i]] for i in train_ids])
    yb = np.array([where[data.test_clips.labels[test_ids[k]]] for k in keep])
    for name, d in dets.items():
        xs_train, xs_test = train_x.pop(0), test_x.pop(0)
        (xa, va), (xb, vb) = on(d, padded(xs_train)), on(d, padded([xs_test[k] for k in keep]))
        for pooling in sorted(e.probe_pooling):
            probe = ClipProbeSettings(
                pooling=pooling,
                num_classes=len(classes),
                heads=e.probe_heads,
                steps=settings["steps"],
                learning_rate=settings["lr"],
                seed=settings["seed"],
            )
            fits[name, f"clip_{pooling}"] = partial(clip_probe, xa, ya, xb, yb, probe, train_valid=va, test_valid=vb)
            extra[name, f"clip_{pooling}"] = {"classes": len(classes), "test_clips_unseen_class": len(test_ids) - len(keep)}
    return fits, extra, {}, bad


def protocol(det: Detector, data: ProbeData, e, seed: int) -> dict:
    """How the probe figures were computed (the same for every model)."""
    return {
        "features": FEATURES,
        "feature_dim": int(det.model.encoder.width),
        "train_split": e.probe_split,
        "test_split": e.split,
        "max_clips": e.probe_clips,
        "steps": e.probe_steps,
        "lr": e.probe_lr,
        "attention_heads": e.probe_heads,
        "seed": seed,
        "frame_hop_s": float(det.column_s),
        "segment_s": float(max(1, round(e.segment_s / det.column_s)) * det.column_s),
        "min_label_overlap": det.train_params.data.min_label_overlap,
        "event_clips": None
        if data.train_clips is None
        else {"train": len(data.train_clips.audio), "test": len(data.test_clips.audio)},
        "mixtures": {"train": len(data.train_ids), "test": len(data.test_ids)},
    }
