"""``sedsynth bench detection``: one scored checkpoint per epoch, the untrained model first."""

from __future__ import annotations

import csv
from dataclasses import replace

import pytest

from benchmarks.detection import COLUMNS, NoRunError, run
from tests.conftest import tiny_train_params


def test_every_epoch_is_scored_on_the_test_split(shard_folder, tmp_path):
    params, folder = shard_folder
    p = tiny_train_params(params, folder, tmp_path / "unused")
    p = replace(
        p, evaluate=replace(p.evaluate, shards=str(folder), device="cpu", event_clips=None, probe_steps=20, probe_clips=16)
    )
    rows = run(p, tmp_path / "bench", epochs=2)
    assert [r["epoch"] for r in rows] == [0, 1, 2]
    assert rows[0]["step"] == 0 and rows[0]["train_min"] == 0.0
    assert 0 < rows[1]["step"] < rows[2]["step"] and 0 < rows[1]["train_min"] < rows[2]["train_min"]
    for r in rows:
        for key in ("psds1", "psds1_astat0", "psds2", "auroc"):
            assert 0.0 <= r[key] <= 1.0, (r["epoch"], key)
        assert r["psds1"] <= r["psds1_astat0"]
        assert 0.0 <= r["probe_frame_auroc"] <= 1.0 and 0.0 <= r["probe_segment_f1"] <= 1.0, r  # the untrained encoder's too
    checkpoints = sorted(p.name for p in (tmp_path / "bench" / "finelap" / "checkpoints").glob("epoch*.pt"))
    assert checkpoints == ["epoch001.pt", "epoch002.pt"]
    with (tmp_path / "bench" / "psds_curve.csv").open() as f:
        written = list(csv.DictReader(f))
    assert list(written[0]) == list(COLUMNS) and len(written) == 3
    assert float(written[2]["psds2"]) == pytest.approx(rows[2]["psds2"], abs=1e-4)
    assert (tmp_path / "bench" / "psds_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # --score-only scores the same checkpoints again without training: the same rows, the run's minutes
    (tmp_path / "bench" / "psds_curve.csv").unlink()
    before = {c: c.stat().st_mtime_ns for c in (tmp_path / "bench" / "finelap" / "checkpoints").glob("*.pt")}
    again = run(p, tmp_path / "bench", epochs=2, score_only=True)
    assert {c: c.stat().st_mtime_ns for c in (tmp_path / "bench" / "finelap" / "checkpoints").glob("*.pt")} == before
    assert [r["train_min"] for r in again] == [r["train_min"] for r in rows]
    assert [r["psds2"] for r in again] == pytest.approx([r["psds2"] for r in rows], abs=1e-6)
    assert (tmp_path / "bench" / "psds_curve.csv").is_file()
    with pytest.raises(NoRunError, match="without --score-only first"):
        run(p, tmp_path / "bench", epochs=3, score_only=True)
