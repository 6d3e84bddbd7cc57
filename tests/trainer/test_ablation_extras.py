"""The ablation rows beside FineLAP Table 5 (the captioning loss, SAM): their settings, blank paper
columns, and a full table that shows them once they ran (and needs them only when named)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from pipeline.config.params import merge, parse_override
from tests.conftest import ROOT
from trainer import ablations
from trainer.config import load_params

SEEDS = (1234, 1235, 1236)


def _write(out, variant: str, seed: int, **changes) -> None:
    m = {
        "psds1": 0.2,
        "psds2": 0.4,
        "auroc": 0.9,
        "alignment": 0.5,
        "t2a_r1": 0.3,
        "a2t_r1": 0.35,
        "zero_shot_accuracy": 0.5,
    } | changes
    folder = ablations.run_dir(out, variant, seed) / "evaluation"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.json").write_text(json.dumps({"test": {"trained": m}}))


def _rows(out) -> dict[str, dict]:
    with (out / "table.csv").open() as f:
        return {r["variant"]: r for r in csv.DictReader(f)}


@pytest.mark.parametrize("variant, key, value", [("caption_loss", "loss.caption_weight", 1.0), ("sam", "optim.sam_rho", 0.075)])
def test_extra_variants_change_one_setting_directly_and_as_experiments(variant, key, value):
    base = load_params(ROOT / "params.yaml")
    direct = ablations.variant_params(base, variant, SEEDS[0])
    group, name = key.split(".")
    assert getattr(getattr(direct.train, group), name) == value != getattr(getattr(base.train, group), name)
    overrides: dict = {}
    for setting in ablations.experiment_settings(base, variant, SEEDS[0]):
        overrides = merge(overrides, parse_override(setting))
    exp = load_params(ROOT / "params.yaml", overrides)
    assert getattr(getattr(exp.train, group), name) == value and exp.seed == SEEDS[0]


def test_extra_rows_join_the_table_once_they_ran_with_blank_paper_columns(tmp_path):
    for v in ablations.TABLE5:
        for seed in SEEDS:
            _write(tmp_path, v, seed)
    text = ablations.write_table(tmp_path)  # the extra rows never ran: Table 5 alone, and a line saying so
    assert set(_rows(tmp_path)) == set(ablations.TABLE5)
    extras = [ablations.VARIANTS[v][0] for v in ablations.VARIANTS if v not in ablations.TABLE5]
    assert f"Not in this table (no run yet): {', '.join(extras)}." in text

    for seed in SEEDS:
        _write(tmp_path, "sam", seed, t2a_r1=0.5)
    text = ablations.write_table(tmp_path)
    rows = _rows(tmp_path)
    assert list(rows) == [*ablations.TABLE5, "sam"]
    assert all(math.isnan(float(rows["sam"][f"paper {c}"])) for c in ablations.PAPER_COLUMNS)
    line = next(line for line in text.splitlines() if line.startswith("| + SAM"))
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    assert cells[-len(ablations.PAPER_COLUMNS) :] == [""] * len(ablations.PAPER_COLUMNS)  # no paper numbers, blank
    directions = next(line for line in text.splitlines() if line.startswith("- + SAM"))
    assert "T2A R@1 up;" in directions and "paper" not in directions  # ours alone
    not_run = [label for label in extras if label != ablations.VARIANTS["sam"][0]]
    assert "rows beside it (+) have no paper numbers" in text and f"no run yet): {', '.join(not_run)}." in text

    with pytest.raises(FileNotFoundError, match="sedsynth ablate --queue caption_loss"):
        ablations.write_table(tmp_path, variants=["caption_loss"])  # named: needed


def test_mae_init_starts_from_the_pretrain_stages_encoder():
    """The variant names the pretrain stage's output (pretrain.out_dir), directly and as a DVC experiment."""
    from trainer.config import load_params

    params = load_params(ROOT / "params.yaml", {"pretrain": {"out_dir": "elsewhere/pretrain"}})
    p = ablations.variant_params(params, "mae_init", params.ablations.seeds[0])
    assert p.train.model.encoder_checkpoint == str(Path("elsewhere/pretrain/checkpoints/encoder.pt"))
    settings = ablations.experiment_settings(params, "mae_init", params.ablations.seeds[0])
    assert f"train.model.encoder_checkpoint={Path('elsewhere/pretrain/checkpoints/encoder.pt')}" in settings


def test_a_captioning_only_encoder_is_a_valid_run():
    from trainer.config import load_params

    params = load_params(ROOT / "params.yaml")
    p = ablations.variant_params(params, "captioning_only", params.ablations.seeds[0])
    assert (p.train.loss.clip_weight, p.train.loss.frame_weight, p.train.loss.caption_weight) == (0.0, 0.0, 1.0)


def _write_encoder(out, variant: str, seed: int, clip_mean: float, frame_auroc: float, cider: float | None) -> None:
    m = {"psds1": 0.2, "psds2": 0.4, "auroc": 0.9, "alignment": 0.5, "t2a_r1": 0.3, "a2t_r1": 0.35, "zero_shot_accuracy": 0.5}
    probes = {
        "trained": {
            "clip_mean": {"top1_accuracy": clip_mean},
            "clip_attention": {"top1_accuracy": clip_mean + 0.01},
            "frame": {"frame_auroc_macro": frame_auroc, "segment_f1": frame_auroc - 0.3},
        }
    }
    data = {"test": {"trained": m}, "probes": probes} | ({"captions": {"cider_d": cider}} if cider is not None else {})
    folder = ablations.run_dir(out, variant, seed) / "evaluation"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.json").write_text(json.dumps(data))


def test_the_encoders_linear_probes_and_cider_d_are_columns_with_their_spread(tmp_path):
    """CaptionStew's comparison: contrastive-only against captioning-only encoders under the linear probe."""
    for seed, (acc, auroc) in zip(SEEDS[:2], ((0.90, 0.95), (0.94, 0.97))):
        _write_encoder(tmp_path, "full", seed, acc, auroc, None)
        _write_encoder(tmp_path, "no_frame_loss", seed, acc - 0.1, auroc - 0.2, None)
        _write_encoder(tmp_path, "captioning_only", seed, acc - 0.3, auroc - 0.1, 0.5 + seed - SEEDS[0])
    text = ablations.write_table(tmp_path, variants=["no_frame_loss", "captioning_only"])
    rows = _rows(tmp_path)
    assert float(rows["full"]["Probe clip acc (mean) mean"]) == pytest.approx(92.0)
    assert float(rows["captioning_only"]["Probe clip acc (mean) min"]) == pytest.approx(60.0)
    assert float(rows["captioning_only"]["Probe frame AUROC max"]) == pytest.approx(0.87)
    assert float(rows["captioning_only"]["CIDEr-D mean"]) == pytest.approx(1.0) and rows["full"]["CIDEr-D n"] == "0"
    assert "Probe clip acc (mean) down" in rows["captioning_only"]["direction vs full"]
    assert "linear probes on the frozen encoder" in text and "CIDEr-D of the captioning decoder" in text
    header = text.splitlines()[0]
    assert "| Probe clip acc (mean) | Probe clip acc (attention) | Probe frame AUROC | Probe segment F1 | CIDEr-D |" in header
