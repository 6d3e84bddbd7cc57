"""The detector (windows, stitching, batching, checkpoints) and ``sedsynth detect`` end to end.

A checkpoint is written without training (the tiny CPU model at its seed-0 initial weights),
so every test here runs in seconds. The detector's sliding windows are checked against their
contract, its stitched probabilities against the same windows scored one by one, and the CLI
on files of several rates, channel counts and formats, an undecodable file and a missing path.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from pipeline.audio import decode_mono, encode_flac, quantize_int16
from sedsynth.cli import main
from tests.conftest import tiny_train_params, tone_burst
from trainer import checkpoint
from trainer.evaluation import detect_files as D
from trainer.evaluation.detector import ClipScores, Detector
from trainer.evaluation.metrics import smooth
from trainer.evaluation.scoring import Packed, score_all
from trainer.model import build_model
from trainer.objective import Objective
from trainer.stages.train import config_of

SR = 16000
QUERIES = ["dog barking", "car horn"]
HEADER = ["file", "query", "onset_s", "offset_s", "score"]
DCASE_HEADER = ["filename", "onset", "offset", "event_label"]


def window_starts(det: Detector, num_samples: int) -> list[int]:
    """The windows' contract: start samples of the windows covering ``num_samples`` (multiples
    of the column hop), as the detector's window cutter must emit them."""
    covered = det.columns * det.column_samples
    if num_samples <= covered:
        return [0]
    last = -(-(num_samples - covered) // det.column_samples) * det.column_samples
    starts = list(range(0, last, det.hop_samples))
    return starts + [last]


@dataclass
class Setup:
    params: object
    objective: Objective
    ckpt: Path
    ckpt_zero_bias: Path  # the same weights with frame bias 0: probabilities near 0.5, not 1e-4
    files: dict[str, Path]  # a (3 s, 44.1 kHz stereo WAV), b (23 s, 8 kHz mono FLAC), x (garbage)
    durations: dict[str, float]
    params_yaml: Path


@pytest.fixture(scope="module")
def setup(shard_folder, tmp_path_factory) -> Setup:
    params, folder = shard_folder
    tmp = tmp_path_factory.mktemp("detect")
    p = tiny_train_params(params, folder, tmp / "m")
    torch.manual_seed(0)
    objective = Objective(build_model(p.train.model), p.train.loss)
    ckpt = tmp / "ckpt.pt"
    checkpoint.save(ckpt, objective, step=0, epoch=0, batches_in_epoch=0, config=config_of(p))
    zero = Objective(build_model(p.train.model), p.train.loss)
    zero.load_state_dict(objective.state_dict())
    with torch.no_grad():
        zero.frame_loss.bias.fill_(0.0)
    ckpt_zero = tmp / "ckpt_zero_bias.pt"
    checkpoint.save(ckpt_zero, zero, step=0, epoch=0, batches_in_epoch=0, config=config_of(p))

    audio = tmp / "audio"
    audio.mkdir()
    left = tone_burst(44100, 3.0, 0.5, 2.0, freq_hz=880, seed=1)
    right = tone_burst(44100, 3.0, 1.0, 2.5, freq_hz=330, seed=2)
    sf.write(audio / "a.wav", np.stack([left, right], axis=1), 44100, subtype="PCM_16")
    sf.write(audio / "b.flac", tone_burst(8000, 23.0, 4.0, 9.0, freq_hz=500, seed=3), 8000, subtype="PCM_16")
    (audio / "x.wav").write_bytes(b"this is not audio at all " * 40)
    params_yaml = tmp / "params.yaml"
    params_yaml.write_text("{}\n")
    return Setup(
        p,
        objective,
        ckpt,
        ckpt_zero,
        {k: audio / f"{k}.{e}" for k, e in (("a", "wav"), ("b", "flac"), ("x", "wav"))},
        {"a": 3.0, "b": 23.0},
        params_yaml,
    )


@pytest.fixture(scope="module")
def det(setup) -> Detector:
    return Detector.from_checkpoint(setup.ckpt, device="cpu")


def noise(seconds: float, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(round(seconds * SR)) * 0.1).astype(np.float32)


# --------------------------------------------------------------------------- checkpoints


def test_checkpoint_round_trip_and_untrained_weights(setup, det):
    want = setup.objective.state_dict()
    got = det.objective.state_dict()
    assert set(checkpoint.trainable_state(setup.objective)) <= set(got)
    for k in checkpoint.trainable_state(setup.objective):
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, msg=k)
    assert not det.objective.training and not det.model.training
    assert det.sample_rate_hz == SR

    untrained = Detector.untrained(setup.params.train, seed=0, device="cpu")
    name, first = next(iter(setup.objective.model.encoder.named_parameters()))
    torch.testing.assert_close(dict(untrained.model.encoder.named_parameters())[name], first, rtol=0, atol=0)
    for k, v in untrained.objective.state_dict().items():
        torch.testing.assert_close(v, want[k], rtol=0, atol=0, msg=k)
    other = Detector.untrained(setup.params.train, seed=1, device="cpu")
    assert not torch.equal(dict(other.model.encoder.named_parameters())[name], first)

    # the weights really come from the file: the zero-bias checkpoint loads its own bias
    zero = Detector.from_checkpoint(setup.ckpt_zero_bias, device="cpu")
    assert zero.objective.frame_loss.bias.item() == 0.0
    assert det.objective.frame_loss.bias.item() == setup.params.train.loss.init_bias
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        Detector.from_checkpoint(setup.ckpt.with_name("missing.pt"))


# --------------------------------------------------------------------------- windows


def test_window_geometry(det):
    assert det.window_samples == 10 * SR
    assert det.columns * det.column_samples == det.window_samples  # columns starting inside 10 s
    assert det.column_s == pytest.approx(det.column_samples / SR)
    assert det.hop_samples % det.column_samples == 0
    assert 0 < det.hop_samples <= det.window_samples
    # half of 125 columns, rounded to a whole column
    assert det.hop_samples == round(det.columns / 2) * det.column_samples
    assert window_starts(det, 10 * SR) == [0]
    assert window_starts(det, 3 * SR) == [0]
    assert window_starts(det, 1) == [0]
    assert window_starts(det, 25 * SR) == [0, 79360, 158720, 238080, 240640]


def test_a_checkpoint_written_before_a_key_was_renamed_still_loads(setup, tmp_path):
    state = torch.load(setup.ckpt, weights_only=True)
    data = state["config"]["train"]["data"]
    data["negatives"] = data.pop("negative_sampling")  # as checkpoints stored it before the rename
    old = tmp_path / "old.pt"
    torch.save(state, old)
    assert (
        Detector.from_checkpoint(old, device="cpu").train_params
        == Detector.from_checkpoint(setup.ckpt, device="cpu").train_params
    )


@pytest.mark.parametrize("seconds", [10.0, 10.05, 12.5, 23.0, 25.0, 61.3])
def test_windows_cover_every_sample_and_frame(det, seconds):
    n = round(seconds * SR)
    starts = window_starts(det, n)
    edges = det.timestamps_s(n)
    L = len(edges) - 1
    assert starts[0] == 0
    assert all(s % det.column_samples == 0 for s in starts)
    assert starts[-1] + det.window_samples >= n
    if len(starts) > 1:
        assert starts[-2] + det.window_samples < n  # the last window is needed
        diffs = np.diff(starts)
        assert (diffs[:-1] == det.hop_samples).all()
        assert 0 < diffs[-1] <= det.hop_samples
    covered = np.zeros(n, dtype=bool)
    frames = np.zeros(L, dtype=bool)
    for s in starts:
        covered[s : s + det.window_samples] = True
        first = s // det.column_samples
        assert first < L
        frames[first : first + det.columns] = True
    assert covered.all() and frames.all()
    # frame boundaries: every column_s from 0, the last one at the clip's end
    assert edges[0] == 0.0
    assert edges[-1] == pytest.approx(seconds, abs=1e-12)
    steps = np.diff(edges)
    assert (steps > 0).all()
    np.testing.assert_allclose(steps[:-1], det.column_s)
    assert steps[-1] <= det.column_s + 1e-9
    assert L == int(np.ceil(seconds / det.column_s - 1e-9))


def test_timestamps_by_hand(det):
    np.testing.assert_allclose(det.timestamps_s(SR // 5), [0.0, 0.08, 0.16, 0.2])
    assert len(det.timestamps_s(10 * SR)) == 126
    assert len(det.timestamps_s(25 * SR)) == 314


# --------------------------------------------------------------------------- scoring


def test_score_shapes_and_ranges(det):
    vocabs = [det.vocabulary(QUERIES), det.vocabulary(["bird song"])]
    wave = noise(25.0, 0)
    (s,) = det.score([wave], vocabs)
    assert isinstance(s, ClipScores)
    L = len(det.timestamps_s(len(wave))) - 1
    np.testing.assert_array_equal(s.timestamps_s, det.timestamps_s(len(wave)))
    assert [p.shape for p in s.probs] == [(L, 2), (L, 1)]
    for p in s.probs:
        assert p.dtype == np.float32 and np.isfinite(p).all()
        assert (p >= 0).all() and (p <= 1).all()
    assert s.clip.shape == (32,)
    assert np.linalg.norm(s.clip) == pytest.approx(1.0, abs=1e-5)
    (empty,) = det.score([wave], [det.vocabulary([])])
    assert empty.probs[0].shape == (L, 0)


def test_long_audio_is_the_mean_of_its_windows_scored_alone(det):
    vocab = det.vocabulary(QUERIES)
    wave = noise(25.0, 1)
    (whole,) = det.score([wave], [vocab])
    starts = window_starts(det, len(wave))
    pieces = list(det.score([wave[s : s + det.window_samples] for s in starts], [vocab]))
    L = len(whole.timestamps_s) - 1
    total, count = np.zeros((L, 2)), np.zeros((L, 1))
    for s, piece in zip(starts, pieces):
        first = s // det.column_samples
        take = min(det.columns, L - first)
        total[first : first + take] += piece.probs[0][:take]
        count[first : first + take] += 1
    np.testing.assert_allclose(whole.probs[0], total / count, atol=1e-5)
    # the frames only the first window sees are exactly the first 10 s scored alone
    only_first = starts[1] // det.column_samples
    np.testing.assert_allclose(whole.probs[0][:only_first], pieces[0].probs[0][:only_first], atol=1e-6)
    clip = np.mean([p.clip for p in pieces], axis=0)  # unit vectors: the normalised mean
    np.testing.assert_allclose(whole.clip, clip / np.linalg.norm(clip), atol=1e-5)


def test_batching_does_not_change_scores(setup):
    det = Detector.from_checkpoint(setup.ckpt_zero_bias, device="cpu")
    vocab, other = det.vocabulary(QUERIES), det.vocabulary(["bird song", "rain", "speech"])
    waves = [noise(23.0, 2), noise(10.0, 3), noise(3.0, 4)]
    alone = [next(iter(det.score([w], [vocab]))) for w in waves]
    assert len({len(window_starts(det, len(w))) for w in waves}) > 1
    for batch_size in (16, 3):  # 3: a clip's windows split across forward passes
        det.batch_size = batch_size
        together = list(det.score(waves, [vocab]))
        assert len(together) == len(waves)
        for a, b in zip(alone, together):
            np.testing.assert_array_equal(a.timestamps_s, b.timestamps_s)
            np.testing.assert_allclose(b.probs[0], a.probs[0], atol=1e-5)
            np.testing.assert_allclose(b.clip, a.clip, atol=1e-6)
    # per-clip vocabularies (open vocabulary): each clip gets its own
    det.batch_size = 16
    mixed = list(det.score(waves[:2], iter([[vocab], [other]])))
    assert mixed[0].probs[0].shape[1] == 2 and mixed[1].probs[0].shape[1] == 3
    np.testing.assert_allclose(mixed[0].probs[0], alone[0].probs[0], atol=1e-5)
    (ref,) = det.score([waves[1]], [other])
    np.testing.assert_allclose(mixed[1].probs[0], ref.probs[0], atol=1e-5)


def test_score_all_keeps_each_clips_scores_packed_and_read_only(det, setup):
    vocabs = [det.vocabulary(QUERIES), det.vocabulary(["bird song"])]
    waves = {"n1": noise(23.0, 5), "n2": noise(3.0, 6)}
    audio = [(i, encode_flac(quantize_int16(w), SR)) for i, w in waves.items()] + [("bad", b"not audio " * 30)]
    skips = []
    scored = score_all(det, audio, lambda i: vocabs, skips)
    assert scored.ids == ["n1", "n2"] and [s.item_id for s in skips] == ["bad"]
    alone = list(det.score([decode_mono(b, det.sample_rate_hz) for _, b in audio[:2]], vocabs))
    for k, ref in enumerate(alone):
        kept = [scored.clips[k], scored.timestamps_s[k], *scored.probs[k]]
        for a, b in zip(kept, [ref.clip, ref.timestamps_s, *ref.probs]):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a, b)
            assert not a.flags.writeable
    assert np.shares_memory(scored.probs[0][0].base, scored.probs[1][1].base)  # one chunk, not one allocation each


def test_score_all_gives_the_freed_heap_back_every_so_many_clips(det, monkeypatch):
    import trainer.evaluation.scoring as S

    released = []
    monkeypatch.setattr(S, "RELEASE_EVERY_CLIPS", 2)
    monkeypatch.setattr(S, "release_freed_heap", lambda: released.append(True))
    audio = [(f"n{k}", encode_flac(quantize_int16(noise(1.0, k)), SR)) for k in range(5)]
    scored = score_all(det, audio, lambda i: [det.vocabulary(QUERIES)], [])
    assert len(scored.ids) == 5 and len(released) == 2  # after the 2nd and the 4th clip


def test_packed_copies_into_aligned_chunks():
    rng = np.random.default_rng(0)
    store = Packed(chunk_bytes=4096)
    arrays = [
        rng.random((7, 3), dtype=np.float32),
        np.arange(5, dtype=np.float64),
        np.zeros((0, 4), np.float32),
        rng.integers(0, 9, (2, 2, 2)),
        rng.random((40, 40)),
    ]  # the last is larger than a chunk: a chunk of its own
    views = [store.put(a) for a in arrays]
    for a, v in zip(arrays, views):
        assert v.dtype == a.dtype and v.shape == a.shape and not v.flags.writeable and v.flags.c_contiguous
        np.testing.assert_array_equal(v, a)
        assert not np.shares_memory(v, a)
        assert v.ctypes.data % Packed.ALIGN_BYTES == 0 or v.size == 0
    assert np.shares_memory(views[0], views[3].base) and views[4].base.nbytes < 2 * arrays[4].nbytes
    np.testing.assert_array_equal(store.put(arrays[0][:, 1]), arrays[0][:, 1])  # a strided view: copied contiguous
    arrays[0][:] = 5  # the copies do not follow the originals
    assert not (views[0] == 5).any()
    filled = store.zeros((3, 2), np.int16)
    assert filled.flags.writeable and filled.dtype == np.int16 and not filled.any()
    filled[1] = 7
    np.testing.assert_array_equal(views[3], arrays[3])  # its neighbours untouched


# --------------------------------------------------------------------------- events


def test_events_on_crafted_probabilities():
    t = np.arange(9) * 0.5  # 8 frames of 0.5 s
    p = np.array([0.6, 0.2, 0.5, 0.7, 0.1, 0.0, 0.9, 0.8])
    assert D.events(t, p, 0.5) == [(0.0, 0.5, pytest.approx(0.6)), (1.0, 2.0, pytest.approx(0.7)), (3.0, 4.0, pytest.approx(0.9))]
    assert D.events(t, p, 0.55) == [
        (0.0, 0.5, pytest.approx(0.6)),
        (1.5, 2.0, pytest.approx(0.7)),
        (3.0, 4.0, pytest.approx(0.9)),
    ]
    assert D.events(t, p, 0.95) == []
    assert D.events(t, p, 0.0) == [(0.0, 4.0, pytest.approx(0.9))]
    t2 = np.array([0.0, 0.08, 0.16, 0.2])  # a clip ending mid-column
    assert D.events(t2, np.array([0.1, 0.6, 0.7]), 0.5) == [(0.08, 0.2, pytest.approx(0.7))]


def test_detect_smooths_then_thresholds(tmp_path):
    """``detect`` median-filters each query's frames, then finds runs: a one-frame spike is no event."""
    sf.write(tmp_path / "c.wav", np.zeros(800, np.float32), 8000)
    t = np.arange(11) * 0.1
    probs = np.zeros((10, 2), np.float32)
    probs[4, 0] = 0.9  # a one-frame spike: removed
    probs[2:6, 1] = 0.8  # a four-frame run: kept
    probs[3, 1] = 0.95

    class Stub:
        sample_rate_hz = SR

        def vocabulary(self, texts):
            return tuple(texts)

        def score_stream(self, blocks, vocabs):
            assert len(np.concatenate(list(blocks))) == 1600 and vocabs == [("q0", "q1")]  # resampled to 16 kHz
            return ClipScores(np.zeros(4), t, [probs])

    rows, failed = D.detect(Stub(), [str(tmp_path / "c.wav"), str(tmp_path / "x.wav")], ["q0", "q1"], threshold=0.5)
    assert rows == [D.Detection(str(tmp_path / "c.wav"), "q1", pytest.approx(0.2), pytest.approx(0.6), pytest.approx(0.8))]
    assert list(failed) == [str(tmp_path / "x.wav")] and failed[str(tmp_path / "x.wav")].startswith(
        "cannot read it (unreadable: "
    )
    rows, _ = D.detect(Stub(), [str(tmp_path / "c.wav")], ["q0", "q1"], threshold=0.5, median_frames=1)
    assert [(r.query, r.onset_s, r.offset_s) for r in rows] == [
        ("q0", pytest.approx(0.4), pytest.approx(0.5)),
        ("q1", pytest.approx(0.2), pytest.approx(0.6)),
    ]
    assert rows[1].score == pytest.approx(0.95)


# --------------------------------------------------------------------------- the CLI


def run_cli(setup, capsys, *extra: str, ckpt: Path | None = None) -> tuple[int, str, str]:
    files = [str(setup.files["a"]), str(setup.files["b"]), str(setup.files["x"]), str(setup.files["a"].with_name("missing.wav"))]
    argv = [
        "detect",
        *files,
        "--query",
        QUERIES[0],
        "--query",
        QUERIES[1],
        "--params",
        str(setup.params_yaml),
        "--checkpoint",
        str(ckpt or setup.ckpt),
        "--device",
        "cpu",
        *extra,
    ]
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def check_stderr(setup, err: str) -> None:
    lines = err.strip().splitlines()
    missing = str(setup.files["a"].with_name("missing.wav"))
    assert any(missing in line and "does not exist" in line for line in lines), err
    assert any(str(setup.files["x"]) in line and "cannot read" in line and "unreadable" in line for line in lines), err
    assert str(setup.files["a"]) not in err and str(setup.files["b"]) not in err


def test_cli_tsv_and_pictures(setup, capsys, tmp_path):
    pictures = tmp_path / "pictures"
    code, out, err = run_cli(setup, capsys, "--format", "tsv", "--threshold", "0.0", "--pictures", str(pictures))
    assert code == 2
    check_stderr(setup, err)
    rows = list(csv.reader(out.strip().splitlines(), delimiter="\t"))
    assert rows[0] == DCASE_HEADER
    body = rows[1:]
    # threshold 0: every frame is active, so each readable file has one event per query: the whole file
    assert [(r[0], r[3]) for r in body] == [(setup.files[k].name, q) for k in ("a", "b") for q in QUERIES]
    for f, on, off, _ in body:
        duration = setup.durations[Path(f).stem]
        assert float(on) == 0.0
        assert float(off) == pytest.approx(duration, abs=1e-6)
    assert sorted(p.name for p in pictures.iterdir()) == ["a.png", "b.png"]
    for p in pictures.iterdir():
        data = p.read_bytes()
        assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_table_scores_match_the_detector(setup, capsys):
    code, out, err = run_cli(setup, capsys, "--threshold", "0.0", ckpt=setup.ckpt_zero_bias)
    assert code == 2
    check_stderr(setup, err)
    lines = out.rstrip("\n").splitlines()
    assert len(lines) == 1 + 2 * len(QUERIES)
    assert len({len(line) for line in lines}) == 1  # aligned columns: every line as wide
    header = lines[0]
    assert header.split() == HEADER
    # expected rows from the detector itself: whole-file events scored by the smoothed peak
    det = Detector.from_checkpoint(setup.ckpt_zero_bias, device="cpu")
    vocab = det.vocabulary(QUERIES)
    expected = []
    for k in ("a", "b"):
        (s,) = det.score([decode_mono(setup.files[k], SR)], [vocab])
        probs = smooth(s.probs[0], 3)
        for q in range(len(QUERIES)):
            (ev,) = D.events(s.timestamps_s, probs[:, q], 0.0)
            expected.append((str(setup.files[k]), QUERIES[q], ev))
    score_end = header.index("score") + len("score")
    for line, (f, q, (on, off, peak)) in zip(lines[1:], expected):
        assert line.startswith(f + " ")
        assert line[header.index("query") :].startswith(q + " ")
        assert line.endswith(f"{peak:.3f}") and len(line) == score_end
        assert line[: header.index("onset_s") + len("onset_s")].endswith(f"{on:.3f}")
        assert line[: header.index("offset_s") + len("offset_s")].endswith(f"{off:.3f}")
        assert 0.3 < peak < 1.0  # bias 0: a real probability, not 1e-4
    assert off == pytest.approx(setup.durations["b"])


def test_cli_without_events_prints_the_header_only(setup, capsys):
    code, out, _ = run_cli(setup, capsys, "--format", "tsv", "--threshold", "0.999")
    assert code == 2
    assert out.strip().split("\t") == DCASE_HEADER


def test_cli_reports_a_missing_checkpoint(setup, capsys, tmp_path):
    code, out, err = run_cli(setup, capsys, ckpt=tmp_path / "nope.pt")
    assert code == 2
    assert "sedsynth detect: error:" in err and "nope.pt" in err
    assert out == ""


def test_cli_exit_status_is_zero_when_every_file_reads(setup, capsys):
    argv = [
        "detect",
        str(setup.files["b"]),
        "--query",
        QUERIES[0],
        "--params",
        str(setup.params_yaml),
        "--checkpoint",
        str(setup.ckpt),
        "--device",
        "cpu",
        "--format",
        "tsv",
        "--threshold",
        "0",
    ]
    capsys.readouterr()
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "error" not in err  # (the text model may draw a loading bar there)
    assert len(out.strip().splitlines()) == 2


def test_read_audio_downmixes_and_resamples(setup):
    a = decode_mono(setup.files["a"], SR)
    assert a.dtype == np.float32 and a.shape == (3 * SR,)
    b = decode_mono(setup.files["b"], SR)
    assert b.shape == (23 * SR,)
    raw, _ = sf.read(setup.files["a"], dtype="float32")
    np.testing.assert_allclose(decode_mono(setup.files["a"], 44100), raw.mean(axis=1), atol=1e-6)
    for bad in (setup.files["x"], setup.files["x"].read_bytes()):
        with pytest.raises(Exception, match="unreadable") as e:
            decode_mono(bad, SR)
        assert e.type.__name__ == "AudioError"


def detect_main(setup, capsys, ckpt: Path, threshold: float | None) -> tuple[int, list[list[str]], str]:
    """``sedsynth detect b.flac --format tsv`` through :func:`detect.main`, ``threshold`` None as without ``--threshold``."""
    import argparse

    from trainer.config import Params

    args = argparse.Namespace(
        audio=[str(setup.files["b"])],
        query=[QUERIES[0]],
        checkpoint=str(ckpt),
        threshold=threshold,
        format="tsv",
        scores=None,
        pictures=None,
        device="cpu",
    )
    capsys.readouterr()
    code = D.main(args, Params())
    out, err = capsys.readouterr()
    return code, list(csv.reader(out.strip().splitlines(), delimiter="\t")), err


def test_without_threshold_detect_uses_the_checkpoint_threshold_and_says_so(setup, capsys, tmp_path):
    calibrated = tmp_path / "calibrated.pt"
    calibrated.write_bytes(setup.ckpt.read_bytes())
    # probabilities sit near 1e-4 (frame bias -10): threshold 0 finds the whole file, 0.5 nothing
    checkpoint.store_entry(calibrated, "calibration", {"threshold": 0.0, "valid_f1": 0.25, "split": "valid"})
    code, rows, err = detect_main(setup, capsys, calibrated, None)
    assert code == 0 and rows[0] == DCASE_HEADER
    assert [(r[0], r[3]) for r in rows[1:]] == [(setup.files["b"].name, QUERIES[0])]
    assert "threshold 0 after a 3-frame median filter (stored in the checkpoint: chosen on the valid split" in err
    # --threshold still wins
    code, rows, err = detect_main(setup, capsys, calibrated, 0.5)
    assert code == 0 and rows == [DCASE_HEADER] and "threshold 0.5 after a 3-frame median filter (--threshold)" in err


def test_without_threshold_or_calibration_detect_falls_back_to_one_half(setup, capsys):
    code, rows, err = detect_main(setup, capsys, setup.ckpt, None)
    assert code == 0 and rows == [DCASE_HEADER]
    assert "holds no calibrated threshold" in err and "threshold 0.5 after a 3-frame median filter (fallback 0.5" in err


def test_names_with_a_tab_or_line_break_cannot_forge_tsv_rows(tmp_path):
    """A file named ``x\\tforged\\t0\\t9\\tgun.wav`` would add a row to the DCASE detections and give
    sed_scores_eval an id that is no audio file: it is refused (with the reason) where the outputs name
    files, and scored as usual in the table."""
    t = np.arange(5) * 0.1
    probs = np.full((4, 1), 0.9, np.float32)

    class Stub:
        sample_rate_hz = SR

        def vocabulary(self, texts):
            return tuple(texts)

        def score_stream(self, blocks, vocabs):
            list(blocks)
            return ClipScores(np.zeros(4), t, [probs])

    plain = tmp_path / "plain.wav"
    forged = tmp_path / "x\tforged\t0\t9\tgun.wav"
    broken = tmp_path / "two\nlines.wav"
    for f in (plain, forged, broken):
        sf.write(f, np.zeros(800, np.float32), 8000)
    files = [str(plain), str(forged), str(broken)]

    rows, failed = D.detect(Stub(), files, ["q"], threshold=0.5, unique_names=True, scores_dir=tmp_path / "scores")
    assert sorted(failed) == sorted(files[1:]) and all("tab or line break" in why for why in failed.values())
    assert [r.file for r in rows] == [str(plain)]
    assert sorted(p.name for p in (tmp_path / "scores").iterdir()) == ["plain.tsv"]
    lines = D.format_rows(rows, tsv=True).split("\n")
    assert len(lines) == 2 and all(len(line.split("\t")) == 4 for line in lines)

    rows, failed = D.detect(Stub(), files, ["q"], threshold=0.5)  # the table: every file, full paths
    assert not failed and {r.file for r in rows} == set(files)
    with pytest.raises(ValueError, match="tab or line break"):
        D.format_rows(rows, tsv=True)
    with pytest.raises(ValueError, match="tab or line break"):
        D.write_score_file(tmp_path / "scores" / "a\tb.tsv", t, probs, ["q"])
