"""``sedsynth bench detection``: PSDS1 against training minutes, on the params' own shards.

Trains ``params.train`` for ``--epochs`` epochs into ``--out`` (``<out>/finelap``) keeping one
checkpoint per epoch (``train.keep_epoch_checkpoints``), then scores every epoch's checkpoint on
``evaluate.split`` as ``sedsynth evaluate`` does (its protocol and linear probes, without pictures
or the untrained model after epoch 1). Prints one row per epoch: steps, wall-clock minutes since
training started (held-out scoring after each epoch included), PSDS1 with alpha_st 1 and 0, PSDS2,
segment AUROC, collar F1 at 0.5, zero-shot accuracy through the clip embedding and the frame head,
and the frozen encoder's frame probe (AUROC, 1 s segment F1), and writes ``<out>/psds_curve.csv``
and ``<out>/psds_curve.png``.

``--score-only`` scores the checkpoints an earlier run left in ``<out>/finelap`` again, without
training (after a change to the evaluation protocol); the minutes are that run's.

The learning-rate schedule spans all ``--epochs``, so an early row is a checkpoint in the middle
of a longer schedule, not a shorter run of its own: it answers "how far does more training
take this model", not "what is the best model for N minutes".
"""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

from pipeline.figures import pyplot, save_png

# Scores a detector should reach on this test split (dashed in the picture).
TARGETS = ((0.30, "PSDS1 target 0.30"), (0.50, "PSDS2 target 0.50"))
COLUMNS = (
    "epoch",
    "step",
    "train_min",
    "psds1",
    "psds1_astat0",
    "psds2",
    "auroc",
    "f1",
    "zero_shot_accuracy",
    "zero_shot_frame_accuracy",
    "probe_frame_auroc",
    "probe_segment_f1",
)


class NoRunError(FileNotFoundError):
    """``--score-only`` without the checkpoints of an earlier run; the message says what to run
    (the command prints it as one line, as it does every FileNotFoundError)."""


def run(params, out: Path, epochs: int, score_only: bool = False) -> list[dict]:
    """Train for ``epochs`` into ``out/finelap`` (unless ``score_only``) and score each epoch's
    checkpoint; returns the rows of :data:`COLUMNS` (``epoch`` 0 is the untrained model)."""
    from trainer.stages import evaluate, train

    out = Path(out)
    t = params.train
    run_dir = out / "finelap"
    params = replace(
        params,
        train=replace(
            t, optim=replace(t.optim, epochs=epochs, max_steps=0), out_dir=str(run_dir), keep_epoch_checkpoints=True, resume=False
        ),
    )
    if not score_only:
        train.run(params)
    missing = [
        f"epoch{epoch:03d}.pt"
        for epoch in range(1, epochs + 1)
        if not (run_dir / "checkpoints" / f"epoch{epoch:03d}.pt").is_file()
    ]
    if missing or not (run_dir / "valid_log.csv").is_file():
        raise NoRunError(
            f"bench detection: {run_dir} holds no run of {epochs} epochs to score (missing {(missing or ['valid_log.csv'])[0]}); "
            f"run `sedsynth bench detection --epochs {epochs} --out {out}` without --score-only first"
        )
    with (run_dir / "valid_log.csv").open() as f:
        log = {int(r["epoch"]): r for r in csv.DictReader(f)}
    scores: dict[int, dict] = {}
    for epoch in range(1, epochs + 1):
        e = replace(
            params.evaluate,
            checkpoint=str(run_dir / "checkpoints" / f"epoch{epoch:03d}.pt"),
            untrained=epoch == 1,
            pictures=0,
            benchmarks={},
            f1_threshold=0.5,
            f1_median_filter_frames=params.evaluate.median_filter_frames,
            out_dir=str(out / "evaluation" / f"epoch{epoch:03d}"),
        )
        summary = evaluate.run(replace(params, evaluate=e))
        for model, at in (("trained", epoch), ("untrained", 0)):
            if model in summary["test"]:
                frame = ((summary.get("probes") or {}).get(model) or {}).get("frame", {})
                scores[at] = summary["test"][model] | {
                    "probe_frame_auroc": frame.get("frame_auroc_macro", float("nan")),
                    "probe_segment_f1": frame.get("segment_f1", float("nan")),
                }
    rows = [
        {
            "epoch": epoch,
            "step": int(log[epoch]["step"]),
            "train_min": float(log[epoch]["wall_s"] or 0.0) / 60.0,
            **{k: s.get(k, float("nan")) for k in COLUMNS[3:]},
        }
        for epoch, s in sorted(scores.items())
    ]
    write_curve(rows, out)
    return rows


def write_curve(rows: list[dict], out: Path) -> None:
    """``out/psds_curve.csv`` (the rows) and ``out/psds_curve.png`` (PSDS1 and PSDS2 over minutes)."""
    with (out / "psds_curve.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in rows)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    minutes = [r["train_min"] for r in rows]
    for key, label, style in (
        ("psds1", "PSDS1 (alpha_st 1)", "-"),
        ("psds1_astat0", "PSDS1 (alpha_st 0)", "-"),
        ("psds2", "PSDS2", "-"),
        ("zero_shot_frame_accuracy", "zero-shot (frame head)", ":"),
        ("probe_segment_f1", "encoder frame probe, segment F1", "--"),
    ):
        ax.plot(minutes, [r[key] for r in rows], marker="o", ls=style, label=label)
    ax.set_xlabel("training minutes (held-out scoring after each epoch included)")
    ax.set_ylabel("score on the test split")
    for target, label in TARGETS:
        ax.axhline(target, color="0.5", lw=0.8, ls="--")
        ax.text(minutes[-1], target + 0.01, label, ha="right", va="bottom", fontsize=7, color="0.35")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    save_png(fig, out / "psds_curve.png", dpi=120)


def print_figures(rows: list[dict]) -> None:
    print("bench detection: each epoch's checkpoint on the test split (epoch 0: untrained)")
    print("  epoch  step  minutes  PSDS1  PSDS1(a_st=0)  PSDS2  AUROC  F1@0.5  ZS clip  ZS frame  probe AUROC  probe seg F1")
    for r in rows:
        print(
            f"  {r['epoch']:5d} {r['step']:5d} {r['train_min']:8.1f}  {r['psds1']:.3f}  {r['psds1_astat0']:13.3f}  "
            f"{r['psds2']:.3f}  {r['auroc']:.3f}  {r['f1']:.3f}  {r['zero_shot_accuracy']:7.3f}  {r['zero_shot_frame_accuracy']:8.3f}  "
            f"{r['probe_frame_auroc']:11.3f}  {r['probe_segment_f1']:12.3f}"
        )
