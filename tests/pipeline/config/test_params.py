"""params.yaml loading: the shipped file is valid, and mistakes fail with the key and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config.params import ParamsError, parse_override
from tests.conftest import ROOT
from trainer.config import Params, load_params


def test_shipped_params_load_and_match_paper_defaults() -> None:
    p = load_params(ROOT / "params.yaml")
    assert p.clip.segmentation.threshold_db == -20.0
    assert (p.clip.min_duration_s, p.clip.max_duration_s) == (1.0, 7.5)
    assert p.ambience.segment_s == 10.0 and p.ambience.min_recording_s == 10.0
    assert p.clip == Params().clip, "params.yaml and the dataclass defaults agree"
    assert p.ambience == Params().ambience


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def test_unknown_key_suggests_the_close_one(tmp_path: Path) -> None:
    with pytest.raises(ParamsError, match=r"clip.segmentation.treshold_db.*did you mean 'threshold_db'"):
        load_params(_write(tmp_path, "clip:\n  segmentation:\n    treshold_db: -20\n"))


@pytest.mark.parametrize(
    "text, match",
    [
        ("clip:\n  min_duration_s: short\n", "clip.min_duration_s"),
        ("clip:\n  segmentation:\n    threshold_reference: loudest\n", "'peak' or 'dbfs' or 'percentile'"),
        ("compute:\n  workers: 0\n", "compute.workers"),
        ("clip:\n  min_duration_s: 9\n", "clip.min_duration_s"),
        ("clip:\n  splits: [train, test]\n", "clip.splits"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(ParamsError, match=match):
        load_params(_write(tmp_path, text))


def test_overrides_merge_into_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "clip:\n  max_duration_s: 6.0\n")
    p = load_params(path, parse_override("clip.segmentation.threshold_db=-30"))
    assert p.clip.max_duration_s == 6.0 and p.clip.segmentation.threshold_db == -30.0
