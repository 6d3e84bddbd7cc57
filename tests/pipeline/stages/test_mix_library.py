"""The mix stage on a Scaper-layout library (``foreground/<label>/*.wav``, ``background/<label>/*.wav``,
as in Scaper's tests/data/audio): mixed directly, bad files reported, the analysed sources kept
in the output, same bytes for any worker count, then captions, clusters and shards on top."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from pipeline.config.params import ComputeParams, HoldoutFractions, MixtureCounts, SoundLibraryParams
from pipeline.mix.bank import FileSources
from pipeline.mix.render import render
from pipeline.mix.sources import SOURCES, MixError
from pipeline.schema import BackgroundSegment, EventClip, EventOccurrence, MixtureRecipe, from_table
from pipeline.stages.mix import run
from tests.conftest import ROOT, tone_burst, tree_digest
from trainer.config import Params

LABELS = {"car_horn": 500.0, "human_voice": 220.0, "siren": 900.0}


def write_library(root: Path) -> Path:
    """Scaper's test library in miniature: 3 labels x 3 events (16 kHz mono and 44.1 kHz stereo),
    2 background labels x 2 recordings (one shorter than a mixture), one corrupt and one silent file."""
    rng = np.random.default_rng(5)
    for k, (label, freq) in enumerate(LABELS.items()):
        for i in range(3):
            sr = 16000 if i % 2 == 0 else 44100
            x = tone_burst(
                sr, 0.6 + 0.3 * i, 0.05, 0.5 + 0.3 * i, level_dbfs=-14.0, freq_hz=freq * (1 + 0.1 * i), seed=10 * k + i
            )
            path = root / "foreground" / label / f"{label}{i}.wav"
            path.parent.mkdir(parents=True, exist_ok=True)
            sf.write(path, x if sr == 16000 else np.stack([x, 0.8 * x], axis=1), sr, subtype="PCM_16")
    (root / "foreground/siren/broken.wav").write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(16))
    sf.write(root / "foreground/human_voice/quiet.wav", np.zeros(16000, np.float32), 16000, subtype="PCM_16")
    for label, lengths in (("park", (5.0, 2.5)), ("street", (6.0, 4.5))):
        for i, seconds in enumerate(lengths):
            x = (0.03 * rng.standard_normal(int(seconds * 44100))).astype(np.float32)
            path = root / "background" / label / f"{label}{i}.wav"
            path.parent.mkdir(parents=True, exist_ok=True)
            sf.write(path, np.stack([x, x], axis=1), 44100, subtype="PCM_16")
    return root


def library_params(root: Path, workers: int = 1) -> Params:
    p = Params()
    mix = replace(
        p.mix,
        events=str(root / "foreground"),
        backgrounds=str(root / "background"),
        mixtures=MixtureCounts(train=6, valid=4, test=4),
        partition_size=4,
        holdout=HoldoutFractions(0.4, 0.3, 0.3),
        spec={"duration_s": ["const", 4.0], "events_per_mixture": ["choose", [1, 2]]},
        library=SoundLibraryParams(license="CC-BY"),
        export=replace(p.mix.export, timelines=1),
    )
    return replace(p, compute=ComputeParams(workers=workers, chunk_size=1), mix=mix)


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    return write_library(tmp_path_factory.mktemp("scaper-library"))


@pytest.fixture(scope="module")
def mixed_library(library: Path, tmp_path_factory) -> tuple[Params, Path]:
    out = tmp_path_factory.mktemp("library-mix") / "mixtures"
    params = replace(library_params(library), mix=replace(library_params(library).mix, out_dir=str(out)))
    run(params)
    return params, out


def test_a_library_mixes_directly_with_relabeled_boundaries(library: Path, mixed_library) -> None:
    _, out = mixed_library
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mixtures_by_split"] == {"train": 6, "valid": 4, "test": 4}
    assert summary["libraries"]["events"] == {"root": str(library / "foreground"), "kept": 9, "skipped": 2}
    assert summary["libraries"]["backgrounds"]["kept"] == 4
    segments = pq.read_table(out / "segments.parquet").to_pylist()
    assert segments and {s["label"] for s in segments} <= set(LABELS)
    assert all(0.0 <= s["onset_s"] < s["offset_s"] <= 4.0 for s in segments)
    events = from_table(pq.read_table(out / SOURCES / "events" / "manifest.parquet"), EventClip)
    backgrounds = from_table(pq.read_table(out / SOURCES / "backgrounds" / "manifest.parquet"), BackgroundSegment)
    assert all(
        (library / "foreground" / e.source_path).is_file() and (out / SOURCES / "events" / e.audio_path).is_file() for e in events
    )
    assert {e.label: e.mid != "" for e in events} == {"car_horn": False, "human_voice": True, "siren": True}
    assert {b.category for b in backgrounds} == {"park", "street"} and min(
        b.duration_s for b in backgrounds
    ) == 4.0  # the 2.5 s one, looped
    assert not (out.parent / f".{out.name}.{SOURCES}").exists()


def test_the_skip_report_names_the_bad_files(mixed_library) -> None:
    _, out = mixed_library
    rows = (out / "skipped.csv").read_text().splitlines()
    found = {line.split(",")[1]: line.split(",")[2] for line in rows[1:]}
    assert found == {"siren/broken.wav": "unreadable", "human_voice/quiet.wav": "silent"}


def test_library_splits_are_disjoint_by_file_and_recipes_re_render(mixed_library) -> None:
    _, out = mixed_library
    mixtures = from_table(pq.read_table(out / "mixtures.parquet"), MixtureRecipe)
    occurrences = from_table(pq.read_table(out / "occurrences.parquet"), EventOccurrence)
    split_of = {m.mixture_id: m.split for m in mixtures}
    clip_splits: dict[str, set[str]] = {}
    for o in occurrences:
        clip_splits.setdefault(o.clip_id, set()).add(split_of[o.mixture_id])
    assert all(len(s) == 1 for s in clip_splits.values())
    bg_splits: dict[str, set[str]] = {}
    for m in mixtures:
        bg_splits.setdefault(m.background_id, set()).add(m.split)
    assert all(len(s) == 1 for s in bg_splits.values())
    events = from_table(pq.read_table(out / SOURCES / "events" / "manifest.parquet"), EventClip)
    backgrounds = from_table(pq.read_table(out / SOURCES / "backgrounds" / "manifest.parquet"), BackgroundSegment)
    sources = FileSources(
        out / SOURCES / "events",
        out / SOURCES / "backgrounds",
        16000,
        {e.clip_id: e.audio_path for e in events},
        {b.segment_id: b.audio_path for b in backgrounds},
    )
    m = mixtures[0]
    stored, _ = sf.read(out / m.audio_path, dtype="int16")
    np.testing.assert_array_equal(render(m, [o for o in occurrences if o.mixture_id == m.mixture_id], sources), stored)


def test_same_bytes_with_one_and_two_workers(library: Path, mixed_library, tmp_path: Path) -> None:
    _, out = mixed_library
    two = tmp_path / "two"
    run(library_params(library, workers=2), out_dir=two)
    assert tree_digest(two) == tree_digest(out)


def test_a_library_without_unknown_licences_allowed_is_refused_with_the_hint(library: Path, tmp_path: Path) -> None:
    p = library_params(library)
    p = replace(p, mix=replace(p.mix, library=SoundLibraryParams()))
    with pytest.raises(MixError, match="add unknown to mix.allowed_licenses"):
        run(p, out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / f".out.{SOURCES}").exists()


def test_a_folder_with_neither_manifest_nor_labels_names_both_options(library: Path, tmp_path: Path) -> None:
    (tmp_path / "flat").mkdir()
    sf.write(tmp_path / "flat" / "a.wav", np.zeros(100, np.float32), 16000)
    with pytest.raises(FileNotFoundError, match=r"sedsynth clip.*Scaper-layout library"):
        run(library_params(library), events_dir=tmp_path / "flat", out_dir=tmp_path / "out")
    with pytest.raises(FileNotFoundError, match=r"sedsynth ambience.*mix.backgrounds"):
        run(library_params(library), backgrounds_dir=tmp_path / "flat", out_dir=tmp_path / "out")


def test_captions_clusters_and_shards_run_on_a_library_mix(mixed_library, tmp_path: Path) -> None:
    from pipeline.stages import captions, clusters
    from pipeline.stages.shards import run as shards

    params, out = mixed_library
    captions.run(params, out, tmp_path / "captions")
    clusters.run(params, tmp_path / "captions", tmp_path / "clusters")
    shards(params, out, tmp_path / "captions", tmp_path / "clusters", tmp_path / "dataset")
    phrases = pq.read_table(tmp_path / "clusters" / "phrases.parquet").to_pylist()
    horn = [r for r in phrases if r["label"] == "car_horn"]
    assert horn and all(r["mid"] == "" and r["method"] == "sbert" for r in horn)
    rows = [r for f in sorted((tmp_path / "dataset" / "data").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert len(rows) == 14 and {p["label"] for r in rows for p in r["phrases"]} <= set(LABELS)


SCAPER_PYTHON = ROOT / ".venv-scaper" / "bin" / "python"


@pytest.mark.skipif(not SCAPER_PYTHON.exists(), reason="needs Scaper in .venv-scaper (docs/benchmarks.md, Mixing)")
def test_scaper_accepts_the_same_library_folder(library: Path, tmp_path: Path) -> None:
    """Scaper reads its labels from the same folders (it refuses an event label no folder has) and renders from them."""
    script = (
        "import sys, warnings, scaper\n"
        "warnings.filterwarnings('ignore')\n"
        "root, out = sys.argv[1], sys.argv[2]\n"
        "sc = scaper.Scaper(4.0, root + '/foreground', root + '/background', random_state=0)\n"
        "sc.sr = 16000\n"
        "sc.add_background(('const', 'park'), ('const', root + '/background/park/park0.wav'), ('const', 0))\n"
        "for label in ('car_horn', 'human_voice', 'siren'):\n"
        "    sc.add_event(('const', label), ('const', f'{root}/foreground/{label}/{label}1.wav'), ('const', 0), ('uniform', 0, 2),\n"
        "                 ('const', 0.5), ('const', 6), None, None)\n"
        "sc.generate(out + '/s.wav', out + '/s.jams')\n"
    )
    done = subprocess.run(
        [str(SCAPER_PYTHON), "-c", script, str(library), str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "s.wav").exists()


def test_a_library_file_below_the_mixing_rate_is_skipped_and_named(tmp_path: Path) -> None:
    root = write_library(tmp_path / "lib")
    sf.write(root / "foreground/siren/narrow.wav", tone_burst(8000, 0.8, 0.1, 0.7), 8000, subtype="PCM_16")
    run(library_params(root), out_dir=tmp_path / "out")
    skipped = (tmp_path / "out" / "skipped.csv").read_text()
    assert "siren/narrow.wav,low-sample-rate,8000 Hz < sample_rate_hz 16000 Hz" in skipped
    events = from_table(pq.read_table(tmp_path / "out" / SOURCES / "events" / "manifest.parquet"), EventClip)
    assert "siren/narrow.wav" not in {e.source_path for e in events} and events


def test_a_library_all_below_the_mixing_rate_stops_the_run(tmp_path: Path) -> None:
    root = tmp_path / "lib"
    write_library(root)
    for path in (root / "foreground").rglob("*.wav"):
        sf.write(path, tone_burst(8000, 0.8, 0.1, 0.7), 8000, subtype="PCM_16")
    with pytest.raises(MixError, match=r"events files .* and no other usable one, have a lower rate.* must not upsample"):
        run(library_params(root), out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / f".out.{SOURCES}").exists()


def test_audio_of_an_unlisted_extension_is_reported_not_passed_over(tmp_path: Path) -> None:
    root = write_library(tmp_path / "lib")
    sf.write(root / "foreground/siren/voice.oga", tone_burst(16000, 0.8, 0.1, 0.7), 16000, format="OGG", subtype="VORBIS")
    (root / "foreground/siren/notes.txt").write_text("not audio")
    p = library_params(root)
    p = replace(p, mix=replace(p.mix, library=replace(p.mix.library, extensions=("wav",))))
    run(p, out_dir=tmp_path / "out")
    skipped = (tmp_path / "out" / "skipped.csv").read_text()
    assert "siren/voice.oga,other-extension,.oga is not in mix.library.extensions [wav]" in skipped
    assert "notes.txt" not in skipped
    run(library_params(root), out_dir=tmp_path / "default")  # the default extensions read .oga
    events = from_table(pq.read_table(tmp_path / "default" / SOURCES / "events" / "manifest.parquet"), EventClip)
    assert "siren/voice.oga" in {e.source_path for e in events}


def test_jams_exports_point_at_the_sources_kept_in_the_output(library: Path, tmp_path: Path) -> None:
    pytest.importorskip("jams")
    p = library_params(library)
    p = replace(
        p,
        mix=replace(
            p.mix, mixtures=MixtureCounts(train=2, valid=0, test=0), export=replace(p.mix.export, jams=True, timelines=0)
        ),
    )
    run(p, out_dir=tmp_path / "out")
    doc = json.loads(next((tmp_path / "out" / "audio" / "train").glob("*.jams")).read_text())["annotations"][0]
    assert doc["sandbox"]["scaper"]["fg_path"] == str((tmp_path / "out" / SOURCES / "events" / "audio").resolve())
    assert all(Path(x["value"]["source_file"]).is_file() for x in doc["data"])
