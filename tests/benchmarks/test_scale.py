"""``sedsynth bench scale`` runs each stage as its own process at each size and writes its table, CSV and picture."""

from __future__ import annotations

import csv

import pytest

from benchmarks.scale import COLUMNS, FULL_CLIPS, free_after, mixture_counts, overrides, parse_sizes, stage_folders
from sedsynth.cli import build_parser, main
from trainer.config import load_params


def test_sizes_are_clip_counts_and_full_is_fsd50k() -> None:
    assert parse_sizes("10000,1000,1000") == [1000, 10000]
    assert parse_sizes("full") == [FULL_CLIPS]
    with pytest.raises(ValueError, match="--sizes"):
        parse_sizes("1k")


def test_mixtures_scale_to_100k_at_full_size_in_the_params_proportions() -> None:
    shares = {"train": 1600, "valid": 100, "test": 250}
    full = mixture_counts(FULL_CLIPS, shares)
    assert sum(full.values()) == 100_000
    assert full["valid"] == round(100_000 * 100 / 1950)
    assert sum(mixture_counts(1000, shares).values()) == round(100_000 * 1000 / FULL_CLIPS)


def test_a_tiny_run_prints_the_table_and_writes_scale_csv_and_png(tmp_path, capsys) -> None:
    out = tmp_path / "scale"
    status = main(
        [
            "bench",
            "scale",
            "--sizes",
            "12,24",
            "--stages",
            "corpus",
            "--out",
            str(out),
            "--set",
            "compute.workers=1",
            "--set",
            "corpus.ambience_recordings=8",
        ]
    )
    assert status == 0
    printed = capsys.readouterr().out
    for column in ("stage", "items", "wall s", "CPU s", "CPU/wall", "ms/item", "peak RSS", "anon", "PSS", "max proc", "output"):
        assert column in printed
    assert "growth 12 -> 24 clips" in printed and "load average" in printed
    with open(out / "scale.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == COLUMNS
    assert [(r["size"], r["stage"]) for r in rows] == [("12", "corpus"), ("24", "corpus")]
    assert all(
        float(r["wall_s"]) > 0
        and float(r["cpu_s"]) > 0
        and float(r["peak_rss_mib"]) >= float(r["peak_anon_mib"]) > 0
        and float(r["peak_rss_mib"]) >= float(r["peak_pss_mib"]) > 0
        and int(r["output_bytes"]) > 0
        for r in rows
    )
    assert (out / "scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "24" / "logs" / "corpus.log").exists() and not (out / "24" / "sources").exists()  # data removed, log kept


def test_inputs_go_once_no_later_stage_reads_them(tmp_path) -> None:
    config = overrides(tmp_path, 100, load_params("params.yaml"))
    stages = ("corpus", "clip", "ambience", "mix", "captions", "clusters", "shards")
    for stage in stages:
        for folder in stage_folders(stage, config):
            folder.mkdir(parents=True)
    gone_after = {}
    for stage in stages:
        free_after(stage, config)
        for other in stages:
            if other not in gone_after and not any(f.exists() for f in stage_folders(other, config)):
                gone_after[other] = stage
    # the corpus outlives its readers (clip, ambience) until mix has written; the mixtures go after shards
    assert gone_after == {"corpus": "mix", "mix": "shards"}


def test_an_unknown_stage_is_refused_before_anything_runs(tmp_path) -> None:
    assert main(["bench", "scale", "--sizes", "10", "--stages", "corpus,mixing", "--out", str(tmp_path / "s")]) == 2


def test_the_parser_takes_the_flags() -> None:
    args = build_parser().parse_args(["bench", "scale", "--sizes", "full", "--train", "--keep", "--reuse"])
    assert (args.what, args.sizes, args.out, args.train, args.keep, args.reuse) == (
        "scale",
        "full",
        "bench-out/scale",
        True,
        True,
        True,
    )


def test_reuse_runs_the_named_stages_on_a_kept_run_and_refuses_a_missing_one(tmp_path, capsys) -> None:
    out = tmp_path / "scale"
    common = ["--out", str(out), "--set", "compute.workers=1", "--set", "corpus.ambience_recordings=8", "--keep"]
    assert main(["bench", "scale", "--sizes", "12", "--stages", "corpus,clip"] + common) == 0
    events = sorted(p.name for p in (out / "12" / "events").rglob("*") if p.is_file())
    assert main(["bench", "scale", "--sizes", "12", "--stages", "ambience", "--reuse"] + common) == 0
    assert sorted(p.name for p in (out / "12" / "events").rglob("*") if p.is_file()) == events  # the kept run's output stays
    assert (out / "12" / "backgrounds").is_dir() and (out / "12" / "logs" / "clip.log").exists()
    with open(out / "scale.csv", newline="") as f:
        assert [r["stage"] for r in csv.DictReader(f)] == ["ambience"]
    capsys.readouterr()
    assert main(["bench", "scale", "--sizes", "24", "--stages", "ambience", "--reuse"] + common) == 2
    assert "--reuse" in capsys.readouterr().err and not (out / "24").exists()
