"""Clip and ambience stages under input that leaves nothing, and the pictures that explain refusals.

- A stage that keeps nothing fails (exit status 2) with the count per skip reason, writes its
  skip report beside the output folder and leaves the previous output as it was.
- ``ambience.keywords: all`` selects every recording; a recording shorter than one segment is
  reported, never dropped without a trace.
- ``clipping_examples.png`` shows one refused clip per energy-curve reason that occurred.
- Every PNG the project writes carries no matplotlib version stamp and repeats byte for byte.
"""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from pipeline.clip.plots import plot_clipping_examples
from pipeline.config.params import SegmentationParams
from pipeline.outputs import NoOutputError, rejected_report_path
from pipeline.schema import BackgroundSegment, EventClip, Skip, from_table
from pipeline.stages import ambience, clip
from sedsynth.cli import main
from tests.conftest import BARK, BARK_AND_MEOW, KNOCK, MEOW, ROOT, tone_burst, tree_digest, write_fsd50k

SR = 16000


def _skips(path: Path) -> dict[str, str]:
    with path.open() as f:
        return {r["item_id"]: r["reason"] for r in csv.DictReader(f)}


@pytest.fixture
def refusals(tmp_path: Path) -> Path:
    """One kept clip and one clip per refusal reason, under an absolute -40 dBFS threshold."""
    clipped = np.clip(tone_burst(SR, 4.0, 1.0, 3.0, level_dbfs=6.0), -1.0, 1.0 - 2**-15)
    dev = [
        (1, *BARK, "train"),  # kept, 1.0-3.0 s
        (2, *MEOW, "train"),  # too-short
        (3, *KNOCK, "train"),  # too-long
        (4, *BARK, "train"),  # silent
        (5, *MEOW, "train"),  # clipped
        (6, *KNOCK, "train"),  # no-segment: audible, but under the absolute threshold
        (7, *BARK, "train"),  # missing-file (no audio)
        (8, *BARK_AND_MEOW, "train"),  # multi-label (not an energy reason)
    ]
    audio = {
        "1": (tone_burst(SR, 4.0, 1.0, 3.0), SR, "PCM_16"),
        "2": (tone_burst(SR, 3.0, 1.0, 1.3), SR, "PCM_16"),
        "3": (tone_burst(SR, 10.0, 0.5, 9.5), SR, "PCM_16"),
        "4": (np.zeros(SR * 3, dtype=np.float32), SR, "PCM_16"),
        "5": (clipped, SR, "PCM_16"),
        "6": (tone_burst(SR, 3.0, 1.0, 2.0, level_dbfs=-60.0), SR, "PCM_16"),
        "8": (tone_burst(SR, 3.0, 1.0, 2.0), SR, "PCM_16"),
    }
    return write_fsd50k(tmp_path / "FSD50K", dev, [], audio)


def _absolute_threshold(params):
    seg = SegmentationParams(threshold_reference="dbfs", threshold_db=-40.0)
    return replace(params, clip=replace(params.clip, segmentation=seg, plot_examples=1))


def test_clipping_examples_show_one_panel_per_refusal_reason(refusals: Path, tmp_path: Path, params) -> None:
    p = _absolute_threshold(params)
    out = tmp_path / "events"
    clip.run(p, refusals, out)
    skips = _skips(out / "skipped.csv")
    energy_reasons = {"too-short", "too-long", "silent", "clipped", "no-segment"}
    assert energy_reasons <= set(skips.values()), "the corpus exercises every energy reason"

    records = from_table(pq.read_table(out / "manifest.parquet"), EventClip)
    with (out / "skipped.csv").open() as f:
        all_skips = [Skip(r["item_id"], r["path"], r["reason"], r["detail"]) for r in csv.DictReader(f)]
    titles = plot_clipping_examples(records[:1], all_skips, refusals, p.clip, tmp_path / "again.png")
    for clip_id, reason in skips.items():
        if reason in energy_reasons:
            assert any(clip_id in t and reason in t for t in titles), (clip_id, reason, titles)
    assert not any("missing-file" in t or "multi-label" in t for t in titles), "reasons without a curve get no panel"
    assert any("fsd50k-1" in t and "kept" in t for t in titles)
    # The stage's picture is this one, and it repeats byte for byte.
    assert (tmp_path / "again.png").read_bytes() == (out / "clipping_examples.png").read_bytes()


def test_pngs_carry_no_version_stamp_and_repeat_exactly(tmp_path: Path) -> None:
    from trainer.evaluation import plots
    from trainer.logs import plot_curves

    def draw(folder: Path) -> list[Path]:
        rows = [{"step": 1, "loss": 2.0, "clip": 1.0, "frame": 1.0}, {"step": 2, "loss": 1.5, "clip": 0.8, "frame": 0.7}]
        plot_curves(rows, [{"epoch": 0, "frame_auroc": 0.5, "a2t_r1": 0.1, "t2a_r1": 0.1}], folder / "curves.png")
        wave = np.sin(np.arange(16000) / 10).astype(np.float32)
        stamps = np.linspace(0, 1, 11)
        plots.detection_figure(folder / "detect.png", wave, 16000, stamps, np.full((10, 1), 0.7), ["dog"], title="a clip")
        return [folder / "curves.png", folder / "detect.png"]

    first, second = draw(tmp_path / "a"), draw(tmp_path / "b")
    for a, b in zip(first, second):
        data = a.read_bytes()
        assert data.startswith(b"\x89PNG") and b"Matplotlib" not in data and b"Software" not in data, a.name
        assert data == b.read_bytes(), a.name


def test_a_clip_run_that_keeps_nothing_fails_and_keeps_the_previous_output(refusals: Path, tmp_path: Path, params) -> None:
    p = _absolute_threshold(params)
    out = tmp_path / "events"
    clip.run(p, refusals, out)  # a good run first
    before = tree_digest(out)
    (refusals / "FSD50K.dev_audio" / "1.wav").unlink()  # now no clip survives
    with pytest.raises(NoOutputError) as e:
        clip.run(p, refusals, out)
    message = str(e.value)
    report = rejected_report_path(out)
    assert report == tmp_path / "events.skipped.csv" and str(report) in message
    reasons = _skips(report)
    assert reasons["fsd50k-1"] == "missing-file" and len(reasons) == 8
    for reason in set(reasons.values()):
        count = sum(r == reason for r in reasons.values())
        assert f"{reason} {count}" in message
    assert "\n" not in message
    assert tree_digest(out) == before, "the previous good output is untouched"
    assert not list(tmp_path.glob(".events*")), "no staging folder is left"


def test_the_cli_exits_2_on_an_empty_clip_run_and_a_later_good_run_clears_the_report(
    refusals: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "events"
    args = [
        "clip",
        "--params",
        str(ROOT / "params.yaml"),
        "--set",
        f"sources.fsd50k_dir={refusals}",
        "--set",
        f"clip.out_dir={out}",
        "--set",
        "compute.workers=1",
        "--set",
        "clip.plot_examples=0",
        "--set",
        "clip.segmentation.threshold_reference=dbfs",
        "--set",
        "clip.segmentation.threshold_db=-40",
    ]
    good = refusals / "FSD50K.dev_audio" / "1.wav"
    kept = good.read_bytes()
    good.unlink()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("sedsynth clip: error: no event clips from 8 rows") and "missing-file 2" in err
    assert (tmp_path / "events.skipped.csv").exists() and not out.exists()
    good.write_bytes(kept)
    assert main(args) == 0
    assert out.is_dir() and not (tmp_path / "events.skipped.csv").exists(), "a stale report would mislead"


def _library(root: Path, files: dict[str, float], category: str) -> Path:
    """Noise recordings (path -> seconds) listed in metadata.csv under one category."""
    rng = np.random.default_rng(0)
    for rel, seconds in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        sf.write(root / rel, (rng.standard_normal(int(seconds * SR)) * 0.03).astype(np.float32), SR, subtype="PCM_16")
    with (root / "metadata.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["filename", "category"])
        w.writerows([rel, category] for rel in files)
    return root


def test_an_ambience_run_that_keeps_nothing_names_the_reasons_and_keywords_all_fixes_it(tmp_path: Path, params, capsys) -> None:
    library = _library(tmp_path / "lib", {"a.wav": 12.0, "b.wav": 21.0}, "Field recording")
    out = tmp_path / "backgrounds"
    with pytest.raises(NoOutputError, match=r"filtered-category 2.*ambience.keywords: all") as e:
        ambience.run(params, library, out)
    assert str(rejected_report_path(out)) in str(e.value) and not out.exists()
    assert _skips(rejected_report_path(out)) == {"a.wav": "filtered-category", "b.wav": "filtered-category"}

    p = replace(params, ambience=replace(params.ambience, keywords="all"))
    summary = ambience.run(p, library, out)
    assert summary["outputs"] == 3 and summary["recordings_used"] == 2
    assert not rejected_report_path(out).exists()


def test_keywords_all_reads_from_params_yaml(tmp_path: Path) -> None:
    from trainer.config import load_params

    path = tmp_path / "params.yaml"
    path.write_text("ambience:\n  keywords: all\n")
    assert load_params(path).ambience.keywords == "all"


def test_a_recording_shorter_than_one_segment_is_reported(tmp_path: Path, params) -> None:
    library = _library(tmp_path / "lib", {"Ambiance/long.wav": 10.5, "Ambiance/short.wav": 6.0}, "Ambiance")
    p = replace(params, ambience=replace(params.ambience, min_recording_s=0.0))
    out = tmp_path / "backgrounds"
    ambience.run(p, library, out)
    records = from_table(pq.read_table(out / "manifest.parquet"), BackgroundSegment)
    assert [r.source_path for r in records] == ["Ambiance/long.wav"]
    with (out / "skipped.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["path"], r["reason"]) for r in rows] == [("Ambiance/short.wav", "too-short")]
    assert "segment" in rows[0]["detail"]
