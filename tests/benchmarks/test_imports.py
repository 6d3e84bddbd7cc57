"""``sedsynth bench import`` on 50 clips: every figure is produced and the figures agree with each other (no timing asserted)."""

from __future__ import annotations

import re

import pytest

from benchmarks.imports import PER_FORMAT, bench_import, print_figures
from tests.pipeline.imports.conftest import MidIndex
from trainer.config import Params

CLIPS = 50
MEMORY_MARGIN_MIB = 64.0


@pytest.fixture(scope="module")
def figures():
    return bench_import(Params(), CLIPS, index=MidIndex(), workers=(1,))


def test_rows_written_are_the_kept_clips_and_the_missing_share_is_as_generated(figures):
    corpus, run = figures["corpus"], figures["runs"][1]
    assert figures["rows_written"] == figures["kept"] == run["rows"] == corpus["clips"] - corpus["missing"]
    assert run["clips"] == corpus["clips"]
    assert run["summary"]["missing_audio"] == corpus["missing"]
    assert run["summary"]["missing_audio_share"] == pytest.approx(corpus["missing"] / corpus["clips"], abs=1e-6)
    assert figures["peer_rows"] == figures["rows_written"]  # fewer than PEER_ROWS: every row goes to the peer


def test_per_format_runs_hold_one_format_each(figures):
    assert list(figures["per_format"]) == list(PER_FORMAT)
    rates = {name: r["import"]["summary"]["source_rates_hz"] for name, r in figures["per_format"].items()}
    assert rates == {
        "16 kHz mono FLAC": {"16000": rates["16 kHz mono FLAC"]["16000"]},
        "16 kHz mono WAV": {"16000": rates["16 kHz mono WAV"]["16000"]},
        "44.1 kHz stereo WAV": {"44100": rates["44.1 kHz stereo WAV"]["44100"]},
    }
    flac = figures["per_format"]["16 kHz mono FLAC"]["import"]["summary"]
    assert flac["kept_source_flac"] == flac["outputs"] and figures["flac_reencoded"]["summary"]["kept_source_flac"] == 0
    for r in figures["per_format"].values():
        assert r["audio"]["clips"] == r["import"]["rows"] and r["audio"]["per_core"] > 0 and r["import"]["per_core"] > 0


def test_memory_at_the_small_size_is_not_above_the_full_one(figures):
    # the rise above the memory held when each import starts: what a process of a long test run
    # already holds (and the allocator keeps after the full run) is not the import's
    small, full = figures["small_run"], figures["runs"][1]
    assert small["peak_rss_mib"] > 0 and small["rss_rise_mib"] <= full["rss_rise_mib"] + MEMORY_MARGIN_MIB


def test_the_report_states_the_target_per_format(figures, capsys):
    print_figures(figures)
    out = capsys.readouterr().out
    assert "target >= 200 clips/s per core" in out and "clips per CPU second" in out
    for name in PER_FORMAT:
        assert name in out
    verdicts = len(re.findall(r"\b(meets|below)\b", out))
    assert verdicts == len(figures["runs"]) + 2 * len(PER_FORMAT)  # each run once, each format for audio and import
