"""TACOS reader: the Zenodo release layout, its quirks, splits and skip reasons."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from pipeline.imports import reader, tacos
from pipeline.schema import ImportedRegion

LICENSE_CC0 = "http://creativecommons.org/publicdomain/zero/1.0/"


def write_audio(path: Path, seconds: float = 0.5, rate_hz: int = 16000) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(int(seconds * rate_hz)) / rate_hz
    sf.write(path, 0.1 * np.sin(2 * np.pi * 440 * t), rate_hz, format="WAV")  # readers never decode it


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


@pytest.fixture
def release(tmp_path: Path) -> Path:
    """A TACOS release in its published layout, with the quirks a reader must survive."""
    write(
        tmp_path / "annotations_strong.csv",
        "\n".join(
            [
                "filename,text,onset,offset",
                "1001.mp3,A dog barks twice.,0.5,1.5",
                '1001.mp3,"A dog barks, then a car passes by.",0.2,3.0',
                "1001.mp3,A dog barks twice.,1.0,2.0",  # overlaps the first one, same text: kept apart
                "1001.mp3,Rain falls on a roof.,1.0,1.0",  # onset == offset
                "1001.mp3,,2.0,3.0",  # empty caption
                "1001.mp3,Birds chirp.,4.0,99.0",  # past the clip's end: kept for the writer
                "1002.mp3,Footsteps on gravel.,-0.5,1.0",  # the clip's only row is negative
                "1003.mp3,A door slams.,soon,1.0",  # not a number
                "1003.mp3,A door slams.,0.0,0.4",  # audio of 1003 is missing
                "1004.mp3,Keys jingle.,0,0.3",
                "1005.mp3,Wind blows.,0.1",  # one field short
                "1006.mp3,A bell rings.,0.0,2.0",  # in no split file
                "../etc/passwd,Escapes the root.,0.0,1.0",
            ]
        )
        + "\n",
    )
    write(
        tmp_path / "annotations_weak.csv",
        "\n".join(
            [
                "filename,text",
                '1001.mp3,"A dog barks near a road, then a car passes."',
                '1001.mp3,"A dog barks near a road, then a car passes."',  # repeated: kept once
                "1004.mp3,",
                "1007.mp3,A weak caption without strong ones.",
            ]
        )
        + "\n",
    )
    write(
        tmp_path / "metadata.csv",
        "\n".join(
            [
                "filename,keywords,freesound_id,sound_link,manufacturer,license,superclass,subclass,title,description,duration",
                f'1001.mp3,"dog, car",1001,https://freesound.org/people/ann/sounds/1001/,ann,{LICENSE_CC0},Animal,Dog,Street dog,'
                '"Recorded at night,\nnear a road.",12.5',
                "1004.mp3,keys,1004,https://freesound.org/people/bo/sounds/1004/,bo,http://creativecommons.org/licenses/by/4.0/,"
                "Object,Keys,Keys,plain,3.0",
            ]
        )
        + "\n",
    )
    write(tmp_path / "development_split.csv", "filename\n1001.mp3\n1002.mp3\n1003.mp3\n1007.mp3\n")
    write(tmp_path / "test_split.csv", "filename\n1004.mp3\n")
    for name in ("1001", "1002", "1004", "1006", "1007"):
        write_audio(tmp_path / "audio" / f"{name}.mp3")
    return tmp_path


def test_release_clips_regions_and_captions(release: Path) -> None:
    clips, _ = tacos.read(release, {})
    assert [c.clip_id for c in clips] == ["tacos-1001", "tacos-1004"]
    dog, keys = clips
    assert (dog.audio_path, dog.split, keys.split) == ("audio/1001.mp3", "train", "test")
    assert dog.captions == ("A dog barks near a road, then a car passes.",)
    assert keys.captions == ()
    assert dog.regions == (
        ImportedRegion("", "", "A dog barks, then a car passes by.", 0.2, 3.0),
        ImportedRegion("", "", "A dog barks twice.", 0.5, 1.5),
        ImportedRegion("", "", "A dog barks twice.", 1.0, 2.0),
        ImportedRegion("", "", "Birds chirp.", 4.0, 99.0),
    )
    assert dog.license == LICENSE_CC0
    assert dog.attribution.startswith('"Street dog" by ann (https://freesound.org/people/ann/sounds/1001/); ')
    assert "TACOS" in dog.attribution and "CC BY 4.0" in dog.attribution


def test_release_skip_reasons(release: Path) -> None:
    _, skips = tacos.read(release, {})
    got = sorted((s.item_id, s.reason) for s in skips)
    assert got == sorted(
        [
            ("tacos-1001#line5", "bad-region"),
            ("tacos-1001#line6", "empty-caption"),
            ("tacos-1002#line8", "bad-region"),
            ("tacos-1002", "no-label"),
            ("tacos-1003#line9", "malformed-row"),
            ("tacos-1003", "missing-file"),
            ("annotations_strong.csv#line12", "malformed-row"),
            ("tacos-1006", "not-in-metadata"),
            ("annotations_strong.csv#line14", "malformed-row"),
            ("tacos-1004#weak-line4", "empty-caption"),
            ("tacos-1007", "no-label"),
        ]
    )
    by_id = {s.item_id: s for s in skips}
    assert "onset 1 s is not before offset 1 s" in by_id["tacos-1001#line5"].detail
    assert by_id["tacos-1003"].path == "audio/1003.mp3"


def test_documented_fallback_columns_without_split_or_metadata_files(tmp_path: Path) -> None:
    write(tmp_path / "annotations_strong.csv", "filename,onset,offset,caption\na.wav,0.0,1.0,A cat meows.\n")
    write_audio(tmp_path / "clips" / "a.wav")
    clips, skips = tacos.read(tmp_path, {"audio_dir": "clips", "split": "valid"})
    assert skips == []
    assert [(c.clip_id, c.audio_path, c.split, c.license, c.captions) for c in clips] == [
        ("tacos-a", "clips/a.wav", "valid", "", ())
    ]
    assert clips[0].regions == (ImportedRegion("", "", "A cat meows.", 0.0, 1.0),)
    assert clips[0].attribution == tacos.CAPTIONS_CREDIT


def test_valid_fraction_takes_a_stable_share_of_development_clips_only(tmp_path: Path) -> None:
    names = [f"{n}.mp3" for n in range(2000, 2030)]
    write(tmp_path / "annotations_strong.csv", "filename,text,onset,offset\n" + "".join(f"{x},A sound.,0,1\n" for x in names))
    write(tmp_path / "development_split.csv", "filename\n" + "\n".join(names[:20]) + "\n")
    write(tmp_path / "test_split.csv", "filename\n" + "\n".join(names[20:]) + "\n")
    for x in names:
        write_audio(tmp_path / "audio" / x, seconds=0.05)
    clips, _ = tacos.read(tmp_path, {"valid_fraction": "0.5"})
    splits = {c.clip_id: c.split for c in clips}
    assert {splits[f"tacos-{n}"] for n in range(2020, 2030)} == {"test"}
    development = [splits[f"tacos-{n}"] for n in range(2000, 2020)]
    assert set(development) == {"train", "valid"}
    assert development == [("valid" if tacos._unit_hash(f"tacos-{n}") < 0.5 else "train") for n in range(2000, 2020)]
    assert tacos.read(tmp_path, {"valid_fraction": "0.5"})[0] == clips  # the same clips every run
    with pytest.raises(ValueError, match="valid_fraction"):
        tacos.read(tmp_path, {"valid_fraction": "1.5"})


def test_header_without_text_column_is_one_skip(tmp_path: Path) -> None:
    write(tmp_path / "annotations_strong.csv", "filename,onset,offset\na.mp3,0,1\n")
    clips, skips = tacos.read(tmp_path, {})
    assert clips == []
    assert [(s.item_id, s.reason) for s in skips] == [("annotations_strong.csv", "malformed-row")]


def test_missing_release_names_the_expected_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="annotations_strong.csv"):
        tacos.read(tmp_path, {})


def test_kind_dispatch() -> None:
    assert reader("tacos") is tacos.read


def test_a_csv_linked_out_of_the_root_is_skipped_not_read(release: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (outside / "metadata.csv").write_text("filename,title,manufacturer\n1001.mp3,private title,someone\n")
    (release / "metadata.csv").unlink()
    (release / "metadata.csv").symlink_to(outside / "metadata.csv")
    clips, skips = tacos.read(release, {})
    assert ("metadata.csv", "outside-root") in [(s.item_id, s.reason) for s in skips]
    assert clips and not any("private" in c.attribution for c in clips)
    (release / "annotations_strong.csv").rename(outside / "strong.csv")
    (release / "annotations_strong.csv").symlink_to(outside / "strong.csv")
    clips, skips = tacos.read(release, {})
    assert clips == [] and [(s.item_id, s.reason) for s in skips] == [("annotations_strong.csv", "outside-root")]
