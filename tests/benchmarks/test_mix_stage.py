"""``sedsynth bench mix`` states how the rate scales from 1 to 2 workers, against its targets."""

from __future__ import annotations

import shutil
from collections import namedtuple

from benchmarks.mix_stage import floor_inputs, floor_pass, keep_or_remove, print_figures, storing_pass

Usage = namedtuple("Usage", "total used free")


def test_the_report_states_the_two_worker_ratio_and_the_100k_time(capsys) -> None:
    run = {"seconds": 10.0, "mixtures_per_s": 100.0, "mixtures_per_s_per_core": 100.0, "peak_rss_mib": 300.0}
    two = {**run, "seconds": 5.4, "mixtures_per_s": 185.0, "mixtures_per_s_per_core": 92.5}
    print_figures(
        {
            "mixtures": 1000,
            "preset": "finelap",
            "runs": {1: run, 2: two},
            "scaper": {"mixtures": 0, "seconds": 0.0, "mixtures_per_s": 0.0},
        }
    )
    out = capsys.readouterr().out
    assert "2 workers / 1 worker: 1.85x the rate (target >= 1.8x)" in out
    assert "100k mixtures on 2 workers at this rate: 9.0 min (target <= 6)" in out


def test_repeated_passes_report_the_best_and_list_every_pass(capsys) -> None:
    one = {
        "seconds": 9.0,
        "mixtures_per_s": 111.1,
        "mixtures_per_s_per_core": 111.1,
        "peak_rss_mib": 300.0,
        "pass_seconds": [10.0, 9.0],
    }
    two = {
        "seconds": 5.0,
        "mixtures_per_s": 200.0,
        "mixtures_per_s_per_core": 100.0,
        "peak_rss_mib": 700.0,
        "pass_seconds": [5.0, 5.6],
    }
    print_figures({"mixtures": 1000, "preset": "finelap", "repeat": 2, "runs": {1: one, 2: two}, "scaper": {"mixtures": 0}})
    out = capsys.readouterr().out
    assert "(best of 2 interleaved passes)" in out
    assert "(passes: 10.0, 9.0 s)" in out and "(passes: 5.0, 5.6 s)" in out
    assert "2 workers / 1 worker: 1.80x the rate" in out


def test_the_report_states_the_floor_and_the_stage_share_of_it(capsys) -> None:
    one = {"seconds": 10.0, "mixtures_per_s": 300.0, "mixtures_per_s_per_core": 300.0, "peak_rss_mib": 300.0}
    floor = {"seconds": 5.0, "mixtures_per_s": 400.0, "arithmetic_ms": 0.2, "encode_ms": 2.3}
    print_figures(
        {
            "mixtures": 1000,
            "preset": "finelap",
            "runs": {1: one},
            "floor": floor,
            "scaper": {"mixtures": 100, "seconds": 4.0, "mixtures_per_s": 25.0},
        }
    )
    out = capsys.readouterr().out
    assert "stage / floor (1 worker): 0.75 of the floor's rate (target >= 0.7)" in out
    assert "arithmetic 0.20 ms + FLAC 2.30 ms per mixture; stage 3.33 ms" in out
    assert "ratio per core: 12.0x Scaper (target >= 12x)" in out
    assert "storing" not in out  # not measured: no line
    print_figures({"mixtures": 1000, "preset": "finelap", "runs": {1: one}, "floor": floor, "storing_ms": 0.5})
    assert "the stage's 3.33 ms = floor 2.50 + storing 0.50 + the rest 0.33 (drawing" in capsys.readouterr().out
    two = dict(one, mixtures_per_s=600.0)  # only 2 workers timed: the share is per core, and says so
    print_figures({"mixtures": 1000, "preset": "finelap", "runs": {2: two}, "floor": floor})
    assert "stage / floor (2 workers, per core): 0.75 of the floor's rate" in capsys.readouterr().out


def test_the_floor_encodes_the_stage_s_own_bytes(mixed) -> None:
    _, mix_dir, events_dir, backgrounds_dir = mixed
    inputs = floor_inputs(mix_dir, events_dir, backgrounds_dir)  # raises if a re-rendered mixture's FLAC differs from the file
    assert len(inputs.mixtures) == len(list(mix_dir.glob("audio/*/*.flac")))
    arithmetic, encode = floor_pass(inputs)
    assert arithmetic > 0 and encode > 0


def test_storing_writes_the_stage_s_files_again_byte_for_byte(mixed, tmp_path) -> None:
    _, mix_dir, _, _ = mixed
    stored = sorted(mix_dir.glob("audio/*/*.flac"))
    seconds, files = storing_pass(mix_dir, tmp_path / "stored", limit=3)
    assert files == 3 and seconds > 0
    assert [p.read_bytes() for p in sorted((tmp_path / "stored").iterdir())] == [p.read_bytes() for p in stored[:3]]
    assert storing_pass(mix_dir, tmp_path / "all")[1] == len(stored)


def test_passes_are_kept_while_the_disk_holds_them_else_only_the_newest(tmp_path, monkeypatch, capsys) -> None:
    kept = []
    for name in ("mix-1-0", "mix-2-0", "mix-1-1"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.flac").write_bytes(b"x" * 1000)
        kept.append(tmp_path / name)
    assert keep_or_remove(kept, tmp_path) is False  # removing files right before a pass slows its file creation
    assert all(p.exists() for p in kept)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(2**31, 2**31 - 2**30, 2**30))  # no room for two more
    assert keep_or_remove(kept[:1], tmp_path) is False  # a single pass: nothing to remove
    assert keep_or_remove(kept, tmp_path) is True
    assert kept == [tmp_path / "mix-1-1"] and not (tmp_path / "mix-1-0").exists() and not (tmp_path / "mix-2-0").exists()
    one = {"seconds": 1.0, "mixtures_per_s": 10.0, "mixtures_per_s_per_core": 10.0, "peak_rss_mib": 1.0}
    print_figures({"mixtures": 10, "preset": "finelap", "runs": {1: one}, "removed_between_passes": True})
    assert "passes were removed between them" in capsys.readouterr().out


def test_the_profile_splits_a_pass_into_parts_that_add_up_and_leaves_the_stage_as_it_was(mixed, tmp_path) -> None:
    import pipeline.mix.instantiate as instantiate
    from benchmarks.mix_stage import PARTS, profile_pass
    from pipeline.stages.mix import run

    params, mix_dir, events_dir, backgrounds_dir = mixed
    before = {name: getattr(instantiate, name) for name in ("draw_mixture", "_render", "relabel_mixture")}
    n = sum(getattr(params.mix.mixtures, s) for s in ("train", "valid", "test"))
    rows = profile_pass(run, params, events_dir, backgrounds_dir, tmp_path / "out", n)
    assert {name: getattr(instantiate, name) for name in before} == before  # every wrapped function restored
    ms = {part: value for _, part, value in rows}
    assert {part for _, _, part, _ in PARTS} <= set(ms) and all(
        ms[p] > 0 for p in ("FLAC encode", "relabeling", "drawing (RNG, placement, levels, recipe)")
    )
    partition_parts = [value for depth, part, value in rows if depth == 2]
    assert abs(sum(partition_parts) - ms["partitions (every mixture's work)"]) < 1e-9  # the rest closes the sum
    assert sorted(p.name for p in (tmp_path / "out" / "audio").rglob("*.flac")) == sorted(
        p.name for p in (mix_dir / "audio").rglob("*.flac")
    )
