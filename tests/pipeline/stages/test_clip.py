"""The clip stage on a hand-built FSD50K-layout corpus: known segments, bad input, determinism."""

from __future__ import annotations

import csv
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from pipeline.config.params import ComputeParams
from pipeline.fsd50k import read_fsd50k, single_label
from pipeline.ontology import default_ontology
from pipeline.schema import EventClip, from_table
from pipeline.stages import clip
from tests.conftest import BARK, BARK_AND_MEOW, KNOCK, MEOW, tone_burst, tree_digest, write_fsd50k

SR = 44100


def _rows_and_audio() -> tuple[list, list, dict]:
    """Each fname has a known fate; see EXPECTED."""
    nan = tone_burst(SR, 3.0, 0.5, 2.0)
    nan[1000] = np.nan
    stereo96 = np.stack([tone_burst(96000, 4.0, 1.0, 3.0), tone_burst(96000, 4.0, 1.0, 3.0, seed=3)], axis=1)
    clipped = np.clip(tone_burst(SR, 4.0, 1.0, 3.0, level_dbfs=6.0), -1.0, 1.0 - 2**-15)
    dev = [
        (101, *BARK, "train"),  # clean 1.0-3.5 s
        (102, *MEOW, "val"),  # clean, 8-bit
        (103, *BARK_AND_MEOW, "train"),
        (104, *KNOCK, "train"),  # corrupt bytes
        (105, *BARK, "train"),  # zero-length
        (106, *MEOW, "train"),  # NaN samples
        (107, *KNOCK, "train"),  # 96 kHz stereo
        (108, *BARK, "train"),  # file missing
        (109, *MEOW, "train"),  # event too short
        (110, *KNOCK, "train"),  # event too long
        (111, *BARK, "train"),  # digital silence
        (112, *MEOW, "train"),  # clipped
        (113, "Bark,Dog", "/m/05tny_", "train"),  # 2 labels, 1 mid
        (115, *BARK, "train"),  # 0-byte file
        (116, *MEOW, "train"),  # DC offset under the event
    ]
    dev.append(("114",))  # a row with one field
    ev = [(201, *KNOCK)]
    audio = {
        "101": (tone_burst(SR, 5.0, 1.0, 3.5), SR, "PCM_16"),
        "102": (tone_burst(22050, 4.0, 0.7, 2.2, freq_hz=700), 22050, "PCM_U8"),
        "103": (tone_burst(SR, 4.0, 1.0, 3.0), SR, "PCM_16"),
        "104": b"RIFF\x00\x00\x00\x00WAVEgarbage-not-audio",
        "105": (np.zeros(0, dtype=np.float32), SR, "PCM_16"),
        "106": (nan, SR, "FLOAT"),
        "107": (stereo96, 96000, "PCM_24"),
        "109": (tone_burst(SR, 3.0, 1.0, 1.4), SR, "PCM_16"),
        "110": (tone_burst(SR, 12.0, 1.0, 10.0), SR, "PCM_16"),
        "111": (np.zeros(SR * 3, dtype=np.float32), SR, "PCM_16"),
        "112": (clipped, SR, "PCM_16"),
        "115": b"",
        "116": (tone_burst(SR, 4.0, 1.5, 3.0) + np.float32(0.3), SR, "PCM_16"),
        "201": (tone_burst(SR, 3.0, 0.25, 1.75, freq_hz=1500), SR, "PCM_16"),
    }
    return dev, ev, audio


EXPECTED_KEPT = {
    "fsd50k-116": (1.5, 3.0),
    "fsd50k-101": (1.0, 3.5),
    "fsd50k-102": (0.7, 2.2),
    "fsd50k-107": (1.0, 3.0),
    "fsd50k-201": (0.25, 1.75),
}
EXPECTED_SKIPS = {
    "fsd50k-103": "multi-label",
    "fsd50k-104": "unreadable",
    "fsd50k-105": "empty",
    "fsd50k-106": "non-finite",
    "fsd50k-108": "missing-file",
    "fsd50k-109": "too-short",
    "fsd50k-110": "too-long",
    "fsd50k-111": "silent",
    "fsd50k-112": "clipped",
    "fsd50k-dev-line14": "malformed-row",  # 113
    "fsd50k-dev-line17": "malformed-row",  # 114
    "fsd50k-115": "empty",
}


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    dev, ev, audio = _rows_and_audio()
    return write_fsd50k(tmp_path / "FSD50K", dev, ev, audio, licences={"102": "http://creativecommons.org/licenses/by-nc/3.0/"})


def _skips(out: Path) -> dict[str, str]:
    with (out / "skipped.csv").open() as f:
        return {r["item_id"]: r["reason"] for r in csv.DictReader(f)}


def test_stage_keeps_good_clips_and_reports_every_bad_one(corpus: Path, tmp_path: Path, params) -> None:
    out = tmp_path / "events"
    summary = clip.run(params, corpus, out)
    records = from_table(pq.read_table(out / "manifest.parquet"), EventClip)
    kept = {r.clip_id: r for r in records}
    assert set(kept) == set(EXPECTED_KEPT)
    assert _skips(out) == EXPECTED_SKIPS
    assert summary["outputs"] == len(EXPECTED_KEPT) and summary["skipped"] == len(EXPECTED_SKIPS)
    hop = params.clip.segmentation.hop_s
    for clip_id, (on, off) in EXPECTED_KEPT.items():
        r = kept[clip_id]
        assert abs(r.onset_in_source_s - on) <= hop and abs(r.offset_in_source_s - off) <= hop
        audio, sr = sf.read(out / r.audio_path, dtype="int16")
        assert sr == params.sample_rate_hz == r.sample_rate_hz
        assert audio.ndim == 1 and audio.shape[0] == r.num_samples
        assert abs(r.duration_s - (off - on)) <= 2 * hop
        assert len(r.envelope_db) == -(-r.num_samples // round(r.envelope_hop_s * sr))
        assert -30 < r.loudness_lufs < 0 and r.rms_dbfs < r.peak_dbfs
    dc_removed, _ = sf.read(out / kept["fsd50k-116"].audio_path)
    assert abs(dc_removed.mean()) < 0.01
    assert kept["fsd50k-101"].label == "Bark" and kept["fsd50k-101"].mid == "/m/05tny_"
    assert kept["fsd50k-102"].license == "CC-BY-NC" and kept["fsd50k-101"].license == "CC-BY"
    assert kept["fsd50k-107"].source_channels == 2 and kept["fsd50k-107"].source_sample_rate_hz == 96000
    assert kept["fsd50k-201"].source_split == "eval" and kept["fsd50k-102"].source_split == "val"
    assert (out / "clipping_examples.png").stat().st_size > 10_000
    assert not list(tmp_path.glob(".events.*")), "staging folders are cleaned up"


def test_one_and_two_workers_write_identical_bytes(corpus: Path, tmp_path: Path, params) -> None:
    one = tmp_path / "one"
    two = tmp_path / "two"
    clip.run(params, corpus, one)
    clip.run(replace(params, compute=ComputeParams(workers=2, chunk_size=1)), corpus, two)
    assert tree_digest(one) == tree_digest(two)


def test_failed_run_keeps_the_previous_output(corpus: Path, tmp_path: Path, params, monkeypatch) -> None:
    out = tmp_path / "events"
    clip.run(params, corpus, out)
    before = tree_digest(out)

    def explode(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(clip, "write_manifest", explode)
    with pytest.raises(RuntimeError):
        clip.run(params, corpus, out)
    assert tree_digest(out) == before


def test_single_label_rule_uses_the_ontology_leaves(corpus: Path) -> None:
    clips, skips = read_fsd50k(corpus)
    ontology = default_ontology()
    by_name = {c.fname: c for c in clips}
    assert single_label(by_name["101"], ontology, "one-leaf") == ("Bark", "/m/05tny_")
    assert single_label(by_name["103"], ontology, "one-leaf").reason == "multi-label"
    assert single_label(by_name["101"], ontology, "one-label").reason == "multi-label"
    assert {s.item_id for s in skips} == {"fsd50k-dev-line14", "fsd50k-dev-line17"}


def test_missing_ground_truth_says_what_to_point_at(tmp_path: Path, params) -> None:
    with pytest.raises(FileNotFoundError, match="sources.fsd50k_dir"):
        clip.run(params, tmp_path / "nowhere", tmp_path / "events")


def test_a_dask_scheduler_address_gives_the_same_bytes(corpus: Path, tmp_path: Path, params) -> None:
    from distributed import LocalCluster

    clip.run(params, corpus, tmp_path / "local")
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=None) as cluster:
        remote = replace(params, compute=ComputeParams(scheduler=cluster.scheduler_address, chunk_size=2))
        clip.run(remote, corpus, tmp_path / "remote")
    assert tree_digest(tmp_path / "local") == tree_digest(tmp_path / "remote")


def test_real_layout_quirks_are_reported_not_fatal(tmp_path: Path, params) -> None:
    tone = (tone_burst(SR, 3.0, 0.5, 2.0), SR, "PCM_16")
    root = write_fsd50k(
        tmp_path / "FSD50K",
        [(1, *BARK, "train"), (2, *MEOW, "train"), ("../escape", *BARK, "train")],
        [(1, *KNOCK), (3, *KNOCK)],
        {"1": tone, "2": tone, "3": tone, "9": tone},
    )
    shutil.copy(root / "FSD50K.eval_audio" / "1.wav", root / "FSD50K.dev_audio" / "1.wav")
    dev = root / "FSD50K.ground_truth" / "dev.csv"
    lines = dev.read_text().splitlines()
    lines.insert(2, '77,"Bark,Dog,/m/05tny_,/m/0bt9lr,train')  # an unbalanced quote
    dev.write_text("\n".join(lines) + "\n")
    info = root / "FSD50K.metadata" / "eval_clips_info_FSD50K.json"
    info.write_text('{"3": {"title": "\\ud83d broken", "license": null, "uploader": 5}}')
    out = tmp_path / "events"
    clip.run(params, root, out)
    records = {r.clip_id: r for r in from_table(pq.read_table(out / "manifest.parquet"), EventClip)}
    assert set(records) == {"fsd50k-1", "fsd50k-2", "fsd50k-3"}
    assert records["fsd50k-3"].license == "unknown" and records["fsd50k-3"].uploader == "5"
    skips = _skips(out)
    assert skips.pop("fsd50k-dev-line3") == "malformed-row"  # the broken row alone
    assert skips.pop("fsd50k-dev-line5") == "malformed-row"  # ../escape
    assert skips.pop("fsd50k-eval-line2") == "malformed-row"  # fname 1 again, in eval
    assert skips.pop("FSD50K.dev_audio/9.wav") == "not-in-metadata"
    assert skips.pop("FSD50K.eval_audio/1.wav") == "not-in-metadata"  # its only row was the duplicate
    assert skips == {}
    assert not (tmp_path / "escape.flac").exists()


def test_a_failed_run_leaves_no_staging_folder(corpus: Path, tmp_path: Path, params, monkeypatch) -> None:
    monkeypatch.setattr(clip, "write_skips", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        clip.run(params, corpus, tmp_path / "events")
    assert list(tmp_path.iterdir()) == [corpus]


def test_an_output_path_that_is_a_file_is_refused(corpus: Path, tmp_path: Path, params) -> None:
    (tmp_path / "events").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a folder"):
        clip.run(params, corpus, tmp_path / "events")
    assert (tmp_path / "events").read_text() == "keep me"
