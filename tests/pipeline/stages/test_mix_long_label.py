"""The mix stage on a Scaper-layout library whose label folders have the longest names a filesystem allows
(255 bytes): the mixtures are made, the tables and DCASE files keep the labels whole, and the timeline
picture names each lane with the label's start."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import soundfile as sf

from pipeline.config.params import ComputeParams, HoldoutFractions, MixtureCounts, SoundLibraryParams
from pipeline.mix.exports import LANE_LABEL_CHARS, lane_label
from pipeline.stages.mix import run
from tests.conftest import tone_burst
from trainer.config import Params

LONG_LABELS = ("siren_" + "a" * 249, "\u00fc" * 127)  # 255 bytes, and 254 bytes of two-byte UTF-8 characters


def write_library(root: Path) -> Path:
    """3 events per long label (16 kHz mono) and 3 background recordings: one file of each per split."""
    rng = np.random.default_rng(3)
    for k, label in enumerate(LONG_LABELS):
        for i in range(3):
            path = root / "foreground" / label / f"e{i}.wav"
            path.parent.mkdir(parents=True, exist_ok=True)
            sf.write(
                path,
                tone_burst(16000, 0.8, 0.05, 0.7, level_dbfs=-14.0, freq_hz=400.0 * (k + 1) + 50 * i, seed=i),
                16000,
                subtype="PCM_16",
            )
    for i in range(3):
        path = root / "background" / "park" / f"b{i}.wav"
        path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(path, (0.03 * rng.standard_normal(3 * 16000)).astype(np.float32), 16000, subtype="PCM_16")
    return root


def test_a_label_folder_with_a_255_byte_name_mixes(tmp_path: Path) -> None:
    root = write_library(tmp_path / "library")
    assert {len(d.name.encode("utf-8")) for d in (root / "foreground").iterdir()} == {255, 254}
    p = Params()
    out = tmp_path / "mixtures"
    mix = replace(
        p.mix,
        events=str(root / "foreground"),
        backgrounds=str(root / "background"),
        out_dir=str(out),
        mixtures=MixtureCounts(train=2, valid=1, test=1),
        partition_size=2,
        holdout=HoldoutFractions(0.34, 0.33, 0.33),
        spec={"duration_s": ["const", 3.0], "events_per_mixture": ["const", 1]},
        library=SoundLibraryParams(license="CC0"),
        export=replace(p.mix.export, timelines=4),
    )
    run(replace(p, compute=ComputeParams(workers=1, chunk_size=1), mix=mix))

    assert (out / "timelines.png").stat().st_size > 0
    labels = {row["label"] for row in pq.read_table(out / "occurrences.parquet").to_pylist()}
    assert labels and labels <= set(LONG_LABELS)
    with open(out / "metadata" / "train" / "events.tsv", newline="", encoding="utf-8") as f:
        assert {row["event_label"] for row in csv.DictReader(f, delimiter="\t")} - {""} <= set(LONG_LABELS)


def test_a_lane_names_a_long_label_by_its_start() -> None:
    assert lane_label("Vehicle_horn_and_car_horn_and_honking") == "Vehicle_horn_and_car_horn_and_honking"
    shown = lane_label(LONG_LABELS[0])
    assert len(shown) == LANE_LABEL_CHARS and shown.startswith("siren_aaa") and shown.endswith("\u2026")
