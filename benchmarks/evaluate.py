"""``sedsynth bench evaluate``: where the evaluation's metric time goes on a large test split.

Input: a clip count (default 10,000), classes and the frame grid of the default encoder.
Output: printed figures: seconds per metric step of the stage (median filter, score tables,
PSDS1, PSDS2, segment AUROC, collar F1, score files, alignment, retrieval), the time inside
sed_scores_eval's own calls (the peer: the reference implementation every number comes
from) and the share outside it (target below 20%).

The scores are synthetic (seeded): each clip has 1-4 events of random classes, and the scores
follow the events with noise, so PSDS curves have the size real ones have. Model scoring is
measured by the ``evaluate`` stage itself (clips/s in its report) and is not part of this.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from trainer.evaluation import metrics as M
from trainer.evaluation.ranking import retrieval
from trainer.evaluation.scoring import Scored, detection, grounding


def synthetic(clips: int, classes: int, frames: int = 125, column_s: float = 0.08, seed: int = 0):
    rng = np.random.default_rng(seed)
    names = [f"class_{k:02d}" for k in range(classes)]
    edges = np.arange(frames + 1) * column_s
    scored, truth, durations = Scored(), {}, {}
    for n in range(clips):
        i = f"clip_{n:06d}"
        probs = rng.random((frames, classes), dtype=np.float32) * 0.6
        events = []
        for _ in range(rng.integers(1, 5)):
            c = int(rng.integers(classes))
            on = float(rng.uniform(0, 8.5))
            off = min(on + float(rng.uniform(0.3, 4.0)), frames * column_s)
            if any(e[2] == names[c] and on <= e[1] and e[0] <= off for e in events):
                continue
            events.append((on, off, names[c]))
            a, b = int(on / column_s), int(np.ceil(off / column_s))
            probs[a:b, c] += rng.uniform(0.0, 0.6)
        scored.ids.append(i)
        scored.timestamps_s.append(edges)
        probs = np.clip(probs, 0, 1)
        scored.probs.append([probs, probs[:, sorted({names.index(e[2]) for e in events})]])
        truth[i], durations[i] = sorted(events), float(edges[-1])
    return scored, truth, durations, names


class _Settings:
    median_filter_frames, segment_s, max_fpr, f1_threshold = 3, 1.0, 0.1, 0.5
    f1_median_filter_frames = median_filter_frames  # collar F1 on the PSDS filter, as evaluate does without a calibrated one


def run(clips: int = 10000, classes: int = 20, write_scores: bool = True) -> dict:
    started = time.perf_counter()
    scored, truth, durations, names = synthetic(clips, classes)
    made = time.perf_counter() - started
    timer = M.Timer()
    with tempfile.TemporaryDirectory() as tmp:
        result = detection(
            scored, 0, truth, durations, names, _Settings, timer, folder=Path(tmp) if write_scores else None, model="bench"
        )
    own = {
        i: [(c, [(on, off) for on, off, cc in truth[i] if cc == c]) for c in sorted({e[2] for e in truth[i]})] for i in scored.ids
    }
    result |= grounding(scored, 1, lambda i: own[i], timer)
    rng = np.random.default_rng(1)
    audio = rng.standard_normal((clips, 128)).astype(np.float32)
    text = audio + rng.standard_normal((clips, 128)).astype(np.float32) * 2.0
    with timer("retrieval"):
        result |= retrieval(
            audio / np.linalg.norm(audio, axis=1, keepdims=True),
            text / np.linalg.norm(text, axis=1, keepdims=True),
            [(k, k) for k in range(clips)],
        )
    return {
        "clips": clips,
        "classes": classes,
        "synthesis_s": made,
        "psds1": result["psds1"],
        "psds2": result["psds2"],
        "auroc": result["auroc"],
        "alignment": result["alignment"],
        "t2a_r1": result["t2a_r1"],
        **timer.summary(),
    }


def print_figures(f: dict) -> None:
    print(
        f"bench evaluate: {f['clips']} clips x {f['classes']} classes, 125 frames each (synthetic scores, "
        f"PSDS1 {f['psds1']:.3f}, PSDS2 {f['psds2']:.3f}, AUROC {f['auroc']:.3f}, alignment {f['alignment']:.3f}, "
        f"T2A R@1 {f['t2a_r1']:.3f})"
    )
    for k, v in f.items():
        if k.endswith("_s") and k not in ("total_s", "metrics_s", "sed_scores_eval_s", "synthesis_s"):
            print(f"  {k.removesuffix('_s'):<22}{v:9.2f} s")
    print(f"  metrics in all         {f['metrics_s']:9.2f} s")
    print(f"  inside sed_scores_eval {f['sed_scores_eval_s']:9.2f} s   <- peer (the reference implementation)")
    print(
        f"  outside it             {f['metrics_s'] - f['sed_scores_eval_s']:9.2f} s   "
        f"({100 * f['outside_sed_scores_eval_share']:.1f}% of the metric time; target < 20%)"
    )
