"""Scaper-layout libraries read as mix sources: file listing, labels to MIDs, and the analysis
of one event or background file (whole or trimmed, looped, or skipped with the reason)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from pipeline.config.params import AmbienceParams, ClipParams, SoundLibraryParams
from pipeline.mix.scaper_library import (
    LibraryFile,
    analyse_background,
    analyse_event,
    label_class,
    label_folders,
    list_library,
    loop_to,
)
from pipeline.ontology import default_ontology
from pipeline.schema import BackgroundSegment, EventClip, Skip
from tests.conftest import tone_burst

RATE = 16000


def write(path: Path, x: np.ndarray, sr: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, x, sr, subtype="PCM_16")
    return path


def one(root: Path, rel: str) -> LibraryFile:
    return LibraryFile(rel, root / rel, rel.split("/")[0])


def test_listing_takes_the_label_from_the_top_folder_and_reports_loose_files(tmp_path: Path) -> None:
    x = tone_burst(RATE, 0.5, 0.1, 0.4)
    for rel in ("siren/a.wav", "siren/deeper/b.flac", "car_horn/c.WAV", "loose.wav", ".hidden/d.wav", "siren/notes.txt"):
        if rel.endswith(".txt"):
            (tmp_path / rel).write_text("not audio")
        else:
            write(tmp_path / rel, x, RATE)
    (tmp_path / "empty_label").mkdir()
    files, skips = list_library(tmp_path, ("wav", "flac"))
    assert [(f.rel_path, f.label) for f in files] == [
        ("car_horn/c.WAV", "car_horn"),
        ("siren/a.wav", "siren"),
        ("siren/deeper/b.flac", "siren"),
    ]
    assert [(s.path, s.reason) for s in skips] == [("loose.wav", "no-label")]
    assert label_folders(tmp_path, ("wav", "flac")) == ["car_horn", "siren"]
    assert label_folders(tmp_path / "nothing", ("wav",)) == []
    assert len({f.item_id for f in files}) == 3 and all("/" not in f.item_id for f in files)


def test_labels_match_audioset_names_ignoring_case_and_underscores() -> None:
    ontology = default_ontology()
    siren = next(c for c in ontology.by_mid.values() if c.name == "Siren")
    voice = next(c for c in ontology.by_mid.values() if c.name == "Human voice")
    assert label_class("SIREN", ontology) == (siren.mid, "Siren")
    assert label_class("human_voice", ontology) == (voice.mid, "Human voice")
    assert label_class("car_horn", ontology) == ("", "car horn")  # AudioSet says "Vehicle horn, car horn, honking"


def test_an_event_file_is_used_whole_downmixed_and_resampled(tmp_path: Path) -> None:
    burst = tone_burst(44100, 1.5, 0.5, 1.0, seed=1)
    write(tmp_path / "siren/a.wav", np.stack([burst, burst], axis=1), 44100)
    clip = ClipParams()
    r = analyse_event(
        one(tmp_path, "siren/a.wav"), SoundLibraryParams(license="CC0"), clip, RATE, tmp_path / "out", "/m/x", "Siren"
    )
    assert isinstance(r, EventClip)
    assert (r.onset_in_source_s, r.offset_in_source_s) == (0.0, 1.5)
    assert (r.num_samples, r.sample_rate_hz, r.source_sample_rate_hz, r.source_channels) == (24000, RATE, 44100, 2)
    assert (r.label, r.mid, r.source_path, r.source_split, r.license) == ("siren", "/m/x", "siren/a.wav", "", "CC0")
    stored, sr = sf.read(tmp_path / "out" / Path(r.audio_path).name, dtype="int16")
    assert sr == RATE and stored.shape == (24000,)
    assert len(r.envelope_db) > 0 and r.envelope_hop_s == pytest.approx(clip.envelope_hop_s)

    trimmed = analyse_event(
        one(tmp_path, "siren/a.wav"), SoundLibraryParams(trim_events=True), clip, RATE, tmp_path / "out2", "", "siren"
    )
    assert isinstance(trimmed, EventClip)
    assert trimmed.onset_in_source_s == pytest.approx(0.5, abs=0.04) and trimmed.offset_in_source_s == pytest.approx(
        1.0, abs=0.04
    )
    assert trimmed.license == "unknown"


def test_bad_event_files_are_skipped_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "siren").mkdir()
    (tmp_path / "siren/corrupt.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk" * 8)
    write(tmp_path / "siren/silent.wav", np.zeros(RATE, np.float32), RATE)
    write(tmp_path / "siren/clipped.wav", np.sign(tone_burst(RATE, 1.0, 0.0, 1.0)).astype(np.float32), RATE)
    write(tmp_path / "siren/short.wav", tone_burst(RATE, 0.02, 0.0, 0.02), RATE)
    write(tmp_path / "siren/long.wav", tone_burst(RATE, 3.0, 0.0, 3.0), RATE)
    lib = SoundLibraryParams(max_event_s=2.0)
    reasons = {}
    for name in ("corrupt", "silent", "clipped", "short", "long"):
        r = analyse_event(one(tmp_path, f"siren/{name}.wav"), lib, ClipParams(), RATE, tmp_path / "out", "", "siren")
        assert isinstance(r, Skip) and r.path == f"siren/{name}.wav"
        reasons[name] = r.reason
    assert reasons == {
        "corrupt": "unreadable",
        "silent": "silent",
        "clipped": "clipped",
        "short": "too-short",
        "long": "too-long",
    }
    assert not list((tmp_path / "out").glob("*.flac"))


def test_a_short_background_is_looped_to_the_mixture_length_and_a_long_one_kept_whole(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    noise = (0.05 * rng.standard_normal(int(2.5 * 44100))).astype(np.float32)
    write(tmp_path / "park/short.wav", np.stack([noise, noise], axis=1), 44100)
    write(tmp_path / "street/long.wav", (0.05 * rng.standard_normal(6 * RATE)).astype(np.float32), RATE)
    write(tmp_path / "street/silent.wav", np.zeros(6 * RATE, np.float32), RATE)
    amb = AmbienceParams()
    short = analyse_background(one(tmp_path, "park/short.wav"), amb, RATE, 4.0, tmp_path / "out", "")
    long = analyse_background(one(tmp_path, "street/long.wav"), amb, RATE, 4.0, tmp_path / "out", "CC-BY")
    silent = analyse_background(one(tmp_path, "street/silent.wav"), amb, RATE, 4.0, tmp_path / "out", "")
    assert isinstance(short, BackgroundSegment) and isinstance(long, BackgroundSegment)
    assert (short.num_samples, short.category, short.source_channels) == (4 * RATE, "park", 2)
    assert (long.num_samples, long.category, long.license) == (6 * RATE, "street", "CC-BY")
    q, _ = sf.read(tmp_path / "out" / Path(short.audio_path).name, dtype="int16")
    period = int(round(2.5 * RATE))
    np.testing.assert_array_equal(q[period:], q[: q.shape[0] - period])  # the loop repeats the file
    assert isinstance(silent, Skip) and silent.reason == "silent"
    np.testing.assert_array_equal(loop_to(np.arange(3), 7), [0, 1, 2, 0, 1, 2, 0])


def test_params_reject_library_limits_that_keep_nothing() -> None:
    from pipeline.config.params import ParamsError
    from tests.conftest import ROOT
    from trainer.config import load_params

    assert load_params(ROOT / "params.yaml", {"mix": {"library": {"max_event_s": 5.0}}}).mix.library.max_event_s == 5.0
    with pytest.raises(ParamsError, match="mix.library.max_event_s"):
        load_params(ROOT / "params.yaml", {"mix": {"library": {"min_event_s": 2.0, "max_event_s": 1.0}}})
    with pytest.raises(ParamsError, match="mix.library.extensions"):
        load_params(ROOT / "params.yaml", {"mix": {"library": {"extensions": []}}})


def test_a_label_folder_with_a_tab_or_line_break_is_skipped_and_named(tmp_path: Path) -> None:
    x = tone_burst(RATE, 0.5, 0.1, 0.4)
    for rel in ("car\thorn/a.wav", "car\thorn/b.wav", "dog\nbark/c.wav", "siren/d.wav"):
        write(tmp_path / rel, x, RATE)
    files, skips = list_library(tmp_path, ("wav",))
    assert [f.label for f in files] == ["siren"]
    assert [(s.item_id, s.path, s.reason) for s in skips] == [
        ("car\\thorn", "car\\thorn", "bad-label"),
        ("dog\\nbark", "dog\\nbark", "bad-label"),
    ]
    assert "the label folder 'car\\thorn' has a tab, line break" in skips[0].detail and "rename the folder" in skips[0].detail
    assert all("\t" not in s.detail and "\n" not in s.detail for s in skips)
