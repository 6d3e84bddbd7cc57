"""FineLAP's Table 5 ablations on our data: train and evaluate each variant, then one table.

Input: params (the ``train`` and ``evaluate`` sections are the base every variant starts
from) and a variant name from :data:`VARIANTS`. A variant runs one of two ways:

- as a DVC experiment of the default pipeline (:func:`queue_experiments`, ``sedsynth ablate
  --queue``): ``dvc exp run --queue -n <variant> -S train...`` with the variant's params, run by
  ``dvc queue start`` and listed by ``dvc exp show``;
- directly (:func:`run_variant`, ``sedsynth ablate VARIANT``): the trainer's outputs and
  ``evaluation/`` in ``<ablations.out_dir>/<variant>/``.

:func:`write_table` writes ``<ablations.out_dir>/table.md`` / ``table.csv``: our held-out
numbers in the paper's row order (each variant from its experiment on the current commit,
else from its folder), the paper's numbers beside them, and whether each change against the
full model goes the paper's way.

Every variant trains for the same number of steps and is evaluated at its last step
(``latest.pt``), as the paper keeps the optimisation steps comparable.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import subprocess
import sys
from pathlib import Path

from pipeline.outputs import write_atomic
from pipeline.config.params import build, merge
from trainer.config import Params

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
    _check(variant)
    root = Path(params.ablations.out_dir) / variant
    raw = dataclasses.asdict(params)
    raw = merge(raw, {"train": merge(VARIANTS[variant][1], {"out_dir": str(root), "resume": False})})
    raw = merge(raw, {"evaluate": {"checkpoint": str(root / "checkpoints" / "latest.pt"), "untrained": False,
                                   "pictures": 0, "benchmarks": params.evaluate.benchmarks, "out_dir": str(root / "evaluation")}})
    return build(Params, raw)


def _check(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"ablate: unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")


def _flatten(prefix: str, tree: dict) -> dict[str, object]:
    flat = {}
    for key, value in tree.items():
        flat |= _flatten(f"{prefix}.{key}", value) if isinstance(value, dict) else {f"{prefix}.{key}": value}
    return flat


def experiment_settings(params: Params, variant: str) -> list[str]:
    """``key=value`` params (for ``dvc exp run -S``) that make the default pipeline run ``variant``.

    The same changes as :func:`variant_params`, except that the outputs stay the default
    pipeline's (DVC keeps each experiment's outputs apart).
    """
    _check(variant)
    settings = _flatten("train", VARIANTS[variant][1]) | {
        "evaluate.checkpoint": str(Path(params.train.out_dir) / "checkpoints" / "latest.pt"),
        "evaluate.untrained": False, "evaluate.pictures": 0}
    return [f"{key}={json.dumps(value) if not isinstance(value, str) else value}" for key, value in settings.items()]


def _dvc(*args: str, cwd: Path | str = ".") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, capture_output=True, text=True)


def queue_experiments(params: Params, variants: list[str], repo: Path | str = ".") -> dict[str, str]:
    """Queue each variant as a DVC experiment named after it; returns variant -> what happened.

    ``queued``; ``exists`` for a variant that already has an experiment on the current commit
    (left as it is: ``dvc exp remove <name>`` lets it run again); ``refused: <DVC's message>``
    for one DVC would not queue. Each variant not queued is reported on stderr and the others
    are still queued.
    """
    for v in variants:
        _check(v)
    done = experiment_metrics(params, repo)
    outcome = {}
    for v in variants:
        if v in done:
            outcome[v] = "exists"
            print(f"ablate: {v}: an experiment of that name exists on this commit; `dvc exp remove {v}` to run it again",
                  file=sys.stderr)
            continue
        args = ["exp", "run", "--queue", "-n", v]
        for setting in experiment_settings(params, v):
            args += ["-S", setting]
        result = _dvc(*args, cwd=repo)
        if result.returncode != 0:
            lines = (result.stderr or result.stdout).strip().splitlines() or ["no message"]
            outcome[v] = f"refused: {lines[-1]}"
            print(f"ablate: {v}: not queued: {lines[-1]}", file=sys.stderr)
            continue
        outcome[v] = "queued"
    return outcome


def experiment_metrics(params: Params, repo: Path | str = ".") -> dict[str, dict]:
    """Experiment name -> its ``test.trained`` metrics, for the DVC experiments on the current commit.

    Read from ``dvc exp show --json``; queued, running and failed experiments, and a folder
    that is not a DVC project in git, give nothing. The variants' experiments bear their names.
    """
    result = _dvc("exp", "show", "--json", "--hide-queued", "--hide-failed", "--hide-workspace", cwd=repo)
    if result.returncode != 0:
        return {}
    metrics_path = (Path(params.evaluate.out_dir) / "metrics.json").as_posix()
    found = {}
    for baseline in json.loads(result.stdout or "[]"):
        if baseline.get("rev") == "workspace":
            continue
        for exp in baseline.get("experiments") or []:
            for rev in exp.get("revs") or []:
                data = (rev.get("data") or {}).get("metrics", {}).get(metrics_path, {}).get("data")
                name = rev.get("name")
                if name and not rev.get("error") and data and "trained" in data.get("test", {}):
                    found[name] = data["test"]["trained"]
    return found


def run_variant(params: Params, variant: str) -> dict:
    from trainer.stages.evaluate import run as evaluate
    from trainer.stages.train import run as train

    p = variant_params(params, variant)
    print(f"ablate: {variant} ({VARIANTS[variant][0]}): training into {p.train.out_dir}")
    train(p)
    return evaluate(p)


def _direction(delta: float, tolerance: float) -> str:
    return "=" if abs(delta) <= tolerance else ("up" if delta > 0 else "down")


def table(out_dir: Path, experiments: dict[str, dict] | None = None) -> list[dict]:
    """One row per variant with our metrics, the paper's and the directions against ``full``.

    Each variant's metrics come from ``experiments`` (:func:`experiment_metrics`) when it is
    there, else from ``<out_dir>/<variant>/evaluation/metrics.json``; without all five there is
    no table (an error names the missing ones and how to run them).
    """
    experiments = experiments or {}
    ours, source, missing = {}, {}, []
    for v in VARIANTS:
        path = Path(out_dir) / v / "evaluation" / "metrics.json"
        if v in experiments:
            ours[v], source[v] = experiments[v], "dvc experiment"
        elif path.exists():
            ours[v], source[v] = json.loads(path.read_text(encoding="utf-8"))["test"]["trained"], str(path)
        else:
            missing.append(v)
    if missing:
        raise FileNotFoundError(
            f"ablate: no evaluation for {', '.join(missing)} (no DVC experiment of that name on this commit, nothing in "
            f"{out_dir}/<variant>/evaluation); run `sedsynth ablate --queue {' '.join(missing)}` and `dvc queue start`, "
            f"or {' and '.join(f'`sedsynth ablate {v}`' for v in missing)}")
    rows = []
    for v, (name, _) in VARIANTS.items():
        row = {"variant": v, "name": name, "source": source[v]}
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


def write_table(out_dir: Path, experiments: dict[str, dict] | None = None) -> str:
    """:func:`table` as ``<out_dir>/table.md`` (returned) and ``table.csv``, each written whole or not at all."""
    rows = table(out_dir, experiments)
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
    lines.append("")
    lines.append("Read from: " + "; ".join(f"{r['variant']} {r['source']}" for r in rows))
    text = "\n".join(lines) + "\n"
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]) + (["direction vs full"] if "direction vs full" not in rows[0] else []),
                       lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    write_atomic(Path(out_dir) / "table.md", text.encode("utf-8"))
    write_atomic(Path(out_dir) / "table.csv", buf.getvalue().encode("utf-8"))
    return text
