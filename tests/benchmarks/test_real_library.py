"""``sedsynth bench real-library``: the Debian packages' sounds sorted into a Scaper-layout library by
the class table, and the default recipe run on it with only its folders moved."""

from __future__ import annotations

import csv
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from benchmarks.real_library import (
    BACKGROUND,
    FOREGROUND,
    FREEDESKTOP,
    MIN_FILES,
    WESNOTH,
    NoSoundsError,
    build_library,
    library_params,
    print_figures,
    run,
)
from pipeline.outputs import OutDirError
from tests.conftest import debug_params, tone_burst

AMBIENT = WESNOTH + "/ambient"


def write_sound(path: Path, seconds: float, freq_hz: float, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    x = tone_burst(16000, seconds, 0.05, 0.6 * seconds, level_dbfs=-16.0, freq_hz=freq_hz, seed=seed)
    fmt = {".wav": "WAV", ".ogg": "OGG", ".oga": "OGG"}[path.suffix]
    sf.write(path, x, 16000, format=fmt, subtype="PCM_16" if fmt == "WAV" else "VORBIS")


def write_sounds(root: Path) -> Path:
    """The packages' folders in miniature: 3 classes of 5 files, a class of 4 (too few), a file no
    class takes, a link, and 3 ambient recordings."""
    k = 0
    for i in range(1, 6):
        write_sound(root / WESNOTH / f"wolf-hit-{i}.ogg", 0.5, 300.0 + 20 * i, k := k + 1)
        write_sound(root / WESNOTH / f"throw-{i}.wav", 0.4, 1800.0 + 50 * i, k := k + 1)
    for name in ("front-left", "front-right", "rear-left", "rear-right", "side-left"):
        write_sound(root / FREEDESKTOP / f"audio-channel-{name}.oga", 0.6, 700.0, k := k + 1)
    for name in ("hiss", "hiss-big", "hiss-die", "hiss-hit"):
        write_sound(root / WESNOTH / f"{name}.wav", 0.5, 3000.0, k := k + 1)
    write_sound(root / WESNOTH / "gold.ogg", 0.3, 2500.0, k := k + 1)
    os.symlink(root / WESNOTH / "wolf-hit-1.ogg", root / WESNOTH / "wolf-die-1.ogg")
    rng = np.random.default_rng(3)
    for name in ("birds1", "campfire", "night"):
        path = root / AMBIENT / f"{name}.ogg"
        path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(path, (0.02 * rng.standard_normal(16000 * 3)).astype(np.float32), 16000, format="OGG", subtype="VORBIS")
    return root


def test_the_class_table_sorts_the_packages_into_a_scaper_library(tmp_path: Path) -> None:
    sounds = write_sounds(tmp_path / "sounds")
    built = build_library(sounds, tmp_path / "library")
    lib = tmp_path / "library"
    assert sorted(p.name for p in (lib / "foreground").iterdir()) == ["speech", "whoosh", "wolf"]
    assert sorted(p.name for p in (lib / "foreground" / "wolf").iterdir()) == [f"wolf-hit-{i}.ogg" for i in range(1, 6)]
    assert not any(p.is_symlink() for p in lib.rglob("*"))  # the link was not followed, nor copied
    assert sorted(p.name for p in (lib / "background").iterdir()) == ["birds", "campfire", "night"]
    assert {k: len(v) for k, v in built["left_out"].items()} == {"hiss": 4}
    with (lib / "unused.csv").open() as f:
        unused = {r["path"]: r["reason"] for r in csv.DictReader(f)}
    assert unused[f"{WESNOTH}/gold.ogg"] == "no class"
    assert unused[f"{WESNOTH}/hiss.wav"] == f"class hiss: 4 files, fewer than {MIN_FILES}"
    # a second build replaces the library whole
    (sounds / WESNOTH / "throw-5.wav").unlink()
    build_library(sounds, lib)
    assert not (lib / "foreground" / "whoosh").exists() and (lib / "foreground" / "wolf").is_dir()


def test_a_folder_without_the_packages_is_one_line_saying_how_to_unpack_them(tmp_path: Path) -> None:
    with pytest.raises(NoSoundsError, match=r"apt-get download wesnoth-1.16-data.*dpkg -x"):
        build_library(tmp_path, tmp_path / "library")
    assert not (tmp_path / "library").exists()


def test_the_run_writes_nowhere_it_should_not(tmp_path: Path) -> None:
    sounds = write_sounds(tmp_path / "sounds")
    for out, why in (("/", "filesystem root"), (str(sounds / "run"), "--sounds"), (str(tmp_path), "--sounds")):
        with pytest.raises(OutDirError, match=why):
            run(debug_params(), sounds, Path(out))
    with pytest.raises(NoSoundsError):
        run(debug_params(), tmp_path / "nothing", tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_every_class_pattern_names_one_folder_and_labels_are_folder_names() -> None:
    for label, (folder, _) in {**FOREGROUND, **BACKGROUND}.items():
        assert label.replace("_", "").isalnum() and label == label.lower(), label
        assert folder.startswith("usr/share/"), folder


def test_only_the_folders_move_the_recipe_stays(tmp_path: Path) -> None:
    params = debug_params()
    p = library_params(params, tmp_path / "library", tmp_path / "run")
    assert p.mix.events == str(tmp_path / "library" / "foreground") and "unknown" in p.mix.allowed_licenses
    for section in ("mix", "captions", "clusters", "shards", "train", "evaluate"):
        assert getattr(p, section).out_dir.startswith(str(tmp_path / "run")), section
    assert p.mix.spec == params.mix.spec and p.mix.holdout == params.mix.holdout and p.mix.mixtures == params.mix.mixtures
    assert p.train.optim == params.train.optim and p.train.model == params.train.model and p.train.loss == params.train.loss
    assert replace(p.evaluate, checkpoint="", shards="", event_clips="", out_dir="", benchmarks={}) == replace(
        params.evaluate, checkpoint="", shards="", event_clips="", out_dir="", benchmarks={}
    )


def test_the_recipe_runs_on_the_library_and_prints_the_table(tmp_path: Path, capsys) -> None:
    sounds = write_sounds(tmp_path / "sounds")
    params = debug_params()
    params = replace(params, evaluate=replace(params.evaluate, device="cpu", probe_steps=10, probe_clips=16, pictures=0))
    figures = run(params, sounds, tmp_path / "run")
    assert figures["library"] == {"classes": 3, "event_files": 15, "background_files": 3}
    assert set(figures["per_class"]) == {"speech", "whoosh", "wolf"}
    for model in ("trained", "untrained"):
        assert 0.0 <= figures[model]["psds1"] <= 1.0 and 0.0 <= figures[model]["auroc"] <= 1.0
    assert list(figures["minutes"]) == ["mix", "captions", "clusters", "shards", "train", "evaluate"]
    print_figures(figures, None)
    printed = capsys.readouterr().out
    assert "3 classes, 15 event files, 3 background files" in printed and "wolf" in printed
