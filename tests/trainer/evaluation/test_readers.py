"""Benchmark readers on tiny fixtures written in each benchmark's real on-disk layout."""

from __future__ import annotations

import csv
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from pipeline.imports.audioset_strong import read as import_audioset_strong
from pipeline.imports.dcase import read_dcase_tsv as import_dcase_tsv
from pipeline.imports.urban_sed import read as import_urban_sed
from tests.pipeline.imports.conftest import write_audioset_strong
from trainer.evaluation.readers import (
    READERS,
    BenchmarkError,
    BenchmarkMissing,
    ClassificationSet,
    GroundingSet,
    RetrievalSet,
    SedSet,
    read_audiocaps,
    read_audiogrounding,
    read_audioset_strong,
    read_benchmark,
    read_clotho,
    read_desed,
    read_esc50,
    read_urbansed,
    read_us8k,
)


def wav(path: Path, seconds: float, sr: int = 16000) -> str:
    """Low noise of ``seconds`` at ``sr``; returns the path as a string."""
    path.parent.mkdir(parents=True, exist_ok=True)
    noise = np.random.default_rng(0).standard_normal(round(seconds * sr)) * 1e-3
    sf.write(path, noise.astype(np.float32), sr)
    return str(path)


def write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def write_csv(path: Path, rows: list[list[str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    return path


# --- DESED ---------------------------------------------------------------------------------

DESED_EVENTS = (
    "filename\tonset\toffset\tevent_label\n"
    "a.wav\t0.1\t0.4\tDog\n"
    "a.wav\t0.3\t0.6\tDog\n"
    "a.wav\t0.6\t0.8\tDog\n"
    "a.wav\t0.2\t0.5\tSpeech\n"
    "a.wav\t0.9\t0.9\tSpeech\n"
    "b.wav\t\t\tDishes\n"
    "b.wav\t0.0\t0.25\tAlarm_bell_ringing\n"
    "d.wav\t1.0\t2.0\tDog\n"
)


def desed_fixture(tmp_path: Path) -> tuple[Path, Path, Path]:
    audio = tmp_path / "audio" / "eval" / "public"
    wav(audio / "a.wav", 1.0)
    wav(audio / "b.wav", 0.5, sr=44100)
    wav(audio / "c.wav", 2.0)
    events = write_text(tmp_path / "public.tsv", DESED_EVENTS)
    durations = write_text(
        tmp_path / "public_durations.tsv", "filename\tduration\na.wav\t10.0\nb.wav\t9.5\nc.wav\t8.0\nd.wav\t10.0\n"
    )
    return audio, events, durations


def test_desed_reads_events_merges_and_reports_the_rows_it_leaves_out(tmp_path):
    audio, events, durations = desed_fixture(tmp_path)
    with pytest.warns(
        UserWarning,
        match=r"benchmark desed: 3 clips read; 3 ground-truth rows or clips left out "
        r"\(bad-region 1, malformed-row 1, missing-file 1\)",
    ):
        s = read_desed(audio_dir=audio, events_tsv=events, durations_tsv=durations)
    assert isinstance(s, SedSet) and s.name == "desed" and s.alpha_st == 1.0
    assert list(s.audio) == ["a", "b", "c"]
    assert s.audio["a"] == str(audio / "a.wav")
    assert s.ground_truth == {
        "a": [(0.1, 0.8, "Dog"), (0.2, 0.5, "Speech")],
        "b": [(0.0, 0.25, "Alarm_bell_ringing")],
        "c": [],
    }
    assert s.durations_s == {"a": 10.0, "b": 9.5, "c": 8.0}
    assert s.classes == ("Alarm_bell_ringing", "Dog", "Speech")
    assert s.queries == {"Alarm_bell_ringing": "alarm bell ringing", "Dog": "dog", "Speech": "speech"}
    # the zero-length event, the weak label (a label without times) and the clip without audio
    assert sorted((x.item_id, x.reason) for x in s.skips) == [
        ("a#line6", "bad-region"),
        ("b#line7", "malformed-row"),
        ("d", "missing-file"),
    ]
    assert "weak label" in next(x.detail for x in s.skips if x.item_id == "b#line7")


def test_desed_durations_from_audio_headers(tmp_path):
    audio, events, _ = desed_fixture(tmp_path)
    with pytest.warns(UserWarning, match=r"2 clips read; 3 ground-truth rows or clips left out"):
        s = read_desed(audio_dir=audio, events_tsv=events)
    assert list(s.audio) == ["a", "b"]
    assert s.durations_s == pytest.approx({"a": 1.0, "b": 0.5})


def test_desed_a_bad_row_is_left_out_and_reported_not_raised(tmp_path):
    audio, _, _ = desed_fixture(tmp_path)
    events = write_text(
        tmp_path / "bad.tsv",
        "filename\tonset\toffset\tevent_label\n"
        "a.wav\t0.1\t0.4\tDog\na.wav\t0.5\t0.2\tDog\n"  # inverted
        "b.wav\tzero\t0.4\tDog\nb.wav\t0.1\t0.2\tDog\n"  # not a number
        "c.wav\t0.1\n",
    )  # a field short: c is not scored as a clip without events
    with pytest.warns(UserWarning, match=r"2 clips read; 4 ground-truth rows or clips left out"):
        s = read_desed(audio_dir=audio, events_tsv=events)
    assert s.ground_truth == {"a": [(0.1, 0.4, "Dog")], "b": [(0.1, 0.2, "Dog")]}
    assert sorted((x.item_id, x.reason, x.path) for x in s.skips) == [
        ("a#line3", "bad-region", str(events)),
        ("b#line4", "malformed-row", str(events)),
        ("c", "no-label", str(events)),
        ("c#line6", "malformed-row", str(events)),
    ]
    assert "onset 0.5 s is not before offset 0.2 s" in s.skips[0].detail


def test_desed_a_durations_row_left_out_falls_back_to_the_audio_header(tmp_path):
    audio, events, _ = desed_fixture(tmp_path)
    durations = write_text(tmp_path / "d.tsv", "filename\tduration\na.wav\tlong\nb.wav\t9.5\nc.wav\t8.0\nc.wav\t7.0\n")
    with pytest.warns(UserWarning):
        s = read_desed(audio_dir=audio, events_tsv=events, durations_tsv=durations)
    assert s.durations_s == pytest.approx({"a": 1.0, "b": 9.5, "c": 8.0})
    assert {(x.item_id, x.reason) for x in s.skips} >= {
        (f"{durations}#line2", "malformed-row"),
        (f"{durations}#line5", "malformed-row"),
    }


def test_desed_without_a_usable_row_names_the_file(tmp_path):
    audio, _, _ = desed_fixture(tmp_path)
    no_label = write_text(tmp_path / "nolabel.tsv", "filename\tonset\toffset\na.wav\t0.1\t0.4\n")
    with pytest.raises(
        BenchmarkError, match=r"no usable clip; 1 rows or clips left out: .*nolabel\.tsv: header .* lacks event_label"
    ):
        read_desed(audio_dir=audio, events_tsv=no_label)


def test_desed_without_any_audio_is_missing(tmp_path):
    _, events, _ = desed_fixture(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BenchmarkMissing, match=r"empty holds none of the 3 audio files .*evaluate\.benchmarks\.desed\.audio_dir"):
        read_desed(audio_dir=empty, events_tsv=events)


def test_desed_missing_path_names_the_param(tmp_path):
    audio, _, _ = desed_fixture(tmp_path)
    with pytest.raises(
        BenchmarkMissing,
        match=r"nope\.tsv does not exist; set evaluate\.benchmarks\.desed\.events_tsv to the DESED eval events TSV",
    ):
        read_desed(audio_dir=audio, events_tsv=tmp_path / "nope.tsv")


def test_desed_evaluation_and_import_read_the_same_events(tmp_path):
    """One DCASE TSV with its quirks: the importer (dcase-tsv, no class map) and the benchmark reader keep
    the same clips with the same events and leave out the same rows for the same reasons."""
    audio, _, _ = desed_fixture(tmp_path)
    wav(audio / "e.wav", 1.0)
    events = write_text(tmp_path / "public.tsv", DESED_EVENTS + "e.wav\t0.2\t0.1\tDog\nc.wav\n")
    clips, import_skips = import_dcase_tsv(
        tmp_path, {"tsv": str(events), "audio_dir": str(audio), "split": "test", "id_prefix": "x"}
    )
    with pytest.warns(UserWarning):
        s = read_desed(audio_dir=audio, events_tsv=events)
    imported = {c.clip_id.removeprefix("x-"): c.regions for c in clips}
    assert set(imported) == set(s.ground_truth) == {"a", "b", "c"}
    for clip, regions in imported.items():
        assert s.ground_truth[clip] == _merged(regions)
    # the same rows left out for the same reasons (file-level details name the paths each was given)
    by_row = {x.item_id.removeprefix("x-"): (x.reason, x.detail if "#line" in x.item_id else "") for x in import_skips}
    assert by_row == {x.item_id: (x.reason, x.detail if "#line" in x.item_id else "") for x in s.skips}
    assert set(by_row) == {"a#line6", "b#line7", "d", "e#line10", "e"}


def _merged(regions) -> list[tuple[float, float, str]]:
    """The importer's regions as the scorer takes them: same-class spans that overlap or touch merged."""
    out: list[list] = []
    for label, onset, offset in sorted((r.label, r.onset_s, r.offset_s) for r in regions):
        if out and out[-1][2] == label and onset <= out[-1][1]:
            out[-1][1] = max(out[-1][1], offset)
        else:
            out.append([onset, offset, label])
    return sorted((a, b, label) for a, b, label in out)


# --- URBAN-SED -----------------------------------------------------------------------------


def jams_doc(observations: list[dict]) -> str:
    return json.dumps(
        {
            "annotations": [
                {"namespace": "tag_open", "data": []},
                {"namespace": "scaper", "data": observations, "sandbox": {"scaper": {"duration": 2.0}}},
            ],
            "file_metadata": {"duration": 2.0},
        }
    )


def obs(time: float, duration: float, label: str, role: str) -> dict:
    value = {"label": label, "role": role, "source_file": f"{label}.wav", "snr": 6.0}
    return {"time": time, "duration": duration, "value": value, "confidence": 1.0}


def test_urbansed_txt_and_jams_fallback(tmp_path):
    root = tmp_path / "URBAN-SED_v2.0.0"
    wav(root / "audio" / "test" / "soundscape_test_1.wav", 2.0, sr=44100)
    wav(root / "audio" / "test" / "soundscape_test_2.wav", 1.5, sr=44100)
    wav(root / "audio" / "validate" / "soundscape_validate_1.wav", 1.0)
    ann = root / "annotations" / "test"
    write_text(ann / "soundscape_test_1.txt", "0.000\t0.800\tdog_bark\n0.500\t1.200\tdog_bark\n1.000\t1.900\tsiren\n")
    write_text(ann / "soundscape_test_1.jams", jams_doc([obs(0.0, 2.0, "jackhammer", "foreground")]))
    write_text(
        ann / "soundscape_test_2.jams",
        jams_doc(
            [
                obs(0.0, 1.5, "brown_noise", "background"),
                obs(0.5, 1.0, "dog_bark", "foreground"),
                obs(0.25, 0.5, "car_horn", "foreground"),
            ]
        ),
    )
    s = read_urbansed(root=root)
    assert list(s.audio) == ["soundscape_test_1", "soundscape_test_2"]
    assert s.ground_truth == {
        "soundscape_test_1": [(0.0, 1.2, "dog_bark"), (1.0, 1.9, "siren")],
        "soundscape_test_2": [(0.25, 0.75, "car_horn"), (0.5, 1.5, "dog_bark")],
    }
    assert s.durations_s == pytest.approx({"soundscape_test_1": 2.0, "soundscape_test_2": 1.5})
    assert s.classes == ("car_horn", "dog_bark", "siren")
    assert s.queries == {"car_horn": "car horn", "dog_bark": "dog bark", "siren": "siren"}
    assert s.alpha_st == 1.0
    with pytest.raises(BenchmarkMissing, match=r"annotations/validate does not exist \(split 'validate'"):
        read_urbansed(root=root, split="validate")
    write_text(root / "annotations" / "validate" / "soundscape_validate_1.txt", "")
    assert read_urbansed(root=root, split="validate").ground_truth == {"soundscape_validate_1": []}


def test_urbansed_a_bad_line_is_left_out_and_reported_not_raised(tmp_path):
    root = tmp_path / "urbansed"
    wav(root / "audio" / "test" / "s1.wav", 0.5)
    (root / "annotations" / "test").mkdir(parents=True)
    with pytest.raises(BenchmarkMissing, match=r"audio/test holds no annotated clip; set evaluate\.benchmarks\.urbansed\.root"):
        read_urbansed(root=root)
    write_text(root / "annotations" / "test" / "s1.txt", "0.0\t0.3\tsiren\n0.1 dog_bark\n0.2\t0.4\tcow\n")
    wav(root / "audio" / "test" / "s2.wav", 0.5)  # no annotation: reported, not scored as a clip without events
    with pytest.warns(
        UserWarning,
        match=r"benchmark urbansed: 1 clips read; 3 ground-truth rows or clips left out "
        r"\(malformed-row 1, not-in-metadata 1, unknown-label 1\)",
    ):
        s = read_urbansed(root=root)
    assert s.ground_truth == {"s1": [(0.0, 0.3, "siren")]}
    assert sorted((x.item_id, x.reason) for x in s.skips) == [
        ("s1#line2", "malformed-row"),
        ("s1#line3", "unknown-label"),
        ("s2", "not-in-metadata"),
    ]


def test_urbansed_jams_stored_as_columns(tmp_path):
    """JAMS 0.2 stores an annotation's data as columns; the observations are the same."""
    root = tmp_path / "urbansed"
    wav(root / "audio" / "test" / "s1.wav", 2.0)
    rows = [
        obs(0.0, 2.0, "brown_noise", "background"),
        obs(0.5, 1.0, "dog_bark", "foreground"),
        obs(0.25, 0.5, "car_horn", "foreground"),
    ]
    doc = json.loads(jams_doc(rows))
    doc["annotations"][1]["data"] = {
        column: [row[column] for row in rows] for column in ("time", "duration", "value", "confidence")
    }
    write_text(root / "annotations" / "test" / "s1.jams", json.dumps(doc))
    s = read_urbansed(root=root, format="jams")
    assert s.ground_truth == {"s1": [(0.25, 0.75, "car_horn"), (0.5, 1.5, "dog_bark")]} and s.skips == ()


def test_urbansed_evaluation_and_import_read_the_same_events(tmp_path):
    """One URBAN-SED folder with its quirks, in both formats: the importer and the benchmark reader keep the
    same soundscapes with the same events and leave out the same lines and observations for the same reasons."""
    root = tmp_path / "URBAN-SED_v2.0.0"
    ann = root / "annotations" / "test"
    for n in range(1, 6):
        wav(root / "audio" / "test" / f"s{n}.wav", 2.0)
    write_text(ann / "s1.txt", "0.0\t0.8\tdog_bark\n0.5\t1.2\tdog_bark\n1.0\t1.9\tsiren\nbad line\n1.5\t1.5\tsiren\n")
    write_text(
        ann / "s1.jams",
        jams_doc(
            [
                obs(0.0, 0.8, "dog_bark", "foreground"),
                obs(0.5, 0.7, "dog_bark", "foreground"),
                obs(1.0, 0.9, "siren", "foreground"),
                {"time": 1.0},
                obs(0.0, 2.0, "x", "background"),
            ]
        ),
    )
    write_text(ann / "s2.jams", jams_doc([obs(0.25, 0.5, "car_horn", "foreground"), obs(0.5, 1.0, "cow", "foreground")]))
    write_text(ann / "s3.txt", "1\t0.5\tsiren\n")  # its only event is backwards
    write_text(ann / "s4.txt", "")  # a soundscape without foreground events
    write_text(ann / "s6.txt", "0\t1\tsiren\n")  # no audio
    for fmt in ("txt", "jams"):
        clips, import_skips = import_urban_sed(root, {"format": fmt})
        with pytest.warns(UserWarning):
            s = read_urbansed(root=root, format=fmt)
        imported = {c.clip_id.removeprefix("urbansed-"): c.regions for c in clips}
        assert set(imported) == set(s.ground_truth) == {"s1", "s2", "s4"}, fmt
        for clip, regions in imported.items():
            assert s.ground_truth[clip] == _merged(regions), (fmt, clip)
        # the importer also reports the splits it has no folder for
        by_item = {x.item_id.removeprefix("urbansed-"): (x.reason, x.detail) for x in import_skips if "/" not in x.item_id}
        assert by_item == {x.item_id: (x.reason, x.detail) for x in s.skips}, fmt
        assert {"s2#event1", "s3", "s5", "s6"} <= set(by_item), fmt


# --- AudioSet-Strong -----------------------------------------------------------------------


def test_audioset_strong_maps_mids_and_sets_alpha_st_zero(tmp_path):
    audio = tmp_path / "audio"
    wav(audio / "abc_30000.wav", 1.0)
    flac = audio / "xyz_0.flac"
    sf.write(flac, np.zeros(8000, dtype=np.float32), 16000)
    tsv = write_text(
        tmp_path / "audioset_eval_strong.tsv",
        (
            "segment_id\tstart_time_seconds\tend_time_seconds\tlabel\n"
            "abc_30000\t0.000\t0.400\t/m/09x0r\n"
            "abc_30000\t0.300\t0.700\t/m/09x0r\n"
            "abc_30000\t0.100\t0.200\t/m/0174k2\n"
            "xyz_0\t0.000\t0.500\t/m/05tny_\n"
            "gone_10000\t0.000\t1.000\t/m/09x0r\n"
        ),
    )
    with pytest.warns(UserWarning, match=r"2 clips read; 1 ground-truth rows or clips left out \(missing-file 1\)"):
        s = read_audioset_strong(audio_dir=audio, segments_tsv=tsv, class_names={"/m/05tny_": "Dog bark"})
    assert s.name == "audioset_strong" and s.alpha_st == 0.0
    assert s.audio == {"abc_30000": str(audio / "abc_30000.wav"), "xyz_0": str(flac)}
    assert s.ground_truth == {
        "abc_30000": [(0.0, 0.7, "Speech"), (0.1, 0.2, "Washing machine")],
        "xyz_0": [(0.0, 0.5, "Dog bark")],
    }
    assert s.durations_s == pytest.approx({"abc_30000": 1.0, "xyz_0": 0.5})
    assert s.classes == ("Dog bark", "Speech", "Washing machine")
    assert s.queries["Washing machine"] == "washing machine"


def test_audioset_strong_a_bad_row_is_left_out_and_reported_not_raised(tmp_path):
    wav(tmp_path / "audio" / "abc_0.wav", 0.5)
    tsv = write_text(
        tmp_path / "s.tsv",
        "segment_id\tstart_time_seconds\tend_time_seconds\tlabel\n"
        "abc_0\t0\t1\t/m/nope\nabc_0\t0.5\t0.2\t/m/09x0r\n"
        "abc_0\t0\t0.4\t/m/09x0r\nabc_0\tsoon\t1\t/m/09x0r\n",
    )
    with pytest.warns(
        UserWarning,
        match=r"1 clips read; 3 ground-truth rows or clips left out "
        r"\(bad-region 1, malformed-row 1, unknown-label 1\)",
    ):
        s = read_audioset_strong(audio_dir=tmp_path / "audio", segments_tsv=tsv)
    assert s.ground_truth == {"abc_0": [(0.0, 0.4, "Speech")]}
    assert [(x.path, x.reason) for x in s.skips] == [
        ("s.tsv:2", "unknown-label"),
        ("s.tsv:3", "bad-region"),
        ("s.tsv:5", "malformed-row"),
    ]
    assert "'/m/nope'" in s.skips[0].detail
    header = write_text(tmp_path / "h.tsv", "segment_id\tstart\tend\tlabel\nabc_0\t0\t1\t/m/09x0r\n")
    with pytest.raises(BenchmarkError, match=r"h\.tsv lacks the column\(s\) start_time_seconds, end_time_seconds"):
        read_audioset_strong(audio_dir=tmp_path / "audio", segments_tsv=header)


@pytest.mark.parametrize("tsv", ["audioset_train_strong.tsv", "audioset_eval_strong.tsv"])
def test_audioset_strong_evaluation_and_import_read_the_same_events(tmp_path, tsv):
    """Each TSV of the importer's fixture corpus (quirks included), read by both callers as the eval set: the same
    segments with the same events, and the same rows left out for the same reasons."""
    root = write_audioset_strong(tmp_path / "audioset_strong")
    (root / tsv).replace(root / "eval.tsv")
    clips, import_skips = import_audioset_strong(root, {"train_tsv": "absent.tsv", "eval_tsv": "eval.tsv"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = read_audioset_strong(audio_dir=root / "audio", segments_tsv=root / "eval.tsv")
    imported = {c.clip_id: c.regions for c in clips}
    for clip in s.ground_truth:
        assert s.ground_truth[clip] == _merged(imported[clip]), clip
    # missing-file paths are relative to the corpus root there, to the audio folder here; the audio itself is
    # read later, by the import's writer and by the benchmark reader (for its duration)
    undecodable = {(x.item_id, x.reason) for x in s.skips if x.reason == "unreadable"}
    assert undecodable == ({("corrupt_0", "unreadable")} if tsv == "audioset_train_strong.tsv" else set())
    assert {(x.item_id, x.path.removeprefix("audio/"), x.reason) for x in import_skips} == {
        (x.item_id, x.path, x.reason) for x in s.skips if x.reason != "unreadable"
    }
    assert set(imported) == set(s.ground_truth) | {i for i, _ in undecodable}


# --- AudioGrounding ------------------------------------------------------------------------


def grounding_audio(tmp_path: Path) -> Path:
    audio = tmp_path / "audio" / "test"
    wav(audio / "Yabc.wav", 1.0, sr=32000)
    wav(audio / "Yxyz.wav", 2.0, sr=32000)
    return audio


def test_audiogrounding_v2_layout(tmp_path):
    audio = grounding_audio(tmp_path)
    label = [
        {
            "audiocap_id": 1,
            "audio_id": "Yxyz.wav",
            "tokens": ["a", "dog", "barks", "and", "a", "man", "speaks"],
            "phrases": [
                {"phrase": "a dog barks", "start_index": 0, "end_index": 2, "segments": [[1.0, 1.5], [0.2, 0.6], [0.5, 0.8]]},
                {"phrase": "a man speaks", "start_index": 4, "end_index": 6, "segments": [[0, 0]]},
            ],
        },
        {
            "audiocap_id": 2,
            "audio_id": "Yabc.wav",
            "tokens": ["birds", "chirp"],
            "phrases": [
                {"phrase": "birds chirp", "start_index": 0, "end_index": 1, "segments": [[0.0, 1.0]]},
            ],
        },
        {
            "audiocap_id": 3,
            "audio_id": "Ygone.wav",
            "tokens": ["rain"],
            "phrases": [
                {"phrase": "rain", "start_index": 0, "end_index": 0, "segments": [[0.0, 1.0]]},
            ],
        },
    ]
    path = write_text(tmp_path / "test.json", json.dumps(label))
    with pytest.warns(UserWarning, match="1 of 3"):
        g = read_audiogrounding(audio_dir=audio, json_path=path)
    assert isinstance(g, GroundingSet) and g.name == "audiogrounding"
    assert g.audio == {"Yabc": str(audio / "Yabc.wav"), "Yxyz": str(audio / "Yxyz.wav")}
    assert g.phrases == {
        "Yabc": [("birds chirp", ((0.0, 1.0),))],
        "Yxyz": [("a dog barks", ((0.2, 0.8), (1.0, 1.5))), ("a man speaks", ())],
    }
    assert g.durations_s == pytest.approx({"Yabc": 1.0, "Yxyz": 2.0})


def test_audiogrounding_v1_records_columns_and_json_lines(tmp_path):
    audio = grounding_audio(tmp_path)
    records = [
        {"audiocap_id": 7, "audio_id": "Yxyz", "phrase": "a dog barks", "start_word": 0, "timestamps": [[0.1, 0.4]]},
        {"audiocap_id": 7, "audio_id": "Yxyz", "phrase": "a man speaks", "start_word": 4, "timestamps": [[0.5, 1.0], [1.0, 1.2]]},
        {"audiocap_id": 8, "audio_id": "Yabc", "phrase": "birds chirp", "start_word": 0, "timestamps": [[0.0, 0.9]]},
    ]
    expected = {
        "Yabc": [("birds chirp", ((0.0, 0.9),))],
        "Yxyz": [("a dog barks", ((0.1, 0.4),)), ("a man speaks", ((0.5, 1.2),))],
    }
    as_list = write_text(tmp_path / "list.json", json.dumps(records))
    as_lines = write_text(tmp_path / "lines.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    columns = {
        "audiocap_id": {str(i): r["audiocap_id"] for i, r in enumerate(records)},
        "filename": {str(i): r["audio_id"] + ".wav" for i, r in enumerate(records)},
        "phrase": {str(i): r["phrase"] for i, r in enumerate(records)},
        "timestamps": {str(i): r["timestamps"] for i, r in enumerate(records)},
    }
    as_columns = write_text(tmp_path / "columns.json", json.dumps(columns))
    for path in (as_list, as_lines, as_columns):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert read_audiogrounding(audio_dir=audio, json_path=path).phrases == expected


def test_audiogrounding_bad_segment_and_bad_line(tmp_path):
    audio = grounding_audio(tmp_path)
    inverted = write_text(
        tmp_path / "inv.json", json.dumps([{"audio_id": "Yabc.wav", "phrase": "x", "timestamps": [[0.1, 0.2], [0.9, 0.3]]}])
    )
    with pytest.raises(BenchmarkError, match=r"inv\.json: item 1, segment 2: offset 0\.3 is before onset 0\.9"):
        read_audiogrounding(audio_dir=audio, json_path=inverted)
    broken = write_text(tmp_path / "broken.jsonl", '{"audio_id": "Yabc", "phrase": "x", "timestamps": []}\n{"audio_id": \n')
    with pytest.raises(BenchmarkError, match=r"broken\.jsonl: line 2: not valid JSON"):
        read_audiogrounding(audio_dir=audio, json_path=broken)


# --- AudioCaps and Clotho ------------------------------------------------------------------


def test_audiocaps_groups_captions_per_clip_and_finds_audio(tmp_path):
    audio = tmp_path / "audiocaps" / "test"
    wav(audio / "YaaaBBBccc1.wav", 1.0)
    sf.write(audio / "104.flac", np.zeros(1600, dtype=np.float32), 16000)
    wav(audio / "zzz.wav", 0.5)
    path = write_csv(
        tmp_path / "test.csv",
        [
            ["audiocap_id", "youtube_id", "start_time", "caption"],
            ["101", "aaaBBBccc1", "30", "A dog barks, then a man speaks"],
            ["102", "dddEEEfff2", "0", "Birds chirp"],
            ["103", "aaaBBBccc1", "30", "A man talks while a dog barks"],
            ["104", "dddEEEfff2", "0", "Chirping birds outdoors"],
            ["105", "zzz", "10", "Rain falls"],
            ["106", "gone", "10", "Nothing here"],
        ],
    )
    with pytest.warns(UserWarning, match="1 of 4"):
        r = read_audiocaps(audio_dir=audio, captions_csv=path)
    assert isinstance(r, RetrievalSet) and r.name == "audiocaps"
    assert r.audio == {
        "aaaBBBccc1": str(audio / "YaaaBBBccc1.wav"),
        "dddEEEfff2": str(audio / "104.flac"),
        "zzz": str(audio / "zzz.wav"),
    }
    assert r.captions == {
        "aaaBBBccc1": ("A dog barks, then a man speaks", "A man talks while a dog barks"),
        "dddEEEfff2": ("Birds chirp", "Chirping birds outdoors"),
        "zzz": ("Rain falls",),
    }


def test_audiocaps_extra_field_names_line(tmp_path):
    wav(tmp_path / "a.wav", 0.5)
    path = write_text(tmp_path / "test.csv", "audiocap_id,youtube_id,start_time,caption\n1,a,0,ok\n2,a,0,a dog, barking\n")
    with pytest.raises(BenchmarkError, match=r"test\.csv: line 3: 5 fields where the header has 4"):
        read_audiocaps(audio_dir=tmp_path, captions_csv=path)


def test_clotho_five_captions_per_clip(tmp_path):
    audio = tmp_path / "evaluation"
    wav(audio / "Forest, birds at dawn.wav", 1.0, sr=44100)
    wav(audio / "city_traffic 02.wav", 0.5, sr=44100)
    captions = [f"forest caption {i}" for i in range(1, 6)]
    path = write_csv(
        tmp_path / "clotho_captions_evaluation.csv",
        [
            ["file_name"] + [f"caption_{i}" for i in range(1, 6)],
            ["city_traffic 02.wav", "cars pass by", "a car honks", "traffic hums", "engines idle", 'a "loud" bus'],
            ["Forest, birds at dawn.wav"] + captions,
        ],
    )
    r = read_clotho(audio_dir=audio, captions_csv=path)
    assert r.name == "clotho"
    assert list(r.audio) == ["Forest, birds at dawn", "city_traffic 02"]
    assert r.audio["city_traffic 02"] == str(audio / "city_traffic 02.wav")
    assert r.captions == {
        "Forest, birds at dawn": tuple(captions),
        "city_traffic 02": ("cars pass by", "a car honks", "traffic hums", "engines idle", 'a "loud" bus'),
    }


# --- ESC-50 and UrbanSound8K ---------------------------------------------------------------


def test_esc50(tmp_path):
    root = tmp_path / "ESC-50-master"
    wav(root / "audio" / "1-100032-A-0.wav", 0.5, sr=44100)
    wav(root / "audio" / "1-115545-C-20.wav", 0.5, sr=44100)
    wav(root / "audio" / "2-102414-A-17.wav", 0.5, sr=44100)
    write_csv(
        root / "meta" / "esc50.csv",
        [
            ["filename", "fold", "target", "category", "esc10", "src_file", "take"],
            ["1-100032-A-0.wav", "1", "0", "dog", "True", "100032", "A"],
            ["1-115545-C-20.wav", "1", "20", "crying_baby", "True", "115545", "C"],
            ["2-102414-A-17.wav", "2", "17", "pouring_water", "False", "102414", "A"],
        ],
    )
    c = read_esc50(root=root)
    assert isinstance(c, ClassificationSet) and c.name == "esc50"
    assert c.audio == {k: str(root / "audio" / f"{k}.wav") for k in ("1-100032-A-0", "1-115545-C-20", "2-102414-A-17")}
    assert c.labels == {"1-100032-A-0": "dog", "1-115545-C-20": "crying_baby", "2-102414-A-17": "pouring_water"}
    assert c.classes == ("crying_baby", "dog", "pouring_water")
    assert c.queries == {"crying_baby": "crying baby", "dog": "dog", "pouring_water": "pouring water"}


def test_us8k(tmp_path):
    root = tmp_path / "UrbanSound8K"
    wav(root / "audio" / "fold1" / "100032-3-0-0.wav", 0.5)
    wav(root / "audio" / "fold5" / "100263-2-0-117.wav", 0.5)
    write_csv(
        root / "metadata" / "UrbanSound8K.csv",
        [
            ["slice_file_name", "fsID", "start", "end", "salience", "fold", "classID", "class"],
            ["100032-3-0-0.wav", "100032", "0.0", "0.317551", "1", "1", "3", "dog_bark"],
            ["100263-2-0-117.wav", "100263", "58.5", "62.5", "1", "5", "2", "children_playing"],
            ["100648-1-0-0.wav", "100648", "4.82", "5.47", "2", "10", "1", "car_horn"],
        ],
    )
    with pytest.warns(UserWarning, match="1 of 3"):
        c = read_us8k(root=root)
    assert c.audio == {
        "100032-3-0-0": str(root / "audio" / "fold1" / "100032-3-0-0.wav"),
        "100263-2-0-117": str(root / "audio" / "fold5" / "100263-2-0-117.wav"),
    }
    assert c.labels == {"100032-3-0-0": "dog_bark", "100263-2-0-117": "children_playing"}
    assert c.classes == ("car_horn", "children_playing", "dog_bark")
    assert c.queries["children_playing"] == "children playing"


def test_us8k_bad_fold(tmp_path):
    root = tmp_path / "UrbanSound8K"
    write_csv(
        root / "metadata" / "UrbanSound8K.csv",
        [
            ["slice_file_name", "fsID", "start", "end", "salience", "fold", "classID", "class"],
            ["1-1-0-0.wav", "1", "0", "1", "1", "x", "3", "dog_bark"],
        ],
    )
    with pytest.raises(BenchmarkError, match=r"UrbanSound8K\.csv: line 2: fold 'x'"):
        read_us8k(root=root)


# --- dispatcher ----------------------------------------------------------------------------


def test_read_benchmark_dispatches(tmp_path):
    audio, events, durations = desed_fixture(tmp_path)
    with pytest.warns(UserWarning):
        s = read_benchmark("desed", audio_dir=str(audio), events_tsv=str(events), durations_tsv=str(durations))
    assert s.ground_truth["a"] == [(0.1, 0.8, "Dog"), (0.2, 0.5, "Speech")]
    assert set(READERS) == {"desed", "urbansed", "audioset_strong", "audiogrounding", "audiocaps", "clotho", "esc50", "us8k"}


def test_read_benchmark_checks_every_path_first(tmp_path):
    missing_durations = tmp_path / "nowhere" / "durations.tsv"
    with pytest.raises(BenchmarkMissing) as info:
        read_benchmark("desed", audio_dir=tmp_path, events_tsv=tmp_path / "public.tsv", durations_tsv=missing_durations)
    assert str(info.value) == (
        f"benchmark desed: {tmp_path / 'public.tsv'} does not exist; set evaluate.benchmarks.desed.events_tsv "
        "to the DESED eval events TSV, or remove the entry"
    )
    with pytest.raises(BenchmarkMissing, match=r"evaluate\.benchmarks\.esc50\.root"):
        read_benchmark("esc50", root=tmp_path / "ESC-50")


def test_read_benchmark_rejects_unknown_kind_and_keys(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"unknown benchmark 'desedd'; known benchmarks: audiocaps, audiogrounding, audioset_strong, clotho, desed, esc50, urbansed, us8k",
    ):
        read_benchmark("desedd", root=tmp_path)
    with pytest.raises(ValueError, match=r"benchmark clotho: unexpected key\(s\) root .*accepted keys: audio_dir, captions_csv"):
        read_benchmark("clotho", root=tmp_path, audio_dir=tmp_path, captions_csv=tmp_path)
    with pytest.raises(ValueError, match=r"benchmark urbansed: missing key\(s\) root .*accepted keys: root, split"):
        read_benchmark("urbansed", split="test")
