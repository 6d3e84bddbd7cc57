"""``sedsynth detect`` on inputs a user really has: DCASE output, bad and tiny files, long audio, no params.yaml.

- The DCASE detection TSV and the ``--scores`` folder are read by sed_scores_eval itself, and
  its PSDS and collar F1 run on them against a small ground truth.
- A 1- or 100-sample file gets a picture; a file that fails (too short, unreadable, a picture
  that cannot be drawn, a name used twice) fails alone and is named on stderr.
- Files are streamed: the streamed scores equal the whole-file ones for any block size, and
  the memory a file costs does not grow with its length (traced with a stub encoder, so
  minutes of audio score in seconds).
- With ``--checkpoint`` no ``params.yaml`` is needed; without either the error says to pass
  ``--checkpoint``.

The model is the tiny CPU one at its initial weights with frame bias 0 (probabilities near
0.5, so thresholds cut real events); no data or training is needed.
"""

from __future__ import annotations

import csv
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from sed_scores_eval import collar_based, intersection_based
from sed_scores_eval.base_modules.detection import scores_to_event_list
from sed_scores_eval.base_modules.io import read_ground_truth_events, read_sed_scores

from pipeline.audio import decode_mono, read_blocks
from sedsynth.cli import main
from tests.conftest import tiny_train_params, tone_burst
from tests.trainer.evaluation.test_detect import window_starts
from trainer import checkpoint
from trainer.config import Params
from trainer.evaluation import detect_files as D
from trainer.evaluation.detector import Detector, _WindowCutter
from trainer.evaluation.metrics import smooth
from trainer.evaluation.plots import Spectrogram, frame_envelope
from trainer.model import build_model
from trainer.objective import Objective
from trainer.stages.train import config_of

SR = 16000
QUERIES = ["dog barking", "car horn"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("detect_trust")
    p = tiny_train_params(Params(), tmp / "no-data", tmp / "model")
    torch.manual_seed(0)
    objective = Objective(build_model(p.train.model), p.train.loss)
    with torch.no_grad():
        objective.frame_loss.bias.fill_(0.0)
    path = tmp / "ckpt.pt"
    checkpoint.save(path, objective, step=0, epoch=0, batches_in_epoch=0, config=config_of(p))
    return path


@pytest.fixture(scope="module")
def det(ckpt) -> Detector:
    return Detector.from_checkpoint(ckpt, device="cpu")


@pytest.fixture(scope="module")
def audio(tmp_path_factory) -> dict[str, Path]:
    """a: 3 s 44.1 kHz stereo WAV; b: 10.5 s 8 kHz FLAC; long: 23 s 22.05 kHz stereo FLAC."""
    folder = tmp_path_factory.mktemp("audio")
    left, right = (tone_burst(44100, 3.0, 0.5, 2.0, freq_hz=880, seed=1), tone_burst(44100, 3.0, 1.0, 2.5, freq_hz=330, seed=2))
    sf.write(folder / "a.wav", np.stack([left, right], axis=1), 44100, subtype="PCM_16")
    sf.write(folder / "b.flac", tone_burst(8000, 10.5, 4.0, 9.0, freq_hz=500, seed=3), 8000, subtype="PCM_16")
    rng = np.random.default_rng(4)
    sf.write(folder / "long.flac", (rng.standard_normal((23 * 22050, 2)) * 0.1).astype(np.float32), 22050, subtype="PCM_24")
    return {"a": folder / "a.wav", "b": folder / "b.flac", "long": folder / "long.flac"}


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["detect", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def base_args(ckpt: Path, *files: Path) -> list[str]:
    return [*map(str, files), "--query", QUERIES[0], "--query", QUERIES[1], "--checkpoint", str(ckpt), "--device", "cpu"]


# --------------------------------------------------------------------------- item 10: DCASE output


def test_tsv_and_score_files_are_what_sed_scores_eval_reads(ckpt, audio, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    scores_dir = tmp_path / "scores"
    code, _, err = cli(capsys, *base_args(ckpt, audio["a"], audio["b"]), "--scores", str(scores_dir))
    assert code == 0, err
    scores = read_sed_scores(scores_dir)  # sed_scores_eval's own reader: one file per audio id
    assert sorted(scores) == ["a", "b"]
    for name, duration in (("a", 3.0), ("b", 10.5)):
        table = scores[name]
        assert list(table.columns) == ["onset", "offset", *QUERIES]
        assert table["onset"].iloc[0] == 0.0 and table["offset"].iloc[-1] == pytest.approx(duration, abs=1e-9)
        assert ((table[QUERIES] >= 0) & (table[QUERIES] <= 1)).all().all()

    # a threshold inside the first query's scores, so its events are real runs, not whole files
    threshold = float(np.median(np.concatenate([scores[k][QUERIES[0]].to_numpy() for k in scores])))
    code, out, err = cli(capsys, *base_args(ckpt, audio["a"], audio["b"]), "--format", "tsv", "--threshold", repr(threshold))
    assert code == 0, err
    detections = tmp_path / "detections.tsv"
    detections.write_text(out)
    assert out.splitlines()[0].split("\t") == ["filename", "onset", "offset", "event_label"]
    assert {line.split("\t")[0] for line in out.splitlines()[1:]} == {"a.wav", "b.flac"}  # base names, as ground truth has them
    got = read_ground_truth_events(detections)
    # the same events sed_scores_eval finds in the score files at this threshold (it keeps scores > t; detect keeps >= t)
    expected = scores_to_event_list(scores, thresholds=np.full(len(QUERIES), np.nextafter(threshold, -np.inf)))
    assert sorted(got) == sorted(expected)
    assert sum(e[2] == QUERIES[0] and e[1] - e[0] < 2.9 for events in got.values() for e in events) >= 2
    for name in got:
        assert sorted((e[2], round(e[0], 6), round(e[1], 6)) for e in got[name]) == sorted(
            (e[2], round(float(e[0]), 6), round(float(e[1]), 6)) for e in expected[name]
        )

    # PSDS and collar F1 against a user's ground truth
    truth = tmp_path / "truth.tsv"
    truth.write_text(
        "filename\tonset\toffset\tevent_label\n"
        "a.wav\t0.5\t2.0\tdog barking\nb.flac\t4.0\t9.0\tcar horn\nb.flac\t0.2\t1.0\tdog barking\n"
    )
    durations = tmp_path / "durations.tsv"
    durations.write_text("filename\tduration\na.wav\t3.0\nb.flac\t10.5\n")
    psds, *_ = intersection_based.psds(
        scores_dir, truth, durations, dtc_threshold=0.7, gtc_threshold=0.7, alpha_ct=0.0, alpha_st=1.0, max_efpr=100.0
    )
    assert 0.0 <= psds <= 1.0
    f1, precision, recall, _ = collar_based.fscore(
        scores_dir, truth, threshold, onset_collar=0.2, offset_collar=0.2, offset_collar_rate=0.2
    )
    assert set(f1) >= set(QUERIES) and all(0.0 <= f1[q] <= 1.0 for q in QUERIES)


def test_score_files_hold_the_smoothed_probabilities_detections_come_from(ckpt, det, audio, tmp_path):
    rows, failed = D.detect(det, [str(audio["b"])], QUERIES, threshold=0.5, scores_dir=tmp_path / "s")
    assert not failed
    table = read_sed_scores(tmp_path / "s" / "b.tsv")
    (s,) = det.score([decode_mono(audio["b"], SR)], [det.vocabulary(QUERIES)])
    np.testing.assert_allclose(table[QUERIES].to_numpy(), smooth(s.probs[0], 3), rtol=0, atol=1e-7)
    np.testing.assert_allclose(np.r_[table["onset"].to_numpy(), table["offset"].to_numpy()[-1]], s.timestamps_s, atol=1e-12)


def test_queries_that_cannot_be_labels_or_columns_are_refused(ckpt, audio, tmp_path, capsys):
    for bad in ("", "dog\tbark"):
        code, out, err = cli(capsys, str(audio["a"]), "--query", bad, "--checkpoint", str(ckpt), "--device", "cpu")
        assert code == 2 and out == "" and "--query" in err and len(err.strip().splitlines()) == 1
    code, out, err = cli(capsys, str(audio["a"]), "--query", "onset", "--checkpoint", str(ckpt), "--scores", str(tmp_path / "s"))
    assert code == 2 and "onset" in err and not (tmp_path / "s").exists()


def test_two_inputs_with_one_name_the_second_fails_alone(ckpt, audio, tmp_path, capsys):
    other = tmp_path / "elsewhere"
    other.mkdir()
    twin = other / "a.flac"  # same id "a" as a.wav for sed_scores_eval
    sf.write(twin, np.zeros(SR, np.float32), SR)
    code, out, err = cli(
        capsys,
        *base_args(ckpt, audio["a"], twin, audio["b"]),
        "--format",
        "tsv",
        "--threshold",
        "0",
        "--scores",
        str(tmp_path / "s"),
    )
    assert code == 2
    assert any(str(twin) in line and "rename" in line for line in err.splitlines()), err
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["a.tsv", "b.tsv"]
    names = [line.split("\t")[0] for line in out.splitlines()[1:]]
    assert sorted(set(names)) == ["a.wav", "b.flac"]


def test_a_name_that_would_forge_tsv_rows_fails_alone_on_one_line(ckpt, audio, tmp_path, capsys):
    forged = tmp_path / "x\tforged\t0\t9\tgun.wav"
    sf.write(forged, np.zeros(SR, np.float32), SR)
    code, out, err = cli(capsys, *base_args(ckpt, audio["a"], forged), "--format", "tsv", "--threshold", "0")
    assert code == 2
    assert err.strip().splitlines()[-1] == (
        f"sedsynth detect: error: {str(forged)!r}: its name {forged.name!r} holds a tab or "
        "line break, which would forge rows of the TSV outputs; rename the file"
    )
    assert out.splitlines()[0].split("\t") == ["filename", "onset", "offset", "event_label"]
    assert {tuple(line.split("\t")[0::3]) for line in out.splitlines()[1:]} == {("a.wav", q) for q in QUERIES}


# --------------------------------------------------------------------------- item 16: each file fails alone


def test_tiny_files_get_pictures_and_a_bad_one_fails_alone(ckpt, audio, tmp_path, capsys):
    files = {
        "one": (np.array([0.5], np.float32), SR),
        "hundred": (np.full(100, 0.1, np.float32), SR),
        "below_one_sample": (np.array([0.5], np.float32), 44100),
    }  # 1/44100 s: no sample at 16 kHz
    for name, (x, rate) in files.items():
        sf.write(tmp_path / f"{name}.wav", x, rate, subtype="FLOAT")
    pictures, scores = tmp_path / "pictures", tmp_path / "scores"
    paths = [tmp_path / "one.wav", tmp_path / "below_one_sample.wav", audio["a"], tmp_path / "hundred.wav"]
    code, out, err = cli(
        capsys,
        *base_args(ckpt, *paths),
        "--format",
        "tsv",
        "--threshold",
        "0",
        "--pictures",
        str(pictures),
        "--scores",
        str(scores),
    )
    assert code == 2
    bad = [line for line in err.splitlines() if "error" in line]
    assert len(bad) == 1 and str(tmp_path / "below_one_sample.wav") in bad[0] and "empty" in bad[0], err
    assert sorted(p.name for p in pictures.iterdir()) == ["a.png", "hundred.png", "one.png"]
    for p in pictures.iterdir():
        assert p.read_bytes()[:8] == PNG
    assert sorted(read_sed_scores(scores)) == ["a", "hundred", "one"]
    rows = list(csv.reader(out.splitlines()[1:], delimiter="\t"))
    # threshold 0: one whole-file event per query for each file that scored
    assert sorted((r[0], r[3]) for r in rows) == sorted((f, q) for f in ("a.wav", "hundred.wav", "one.wav") for q in QUERIES)
    assert [float(r[2]) for r in rows if r[0] == "one.wav"] == [pytest.approx(1 / SR)] * len(QUERIES)


def test_a_picture_that_fails_keeps_its_detections_and_the_others(det, audio, tmp_path, monkeypatch):
    real = D.detection_figure

    def flaky(path, *args, **kwargs):
        if Path(path).stem == "a":
            raise RuntimeError("the plotting backend gave up")
        real(path, *args, **kwargs)

    monkeypatch.setattr(D, "detection_figure", flaky)
    rows, failed = D.detect(det, [str(audio["a"]), str(audio["b"])], QUERIES, threshold=0.0, picture_dir=tmp_path / "p")
    assert list(failed) == [str(audio["a"])] and "picture not drawn" in failed[str(audio["a"])]
    assert "the plotting backend gave up" in failed[str(audio["a"])]
    assert sorted({r.file for r in rows}) == sorted([str(audio["a"]), str(audio["b"])])  # a's detections stand
    assert [p.name for p in (tmp_path / "p").iterdir()] == ["b.png"]


@pytest.mark.parametrize("samples", [1, 100, 127, 129, 513, SR * 3 + 7])
def test_spectrogram_covers_the_clip_for_any_length_and_block_size(samples):
    x = np.random.default_rng(samples).standard_normal(samples).astype(np.float32)
    whole = Spectrogram(SR)
    whole.push(x)
    edges, bins, power = whole.columns()
    assert power.shape[1] >= 1 and power.shape == (len(bins) - 1, len(edges) - 1)
    assert edges[0] == 0.0 and edges[-1] == pytest.approx(samples / SR) and (np.diff(edges) > 0).all()
    assert bins[0] == 0 and bins[-1] == SR / 2 and np.isfinite(power).all()
    for block in (1, 50, 4096):
        if samples // block > 2000:
            continue
        streamed = Spectrogram(SR)
        for i in range(0, samples, block):
            streamed.push(x[i : i + block])
        e, _, p = streamed.columns()
        np.testing.assert_array_equal(e, edges)
        np.testing.assert_allclose(p, power, rtol=1e-5, atol=1e-12)


def test_spectrogram_columns_stay_bounded_and_keep_the_signal():
    """Hours cost what minutes do: columns merge pairwise; a tone stays in its frequency bin."""
    sketch = Spectrogram(SR, max_columns=64)
    t = np.arange(SR * 30) / SR
    tone = (0.5 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32)
    for i in range(0, len(tone), 12345):
        sketch.push(tone[i : i + 12345])
    edges, bins, power = sketch.columns()
    assert 32 <= power.shape[1] <= 64 and edges[-1] == pytest.approx(30.0)
    peak_hz = (bins[:-1] + bins[1:])[power.mean(axis=1).argmax()] / 2
    assert abs(peak_hz - 1000) <= SR / 512


# --------------------------------------------------------------------------- item 17: streaming, bounded memory


@pytest.mark.parametrize("name", ["a", "b", "long"])
def test_read_blocks_gives_read_audio_samples_for_any_block_size(audio, name):
    whole = decode_mono(audio[name], SR)
    for block in (997, 4096, 1 << 17):
        joined = np.concatenate(list(read_blocks(audio[name], SR, block_frames=block)))
        np.testing.assert_array_equal(joined, whole)
    joined = np.concatenate(list(read_blocks(audio[name].read_bytes(), SR, block_frames=5000)))
    np.testing.assert_array_equal(joined, whole)


def test_read_blocks_reports_bad_files_like_read_audio(tmp_path):
    bad = tmp_path / "x.wav"
    bad.write_bytes(b"not audio " * 50)
    empty = tmp_path / "empty.wav"
    sf.write(empty, np.zeros(0, np.float32), SR)
    nan = tmp_path / "nan.wav"
    x = np.zeros(3 * SR, np.float32)
    x[2 * SR] = np.nan
    sf.write(nan, x, SR, subtype="FLOAT")
    for path, reason in ((bad, "unreadable"), (empty, "empty"), (nan, "non-finite")):
        with pytest.raises(Exception, match=reason) as e:
            list(read_blocks(path, SR, block_frames=SR))
        assert e.type.__name__ == "AudioError" and e.value.reason == reason


@pytest.mark.parametrize("seconds", [0.0, 0.01, 9.99, 10.0, 10.05, 14.96, 23.0, 41.3, 300.07])
def test_window_cutter_cuts_the_detector_windows_whatever_the_blocks(det, seconds):
    """The contract both paths share, checked against :func:`window_starts` and the samples themselves."""
    n = round(seconds * SR)
    wave = np.arange(n, dtype=np.float32) + 1  # each sample names its position
    L = len(det.timestamps_s(n)) - 1
    rng = np.random.default_rng(n)
    for sizes in ([n or 1], [1000], list(rng.integers(1, 200000, 40))):
        cutter, windows, i, k, held = _WindowCutter(det), [], 0, 0, 0
        while i < n:
            windows += cutter.push(wave[i : i + sizes[k % len(sizes)]])
            i, k = i + sizes[k % len(sizes)], k + 1
            held = max(held, len(cutter.buffer) + sum(map(len, cutter.arrived)))
        windows += cutter.close()
        assert [w.start for w in windows] == window_starts(det, n)
        for w in windows:
            want = wave[w.start : w.start + det.window_samples]
            np.testing.assert_array_equal(w.samples, np.pad(want, (0, det.window_samples - len(want))))
            assert w.columns == min(det.columns, L - w.start // det.column_samples)
        # samples held at once: about a window, a hop and a block, however long the clip
        assert held <= det.window_samples + det.hop_samples + max(sizes)


@pytest.mark.parametrize("seconds", [0.01, 3.0, 10.0, 10.05, 23.0, 41.3])
def test_streamed_scores_equal_whole_wave_scores(det, seconds):
    rng = np.random.default_rng(round(seconds * 100))
    wave = (rng.standard_normal(round(seconds * SR)) * 0.1).astype(np.float32)
    vocab = det.vocabulary(QUERIES)
    (whole,) = det.score([wave], [vocab])
    for sizes in ([1000], [160001], list(rng.integers(1, 40000, 50))):  # small, over a window, ragged
        blocks, i, k = [], 0, 0
        while i < len(wave):
            blocks.append(wave[i : i + sizes[k % len(sizes)]])
            i += sizes[k % len(sizes)]
            k += 1
        streamed = det.score_stream(iter(blocks), [vocab])
        np.testing.assert_array_equal(streamed.timestamps_s, whole.timestamps_s)
        np.testing.assert_allclose(streamed.probs[0], whole.probs[0], rtol=0, atol=1e-6)
        np.testing.assert_allclose(streamed.clip, whole.clip, rtol=0, atol=1e-6)


def test_streamed_file_scores_equal_whole_file_scores(det, audio):
    vocab = det.vocabulary(QUERIES)
    (whole,) = det.score([decode_mono(audio["long"], SR)], [vocab])
    for block in (1000, 22050, 1 << 17):
        streamed = det.score_stream(read_blocks(audio["long"], SR, block_frames=block), [vocab])
        np.testing.assert_array_equal(streamed.timestamps_s, whole.timestamps_s)
        np.testing.assert_allclose(streamed.probs[0], whole.probs[0], rtol=0, atol=1e-6)


class StubEncoder:
    """Stands in for the audio encoder: cheap outputs of the right shapes, and the batch sizes it saw."""

    def __init__(self, det: Detector):
        self.d, self.columns, self.batches = det.model.text_proj[-1].out_features, det.columns, []

    def __call__(self, batch: torch.Tensor):
        self.batches.append(batch.shape[0])
        level = batch.abs().mean(dim=1, keepdim=True)  # (B, 1): something of the input, so scores vary
        return torch.ones(len(batch), self.d) * level, torch.ones(len(batch), self.columns + 1, self.d) * level[:, :, None]


def stubbed(ckpt: Path, monkeypatch, batch_size: int) -> tuple[Detector, StubEncoder]:
    det = Detector.from_checkpoint(ckpt, device="cpu", batch_size=batch_size)
    stub = StubEncoder(det)
    monkeypatch.setattr(det.model, "encode_audio", stub)
    return det, stub


def test_memory_does_not_grow_with_the_length_of_the_file(ckpt, tmp_path, monkeypatch):
    """Peak traced memory of ``detect`` (read, resample, score, score file) on 30 s and on 4 min of 22.05 kHz stereo.

    Pictures are bounded on their own (:class:`Spectrogram` columns, :func:`frame_envelope` steps; tested below).
    """
    det, stub = stubbed(ckpt, monkeypatch, batch_size=4)
    rng = np.random.default_rng(0)
    paths = {}
    for seconds in (30, 240):
        paths[seconds] = tmp_path / f"{seconds}s.wav"
        with sf.SoundFile(paths[seconds], "w", samplerate=22050, channels=2, subtype="PCM_16") as f:
            for _ in range(seconds // 10):
                f.write((rng.standard_normal((22050 * 10, 2)) * 0.1).astype(np.float32))
    D.detect(det, [str(paths[30])], QUERIES, scores_dir=tmp_path / "warm-up")  # imports and caches outside the trace
    peaks = {}
    for seconds, path in paths.items():
        tracemalloc.start()
        _, failed = D.detect(det, [str(path)], QUERIES, scores_dir=tmp_path / "s")
        _, peaks[seconds] = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert not failed
        assert read_sed_scores(tmp_path / "s" / f"{seconds}s.tsv")["offset"].iloc[-1] == pytest.approx(seconds)
    assert max(stub.batches) <= 4
    # held whole, the 4 min file alone is 15 MB of float32 at 16 kHz, and its 47 windows twice that
    assert peaks[240] < peaks[30] + 2e6, peaks
    assert peaks[240] < 20e6, peaks


def test_picture_curves_of_hours_are_bounded_and_keep_peaks():
    L = 3 * 3600 * 25 + 7  # 3 h of 40 ms frames
    edges = np.r_[np.arange(L) * 0.04, L * 0.04 - 0.01]
    probs = np.full((L, 2), 0.1, np.float32)
    probs[123_456, 0] = 0.97  # one frame: still visible
    e, low, high = frame_envelope(edges, probs)
    assert len(e) - 1 == len(low) == len(high) <= 2000
    assert e[0] == 0.0 and e[-1] == edges[-1] and (np.diff(e) > 0).all()
    assert high[:, 0].max() == pytest.approx(0.97) and low.min() == pytest.approx(0.1)
    short = probs[:500]
    e, low, high = frame_envelope(edges[:501], short)
    assert e is not None and low is short and high is short


def test_evaluate_style_clips_share_forward_passes(ckpt, monkeypatch):
    """Ten-second clips (the evaluate stage): one window each, ``batch_size`` clips per forward pass, in order."""
    det, stub = stubbed(ckpt, monkeypatch, batch_size=16)
    waves = [np.full(10 * SR, 0.01 * (k + 1), np.float32) for k in range(37)]
    out = list(det.score(iter(waves), [det.vocabulary(QUERIES)]))
    assert len(out) == 37 and stub.batches == [16, 16, 5]
    levels = [float(s.probs[0][0, 0]) for s in out]
    assert levels == sorted(levels) and len(set(levels)) == 37  # each clip got its own window back


# --------------------------------------------------------------------------- item 18: no params.yaml needed


def test_a_checkpoint_is_enough_without_params_yaml(ckpt, audio, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert not Path("params.yaml").exists()
    code, out, err = cli(capsys, *base_args(ckpt, audio["a"]), "--format", "tsv", "--threshold", "0")
    assert code == 0, err
    assert len(out.strip().splitlines()) == 1 + len(QUERIES)
    # --set still reaches evaluate.* without a params file
    code, out, err = cli(capsys, *base_args(ckpt, audio["a"]), "--set", "evaluate.window_overlap=1.5")
    assert code == 2 and "overlap" in err and out == ""


def test_without_params_yaml_or_checkpoint_the_error_says_pass_checkpoint(audio, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(capsys, str(audio["a"]), "--query", "dog")
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("sedsynth detect: error:") and "--checkpoint" in line and "params.yaml" in line
