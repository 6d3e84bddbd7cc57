"""DESED and generic DCASE strong-TSV readers: published layouts, quirks and skip reasons."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from pipeline.imports import dcase, reader
from pipeline.ontology import default_ontology
from pipeline.schema import ImportedRegion

SPEECH, DOG = "/m/09x0r", "/m/0bt9lr"


def write_audio(path: Path, seconds: float = 0.5, rate_hz: int = 16000) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(int(seconds * rate_hz)) / rate_hz
    sf.write(path, 0.1 * np.sin(2 * np.pi * 440 * t), rate_hz)


def write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture
def desed(tmp_path: Path) -> Path:
    """DESED real as DCASE task 4 lays it out: validation under metadata/ and audio/validation/validation/."""
    write(
        tmp_path / "metadata/validation/validation.tsv",
        [
            "filename\tonset\toffset\tevent_label",
            "Y1_0.000_10.000.wav\t0.0\t1.0\tSpeech",
            "Y1_0.000_10.000.wav\t0.5\t2.0\tSpeech",  # overlaps the row above: both kept
            "Y1_0.000_10.000.wav\t8.0\t12.0\tDog",  # runs past the 10 s clip: kept for the writer
            "Y1_0.000_10.000.wav\t3.0\t3.0\tCat",  # onset == offset
            "Y1_0.000_10.000.wav\t1.0\t2.0\tDoorbell",  # not a DESED class
            "Y1_0.000_10.000.wav\tx\t2.0\tDog",  # not a number
            "Y2_30.000_40.000.wav\t\t\t",  # a clip without events
            "Y3_0.000_10.000.wav\t1.0\t2.0\tFrying",  # its audio is missing
            "Y4_0.000_10.000.wav\t0.1\t0.2",  # a field short
            "Y5_0.000_10.000.wav\t-1.0\t2.0\tBlender",  # the clip's only row is negative
            "/abs/Y6.wav\t0.0\t1.0\tDog",
        ],
    )
    for name in ("Y1_0.000_10.000", "Y2_30.000_40.000", "Y4_0.000_10.000", "Y5_0.000_10.000"):
        write_audio(tmp_path / "audio/validation/validation" / f"{name}.wav")
    return tmp_path


def test_desed_validation_clips(desed: Path) -> None:
    clips, _ = dcase.read_desed(desed, {})
    assert [(c.clip_id, c.audio_path, c.split) for c in clips] == [
        ("desed-Y1_0.000_10.000", "audio/validation/validation/Y1_0.000_10.000.wav", "valid"),
        ("desed-Y2_30.000_40.000", "audio/validation/validation/Y2_30.000_40.000.wav", "valid"),
    ]
    assert clips[0].regions == (
        ImportedRegion("Speech", SPEECH, "", 0.0, 1.0),
        ImportedRegion("Speech", SPEECH, "", 0.5, 2.0),
        ImportedRegion("Dog", DOG, "", 8.0, 12.0),
    )
    assert clips[1].regions == () and clips[1].captions == ()
    assert clips[0].license == "" and "DESED" in clips[0].attribution


def test_desed_skip_reasons(desed: Path) -> None:
    _, skips = dcase.read_desed(desed, {})
    tsv = "metadata/validation/validation.tsv"
    assert sorted((s.item_id, s.reason) for s in skips) == sorted(
        [
            ("metadata/eval/public.tsv", "missing-file"),
            ("desed-Y1_0.000_10.000#line5", "bad-region"),
            ("desed-Y1_0.000_10.000#line6", "unknown-label"),
            ("desed-Y1_0.000_10.000#line7", "malformed-row"),
            ("desed-Y3_0.000_10.000", "missing-file"),
            ("desed-Y4_0.000_10.000#line10", "malformed-row"),  # a short row still names its clip,
            ("desed-Y4_0.000_10.000", "no-label"),  # which is not kept as a clip without events
            ("desed-Y5_0.000_10.000#line11", "bad-region"),
            ("desed-Y5_0.000_10.000", "no-label"),
            (f"{tsv}#line12", "malformed-row"),
        ]
    )
    assert {s.path for s in skips if s.item_id.startswith("desed-Y1")} == {tsv}


def test_desed_public_eval_archive_layout_and_split_options(tmp_path: Path) -> None:
    # DESED_public_eval unpacks to dataset/; older downloads keep validation audio in audio/validation/.
    write(
        tmp_path / "dataset/metadata/eval/public.tsv",
        [
            "filename\tonset\toffset\tevent_label",
            "P1.wav\t0.25\t4.5\tVacuum_cleaner",
            "P2.wav",  # no events, trailing tabs stripped
        ],
    )
    write(tmp_path / "metadata/validation/validation.tsv", ["filename\tonset\toffset\tevent_label", "V1.wav\t1\t2\tCat"])
    write_audio(tmp_path / "dataset/audio/eval/public/P1.wav")
    write_audio(tmp_path / "dataset/audio/eval/public/P2.wav")
    write_audio(tmp_path / "audio/validation/V1.wav")
    clips, skips = dcase.read_desed(tmp_path, {"validation_split": "train"})
    assert skips == []
    assert [(c.clip_id, c.audio_path, c.split, len(c.regions)) for c in clips] == [
        ("desed-P1", "dataset/audio/eval/public/P1.wav", "test", 1),
        ("desed-P2", "dataset/audio/eval/public/P2.wav", "test", 0),
        ("desed-V1", "audio/validation/V1.wav", "train", 1),
    ]
    assert clips[0].regions[0] == ImportedRegion("Vacuum_cleaner", "/m/0d31p", "", 0.25, 4.5)
    with pytest.raises(ValueError, match="public_split"):
        dcase.read_desed(tmp_path, {"public_split": "eval"})


def test_desed_without_tsvs_names_the_layout(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="metadata/validation/validation.tsv"):
        dcase.read_desed(tmp_path, {})


def test_desed_class_map_is_the_ontology() -> None:
    ontology = default_ontology()
    with open(dcase.DESED_CLASSES, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["label"] for r in rows] == [
        "Alarm_bell_ringing",
        "Blender",
        "Cat",
        "Dishes",
        "Dog",
        "Electric_shaver_toothbrush",
        "Frying",
        "Running_water",
        "Speech",
        "Vacuum_cleaner",
    ]
    for row in rows:
        assert ontology.by_mid[row["mid"]].name == row["audioset_name"]


def test_dcase_tsv_without_header_and_class_map(tmp_path: Path) -> None:
    write(
        tmp_path / "meta/strong.tsv",
        [
            "a.wav\t0.0\t1.5\tspeech",
            "a.wav\t1.0\t2.0\tdoor_knock",
            "b.wav\t2.0\t1.0\tspeech",
        ],
    )
    write(tmp_path / "classes.csv", ["label,mid", "speech,/m/09x0r"])
    write_audio(tmp_path / "wav/a.wav")
    write_audio(tmp_path / "wav/b.wav")
    options = {
        "tsv": "meta/strong.tsv",
        "audio_dir": "wav",
        "split": "valid",
        "class_map": str(tmp_path / "classes.csv"),
        "id_prefix": "home",
    }
    clips, skips = dcase.read_dcase_tsv(tmp_path, options)
    assert [(c.clip_id, c.audio_path, c.split) for c in clips] == [("home-a", "wav/a.wav", "valid")]
    assert clips[0].regions == (ImportedRegion("speech", SPEECH, "", 0.0, 1.5), ImportedRegion("door_knock", "", "", 1.0, 2.0))
    assert [(s.item_id, s.reason, s.path) for s in skips] == [
        ("home-b#line3", "bad-region", "meta/strong.tsv"),
        ("home-b", "no-label", "meta/strong.tsv"),
    ]


def test_dcase_tsv_header_in_any_column_order(tmp_path: Path) -> None:
    write(tmp_path / "labels.tsv", ["onset\toffset\tlabel\tfilename", "0.5\t1.0\tdog\tclip.wav"])
    write_audio(tmp_path / "clip.wav")
    clips, skips = dcase.read_dcase_tsv(tmp_path, {"tsv": str(tmp_path / "labels.tsv"), "audio_dir": str(tmp_path)})
    assert skips == []
    assert [(c.clip_id, c.audio_path, c.split, c.regions) for c in clips] == [
        ("dcase-clip", "clip.wav", "train", (ImportedRegion("dog", "", "", 0.5, 1.0),))
    ]


def test_dcase_tsv_needs_its_options(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tsv"):
        dcase.read_dcase_tsv(tmp_path, {"audio_dir": "wav"})
    with pytest.raises(FileNotFoundError, match="nothing.tsv"):
        dcase.read_dcase_tsv(tmp_path, {"tsv": "nothing.tsv", "audio_dir": "wav"})


def test_a_weak_label_in_a_strong_tsv_is_left_out_and_reported(tmp_path: Path) -> None:
    write(
        tmp_path / "strong.tsv",
        ["filename\tonset\toffset\tevent_label", "a.wav\t\t\tDog", "a.wav\t0.5\t1.0\tCat", "b.wav\t\t\tDog"],
    )
    write_audio(tmp_path / "a.wav")
    write_audio(tmp_path / "b.wav")
    clips, skips = dcase.read_dcase_tsv(tmp_path, {"tsv": "strong.tsv", "audio_dir": "."})
    assert [(c.clip_id, c.regions) for c in clips] == [("dcase-a", (ImportedRegion("Cat", "", "", 0.5, 1.0),))]
    assert [(s.item_id, s.reason) for s in skips] == [
        ("dcase-a#line2", "malformed-row"),
        ("dcase-b#line4", "malformed-row"),
        ("dcase-b", "no-label"),
    ]
    assert "weak label" in skips[0].detail


def test_durations_tsv_rows_and_their_skips(tmp_path: Path) -> None:
    write(
        tmp_path / "durations.tsv", ["filename\tduration", "a.wav\t10.0", "b.wav\tten", "c.wav\t0", "a.wav\t9.0", "../d.wav\t1"]
    )
    durations, skips = dcase.read_durations_tsv(tmp_path / "durations.tsv", "durations.tsv")
    assert durations == {"a.wav": 10.0, "b.wav": None, "c.wav": None}
    assert [(s.item_id, s.reason) for s in skips] == [(f"durations.tsv#line{n}", "malformed-row") for n in (3, 4, 5, 6)]
    write(tmp_path / "headless.tsv", ["a.wav\t10.0"])
    assert dcase.read_durations_tsv(tmp_path / "headless.tsv", "headless.tsv") == ({"a.wav": 10.0}, [])
    write(tmp_path / "wrong.tsv", ["filename\tseconds", "a.wav\t10.0"])
    durations, skips = dcase.read_durations_tsv(tmp_path / "wrong.tsv", "wrong.tsv")
    assert durations == {} and [(s.item_id, s.reason) for s in skips] == [("wrong.tsv", "malformed-row")]


def test_kind_dispatch() -> None:
    assert reader("desed") is dcase.read_desed
    assert reader("dcase-tsv") is dcase.read_dcase_tsv


def test_outside_root_refuses_only_what_a_link_leads_out_of_the_root(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "corpus", tmp_path / "elsewhere"
    (root / "audio").mkdir(parents=True)
    elsewhere.mkdir()
    (elsewhere / "x.wav").write_bytes(b"")
    (root / "audio" / "in.wav").write_bytes(b"")
    (root / "audio" / "inner.wav").symlink_to(root / "audio" / "in.wav")
    (root / "audio" / "out.wav").symlink_to(elsewhere / "x.wav")
    (root / "linked").symlink_to(elsewhere)
    assert dcase.outside_root(root, "audio/in.wav") is None
    assert dcase.outside_root(root, "audio/inner.wav") is None, "a link that stays inside the root"
    assert "audio/out.wav is a symbolic link" in dcase.outside_root(root, "audio/out.wav")
    assert dcase.outside_root(root, "linked/x.wav") is not None, "a linked folder"
    assert dcase.outside_root(root, root / "audio" / "out.wav") is not None
    assert dcase.outside_root(root, elsewhere / "x.wav") is None, "a place an option names outside the root is read as named"
    assert dcase.outside_root(root, "../elsewhere/x.wav") is None


def test_a_tsv_linked_out_of_the_root_is_one_skip(tmp_path: Path) -> None:
    root = tmp_path / "corpus"
    write(tmp_path / "private.tsv", ["filename\tonset\toffset\tevent_label", "a.wav\t0\t1\tdog"])
    write_audio(root / "wav/a.wav")
    (root / "labels.tsv").symlink_to(tmp_path / "private.tsv")
    clips, skips = dcase.read_dcase_tsv(root, {"tsv": "labels.tsv", "audio_dir": "wav"})
    assert clips == [] and [(s.item_id, s.reason) for s in skips] == [("labels.tsv", "outside-root")]
