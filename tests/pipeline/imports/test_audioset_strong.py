"""The AudioSet-Strong reader: the released TSVs, with their quirks, -> clips and skips (no audio read)."""

from __future__ import annotations

import pytest

from pipeline.imports import reader
from pipeline.imports.audioset_strong import AudioSetStrongError, in_valid, name_fields, read, split_segment_id
from pipeline.schema import ImportedRegion
from tests.pipeline.imports.conftest import write_tone


def test_segment_ids_split_on_the_last_underscore():
    assert split_segment_id("-0RWZT-miFs_420000") == ("-0RWZT-miFs", 420000)
    assert split_segment_id("abc_def_30000") == ("abc_def", 30000)
    assert split_segment_id("--dash_1000") == ("--dash", 1000)
    for bad in ("nounderscore", "abc_", "_3000", "abc_12x"):
        with pytest.raises(ValueError, match="not <YouTube id>_<start ms>"):
            split_segment_id(bad)
    assert name_fields("Ab_c_30500") == {
        "segment_id": "Ab_c_30500",
        "ytid": "Ab_c",
        "start_ms": "30500",
        "start_s": "30.5",
        "start_3f": "30.500",
        "end_3f": "40.500",
    }


def test_the_published_layout_parses_with_names_from_the_ontology(audioset_root):
    clips, skips = reader("audioset-strong")(audioset_root, {"valid_fraction": 0.0})
    by_id = {c.clip_id: c for c in clips}
    assert [c.clip_id for c in clips] == sorted(by_id)
    assert set(by_id) == {"-0RWZT-miFs_420000", "abc_def_30000", "--dash_1000", "corrupt_0", "silent_5000", "evalclip_0"}
    dog = by_id["-0RWZT-miFs_420000"]
    assert dog.split == "train" and dog.audio_path == "audio/-0RWZT-miFs_420000.wav" and dog.captions == ()
    assert dog.regions == (
        ImportedRegion("Bark", "/m/05tny_", "", 0.5, 2.0),
        ImportedRegion("Bark", "/m/05tny_", "", 1.8, 3.0),
        ImportedRegion("Speech", "/m/09x0r", "", 4.0, 6.0),
    )
    assert "youtube.com/watch?v=-0RWZT-miFs&t=420s" in dog.attribution and dog.license == "unknown"
    assert by_id["--dash_1000"].audio_path == "audio/Y--dash_1000.wav"  # the Y-prefixed download name
    assert by_id["abc_def_30000"].audio_path == "audio/abc_def_30000.flac"
    # times are passed on as written: the writer checks them against the decoded audio
    assert by_id["abc_def_30000"].regions[-1] == ImportedRegion("Speech", "/m/09x0r", "", 12.0, 14.0)
    assert by_id["evalclip_0"].split == "test"
    assert by_id["evalclip_0"].regions[0] == ImportedRegion("Bark", "/m/05tny_", "", 0.0, 1.0)
    reasons = {(s.item_id, s.reason) for s in skips}
    assert reasons == {
        ("abc_def_30000", "unknown-label"),
        ("gone_clip_10000", "missing-file"),
        ("nounderscore", "malformed-row"),
        ("bad_time_0", "malformed-row"),
        ("evalclip_0", "bad-region"),
    }
    empty = next(s for s in skips if s.reason == "bad-region")  # onset == offset: left out as the row is read
    assert empty.path == "audioset_eval_strong.tsv:2" and "onset 3 s is not before offset 3 s" in empty.detail
    unknown = next(s for s in skips if s.reason == "unknown-label")
    assert unknown.path == "audioset_train_strong.tsv:6" and "/m/zzzz_unknown" in unknown.detail
    missing = next(s for s in skips if s.reason == "missing-file")
    assert "audio/gone_clip_10000.wav" in missing.detail and "audio/Ygone_clip_10.000_20.000.wav" in missing.detail


def test_valid_is_a_stable_share_of_train(audioset_root):
    clips, _ = read(audioset_root, {"valid_fraction": 0.5})
    for c in clips:
        expected = "test" if c.clip_id == "evalclip_0" else ("valid" if in_valid(c.clip_id, 0.5) else "train")
        assert c.split == expected
    assert read(audioset_root, {"valid_fraction": 0.5})[0] == clips
    ids = [f"vid{i}_{i * 1000}" for i in range(2000)]
    share = sum(in_valid(i, 0.1) for i in ids) / len(ids)
    assert 0.08 < share < 0.12


def test_options_name_files_folders_and_patterns(audioset_root):
    (audioset_root / "audioset_train_strong.tsv").rename(audioset_root / "train.tsv")
    write_tone(audioset_root / "eval_audio" / "evalclip_0.ogg.flac", 1.0, 16000, 300.0)
    clips, skips = read(
        audioset_root,
        {"train_tsv": "train.tsv", "eval_audio_dir": "eval_audio", "patterns": "{segment_id}.ogg.flac,{segment_id}.wav"},
    )
    by_id = {c.clip_id: c for c in clips}
    assert by_id["evalclip_0"].audio_path == "eval_audio/evalclip_0.ogg.flac"
    assert "-0RWZT-miFs_420000" in by_id and "--dash_1000" not in by_id  # the Y pattern is no longer tried
    assert ("--dash_1000", "missing-file") in {(s.item_id, s.reason) for s in skips}


def test_errors_say_what_to_do(tmp_path, audioset_root):
    with pytest.raises(AudioSetStrongError, match="audioset_train_strong.tsv.*audioset_eval_strong.tsv"):
        read(tmp_path / "empty", {})
    with pytest.raises(AudioSetStrongError, match="unknown option.*'audio_folder'.*options are"):
        read(audioset_root, {"audio_folder": "x"})
    with pytest.raises(AudioSetStrongError, match="valid_fraction"):
        read(audioset_root, {"valid_fraction": 1.5})
    with pytest.raises(AudioSetStrongError, match="pattern '{vid}.wav'"):
        read(audioset_root, {"patterns": ["{vid}.wav"]})
    (audioset_root / "audioset_eval_strong.tsv").write_text("YTID,start_seconds,end_seconds,positive_labels\n", encoding="utf-8")
    with pytest.raises(AudioSetStrongError, match="lacks the column.*starts with the header segment_id<TAB>start_time_seconds"):
        read(audioset_root, {})


def test_columns_are_found_by_name_and_rows_never_merge(tmp_path):
    """Columns in another order, an extra column and a stray quote: every line is one row, read by its header."""
    (tmp_path / "audioset_eval_strong.tsv").write_text(
        "label\tsegment_id\tend_time_seconds\tstart_time_seconds\tnote\n"
        '/m/09x0r\tq_0\t2.0\t1.0\t"open quote\n'
        '/m/05tny_\tq_0\t4.0\t3.0\tclosed"\n',
        encoding="utf-8",
    )
    write_tone(tmp_path / "audio" / "q_0.wav", 1.0, 16000, 300.0)
    clips, skips = read(tmp_path, {})
    assert skips == []
    assert clips[0].regions == (
        ImportedRegion("Speech", "/m/09x0r", "", 1.0, 2.0),
        ImportedRegion("Bark", "/m/05tny_", "", 3.0, 4.0),
    )
