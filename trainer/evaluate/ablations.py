"""FineLAP's Table 5 ablations on our data: train and evaluate each variant, then one table.

Input: params (the ``train`` and ``evaluate`` sections are the base every variant starts
from) and a variant name from :data:`VARIANTS`. Output: ``<ablations.out_dir>/<variant>/``
(the trainer's outputs and ``evaluation/``), and with :func:`write_table`
``table.md`` / ``table.csv``: our held-out numbers in the paper's row order, the paper's
numbers beside them, and whether each change against the full model goes the paper's way.

Every variant trains for the same number of steps and is evaluated at its last step
(``latest.pt``), as the paper keeps the optimisation steps comparable.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

from pipeline.params import Params, build, merge

VARIANTS: dict[str, tuple[str, dict]] = {
    "full": ("FineLAP (Ours)", {}),
    "no_frame_loss": ("w/o Frame-level Loss", {"loss": {"frame_weight": 0.0}}),
    "no_clip_loss": ("w/o Clip-level Loss", {"loss": {"clip_weight": 0.0}}),
    "shared_projector": ("w/o Decoupled Projector", {"model": {"adapter": "shared"}}),
    "infonce": ("FineLAP-InfoNCE", {"loss": {"clip": "infonce"}}),
}

# FineLAP Table 5 (R@1 in %, PSDS1 / PSDS2021 for SED and grounding, accuracy in %)
PAPER_COLUMNS = ("AC-T2A", "AC-A2T", "DESED", "AS-SL", "UrbanSED", "TAG", "VGGSound", "US8K")
PAPER: dict[str, tuple[float, ...]] = {
    "full": (45.7, 62.5, 0.344, 0.474, 0.446, 0.649, 31.5, 84.9),
    "no_frame_loss": (44.4, 58.3, 0.021, 0.191, 0.000, 0.303, 31.4, 82.7),
    "no_clip_loss": (4.9, 6.2, 0.322, 0.451, 0.462, 0.480, 11.3, 58.6),
    "shared_projector": (44.8, 55.4, 0.317, 0.467, 0.442, 0.448, 31.8, 85.4),
    "infonce": (46.0, 61.0, 0.342, 0.474, 0.445, 0.629, 31.5, 80.4),
}

# Our held-out metric -> the paper column it stands in for (direction checks)
OURS = (("t2a_r1", "T2A R@1", "AC-T2A", 100.0), ("a2t_r1", "A2T R@1", "AC-A2T", 100.0),
        ("psds1", "PSDS1", "DESED", 1.0), ("psds2", "PSDS2", "TAG", 1.0), ("auroc", "AUROC", "UrbanSED", 1.0),
        ("alignment", "Spearman", "TAG", 1.0), ("zero_shot_accuracy", "Zero-shot acc", "US8K", 100.0))
TOLERANCE = {"AC-T2A": 1.0, "AC-A2T": 1.0, "US8K": 1.0}  # paper changes smaller than this count as "same"


def variant_params(params: Params, variant: str) -> Params:
    """``params`` with the variant's train changes, its own output folders and a last-step evaluation."""
    if variant not in VARIANTS:
        raise ValueError(f"ablate: unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    root = Path(params.ablations.out_dir) / variant
    raw = dataclasses.asdict(params)
    raw = merge(raw, {"train": merge(VARIANTS[variant][1], {"out_dir": str(root), "resume": False})})
    raw = merge(raw, {"evaluate": {"checkpoint": str(root / "checkpoints" / "latest.pt"), "untrained": False,
                                   "pictures": 0, "benchmarks": params.evaluate.benchmarks, "out_dir": str(root / "evaluation")}})
    return build(Params, raw)


def run_variant(params: Params, variant: str) -> dict:
    from trainer.evaluate.stage import run as evaluate
    from trainer.train import run as train

    p = variant_params(params, variant)
    print(f"ablate: {variant} ({VARIANTS[variant][0]}): training into {p.train.out_dir}")
    train(p)
    return evaluate(p)


def _direction(delta: float, tolerance: float) -> str:
    return "=" if abs(delta) <= tolerance else ("up" if delta > 0 else "down")


def table(out_dir: Path) -> list[dict]:
    """One row per variant with our metrics, the paper's and the directions against ``full``."""
    ours = {}
    for v in VARIANTS:
        path = out_dir / v / "evaluation" / "metrics.json"
        if not path.exists():
            raise FileNotFoundError(f"ablate: no evaluation for {v} at {path}; run `sedsynth ablate {v}` "
                                    "(or `dvc repro configs/ablations/dvc.yaml`)")
        ours[v] = json.loads(path.read_text(encoding="utf-8"))["test"]["trained"]
    rows = []
    for v, (name, _) in VARIANTS.items():
        row = {"variant": v, "name": name}
        for key, label, paper_col, scale in OURS:
            row[label] = ours[v].get(key, float("nan")) * scale
        row |= {f"paper {c}": x for c, x in zip(PAPER_COLUMNS, PAPER[v])}
        if v != "full":
            checks = []
            for key, label, paper_col, scale in OURS:
                ours_delta = (ours[v].get(key, float("nan")) - ours["full"].get(key, float("nan"))) * scale
                paper_delta = PAPER[v][PAPER_COLUMNS.index(paper_col)] - PAPER["full"][PAPER_COLUMNS.index(paper_col)]
                tol = TOLERANCE.get(paper_col, 0.01)
                a, b = _direction(ours_delta, tol), _direction(paper_delta, tol)
                checks.append(f"{label} {a}{'' if a == b else f' (paper {b})'}")
            row["direction vs full"] = "; ".join(checks)
        rows.append(row)
    return rows


def write_table(out_dir: Path) -> str:
    rows = table(out_dir)
    labels = [label for _, label, _, _ in OURS]
    head = ["Methods", *labels, *(f"paper {c}" for c in PAPER_COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["name"], *(f"{r[label]:.1f}" if "R@" in label or "acc" in label else f"{r[label]:.3f}" for label in labels),
                 *(f"{r[f'paper {c}']:.1f}" if c in ("AC-T2A", "AC-A2T", "VGGSound", "US8K") else f"{r[f'paper {c}']:.3f}" for c in PAPER_COLUMNS)]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Ours: the held-out test split of the embedded data (R@1 and zero-shot accuracy in %, PSDS1/PSDS2 "
                 "with sed_scores_eval, segment AUROC, FLAM's Spearman alignment). Paper: FineLAP Table 5.")
    lines.append("")
    lines.append("Direction of each change against the full model (ours; the paper's where it differs):")
    lines += [f"- {r['name']}: {r['direction vs full']}" for r in rows if "direction vs full" in r]
    text = "\n".join(lines) + "\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / ".table.md.tmp"
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out_dir / "table.md")
    with open(out_dir / ".table.csv.tmp", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) + (["direction vs full"] if "direction vs full" not in rows[0] else []))
        w.writeheader()
        w.writerows(rows)
    (out_dir / ".table.csv.tmp").replace(out_dir / "table.csv")
    return text
