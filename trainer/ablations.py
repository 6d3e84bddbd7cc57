"""FineLAP's Table 5 ablations on our data: train and evaluate each variant once per seed, then one table.

Input: params (the ``train`` and ``evaluate`` sections are the base every variant starts
from; ``ablations.seeds`` the seeds each variant runs with, the top-level ``seed`` set to each)
and a variant name from :data:`VARIANTS`. A (variant, seed) runs one of two ways:

- as a DVC experiment of the default pipeline (:func:`queue_experiments`, ``sedsynth ablate
  --queue``): ``dvc exp run --queue -n <variant>-s<seed> -S seed=<seed> -S train...`` with the
  variant's params, run by ``dvc queue start`` and listed by ``dvc exp show``. The data stages
  that read ``seed`` (mix, captions, shards) run again in such an experiment, so its spread
  over seeds holds the data's as well as the training's;
- directly (:func:`run_variant`, ``sedsynth ablate VARIANT [--seed S]``): trained on the data in
  place, the trainer's outputs and ``evaluation/`` in ``<ablations.out_dir>/<variant>/seed<seed>/``.

:func:`write_table` writes ``<ablations.out_dir>/table.md`` / ``table.csv``: per variant, in the
paper's row order, each held-out metric's mean and range (min-max) over the seeds run so far
(each seed from its experiment on the current commit, else from its folder; a variant folder
from before seeds, ``<variant>/evaluation/metrics.json``, reads as one run), the paper's numbers
beside them, and whether each change against the full model goes the paper's way.

Every variant trains for the same number of steps and is evaluated at its last step
(``latest.pt``), as the paper keeps the optimisation steps comparable.

Beside Table 5's variants (:data:`PAPER` has their numbers), extra rows try other papers'
choices on the full model: ``caption_loss`` (Cacophony's auxiliary captioning loss, lambda_cap 1),
``sam`` (Cacophony's SAM, rho 0.075), ``mae_init`` (the encoder starts from the ``pretrain`` stage's
weights; in a DVC experiment the pretrain stage reruns with the experiment's seed first) and
``captioning_only`` (CaptionStew's captioning-only encoder: the decoder's loss alone; compare its
linear probes with ``no_frame_loss``, the contrastive-only encoder), and ``no_phrase_clip`` (the
full model without its phrase-clip loss, which FineLAP does not have). ``no_clip_loss`` drops both
clip-level terms (the caption loss and the phrase-clip loss). Their paper columns are blank; ``--queue`` and the table
take them when named, and the full table shows them once they have a run.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from pipeline.config.params import SEED, build, merge
from pipeline.outputs import write_atomic
from trainer.config import AblationParams, Params

PRETRAINED_ENCODER = "<pretrain.encoder_file>"  # a variant's value for the pretrain stage's encoder weights (pretrain.out_dir)

VARIANTS: dict[str, tuple[str, dict]] = {
    "full": ("FineLAP (Ours)", {}),
    "no_frame_loss": ("w/o Frame-level Loss", {"loss": {"frame_weight": 0.0}}),
    "no_clip_loss": ("w/o Clip-level Loss", {"loss": {"clip_weight": 0.0, "phrase_clip_weight": 0.0}}),
    "shared_projector": ("w/o Decoupled Projector", {"model": {"adapter": "shared"}}),
    "infonce": ("FineLAP-InfoNCE", {"loss": {"clip": "infonce"}}),
    "caption_loss": ("+ Captioning loss (Cacophony)", {"loss": {"caption_weight": 1.0}}),
    "sam": ("+ SAM (Cacophony, rho 0.075)", {"optim": {"sam_rho": 0.075}}),
    "mae_init": ("+ MAE initialisation (Cacophony stage 1)", {"model": {"encoder_checkpoint": PRETRAINED_ENCODER}}),
    "captioning_only": (
        "+ Captioning-only encoder (CaptionStew)",
        {"loss": {"clip_weight": 0.0, "phrase_clip_weight": 0.0, "frame_weight": 0.0, "caption_weight": 1.0}},
    ),
    "no_phrase_clip": ("w/o phrase-clip loss", {"loss": {"phrase_clip_weight": 0.0}}),
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
TABLE5 = tuple(PAPER)  # the paper's rows: --queue's default, and the rows a full table needs
NO_PAPER = (math.nan,) * len(PAPER_COLUMNS)  # an extra row's paper columns (written blank)

# The evaluation's PSDS1 with alpha_st 0 (no penalty for instability across classes); ``psds1`` is alpha_st 1.
PSDS1_ALPHA_ST0_KEY = "psds1_astat0"

# Our held-out metric -> the paper column it stands in for (direction checks)
OURS = (
    ("t2a_r1", "T2A R@1", "AC-T2A", 100.0),
    ("a2t_r1", "A2T R@1", "AC-A2T", 100.0),
    ("psds1", "PSDS1", "DESED", 1.0),
    (PSDS1_ALPHA_ST0_KEY, "PSDS1 (alpha_st 0)", "DESED", 1.0),
    ("psds2", "PSDS2", "TAG", 1.0),
    ("auroc", "AUROC", "UrbanSED", 1.0),
    ("alignment", "Spearman", "TAG", 1.0),
    ("zero_shot_accuracy", "Zero-shot acc", "US8K", 100.0),
)
# The encoder's own measures (no paper column): CaptionStew's linear probes on frozen features and
# the captioning decoder's CIDEr-D, read from the evaluation's ``probes`` and ``captions`` sections.
ENCODER_METRICS = {  # key -> (column, scale, where it is in an evaluation's metrics.json)
    "probe_clip_mean_accuracy": ("Probe clip acc (mean)", 100.0, ("probes", "trained", "clip_mean", "top1_accuracy")),
    "probe_clip_attention_accuracy": (
        "Probe clip acc (attention)",
        100.0,
        ("probes", "trained", "clip_attention", "top1_accuracy"),
    ),
    "probe_frame_auroc": ("Probe frame AUROC", 1.0, ("probes", "trained", "frame", "frame_auroc_macro")),
    "probe_segment_f1": ("Probe segment F1", 1.0, ("probes", "trained", "frame", "segment_f1")),
    "caption_cider_d": ("CIDEr-D", 1.0, ("captions", "cider_d")),
}
ENCODER = tuple((key, label, None, scale) for key, (label, scale, _) in ENCODER_METRICS.items())
OURS = OURS + ENCODER
OPTIONAL = {PSDS1_ALPHA_ST0_KEY, *ENCODER_METRICS}  # a column only when some run's metrics have the key
TOLERANCE = {"AC-T2A": 1.0, "AC-A2T": 1.0, "US8K": 1.0}  # paper changes smaller than this count as "same"
WITHIN_NOISE = "within noise"
BEFORE_SEEDS = "before seeds"  # the seeds cell of a variant read from its folder or experiment of before seeds


def experiment_name(variant: str, seed: int) -> str:
    """The DVC experiment of ``variant`` trained with ``seed``: ``<variant>-s<seed>``."""
    return f"{variant}-s{seed}"


def run_dir(out_dir: Path | str, variant: str, seed: int) -> Path:
    """The folder of a direct run of ``variant`` with ``seed``: ``<out_dir>/<variant>/seed<seed>``."""
    return Path(out_dir) / variant / f"seed{seed}"


def check_seeds(seeds: tuple[int, ...] | list[int]) -> None:
    """Raise ValueError unless ``seeds`` are whole numbers every RNG accepts."""
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, int) or not SEED.accepts(seed):
            raise ValueError(f"ablate: seed {seed!r} is not {SEED}")


def variant_params(params: Params, variant: str, seed: int) -> Params:
    """``params`` with the variant's train changes, ``seed`` as the top-level seed, the run's own output
    folders (:func:`run_dir`) and a last-step evaluation."""
    _check(variant)
    check_seeds([seed])
    root = run_dir(params.ablations.out_dir, variant, seed)
    raw = dataclasses.asdict(params)
    raw = merge(raw, {"seed": seed, "train": merge(variant_changes(params, variant), {"out_dir": str(root), "resume": False})})
    raw = merge(
        raw,
        {
            "evaluate": {
                "checkpoint": str(root / "checkpoints" / "latest.pt"),
                "untrained": False,
                "pictures": 0,
                "benchmarks": params.evaluate.benchmarks,
                "out_dir": str(root / "evaluation"),
            }
        },
    )
    return build(Params, raw)


def variant_changes(params: Params, variant: str) -> dict:
    """The variant's changes to the ``train`` section, :data:`PRETRAINED_ENCODER` read as ``params.pretrain.encoder_file``."""

    def resolve(tree: dict) -> dict:
        return {
            k: resolve(v) if isinstance(v, dict) else str(params.pretrain.encoder_file) if v == PRETRAINED_ENCODER else v
            for k, v in tree.items()
        }

    return resolve(VARIANTS[variant][1])


def _check(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"ablate: unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")


def _flatten(prefix: str, tree: dict) -> dict[str, object]:
    flat = {}
    for key, value in tree.items():
        flat |= _flatten(f"{prefix}.{key}", value) if isinstance(value, dict) else {f"{prefix}.{key}": value}
    return flat


def experiment_settings(params: Params, variant: str, seed: int) -> list[str]:
    """``key=value`` params (for ``dvc exp run -S``) that make the default pipeline run ``variant`` with ``seed``.

    The same changes as :func:`variant_params`, except that the outputs stay the default
    pipeline's (DVC keeps each experiment's outputs apart).
    """
    _check(variant)
    check_seeds([seed])
    settings = (
        {"seed": seed}
        | _flatten("train", variant_changes(params, variant))
        | {
            "evaluate.checkpoint": str(Path(params.train.out_dir) / "checkpoints" / "latest.pt"),
            "evaluate.untrained": False,
            "evaluate.pictures": 0,
        }
    )
    return [f"{key}={json.dumps(value) if not isinstance(value, str) else value}" for key, value in settings.items()]


def _dvc(*args: str, cwd: Path | str = ".") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, capture_output=True, text=True)


def queue_experiments(
    params: Params, variants: list[str], repo: Path | str = ".", seeds: tuple[int, ...] | list[int] | None = None
) -> dict[str, str]:
    """Queue each (variant, seed) as a DVC experiment :func:`experiment_name`; returns experiment name -> what happened.

    ``seeds`` defaults to ``params.ablations.seeds``. ``queued``; ``exists`` for an experiment of
    that name on the current commit (left as it is: ``dvc exp remove <name>`` lets it run again);
    ``refused: <DVC's message>`` for one DVC would not queue. Each one not queued is reported on
    stderr and the others are still queued.
    """
    seeds = tuple(params.ablations.seeds if seeds is None else seeds)
    for v in variants:
        _check(v)
    check_seeds(seeds)
    done = experiment_metrics(params, repo)
    outcome = {}
    for v in variants:
        for seed in seeds:
            name = experiment_name(v, seed)
            if name in done:
                outcome[name] = "exists"
                print(
                    f"ablate: {name}: an experiment of that name exists on this commit; `dvc exp remove {name}` to run it again",
                    file=sys.stderr,
                )
                continue
            args = ["exp", "run", "--queue", "-n", name]
            for setting in experiment_settings(params, v, seed):
                args += ["-S", setting]
            result = _dvc(*args, cwd=repo)
            if result.returncode != 0:
                lines = (result.stderr or result.stdout).strip().splitlines() or ["no message"]
                outcome[name] = f"refused: {lines[-1]}"
                print(f"ablate: {name}: not queued: {lines[-1]}", file=sys.stderr)
                continue
            outcome[name] = "queued"
    return outcome


def experiment_metrics(params: Params, repo: Path | str = ".") -> dict[str, dict]:
    """Experiment name -> its metrics (:func:`run_metrics`), for the DVC experiments on the current commit.

    Read from ``dvc exp show --json``; queued, running and failed experiments, and a folder
    that is not a DVC project in git, give nothing. The variants' experiments bear the names
    of :func:`experiment_name` (or the variant's own name, from before seeds).
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
                    found[name] = run_metrics(data)
    return found


def run_variant(
    params: Params, variant: str, seed: int, *, train: Callable[[Params], object] | None, evaluate: Callable[[Params], dict]
) -> dict:
    """Train ``variant`` with ``seed`` into :func:`run_dir` and evaluate it, with the train and evaluate
    stages' ``run`` functions (the command passes them in: a stage sits above this module); returns
    the evaluation's summary. ``train`` None evaluates the checkpoint an earlier run left there
    again (after a change to the evaluation); FileNotFoundError names the run to make when there is none."""
    p = variant_params(params, variant, seed)
    if train is None:
        if not Path(p.evaluate.checkpoint).is_file():
            raise FileNotFoundError(
                f"ablate: {variant}, seed {seed}: no checkpoint {p.evaluate.checkpoint} to score again; "
                f"train it with `sedsynth ablate {variant} --seed {seed}`"
            )
        print(f"ablate: {variant} ({VARIANTS[variant][0]}), seed {seed}: scoring {p.evaluate.checkpoint} again")
    else:
        print(f"ablate: {variant} ({VARIANTS[variant][0]}), seed {seed}: training into {p.train.out_dir}")
        train(p)
    return evaluate(p)


@dataclasses.dataclass(frozen=True)
class Run:
    """One evaluated run of a variant: its seed (None: a run from before seeds), ``test.trained`` metrics and where they came from."""

    seed: int | None
    metrics: dict
    source: str


def run_metrics(evaluation: dict) -> dict:
    """An evaluation's ``metrics.json`` -> the table's metrics: its ``test.trained`` section, and
    the trained encoder's linear probes and captioning scores (:data:`ENCODER`) where it has them."""
    out = dict(evaluation["test"]["trained"])
    for key, (_, _, path) in ENCODER_METRICS.items():
        value = evaluation
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            out[key] = value
    return out


def _read_metrics(path: Path) -> dict:
    return run_metrics(json.loads(path.read_text(encoding="utf-8")))


def variant_runs(
    out_dir: Path | str, variant: str, seeds: tuple[int, ...] | list[int], experiments: dict[str, dict] | None = None
) -> list[Run]:
    """The evaluated runs of ``variant``, one per seed of ``seeds`` that has one, in ``seeds``' order.

    Each seed from its experiment (:func:`experiment_name`) in ``experiments`` when there, else
    from ``<run_dir>/evaluation/metrics.json``. A variant with no such run falls back to a run
    from before seeds (an experiment named after the variant, else
    ``<out_dir>/<variant>/evaluation/metrics.json``), read as one run of unknown seed.
    """
    experiments = experiments or {}
    runs = []
    for seed in seeds:
        name, path = experiment_name(variant, seed), run_dir(out_dir, variant, seed) / "evaluation" / "metrics.json"
        if name in experiments:
            runs.append(Run(seed, experiments[name], f"dvc experiment {name}"))
        elif path.exists():
            runs.append(Run(seed, _read_metrics(path), str(path)))
    if runs:
        return runs
    legacy = Path(out_dir) / variant / "evaluation" / "metrics.json"
    if variant in experiments:
        return [Run(None, experiments[variant], f"dvc experiment {variant}")]
    if legacy.exists():
        return [Run(None, _read_metrics(legacy), str(legacy))]
    return []


@dataclasses.dataclass(frozen=True)
class Spread:
    """A metric over a variant's runs: mean, min, max of the ``n`` runs that have a finite value (NaN when n is 0)."""

    mean: float
    min: float
    max: float
    n: int


def spread(values: list[float]) -> Spread:
    """:class:`Spread` of ``values``, NaN and missing (None) values left out."""
    kept = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not kept:
        return Spread(math.nan, math.nan, math.nan, 0)
    return Spread(sum(kept) / len(kept), min(kept), max(kept), len(kept))


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value * scale


def _direction(delta: float, tolerance: float) -> str:
    return "=" if abs(delta) <= tolerance else ("up" if delta > 0 else "down")


def our_direction(variant: Spread, full: Spread, tolerance: float) -> str:
    """The change from ``full`` to ``variant``, judged on the means.

    ``=`` when the means are ``tolerance`` or less apart; else ``within noise`` when either has
    two runs or more and their ranges (min-max) overlap; else ``up`` or ``down``. ``no value``
    when either has none.
    """
    if variant.n == 0 or full.n == 0:
        return "no value"
    direction = _direction(variant.mean - full.mean, tolerance)
    if direction != "=" and max(variant.n, full.n) >= 2 and variant.min <= full.max and full.min <= variant.max:
        return WITHIN_NOISE
    return direction


def table(
    out_dir: Path,
    experiments: dict[str, dict] | None = None,
    seeds: tuple[int, ...] | list[int] = AblationParams().seeds,
    variants: list[str] | None = None,
) -> list[dict]:
    """One row per variant: for each shown metric its mean, min, max and n over the variant's runs
    (:func:`variant_runs`), the paper's numbers and the directions against ``full``.

    Row keys: ``variant``, ``name``, ``n`` (runs read), ``n planned`` (``len(seeds)``), ``seeds``,
    ``<label> mean|min|max|n`` per metric of :data:`OURS` (those of :data:`OPTIONAL` only when a run
    has them), ``paper <column>``, ``direction vs full`` (empty for ``full``) and ``source``.
    ``variants`` (default: all of :data:`VARIANTS`; ``full`` is always in) are the rows. A variant with
    no run at all means no table (an error names the missing ones and how to run them), except an
    extra row (not in :data:`TABLE5`) of the default table, which is left out until it has a run.
    An extra row's paper columns are NaN and its directions are ours alone.
    """
    chosen = ["full", *(v for v in (variants or VARIANTS) if v != "full")]
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown:
        raise ValueError(f"ablate: unknown variant {unknown[0]!r}; choose from {', '.join(VARIANTS)}")
    runs = {v: variant_runs(out_dir, v, seeds, experiments) for v in VARIANTS if v in chosen}
    if not variants:
        runs = {v: found for v, found in runs.items() if found or v in TABLE5}
    missing = [v for v, found in runs.items() if not found]
    if missing:
        raise FileNotFoundError(
            f"ablate: no evaluation for {', '.join(missing)} (no DVC experiment <variant>-s<seed> on this commit, nothing in "
            f"{out_dir}/<variant>/seed<seed>/evaluation for seeds {', '.join(map(str, seeds))}); "
            f"run `sedsynth ablate --queue {' '.join(missing)}` and `dvc queue start`, "
            f"or {' and '.join(f'`sedsynth ablate {v}`' for v in missing)}"
        )
    shown = [m for m in OURS if m[0] not in OPTIONAL or any(m[0] in r.metrics for found in runs.values() for r in found)]
    spreads = {
        v: {key: spread([_scaled(r.metrics.get(key), scale) for r in found]) for key, _, _, scale in shown}
        for v, found in runs.items()
    }
    rows = []
    for v, (name, _) in VARIANTS.items():
        if v not in runs:
            continue
        row = {
            "variant": v,
            "name": name,
            "n": len(runs[v]),
            "n planned": len(seeds),
            "seeds": " ".join(BEFORE_SEEDS if r.seed is None else str(r.seed) for r in runs[v]),
        }
        for key, label, _, _ in shown:
            s = spreads[v][key]
            row |= {f"{label} mean": s.mean, f"{label} min": s.min, f"{label} max": s.max, f"{label} n": s.n}
        row |= {f"paper {c}": x for c, x in zip(PAPER_COLUMNS, PAPER.get(v, NO_PAPER))}
        checks = []
        for key, label, paper_col, _ in shown if v != "full" else ():
            tol = TOLERANCE.get(paper_col, 0.01)
            a = our_direction(spreads[v][key], spreads["full"][key], tol)
            if paper_col is None:  # the encoder's own measures: no paper number
                checks.append(f"{label} {a}")
                continue
            paper_delta = PAPER.get(v, NO_PAPER)[PAPER_COLUMNS.index(paper_col)] - PAPER["full"][PAPER_COLUMNS.index(paper_col)]
            b = _direction(paper_delta, tol) if math.isfinite(paper_delta) else a  # an extra row: no paper direction
            checks.append(f"{label} {a}{'' if a == b else f' (paper {b})'}")
        row["direction vs full"] = "; ".join(checks)
        row["source"] = "; ".join(r.source for r in runs[v])
        rows.append(row)
    return rows


def _cell(row: dict, label: str) -> str:
    """``mean (min-max)`` of one metric, ``mean`` alone for one run, ``n/a`` for none; `` n=k`` when fewer runs have it than the row."""
    fmt = "{:.1f}" if "R@" in label or "acc" in label else "{:.3f}"
    n = row[f"{label} n"]
    if n == 0:
        return "n/a"
    text = fmt.format(row[f"{label} mean"])
    if n >= 2:
        text += f" ({fmt.format(row[f'{label} min'])}-{fmt.format(row[f'{label} max'])})"
    return text + (f" n={n}" if n != row["n"] else "")


def _paper_cell(value: float, column: str) -> str:
    """A paper number as Table 5 prints it; blank for a row the paper does not have (NaN)."""
    if not math.isfinite(value):
        return ""
    return f"{value:.1f}" if column in ("AC-T2A", "AC-A2T", "VGGSound", "US8K") else f"{value:.3f}"


def write_table(
    out_dir: Path,
    experiments: dict[str, dict] | None = None,
    seeds: tuple[int, ...] | list[int] = AblationParams().seeds,
    variants: list[str] | None = None,
) -> str:
    """:func:`table` as ``<out_dir>/table.md`` (returned) and ``table.csv``, each written whole or not at all;
    a table of some ``variants`` only says which rows it leaves out."""
    rows = table(out_dir, experiments, seeds, variants)
    labels = [label for _, label, _, _ in OURS if f"{label} mean" in rows[0]]
    head = ["Methods", *labels, *(f"paper {c}" for c in PAPER_COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        method = r["name"] + (f" (n={r['n']}/{r['n planned']})" if r["n"] < r["n planned"] else "")
        cells = [method, *(_cell(r, label) for label in labels), *(_paper_cell(r[f"paper {c}"], c) for c in PAPER_COLUMNS)]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"Ours: the held-out test split of the embedded data, mean over the runs with seeds {', '.join(map(str, seeds))} "
        "(ablations.seeds) and their range min-max in brackets; (n=k/N) after a method run for k of its N seeds so far, "
        "n=k after a value that only k of the row's runs have. R@1 and zero-shot accuracy in %, PSDS1 (alpha_st 1), "
        + ("PSDS1 (alpha_st 0, no penalty for instability across classes), " if "PSDS1 (alpha_st 0)" in labels else "")
        + "PSDS2 with sed_scores_eval, segment AUROC, FLAM's Spearman alignment"
        + (
            "; linear probes on the frozen encoder (CaptionStew's protocol: held-out event clips, accuracy in %, "
            "mean and attention pooling; frame probe on the test mixtures: macro AUROC, segment F1)"
            if any(label.startswith("Probe") for label in labels)
            else ""
        )
        + ("; CIDEr-D of the captioning decoder on the test captions" if "CIDEr-D" in labels else "")
        + ". Paper: FineLAP Table 5"
        + ("; rows beside it (+) have no paper numbers." if any(r["variant"] not in TABLE5 for r in rows) else ".")
    )
    lines.append("")
    lines.append(
        "Direction of each change against the full model, judged on the means (ours; the paper's where it differs); "
        f"{WITHIN_NOISE}: the variant's range over its seeds overlaps the full model's:"
    )
    lines += [f"- {r['name']}: {r['direction vs full']}" for r in rows if r["variant"] != "full"]
    lines.append("")
    shown = {r["variant"] for r in rows}
    not_run = [VARIANTS[v][0] for v in VARIANTS if v not in shown and not variants]
    left_out = [VARIANTS[v][0] for v in VARIANTS if v not in shown and variants]
    if left_out:
        lines.append(f"Not in this table (not asked for): {', '.join(left_out)}.")
        lines.append("")
    if not_run:
        lines.append(f"Not in this table (no run yet): {', '.join(not_run)}.")
        lines.append("")
    lines.append("Read from: " + "; ".join(f"{r['variant']} {r['source']}" for r in rows))
    text = "\n".join(lines) + "\n"
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    write_atomic(Path(out_dir) / "table.md", text.encode("utf-8"))
    write_atomic(Path(out_dir) / "table.csv", buf.getvalue().encode("utf-8"))
    return text
