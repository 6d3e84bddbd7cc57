"""URBAN-SED reader: txt and JAMS annotations in the v2.0 layout, quirks and skip reasons."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from pipeline.imports import reader, urban_sed
from pipeline.ontology import default_ontology
from pipeline.schema import ImportedRegion

BARK, SIREN, GUNSHOT = "/m/05tny_", "/m/03kmc9", "/m/032s66"


def write_audio(path: Path, seconds: float = 0.5, rate_hz: int = 16000) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(int(seconds * rate_hz)) / rate_hz
    sf.write(path, 0.1 * np.sin(2 * np.pi * 440 * t), rate_hz)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def observation(time: float, duration: float, label: str, role: str) -> dict:
    value = {
        "label": label,
        "source_file": f"/UrbanSound8K/{label}.wav",
        "source_time": 0.0,
        "event_time": time,
        "event_duration": duration,
        "snr": 6.0,
        "role": role,
        "pitch_shift": None,
        "time_stretch": None,
    }
    return {"time": time, "duration": duration, "value": value, "confidence": 1.0}


def jams_text(observations: list) -> str:
    annotation = {
        "annotation_metadata": {},
        "namespace": "scaper",
        "data": observations,
        "sandbox": {"scaper": {"duration": 10.0, "n_events": 2}},
        "time": 0,
        "duration": 10.0,
    }
    return json.dumps({"annotations": [annotation], "file_metadata": {"duration": 10.0, "jams_version": "0.3.4"}, "sandbox": {}})


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """URBAN-SED_v2.0.0 with txt and JAMS annotations, quirks included."""
    ann, audio = tmp_path / "annotations", tmp_path / "audio"
    write(
        ann / "train/soundscape_train_bimodal0.txt",
        "\n".join(
            [
                "0.5\t2.0\tdog_bark",
                "1.0\t3.0\tdog_bark",  # overlaps the line above: both kept
                "9.5\t11.0\tsiren",  # past the 10 s soundscape: kept for the writer
                "2.0\t2.0\tjackhammer",  # onset == offset
                "1.0\t2.0\tcow",  # not an UrbanSound8K class
                "oops",
            ]
        )
        + "\n",
    )
    write(
        ann / "train/soundscape_train_bimodal0.jams",
        jams_text(
            [
                observation(0.0, 10.0, "brownian", "background"),
                observation(0.5, 1.5, "dog_bark", "foreground"),
                observation(9.5, 1.5, "siren", "foreground"),
                observation(1.0, 1.0, "cow", "foreground"),
                {"time": 2.0, "duration": 1.0, "confidence": 1.0},
            ]
        ),
    )
    write(ann / "validate/soundscape_validate_uniform3.txt", "0\t1\tgun_shot\n")
    write(ann / "validate/soundscape_validate_uniform3.jams", "{not json")
    write(ann / "test/soundscape_test_unimodal1.txt", "0\t1\tsiren\n")  # its audio is missing
    write(ann / "test/soundscape_test_unimodal2.txt", "3\t1\tsiren\n")  # its only event is backwards
    write(ann / "test/soundscape_test_unimodal2.jams", jams_text([observation(0.0, 10.0, "brownian", "background")]))
    for name in ("train/soundscape_train_bimodal0", "validate/soundscape_validate_uniform3", "test/soundscape_test_unimodal2"):
        write_audio(audio / f"{name}.wav")
    return tmp_path


def test_txt_clips_and_skips(corpus: Path) -> None:
    clips, skips = urban_sed.read(corpus, {})
    assert [(c.clip_id, c.audio_path, c.split) for c in clips] == [
        ("urbansed-soundscape_train_bimodal0", "audio/train/soundscape_train_bimodal0.wav", "train"),
        ("urbansed-soundscape_validate_uniform3", "audio/validate/soundscape_validate_uniform3.wav", "valid"),
    ]
    assert clips[0].regions == (
        ImportedRegion("dog_bark", BARK, "", 0.5, 2.0),
        ImportedRegion("dog_bark", BARK, "", 1.0, 3.0),
        ImportedRegion("siren", SIREN, "", 9.5, 11.0),
    )
    assert clips[1].regions == (ImportedRegion("gun_shot", GUNSHOT, "", 0.0, 1.0),)
    assert clips[0].license == "CC BY 4.0" and "URBAN-SED" in clips[0].attribution
    assert sorted((s.item_id, s.reason) for s in skips) == sorted(
        [
            ("urbansed-soundscape_train_bimodal0#line4", "bad-region"),
            ("urbansed-soundscape_train_bimodal0#line5", "unknown-label"),
            ("urbansed-soundscape_train_bimodal0#line6", "malformed-row"),
            ("urbansed-soundscape_test_unimodal1", "missing-file"),
            ("urbansed-soundscape_test_unimodal2#line1", "bad-region"),
            ("urbansed-soundscape_test_unimodal2", "no-label"),
        ]
    )


def test_jams_foreground_events_only(corpus: Path) -> None:
    clips, skips = urban_sed.read(corpus, {"format": "jams"})
    # the soundscape with only a background is a clip without events; the one with broken JSON is one skip
    assert [(c.clip_id, c.split) for c in clips] == [
        ("urbansed-soundscape_test_unimodal2", "test"),
        ("urbansed-soundscape_train_bimodal0", "train"),
    ]
    assert clips[0].regions == ()
    assert clips[1].regions == (ImportedRegion("dog_bark", BARK, "", 0.5, 2.0), ImportedRegion("siren", SIREN, "", 9.5, 11.0))
    assert sorted((s.item_id, s.reason) for s in skips) == sorted(
        [
            ("urbansed-soundscape_train_bimodal0#event3", "unknown-label"),
            ("urbansed-soundscape_train_bimodal0#event4", "malformed-row"),
            ("urbansed-soundscape_validate_uniform3", "malformed-row"),
            ("urbansed-soundscape_test_unimodal1", "missing-file"),  # it has only a txt, which is read in its place
        ]
    )


def test_jams_stored_as_columns_reads_as_the_list_does(corpus: Path) -> None:
    """JAMS 0.2 stores an annotation's data as columns (time, duration, value, confidence)."""
    path = corpus / "annotations/train/soundscape_train_bimodal0.jams"
    jam = json.loads(path.read_text())
    rows = jam["annotations"][0]["data"][:4]
    as_list, as_list_skips = urban_sed.read(corpus, {"format": "jams"})
    jam["annotations"][0]["data"] = {c: [row[c] for row in rows] for c in ("time", "duration", "value", "confidence")}
    path.write_text(json.dumps(jam))
    as_columns, skips = urban_sed.read(corpus, {"format": "jams"})
    assert as_columns == as_list
    assert {s.item_id for s in as_list_skips} - {s.item_id for s in skips} == {"urbansed-soundscape_train_bimodal0#event4"}
    jam["annotations"][0]["data"]["time"].pop()  # columns of different lengths: not a table
    path.write_text(json.dumps(jam))
    _, skips = urban_sed.read(corpus, {"format": "jams"})
    assert ("urbansed-soundscape_train_bimodal0", "malformed-row") in {(s.item_id, s.reason) for s in skips}


def test_the_urban_sed_1_namespace_and_a_second_annotation(corpus: Path) -> None:
    path = corpus / "annotations/train/soundscape_train_bimodal0.jams"
    jam = json.loads(path.read_text())
    first = dict(jam["annotations"][0], namespace="sound_event")
    second = dict(first, data=[observation(4.0, 1.0, "siren", "foreground")])
    path.write_text(json.dumps(dict(jam, annotations=[first, second])))
    clips, skips = urban_sed.read(corpus, {"format": "jams"})
    bimodal = next(c for c in clips if c.clip_id == "urbansed-soundscape_train_bimodal0")
    assert [r.onset_s for r in bimodal.regions] == [0.5, 9.5]  # the first annotation's events only
    second_skip = next(s for s in skips if s.item_id == "urbansed-soundscape_train_bimodal0#annotation1")
    assert second_skip.reason == "malformed-row" and "is not read" in second_skip.detail


def test_audio_without_an_annotation_is_reported(corpus: Path) -> None:
    write_audio(corpus / "audio/test/soundscape_test_unimodal7.wav")
    _, skips = urban_sed.read(corpus, {})
    unannotated = [s for s in skips if s.item_id == "urbansed-soundscape_test_unimodal7"]
    assert [(s.path, s.reason) for s in unannotated] == [("audio/test/soundscape_test_unimodal7.wav", "not-in-metadata")]


def test_missing_split_folder_and_bad_options(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    for path in sorted((corpus / "annotations/validate").iterdir()):
        path.unlink()
    (corpus / "annotations/validate").rmdir()
    _, skips = urban_sed.read(corpus, {})
    assert ("annotations/validate", "missing-file") in {(s.item_id, s.reason) for s in skips}
    with pytest.raises(ValueError, match="format"):
        urban_sed.read(corpus, {"format": "csv"})
    with pytest.raises(FileNotFoundError, match="annotations"):
        urban_sed.read(tmp_path_factory.mktemp("empty"), {})


def test_urbansound_class_map_is_the_ontology() -> None:
    ontology = default_ontology()
    with open(urban_sed.URBANSOUND_CLASSES, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["label"] for r in rows] == [
        "air_conditioner",
        "car_horn",
        "children_playing",
        "dog_bark",
        "drilling",
        "engine_idling",
        "gun_shot",
        "jackhammer",
        "siren",
        "street_music",
    ]
    for row in rows:
        assert ontology.by_mid[row["mid"]].name == row["audioset_name"]


def test_kind_dispatch() -> None:
    assert reader("urban-sed") is urban_sed.read


def test_an_annotation_linked_out_of_the_root_is_skipped_not_read(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    outside = tmp_path_factory.mktemp("outside") / "elsewhere.txt"
    outside.write_text("0\t1\tsiren\n")
    (corpus / "annotations/test/soundscape_test_unimodal9.txt").symlink_to(outside)
    write_audio(corpus / "audio/test/soundscape_test_unimodal9.wav")
    clips, skips = urban_sed.read(corpus, {})
    assert "urbansed-soundscape_test_unimodal9" not in {c.clip_id for c in clips}
    linked = [s for s in skips if s.item_id == "urbansed-soundscape_test_unimodal9"]
    assert [(s.path, s.reason) for s in linked] == [("annotations/test/soundscape_test_unimodal9.txt", "outside-root")]
    assert "leads outside the corpus root" in linked[0].detail


def test_a_jams_nested_200000_deep_is_skipped_and_the_others_read(corpus: Path) -> None:
    write(corpus / "annotations/train/soundscape_train_deep0.jams", "[" * 200_000 + "]" * 200_000)
    clips, skips = urban_sed.read(corpus, {"format": "jams"})
    deep = [s for s in skips if s.item_id == "urbansed-soundscape_train_deep0"]
    assert [(s.reason, s.detail) for s in deep] == [
        ("malformed-row", "JSON nested deeper than the reader can follow; not a JAMS file")
    ]
    assert "urbansed-soundscape_train_bimodal0" in {c.clip_id for c in clips}
