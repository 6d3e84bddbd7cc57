"""The ambience stage on a hand-built library: selection, cutting, rejection rules, bad input."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from pipeline.ambience.recordings import read_ambience_library
from pipeline.config.params import ComputeParams
from pipeline.schema import BackgroundSegment, from_table
from pipeline.stages import ambience
from tests.conftest import tree_digest


def _noise(sr: int, seconds: float, level_dbfs: float = -30.0, channels: int = 1, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((int(seconds * sr), channels)) * 10 ** (level_dbfs / 20)
    return (x[:, 0] if channels == 1 else x).astype(np.float32)


@pytest.fixture
def library(tmp_path: Path) -> Path:
    root = tmp_path / "library"
    files: dict[str, tuple[np.ndarray, int, str]] = {}
    files["Ambiance/rain.wav"] = (_noise(48000, 35.0, channels=2), 48000, "PCM_24")  # 3 segments
    burst = _noise(22050, 21.0, level_dbfs=-36.0, seed=1)
    burst[int(14.0 * 22050) : int(14.5 * 22050)] *= 8.0  # +18 dB transient in segment 1
    files["Ambience/street.flac"] = (burst, 22050, "PCM_16")
    gap = _noise(16000, 20.0, seed=2)
    gap[int(3 * 16000) : int(4 * 16000)] = 0.0  # digital silence in segment 0
    files["Ambiance/room.wav"] = (gap, 16000, "PCM_16")
    hot = _noise(32000, 10.5, level_dbfs=-3.0, seed=3)
    files["Ambiance/hot.wav"] = (np.clip(hot * 4, -1.0, 1.0 - 2**-15), 32000, "PCM_16")  # clipped
    files["Ambiance/short.wav"] = (_noise(44100, 6.0, seed=4), 44100, "PCM_16")
    files["Foley/door.wav"] = (_noise(44100, 12.0, seed=5), 44100, "PCM_16")
    files["Ambiance/unlisted.wav"] = (_noise(16000, 11.0, seed=6), 16000, "PCM_16")
    for rel, (x, sr, subtype) in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        sf.write(root / rel, x, sr, subtype=subtype)
    (root / "Ambiance/broken.wav").write_bytes(b"not a wav at all")
    rows = [
        ["Ambiance/rain.wav", "Ambiance", "rain on a roof", "CC0", "a"],
        ["Ambience/street.flac", "Ambience", "street", "CC-BY", "b"],
        ["Ambiance/room.wav", "Ambiance", "room tone", "CC0", "c"],
        ["Ambiance/hot.wav", "Ambiance", "hot level", "CC0", "d"],
        ["Ambiance/short.wav", "Ambiance", "too short", "CC0", "e"],
        ["Foley/door.wav", "Foley", "door", "CC0", "f"],
        ["Ambiance/broken.wav", "Ambiance", "corrupt", "CC0", "g"],
        ["Ambiance/gone.wav", "Ambiance", "missing file", "CC0", "h"],
        ["Ambiance/bad-row.wav", "Ambiance"],
    ]
    with (root / "metadata.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["filename", "category", "description", "license", "author"])
        w.writerows(rows)
    return root


def _skips(out: Path) -> list[tuple[str, str]]:
    with (out / "skipped.csv").open() as f:
        return sorted((r["path"], r["reason"]) for r in csv.DictReader(f))


def test_segments_and_skip_report(library: Path, tmp_path: Path, params) -> None:
    out = tmp_path / "backgrounds"
    summary = ambience.run(params, library, out)
    records = from_table(pq.read_table(out / "manifest.parquet"), BackgroundSegment)
    kept = sorted((r.source_path, r.offset_in_source_s) for r in records)
    assert kept == [
        ("Ambiance/rain.wav", 0.0),
        ("Ambiance/rain.wav", 10.0),
        ("Ambiance/rain.wav", 20.0),
        ("Ambiance/room.wav", 10.0),
        ("Ambience/street.flac", 0.0),
    ]
    assert _skips(out) == sorted(
        [
            ("Ambiance/hot.wav", "clipped"),
            ("Ambiance/room.wav", "digital-silence"),
            ("Ambience/street.flac", "salient-event"),
            ("Ambiance/short.wav", "too-short"),
            ("Foley/door.wav", "filtered-category"),
            ("Ambiance/broken.wav", "unreadable"),
            ("Ambiance/gone.wav", "missing-file"),
            ("metadata.csv", "malformed-row"),
            ("Ambiance/unlisted.wav", "not-in-metadata"),
        ]
    )
    for r in records:
        audio, sr = sf.read(out / r.audio_path, dtype="float32")
        assert sr == params.sample_rate_hz and audio.shape == (r.num_samples,) == (10 * sr,)
        assert -40 < r.loudness_lufs < -20 and r.peak_to_median_db < params.ambience.max_peak_to_median_db
    assert {r.license for r in records} == {"CC0", "CC-BY"}
    assert sorted(p.relative_to(out).as_posix() for p in (out / "audio").iterdir()) == sorted(r.audio_path for r in records)
    assert summary["recordings_used"] == 3


def test_without_metadata_the_path_selects(library: Path, tmp_path: Path, params) -> None:
    (library / "metadata.csv").unlink()
    p = replace(params, ambience=replace(params.ambience, metadata_csv=None))
    recordings, skips, mode = read_ambience_library(library, p.ambience)
    assert mode == "folder"
    assert {r.category for r in recordings} == {"Ambiance", "Ambience"}
    assert [s.path for s in skips] == ["Foley/door.wav"]


def test_wrong_column_names_fail_with_the_fix(library: Path, params) -> None:
    p = replace(params.ambience, category_column="kind")
    with pytest.raises(ValueError, match="ambience.category_column"):
        read_ambience_library(library, p)


def test_one_and_two_workers_write_identical_bytes(library: Path, tmp_path: Path, params) -> None:
    ambience.run(params, library, tmp_path / "one")
    ambience.run(replace(params, compute=ComputeParams(workers=2, chunk_size=1)), library, tmp_path / "two")
    assert tree_digest(tmp_path / "one") == tree_digest(tmp_path / "two")


def test_metadata_quirks_bom_header_case_and_bare_file_names(library: Path, params) -> None:
    text = "\ufeffFileName,Category,License\nrain.wav,AMBIANCE,CC0\nstreet.flac,ambience,CC-BY\n"
    (library / "metadata.csv").write_text(text, encoding="utf-8")
    p = replace(params.ambience, path_column="filename", category_column="category")
    recordings, _, _ = read_ambience_library(library, p)
    assert [r.rel_path for r in recordings] == ["Ambiance/rain.wav", "Ambience/street.flac"]
    assert [r.license for r in recordings] == ["CC0", "CC-BY"]


def test_nan_inside_a_recording_rejects_only_its_segment(tmp_path: Path, params) -> None:
    root = tmp_path / "lib"
    (root / "Ambiance").mkdir(parents=True)
    x = _noise(16000, 30.0, seed=9)
    x[16000 * 15] = np.nan
    sf.write(root / "Ambiance" / "nan.wav", x, 16000, subtype="FLOAT")
    p = replace(params, ambience=replace(params.ambience, metadata_csv=None))
    out = tmp_path / "out"
    ambience.run(p, root, out)
    records = from_table(pq.read_table(out / "manifest.parquet"), BackgroundSegment)
    assert [r.offset_in_source_s for r in records] == [0.0, 20.0]
    assert _skips(out) == [("Ambiance/nan.wav", "non-finite")]
