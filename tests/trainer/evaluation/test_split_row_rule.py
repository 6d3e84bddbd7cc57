"""The evaluator reads a split by the one row rule of ``pipeline/shards/rows.py``, audio included.

A row whose audio does not decode (a truncated FLAC, garbage bytes), whose FLAC header states more
than its ``duration_s`` (refused before a frame is decoded), with a cluster id the folder's
``clusters/`` lacks, a label holding a tab or line break (``bad-label``) or an id that cannot name
a file is left out with its reason and one stderr line, before the ground truth and the classes are
assembled: no class is scored without ground truth, and nothing written holds a forged TSV row.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf

from pipeline.audio import encode_flac
from pipeline.shards import rows as R
from tests.trainer.evaluation.test_testset_untrusted import entries, rewrite
from trainer.evaluation import metrics as M
from trainer.evaluation.detector import ClipScores
from trainer.evaluation.scoring import detection, score_all
from trainer.evaluation.testset import read_split


@pytest.fixture
def copy(shard_folder, tmp_path) -> Path:
    shutil.copytree(shard_folder[1], tmp_path / "ds")
    return tmp_path / "ds"


def split_file(copy: Path) -> Path:
    [entry] = entries(copy, "test")
    return copy / entry["path"]


def skip_lines(capsys) -> list[str]:
    return [x for x in capsys.readouterr().err.splitlines() if x.startswith("evaluate: skipping row")]


def undecodable(rows: list[dict]) -> None:
    """Row 0 (the only one with class Meow) holds half its FLAC, row 1 garbage."""
    rows[0]["phrases"][0]["label"] = "Meow"
    rows[0]["audio"]["bytes"] = rows[0]["audio"]["bytes"][: len(rows[0]["audio"]["bytes"]) // 2]
    rows[1]["audio"]["bytes"] = b"not audio at all " * 64


def test_a_row_whose_audio_does_not_decode_is_left_out_before_the_classes(copy, capsys):
    path = split_file(copy)
    rows = rewrite(path, undecodable)
    capsys.readouterr()
    split = read_split(str(copy), "test")
    assert split.ids == tuple(r["id"] for r in rows[2:])
    assert "Meow" not in split.classes and set(split.ground_truth()) == set(split.ids)
    assert [(s.item_id, s.path, s.reason) for s in split.skips] == [(rows[k]["id"], str(path), "unreadable") for k in (0, 1)]
    lines = skip_lines(capsys)
    assert len(lines) == 2
    for k, line in enumerate(lines):
        assert line.startswith(f"evaluate: skipping row {k} of {path} (id {rows[k]['id']}): unreadable audio: cannot decode")


class StubDetector:
    """Scores any wave with fixed random probabilities on 0.5 s frames (the metrics, not the model, are tested)."""

    sample_rate_hz = 16000

    def __init__(self, classes: int):
        self.classes, self.rng = classes, np.random.default_rng(0)

    def score(self, waves, vocabularies):
        for wave, _ in zip(waves, vocabularies):
            frames = max(1, int(len(wave) / self.sample_rate_hz / 0.5))
            t = np.linspace(0.0, len(wave) / self.sample_rate_hz, frames + 1)
            yield ClipScores(np.zeros(4, np.float32), t, [self.rng.uniform(0, 1, (frames, self.classes)).astype(np.float32)])


def test_no_class_is_scored_without_ground_truth(copy, tmp_path):
    """What ``evaluate`` does with the split: score what decodes, then PSDS over the split's classes
    (sed_scores_eval asserts every class has ground truth), writing the score files."""
    rewrite(split_file(copy), undecodable)
    split = read_split(str(copy), "test")
    skips = []
    scored = score_all(StubDetector(len(split.classes)), split.audio(), lambda i: [None], skips)
    e = SimpleNamespace(median_filter_frames=1, f1_median_filter_frames=1, segment_s=1.0, max_fpr=0.1, f1_threshold=0.5)
    result = detection(
        scored, 0, split.ground_truth(), split.durations_s, split.classes, e, M.Timer(), folder=tmp_path, model="trained"
    )
    assert 0 <= result["auroc"] <= 1
    assert scored.ids == list(split.ids) and not skips  # nothing left to fail at scoring
    header = (tmp_path / "scores" / "trained" / f"{split.ids[0]}.tsv").read_text().splitlines()[0].split("\t")
    assert header == ["onset", "offset", *split.classes]


def test_a_cluster_id_the_inventory_lacks_is_left_out(copy, capsys):
    path = split_file(copy)
    rows = rewrite(path, lambda rows: rows[2]["phrases"][0].update(cluster_id=999_999))
    capsys.readouterr()
    split = read_split(str(copy), "test")
    assert rows[2]["id"] not in split.ids and len(split.ids) == len(rows) - 1
    [skip] = split.skips
    assert (skip.item_id, skip.reason) == (rows[2]["id"], "malformed-row") and "cluster id 999999" in skip.detail
    [line] = skip_lines(capsys)
    assert "cluster id 999999" in line


@pytest.mark.parametrize(
    "label", ["Dog\tbark\n x.wav\t0\t9\tGun", "Dog\rbark", "Dog\u2028bark", "Dog\u2029bark", "Dog\x85bark", "Dog\x1fbark"]
)
def test_a_label_that_would_forge_tsv_rows_is_a_bad_label(copy, capsys, label):
    path = split_file(copy)
    rows = rewrite(path, lambda rows: rows[3]["phrases"][0].update(label=label))
    capsys.readouterr()
    split = read_split(str(copy), "test")
    assert rows[3]["id"] not in split.ids and label not in split.classes
    [skip] = split.skips
    assert (skip.item_id, skip.reason) == (rows[3]["id"], "bad-label")
    err = capsys.readouterr().err
    assert all(R.text_problem(line) is None for line in err.split("\n")), "a stderr line holds the label's line break"
    [line] = [x for x in err.split("\n") if x.startswith("evaluate: skipping row")]
    assert f"row 3 of {path}" in line and "the label" in line


@pytest.mark.parametrize("bad_id", ["../../outside", "a\\b", "..", "two\nlines", "tab\there", "x" * 300])
def test_an_id_that_cannot_name_a_file_or_a_tsv_cell_is_left_out(copy, capsys, bad_id):
    path = split_file(copy)
    rewrite(path, lambda rows: rows[4].update(id=bad_id))
    capsys.readouterr()
    split = read_split(str(copy), "test")
    assert bad_id not in split.ids and len(split.ids) == 4
    [skip] = split.skips
    assert skip.reason == "malformed-row" and "the id" in skip.detail
    err = capsys.readouterr().err
    assert all(R.text_problem(line) is None for line in err.split("\n")), "a stderr line holds the id's line break"
    assert len([x for x in err.split("\n") if x.startswith("evaluate: skipping row 4")]) == 1


def test_a_cell_longer_than_its_mixture_is_refused_from_its_header(copy, capsys, monkeypatch):
    """Three minutes of silence are 40 KB of FLAC: the header says so, and not a frame is decoded."""
    rate = json.loads((copy / "index.json").read_text())["sample_rate_hz"]
    long_frames = 180 * rate
    path = split_file(copy)
    rows = rewrite(path, lambda rows: rows[2]["audio"].update(bytes=encode_flac(np.zeros(long_frames, np.int16), rate)))
    assert len(rows[2]["audio"]["bytes"]) < 100_000
    decoded = []
    real = sf.SoundFile.read

    def counting(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        decoded.append((self.frames, len(out)))
        return out

    monkeypatch.setattr(sf.SoundFile, "read", counting)
    capsys.readouterr()
    split = read_split(str(copy), "test")
    assert rows[2]["id"] not in split.ids
    [skip] = split.skips
    assert skip.reason == "too-long" and f"{long_frames} frames" in skip.detail
    assert not [n for frames, n in decoded if frames == long_frames], "the long cell was decoded"
    assert sum(n for _, n in decoded) == sum(round(split.durations_s[i] * rate) for i in split.ids)  # the other rows, once each
    [line] = skip_lines(capsys)
    assert "too-long" in line


def test_every_tsv_writer_refuses_a_cell_that_would_forge_rows(tmp_path):
    from trainer.evaluation.detect_files import Detection, check_queries, format_rows, write_score_file

    for bad in ("a\tb", "a\nb", "a\rb", "a\u2028b", "a\u2029b", "a\x85b", "a\x00b", "a\x7fb"):
        with pytest.raises(ValueError, match="control character"):
            M.tsv_cell(bad, "label")
        with pytest.raises(ValueError):
            write_score_file(tmp_path / "x.tsv", np.arange(3) * 0.5, np.zeros((2, 1)), [bad])
        with pytest.raises(ValueError):
            check_queries([bad])
        with pytest.raises(ValueError):
            format_rows([Detection("/x/a.wav", bad, 0.0, 1.0, 0.9)], tsv=True)
        with pytest.raises(ValueError):
            format_rows([Detection(f"/x/{bad}.wav", "q", 0.0, 1.0, 0.9)], tsv=True)
    assert not (tmp_path / "x.tsv").exists()
    for good in ("dog barking", "Hund bellt – laut", "犬", "a b"):
        assert M.tsv_cell(good) == good


def test_the_score_files_refuse_a_class_that_would_forge_rows(tmp_path):
    t = [np.arange(3) * 0.5]
    scored = SimpleNamespace(ids=["a"], timestamps_s=t, probs=[[np.full((2, 2), 0.5, np.float32)]])
    e = SimpleNamespace(median_filter_frames=1, f1_median_filter_frames=1, segment_s=1.0, max_fpr=0.1, f1_threshold=0.5)
    truth = {"a": [(0.0, 0.5, "Dog"), (0.5, 1.0, "Cat\u2028Meow")]}
    with pytest.raises(ValueError, match="U\\+2028"):
        detection(scored, 0, truth, {"a": 1.0}, ["Dog", "Cat\u2028Meow"], e, M.Timer(), folder=tmp_path, model="trained")
    assert not (tmp_path / "scores").exists()


def test_a_benchmark_drops_bad_labels_and_undecodable_clips_before_its_classes(tmp_path):
    from trainer.evaluation.readers import read_desed

    audio = tmp_path / "audio"
    audio.mkdir()
    noise = (np.random.default_rng(0).standard_normal(16000 * 4) * 0.05).astype(np.float32)
    sf.write(audio / "a.wav", noise, 16000)
    sf.write(audio / "b.flac", noise, 16000)
    (audio / "b.flac").write_bytes((audio / "b.flac").read_bytes()[:3000])  # cut short: the header reads, the frames do not
    (tmp_path / "events.tsv").write_text(
        "filename\tonset\toffset\tevent_label\na.wav\t0.5\t2.0\tDog\na.wav\t1.0\t3.0\tCat\x07Meow\nb.flac\t0.2\t0.9\tBird\n",
        encoding="utf-8",
    )
    with pytest.warns(UserWarning, match="left out"):
        data = read_desed(audio, tmp_path / "events.tsv")
    assert data.classes == ("Dog",) and list(data.audio) == ["a"]
    assert data.ground_truth == {"a": [(0.5, 2.0, "Dog")]}
    assert sorted((s.item_id, s.reason) for s in data.skips) == [("a", "bad-label"), ("b", "unreadable")]
