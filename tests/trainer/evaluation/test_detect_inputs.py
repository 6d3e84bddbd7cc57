"""``sedsynth detect`` inputs and what it says: folders, globs, file lists, a file without events, the median filter.

- A folder gives its audio files sorted (``--recursive`` its subfolders' too); a quoted glob is
  expanded by detect itself; ``--files-from`` reads paths from a file or stdin.
- A link in a folder that leads out of it is skipped with a line; a FIFO is refused.
- A file without events says ``no events found`` with each query's highest score and its time.
- ``--threshold`` keeps the median filter stored with the checkpoint's threshold; ``--median-filter``
  changes it (odd, at least 1).

The model is the tiny CPU one at its initial weights with frame bias 0 (the fixtures of
test_detect_trust), on clips of a second, so each test runs in about a second.
"""

from __future__ import annotations

import io
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from pipeline.audio import decode_mono
from tests.trainer.evaluation.test_detect_trust import QUERIES, base_args, ckpt, cli, det  # noqa: F401 (fixtures)
from trainer import checkpoint
from trainer.evaluation.metrics import smooth

SR = 16000


@pytest.fixture
def clips(tmp_path) -> Path:
    """clips/{b.flac, a.wav, notes.txt, sub/c.wav}: one second each."""
    folder = tmp_path / "clips"
    (folder / "sub").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in ("b.flac", "a.wav", "sub/c.wav"):
        sf.write(folder / name, (rng.standard_normal(SR) * 0.1).astype(np.float32), SR)
    (folder / "notes.txt").write_text("not audio\n")
    return folder


def scored_files(out: str) -> list[str]:
    """The files of a DCASE TSV with --threshold 0 (every file has an event per query), in order."""
    return list(dict.fromkeys(line.split("\t")[0] for line in out.strip().splitlines()[1:]))


def test_a_folder_gives_its_audio_files_sorted_and_recursive_descends(ckpt, clips, capsys):
    code, out, err = cli(capsys, *base_args(ckpt, clips), "--format", "tsv", "--threshold", "0")
    assert code == 0, err
    assert scored_files(out) == ["a.wav", "b.flac"]
    code, out, err = cli(capsys, *base_args(ckpt, clips), "--format", "tsv", "--threshold", "0", "--recursive")
    assert code == 0, err
    assert scored_files(out) == ["a.wav", "b.flac", "c.wav"]


def test_a_folder_without_audio_is_an_error_that_names_it(ckpt, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, out, err = cli(capsys, *base_args(ckpt, tmp_path / "empty"))
    assert code == 2 and "no audio files" in err and str(tmp_path / "empty") in err


def test_a_quoted_glob_is_expanded_by_detect(ckpt, clips, capsys):
    code, out, err = cli(
        capsys, *base_args(ckpt), str(clips / "*.wav"), str(clips / "**" / "*.wav"), "--format", "tsv", "--threshold", "0"
    )
    assert code == 0, err
    assert scored_files(out) == ["a.wav", "c.wav"]  # a file two patterns match is scored once
    code, out, err = cli(capsys, *base_args(ckpt), str(clips / "*.mp4"))
    assert code == 2 and "matches no audio file" in err


def test_files_from_a_list_or_stdin(ckpt, clips, tmp_path, capsys, monkeypatch):
    listing = tmp_path / "list.txt"
    listing.write_text(f"{clips / 'sub' / 'c.wav'}\n\n{clips / 'a.wav'}\n")
    code, out, err = cli(capsys, *base_args(ckpt), "--files-from", str(listing), "--format", "tsv", "--threshold", "0")
    assert code == 0, err
    assert scored_files(out) == ["c.wav", "a.wav"]  # in the list's order
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{clips / 'b.flac'}\n"))
    code, out, err = cli(capsys, *base_args(ckpt), "--files-from", "-", "--format", "tsv", "--threshold", "0")
    assert code == 0, err
    assert scored_files(out) == ["b.flac"]


def test_links_out_of_a_folder_are_skipped_and_fifos_refused(ckpt, clips, tmp_path, capsys):
    outside = tmp_path / "private"
    outside.mkdir()
    shutil.copy(clips / "a.wav", outside / "secret.wav")
    os.symlink(outside / "secret.wav", clips / "z_link.wav")
    os.symlink(clips / "a.wav", clips / "y_inside.wav")  # stays in the folder: scored
    fifo = tmp_path / "pipe.wav"
    os.mkfifo(fifo)
    code, out, err = cli(capsys, *base_args(ckpt, clips, fifo), "--threshold", "0", "--format", "tsv")
    assert code == 2
    assert scored_files(out) == ["a.wav", "b.flac", "y_inside.wav"]
    assert any("z_link.wav" in line and "leads out of" in line for line in err.splitlines()), err
    assert any(str(fifo) in line and "FIFO" in line for line in err.splitlines()), err


def peak_and_time(det, path: Path, frames: int) -> list[tuple[float, float]]:
    (scores,) = det.score([decode_mono(path, det.sample_rate_hz)], [det.vocabulary(QUERIES)])
    probs = smooth(scores.probs[0], frames)
    return [(probs[:, k].max(), scores.timestamps_s[probs[:, k].argmax()]) for k in range(len(QUERIES))]


def calibrated(ckpt: Path, tmp_path: Path, threshold: float, frames: int) -> Path:
    path = tmp_path / "calibrated.pt"
    path.write_bytes(ckpt.read_bytes())
    checkpoint.store_entry(
        path, "calibration", {"threshold": threshold, "valid_f1": 0.5, "split": "valid", "median_filter_frames": frames}
    )
    return path


def test_a_file_without_events_says_so_with_each_querys_highest_score(ckpt, det, clips, tmp_path, capsys):
    path = calibrated(ckpt, tmp_path, 0.999, 9)
    code, out, err = cli(capsys, *base_args(path, clips / "a.wav"))
    assert code == 0, err
    (line,) = out.strip().splitlines()
    assert str(clips / "a.wav") in line and "no events found" in line
    for q, (p, t) in zip(QUERIES, peak_and_time(det, clips / "a.wav", 9)):  # the stored 9-frame filter
        assert f"{q!r} {p:.3f} at {t:.2f} s" in line
    # a DCASE TSV stays one: the line goes to stderr
    code, out, err = cli(capsys, *base_args(path, clips / "a.wav"), "--format", "tsv")
    assert code == 0 and out.strip().split("\t") == ["filename", "onset", "offset", "event_label"]
    assert "no events found" in err


def test_threshold_keeps_the_stored_median_filter_unless_median_filter_is_given(ckpt, det, clips, tmp_path, capsys):
    path = calibrated(ckpt, tmp_path, 0.999, 9)
    code, out, err = cli(capsys, *base_args(path, clips / "a.wav"), "--threshold", "0.9999")
    assert code == 0, err
    assert "threshold 0.9999 after a 9-frame median filter (--threshold)" in err
    peak, t = peak_and_time(det, clips / "a.wav", 9)[0]
    assert f"{QUERIES[0]!r} {peak:.3f} at {t:.2f} s" in out
    code, out, err = cli(capsys, *base_args(path, clips / "a.wav"), "--threshold", "0.9999", "--median-filter", "1")
    assert code == 0 and "after a 1-frame median filter" in err and "filter: --median-filter" in err
    peak, t = peak_and_time(det, clips / "a.wav", 1)[0]
    assert f"{QUERIES[0]!r} {peak:.3f} at {t:.2f} s" in out
    for bad in ("4", "0", "-3"):
        code, out, err = cli(capsys, *base_args(path, clips / "a.wav"), "--median-filter", bad)
        assert code == 2 and out == "" and re.search(r"--median-filter is -?\d+; use an odd number", err), err
