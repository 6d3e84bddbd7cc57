"""The embedded corpora: real on-disk formats, label consistency, audio properties, determinism."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import soundfile as sf

from pipeline.config.params import ComputeParams
from pipeline.corpus import (
    FSD50K_LEAF_CLASSES,
    ambience_like,
    fsd50k_like,
    sound_models,
    write_ambience_library,
    write_fsd50k_corpus,
)
from pipeline.ontology import default_ontology

N_CLIPS = 60
N_RECORDINGS = ambience_like.MIN_RECORDINGS + 1
GT = "FSD50K.ground_truth"

ALLOWED_CLASSES = {
    "Bark", "Meow", "Crowing, cock-a-doodle-doo", "Chirp, tweet", "Church bell", "Bicycle bell",
    "Vehicle horn, car horn, honking", "Siren", "Knock", "Clapping", "Finger snapping", "Cough", "Sneeze",
    "Whistling", "Ringtone", "Chink, clink", "Drill", "Hammer", "Cricket", "Thunder", "Water tap, faucet",
    "Gunshot, gunfire", "Snare drum", "Bass drum", "Acoustic guitar", "Tick-tock", "Keys jangling", "Typing",
    "Zipper (clothing)", "Frog", "Dishes, pots, and pans", "Purr", "Gong", "Harmonica", "Glockenspiel", "Buzz",
}  # fmt: skip


def digest(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def fsd(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fsd50k")
    write_fsd50k_corpus(root, n_clips=N_CLIPS, seed=3)
    return root


@pytest.fixture(scope="module")
def amb(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ambience")
    write_ambience_library(root, n_recordings=N_RECORDINGS, seed=3)
    return root


def split_lists(row: pd.Series) -> tuple[list[str], list[str]]:
    return row["labels"].split(","), row["mids"].split(",")


# --------------------------------------------------------------------------- FSD50K layout


def test_fsd50k_is_deterministic(fsd: Path, tmp_path: Path) -> None:
    write_fsd50k_corpus(tmp_path / "again", n_clips=N_CLIPS, seed=3)
    assert digest(tmp_path / "again") == digest(fsd)
    write_fsd50k_corpus(tmp_path / "other", n_clips=5, seed=4)
    assert digest(tmp_path / "other") != digest(fsd)


def test_fsd50k_does_not_depend_on_the_number_of_workers(fsd: Path, tmp_path: Path) -> None:
    write_fsd50k_corpus(tmp_path / "two", n_clips=N_CLIPS, seed=3, compute=ComputeParams(workers=2, chunk_size=7))
    assert digest(tmp_path / "two") == digest(fsd)


def test_fsd50k_prefix_does_not_depend_on_size(fsd: Path, tmp_path: Path) -> None:
    # Clip i depends on (seed, i) only, so a smaller corpus is a subset of a larger one.
    write_fsd50k_corpus(tmp_path / "small", n_clips=10, seed=3)
    small, full = digest(tmp_path / "small"), digest(fsd)
    audio = [k for k in small if k.endswith(".wav")]
    assert len(audio) == 10
    assert all(small[k] == full[k] for k in audio)


def test_fsd50k_tables_have_exact_columns(fsd: Path) -> None:
    gt = fsd / GT
    dev = pd.read_csv(gt / "dev.csv", dtype=str)
    ev = pd.read_csv(gt / "eval.csv", dtype=str)
    voc = pd.read_csv(gt / "vocabulary.csv", header=None, dtype=str)
    assert list(dev.columns) == ["fname", "labels", "mids", "split"]
    assert list(ev.columns) == ["fname", "labels", "mids"]
    assert voc.shape[1] == 3
    assert voc[0].astype(int).tolist() == list(range(len(voc)))
    assert len(dev) + len(ev) == N_CLIPS
    for name, cols in (("dev.csv", 4), ("eval.csv", 3), ("vocabulary.csv", 3)):
        with (gt / name).open(newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
        assert {len(r) for r in rows} == {cols}, name
    # Lists with commas are quoted fields, as in FSD50K.
    assert '"' in (gt / "dev.csv").read_text(encoding="utf-8")
    assert set(dev["split"]) <= {"train", "val"} and "train" in set(dev["split"])


def test_fsd50k_labels_resolve_through_the_ontology(fsd: Path) -> None:
    onto = default_ontology()
    abstract = {m for m, c in onto.by_mid.items() if c.abstract}
    voc = pd.read_csv(fsd / GT / "vocabulary.csv", header=None, names=["index", "label", "mid"], dtype=str)
    vocabulary = dict(zip(voc["label"], voc["mid"]))
    assert len(set(voc["mid"])) == len(voc)
    for label, mid in vocabulary.items():
        assert onto.by_fsd50k_name[label].mid == mid
        assert mid not in abstract
    for part in ("dev", "eval"):
        table = pd.read_csv(fsd / GT / f"{part}.csv", dtype=str)
        for _, row in table.iterrows():
            labels, mids = split_lists(row)
            assert len(labels) == len(mids) == len(set(mids))
            for label, mid in zip(labels, mids):
                assert vocabulary.get(label) == mid, (row["fname"], label)
            leaves = onto.leaf_mids(mids)
            chains = [[leaf] + [a for a in onto.ancestors(leaf) if a not in abstract] for leaf in leaves]
            assert set(mids) == {m for chain in chains for m in chain}
            if len(leaves) == 1:
                # The leaf, then its ancestors nearest first.
                assert mids == chains[0]


def test_fsd50k_multi_and_single_label_clips(fsd: Path) -> None:
    onto = default_ontology()
    leaf_mids = {onto.by_name[n].mid for n in FSD50K_LEAF_CLASSES}
    counts = []
    for part in ("dev", "eval"):
        for _, row in pd.read_csv(fsd / GT / f"{part}.csv", dtype=str).iterrows():
            leaves = onto.leaf_mids(split_lists(row)[1])
            assert set(leaves) <= leaf_mids
            counts.append(len(leaves))
    assert set(counts) == {1, 2}
    assert 0.08 <= counts.count(2) / len(counts) <= 0.25


def test_fsd50k_audio_format_and_level(fsd: Path) -> None:
    for part, folder in fsd50k_like.AUDIO_DIRS.items():
        names = set(pd.read_csv(fsd / GT / f"{part}.csv", dtype=str)["fname"])
        files = {p.stem for p in (fsd / folder).iterdir()}
        assert files == names
        for fname in names:
            assert fname.isdigit() and 5 <= len(fname) <= 6
            info = sf.info(fsd / folder / f"{fname}.wav")
            assert (info.samplerate, info.channels, info.format, info.subtype) == (44100, 1, "WAV", "PCM_16")
            assert 0.3 <= info.duration <= 30.0
            x, _ = sf.read(fsd / folder / f"{fname}.wav", dtype="float32")
            peak = float(np.max(np.abs(x)))
            assert 10 ** (-32 / 20) < peak < 10 ** (-2.9 / 20)
            # Near-silence before the event: the first 10 ms is far below the event.
            head = x[: max(1, len(x) // 200)]
            assert float(np.max(np.abs(head))) < peak * 0.1


def test_fsd50k_metadata(fsd: Path) -> None:
    uploaders = {}
    for part in ("dev", "eval"):
        meta = json.loads((fsd / "FSD50K.metadata" / f"{part}_clips_info_FSD50K.json").read_text(encoding="utf-8"))
        assert set(meta) == set(pd.read_csv(fsd / GT / f"{part}.csv", dtype=str)["fname"])
        for info in meta.values():
            assert set(info) == {"title", "description", "tags", "license", "uploader"}
            assert info["license"] in fsd50k_like.LICENSES
            assert info["title"] and info["description"].endswith(".") and info["uploader"]
            assert isinstance(info["tags"], list) and info["tags"]
        uploaders[part] = {info["uploader"] for info in meta.values()}
    assert not uploaders["dev"] & uploaders["eval"]


def test_fsd50k_no_temporary_files_left(fsd: Path) -> None:
    assert not [p for p in fsd.rglob("*") if p.name.startswith(".")]


@pytest.mark.parametrize("seed", [0, 7])
def test_default_size_split_and_class_coverage(seed: int) -> None:
    # Planning only (no audio): the default corpus has every class in dev and in eval.
    n = 240
    plans = [fsd50k_like._plan_clip(i, seed, np.random.default_rng([seed, i])) for i in range(n)]
    dev = {p.classes[0] for p in plans if p.split != "eval"}
    ev = {p.classes[0] for p in plans if p.split == "eval"}
    assert dev == ev == set(range(len(FSD50K_LEAF_CLASSES)))
    n_eval = sum(p.split == "eval" for p in plans)
    n_val = sum(p.split == "val" for p in plans)
    assert 0.15 <= n_eval / n <= 0.25
    assert 0.08 <= n_val / (n - n_eval) <= 0.25
    assert len({p.fname for p in plans}) == n
    durations = np.array([p.n_samples / fsd50k_like.SAMPLE_RATE_HZ for p in plans])
    assert 3.0 <= np.median(durations) <= 7.0
    first = np.array([p.segments[0].dur_s for p in plans])
    # A clip of 0.3 s cannot hold leading silence and a 0.3 s burst; otherwise 0.3-9 s.
    assert first.min() > 0.2 and first.max() <= 9.0
    kept = np.mean((first >= 1.0) & (first <= 7.5))
    assert 0.7 <= kept < 1.0


def test_leaf_classes() -> None:
    onto = default_ontology()
    assert len(FSD50K_LEAF_CLASSES) >= 24
    assert set(FSD50K_LEAF_CLASSES) <= ALLOWED_CLASSES
    mids = [onto.by_name[n].mid for n in FSD50K_LEAF_CLASSES]
    # No leaf is an ancestor of another, so every two-class clip has two leaves.
    assert sorted(onto.leaf_mids(mids)) == sorted(mids)


# --------------------------------------------------------------------------- sound models


@pytest.mark.parametrize("name", FSD50K_LEAF_CLASSES)
def test_sound_model(name: str) -> None:
    a = sound_models.synthesize(name, np.random.default_rng(5), 1.3, 44100)
    b = sound_models.synthesize(name, np.random.default_rng(5), 1.3, 44100)
    c = sound_models.synthesize(name, np.random.default_rng(6), 1.3, 44100)
    assert a.dtype == np.float32 and a.shape == (round(1.3 * 44100),)
    assert np.isfinite(a).all() and np.max(np.abs(a)) == pytest.approx(1.0)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert len(sound_models.synthesize(name, np.random.default_rng(5), 0.3, 16000)) == 4800


def test_sound_model_unknown_name() -> None:
    with pytest.raises(ValueError, match="no sound model"):
        sound_models.synthesize("Speech", np.random.default_rng(0), 1.0)


# --------------------------------------------------------------------------- ambience library


def test_ambience_is_deterministic(amb: Path, tmp_path: Path) -> None:
    write_ambience_library(tmp_path / "again", n_recordings=N_RECORDINGS, seed=3)
    assert digest(tmp_path / "again") == digest(amb)


def test_ambience_metadata_columns_and_files(amb: Path) -> None:
    table = pd.read_csv(amb / "metadata.csv", dtype=str)
    assert list(table.columns) == list(ambience_like.METADATA_COLUMNS)
    with (amb / "metadata.csv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert rows[0] == list(ambience_like.METADATA_COLUMNS) and {len(r) for r in rows} == {6}
    assert len(table) == N_RECORDINGS
    listed = set(table["filename"])
    on_disk = {p.relative_to(amb).as_posix() for p in amb.rglob("*") if p.suffix in (".wav", ".flac")}
    assert listed == on_disk
    assert all(f.split("/")[0] == c for f, c in zip(table["filename"], table["category"]))
    categories = set(table["category"])
    assert {"Ambiance", "Ambience"} <= categories
    assert categories & {"Foley", "Impacts", "Vehicles"}
    assert (table["category"] == "Ambiance").sum() > len(table) / 2
    assert not [p for p in amb.rglob("*") if p.name.startswith(".")]


def test_ambience_audio_variety_and_levels(amb: Path) -> None:
    table = pd.read_csv(amb / "metadata.csv", dtype=str)
    rates, channels, kinds, short, salient = set(), set(), set(), [], []
    for rel, category in zip(table["filename"], table["category"]):
        info = sf.info(amb / rel)
        rates.add(info.samplerate)
        channels.add(info.channels)
        kinds.add((info.format, info.subtype))
        x, sr = sf.read(amb / rel, dtype="float64", always_2d=True)
        assert np.max(np.abs(x)) < 1.0
        if category not in ("Ambiance", "Ambience"):
            continue
        rms_db = 10 * np.log10(np.mean(x**2))
        assert -46.0 <= rms_db <= -19.0, rel
        if info.channels == 2:
            assert abs(np.corrcoef(x[:, 0], x[:, 1])[0, 1]) < 0.8
        if info.duration < 10.0:
            short.append(rel)
        frame = int(0.1 * sr)
        e = np.mean(x[: len(x) // frame * frame].reshape(-1, frame, x.shape[1]) ** 2, axis=(1, 2))
        if 10 * np.log10(e.max() / np.median(e)) >= 15.0:
            salient.append(rel)
        if info.duration >= 10.0:
            assert 30.0 <= info.duration <= 180.0
    assert len(rates) >= 3 and rates <= set(ambience_like.SAMPLE_RATES_HZ)
    assert channels == {1, 2}
    assert {("WAV", "PCM_16"), ("WAV", "PCM_24")} <= kinds and any(f == "FLAC" for f, _ in kinds)
    assert any(r.startswith("Ambiance/") for r in short)
    assert any(r.startswith("Ambiance/") for r in salient)


def test_ambience_needs_the_fixed_cases(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least"):
        write_ambience_library(tmp_path, n_recordings=ambience_like.MIN_RECORDINGS - 1)
