"""``sedsynth bench mixing`` runs the Scaper peer on the folders its mixing source reads, as many
mixtures as it makes, and states both ratios and what each side writes; without Scaper, one line says so."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from benchmarks.dynamic_mixing import bench_dynamic_mixing, print_figures
from benchmarks.mix_stage import NO_SCAPER, find_scaper_python
from tests.conftest import tiny_train_params

FIGURES = {
    "rows": 200,
    "encoder": "small",
    "sample_rate_hz": 16000,
    "shards_cold_items_per_s": 300.0,
    "shards_warm_items_per_s": 400.0,
    "mixing_cold_items_per_s": 200.0,
    "mixing_warm_items_per_s": 600.0,
    "mixing_warm_passes": [580.0, 600.0],
    "mixing_open_s": 0.5,
    "shard_audio_bytes": 43 * 2**20,
    "ratio_warm_mixing_to_shards": 1.5,
    "augmented_warm_items_per_s": {"reverb": 170.0, "pitch/stretch": 7.0},
}


def test_the_report_states_scaper_s_rate_both_ratios_and_what_each_side_writes(capsys) -> None:
    print_figures(
        {
            **FIGURES,
            "scaper": {"mixtures": 200, "seconds": 8.0, "mixtures_per_s": 25.0},
            "scaper_passes": [25.0, 22.2],
            "ratio_warm_mixing_to_scaper": 24.0,
            "ratio_cold_mixing_to_scaper": 8.0,
        }
    )
    out = capsys.readouterr().out
    assert "best of 2 interleaved rounds" in out and "(passes: 580.0, 600.0)" in out
    assert "Scaper 1.6.5 (1 process, 1 core)           25.0 mixtures/s" in out
    assert (
        "200 mixtures in 8.0 s, each written as WAV + JAMS + txt (the mixing source writes nothing)  (passes: 25.0, 22.2)" in out
    )
    assert "mixing warm / Scaper (per core)            24.0x  (target >= 20x; round by round: 23.2x, 27.0x)" in out
    assert "mixing cold / Scaper (per core)             8.0x" in out


def test_without_a_scaper_environment_one_line_says_the_peer_did_not_run(capsys) -> None:
    print_figures(FIGURES)
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"  {NO_SCAPER}" and "mixtures/s" not in out


def test_the_scaper_python_is_the_flag_else_the_default_environment_if_present(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert find_scaper_python(None) is None
    with pytest.raises(FileNotFoundError, match="no such file; make Scaper's environment"):
        find_scaper_python("/opt/scaper/bin/python")
    (tmp_path / ".venv-scaper/bin").mkdir(parents=True)
    (tmp_path / ".venv-scaper/bin/python").touch()
    assert find_scaper_python(None) == ".venv-scaper/bin/python"
    assert find_scaper_python(str(tmp_path / ".venv-scaper/bin/python")) == str(tmp_path / ".venv-scaper/bin/python")


def test_scaper_mixes_as_many_mixtures_from_the_mixing_source_s_folders(mixed, shard_folder, tmp_path, monkeypatch) -> None:
    """A stand-in for Scaper's python records the peer's config and reports a time (0.5 s, then 0.25 s); the bench
    runs for real on tiny data, two rounds, without its reverb and pitch/stretch passes (seconds of Rubber Band
    that test nothing here). The best of each side's passes is kept."""
    params, folder = shard_folder
    _, _, events, backgrounds = mixed
    p = tiny_train_params(params, folder, tmp_path / "run")
    p = replace(p, mix=replace(p.mix, events=str(events), backgrounds=str(backgrounds)))
    stand_in = tmp_path / "python"
    calls = tmp_path / "calls"
    stand_in.write_text(
        f"#!/bin/sh\ncp \"$2\" '{tmp_path / 'config.json'}'\necho x >> '{calls}'\n"
        f"if [ $(wc -l < '{calls}') -eq 1 ]; then s=0.5; else s=0.25; fi\n"
        'echo "{\\"mixtures\\": 4, \\"seconds\\": $s}"\n'
    )
    stand_in.chmod(0o755)
    monkeypatch.setattr("benchmarks.dynamic_mixing.AUGMENTED", {})
    f = bench_dynamic_mixing(p, rows=4, scaper_python=str(stand_in), repeat=2)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["mixtures"] == f["mixed_rows"] == 4
    assert config["events"] and all(path.startswith(f"{events.resolve()}/") for _, path, _ in config["events"])
    assert config["backgrounds"] and all(path.startswith(f"{backgrounds.resolve()}/") for path in config["backgrounds"])
    assert calls.read_text().count("x") == 2 and f["scaper_passes"] == [8.0, 16.0] and f["scaper"]["mixtures_per_s"] == 16.0
    assert len(f["mixing_warm_passes"]) == 2 and f["mixing_warm_items_per_s"] == max(f["mixing_warm_passes"])
    assert f["ratio_warm_mixing_to_scaper"] == f["mixing_warm_items_per_s"] / 16.0
    assert f["ratio_cold_mixing_to_scaper"] == f["mixing_cold_items_per_s"] / 16.0
