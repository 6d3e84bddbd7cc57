"""A small Scaper-layout library through the mix stage: 3 labels x 5 files and 2 backgrounds mix
with the default holdout and preset and one setting (``mix.background_split``), every label in
every split; the refusals name the setting to change, the folder to point at, and the user's
files, in the run's report folder."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from pipeline.config.params import ComputeParams, MixtureCounts, SoundLibraryParams
from pipeline.mix.sources import SOURCES, MixError
from pipeline.outputs import rejected_report_path
from pipeline.schema import BackgroundSegment, EventClip, from_table
from pipeline.stages.mix import LABEL_COVERAGE, report_dir, run
from sedsynth.cli import main
from tests.conftest import ROOT, tone_burst
from trainer.config import Params

LABELS = {"car_horn": 500.0, "dog_bark": 300.0, "siren": 900.0}
BACKGROUND_S = 25.0  # two mixture-length segments each, at the default 10 s mixtures


def write_small_library(root: Path) -> Path:
    """``foreground/<label>/<label><i>.wav``: 3 labels x 5 tone bursts of 1-2 s; ``background/{park,street}/*.wav``: 25 s of noise each."""
    for k, (label, freq) in enumerate(LABELS.items()):
        for i in range(5):
            x = tone_burst(
                16000, 1.0 + 0.2 * i, 0.1, 0.8 + 0.2 * i, level_dbfs=-14.0, freq_hz=freq * (1 + 0.05 * i), seed=10 * k + i
            )
            path = root / "foreground" / label / f"{label}{i}.wav"
            path.parent.mkdir(parents=True, exist_ok=True)
            sf.write(path, x, 16000, subtype="PCM_16")
    rng = np.random.default_rng(3)
    for label in ("park", "street"):
        path = root / "background" / label / f"{label}.wav"
        path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(path, (0.03 * rng.standard_normal(int(BACKGROUND_S * 16000))).astype(np.float32), 16000, subtype="PCM_16")
    return root


@pytest.fixture(scope="module")
def small_library(tmp_path_factory) -> Path:
    return write_small_library(tmp_path_factory.mktemp("small-library"))


def params_for(root: Path, out: Path, **mix) -> Params:
    """params.yaml's defaults (holdout 0.8/0.1/0.1, the finelap preset), the library, a CC-BY licence and few mixtures."""
    p = Params()
    m = replace(
        p.mix,
        events=str(root / "foreground"),
        backgrounds=str(root / "background"),
        out_dir=str(out),
        mixtures=MixtureCounts(train=4, valid=2, test=2),
        partition_size=4,
        library=SoundLibraryParams(license="CC-BY"),
        export=replace(p.mix.export, timelines=0),
    )
    return replace(p, compute=ComputeParams(workers=1, chunk_size=1), mix=replace(m, **mix))


def coverage_rows(path: Path) -> dict[str, dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return {row["label"]: row for row in csv.DictReader(f)}


def test_two_backgrounds_by_recording_are_refused_naming_background_split(small_library: Path, tmp_path: Path) -> None:
    with pytest.raises(MixError) as caught:
        run(params_for(small_library, tmp_path / "mix"))
    text = str(caught.value)
    assert (
        "2 recordings cannot give each of the 3 splits that make mixtures its own recordings, whatever mix.holdout says" in text
    )
    assert "mix.background_split: segment" in text and "or shared" in text and "change mix.holdout" not in text
    assert not (tmp_path / "mix").exists()


def test_three_labels_of_five_files_fill_every_split_with_one_setting(small_library: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "mix"
    summary = run(params_for(small_library, out, background_split="segment"))
    assert summary["mixtures_by_split"] == {"train": 4, "valid": 2, "test": 2}
    rows = coverage_rows(out / LABEL_COVERAGE)
    assert {label: (r["train"], r["valid"], r["test"], r["missing_from"]) for label, r in rows.items()} == {
        label: ("3", "1", "1", "") for label in LABELS
    }, "each label's 5 files split 3/1/1 by the default holdout"
    assert (
        summary["label_coverage"]["labels_by_split"] == {"train": 3, "valid": 3, "test": 3}
        and summary["label_coverage"]["missing"] == {}
    )
    assert "labels per split: train 3/3, valid 3/3, test 3/3" in capsys.readouterr().err

    # the mixtures use each file in one split only, and every label is heard in train
    events = from_table(pq.read_table(out / SOURCES / "events" / "manifest.parquet"), EventClip)
    occurrences = pq.read_table(out / "occurrences.parquet").to_pylist()
    split_of = {m["mixture_id"]: m["split"] for m in pq.read_table(out / "mixtures.parquet").to_pylist()}
    label_of = {e.clip_id: e.label for e in events}
    splits_per_clip: dict[str, set[str]] = {}
    for o in occurrences:
        splits_per_clip.setdefault(o["clip_id"], set()).add(split_of[o["mixture_id"]])
    assert all(len(s) == 1 for s in splits_per_clip.values())
    assert {label_of[o["clip_id"]] for o in occurrences if split_of[o["mixture_id"]] == "train"} == set(LABELS)

    # each 25 s background is cut into two segments; one recording may serve several splits, and the summary says so
    backgrounds = from_table(pq.read_table(out / SOURCES / "backgrounds" / "manifest.parquet"), BackgroundSegment)
    assert sorted((b.source_path, b.offset_in_source_s, b.duration_s) for b in backgrounds) == [
        ("park/park.wav", 0.0, 10.0),
        ("park/park.wav", 10.0, 15.0),
        ("street/street.wav", 0.0, 10.0),
        ("street/street.wav", 10.0, 15.0),
    ]
    assert summary["libraries"]["backgrounds"] == {
        "root": str(small_library / "background"),
        "kept": 2,
        "skipped": 0,
        "segments": 4,
    }
    rule = summary["split_rule"]
    assert rule["backgrounds"] == "segment" and rule["events"].startswith("a library's files, split within each label")
    assert rule["backgrounds_held_out"] is False and rule["shared_backgrounds"] >= 1
    # valid and test hold 3 clips each, fewer than the 5 a finelap mixture may draw: served, and said
    assert summary["events_per_mixture_capped"] == {"valid": 3, "test": 3}


def test_shared_backgrounds_serve_every_split_and_the_summary_states_the_leak(
    small_library: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "mix"
    summary = run(params_for(small_library, out, background_split="shared"))
    mixtures = pq.read_table(out / "mixtures.parquet").to_pylist()
    assert {m["split"] for m in mixtures} == {"train", "valid", "test"}
    rule = summary["split_rule"]
    assert rule["backgrounds_held_out"] is False and rule["shared_backgrounds"] == 2
    assert "not held out" in rule["backgrounds_rule"]
    assert "backgrounds (mix.background_split: shared): every background serves every split" in capsys.readouterr().err


def test_a_library_root_is_refused_naming_the_folder_to_set(small_library: Path, tmp_path: Path) -> None:
    out = tmp_path / "mix"
    with pytest.raises(MixError, match=rf"set mix\.events to {small_library / 'foreground'}$"):
        run(params_for(small_library, out, events=str(small_library)))
    with pytest.raises(MixError, match=rf"set mix\.backgrounds to {small_library / 'background'}$"):
        run(params_for(small_library, out, backgrounds=str(small_library)))
    assert not out.exists() and not report_dir(out).exists()


def test_a_refused_run_reports_the_library_files_in_its_report_folder(small_library: Path, tmp_path: Path) -> None:
    out = tmp_path / "mix"
    unlicensed = params_for(small_library, out, background_split="segment", library=SoundLibraryParams())
    with pytest.raises(MixError) as caught:
        run(unlicensed)
    report = report_dir(out) / "skipped.csv"
    assert report == tmp_path / "reports" / "mix" / "skipped.csv" and str(report) in str(caught.value)
    assert not rejected_report_path(out).exists(), "nothing beside the output folder"
    with open(report, newline="", encoding="utf-8") as f:
        paths = {row["path"] for row in csv.DictReader(f)}
    assert {f"{label}/{label}{i}.wav" for label in LABELS for i in range(5)} <= paths, (
        "the user's files, by their path in the library"
    )
    assert {"park/park.wav", "street/street.wav"} <= paths and not any(p.startswith("audio/") for p in paths)

    # a run that succeeds removes the reports that no longer apply
    run(replace(unlicensed, mix=replace(unlicensed.mix, library=SoundLibraryParams(license="CC-BY"))))
    assert not report_dir(out).exists() and not (tmp_path / "reports").exists()


def test_the_documented_set_syntax_runs_the_small_library_from_the_command_line(
    small_library: Path, tmp_path: Path, capsys
) -> None:
    """docs/your-data.md's recipe: the library (no licence stated: unknown), one setting, and a list and a mapping given with --set."""
    out = tmp_path / "mix"
    sets = [
        f"mix.events={small_library / 'foreground'}",
        f"mix.backgrounds={small_library / 'background'}",
        "mix.background_split=shared",
        "mix.allowed_licenses=[CC0, CC-BY, unknown]",
        "mix.holdout={train: 0.6, valid: 0.2, test: 0.2}",
        "mix.mixtures={train: 3, valid: 1, test: 1}",
        "mix.export.timelines=0",
        f"mix.out_dir={out}",
        "compute.workers=1",
    ]
    assert main(["mix", "--params", str(ROOT / "params.yaml"), *[a for s in sets for a in ("--set", s)]]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["license_filter"]["allowed"] == ["CC0", "CC-BY", "unknown"]
        and summary["licenses"]["dataset_license"] == "unknown"
    )
    assert summary["mixtures_by_split"] == {"train": 3, "valid": 1, "test": 1}
    # holdout 0.6/0.2/0.2 of 5 files per label: 3/1/1
    assert {r["train"] + r["valid"] + r["test"] for r in coverage_rows(out / LABEL_COVERAGE).values()} == {"311"}
    assert "labels per split: train 3/3, valid 3/3, test 3/3" in capsys.readouterr().err
