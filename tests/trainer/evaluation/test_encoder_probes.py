"""Probes on a detector's frozen encoder: frames line up with the detector's grid across windows,
frame targets line up with the frames (features that encode the events score AUROC ~1, noise
~0.5), event clips train on one side and score on the other, the fast attention pooling is
multi-head attention, single-label mAP ranks by softmax, and the heads fit on one CPU thread."""

from __future__ import annotations

import contextlib
import gc
import io
import weakref
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
import torch
from torch import nn

from trainer.evaluation.detector import Detector
from trainer.evaluation.encoder_probes import encoder_frames, frame_targets, one_cpu_thread, probe_data, run_probes
from trainer.evaluation.probes import AttentionPool
from trainer.evaluation.testset import EventClips

pytestmark = pytest.mark.usefixtures("one_torch_thread")

RATE, COLUMN, COLUMNS = 8000, 400, 40  # 50 ms columns, 2 s windows
TONES = {"Bark": 500.0, "Meow": 1000.0, "Knock": 2000.0}


class ToneEncoder(nn.Module):
    """Per 50 ms column, the magnitude at each class's tone frequency (or seeded noise): a stand-in
    encoder whose frames encode which classes sound there. ``(B, S) -> (cls, (B, L, 1, D))``."""

    def __init__(self, noise: bool = False):
        super().__init__()
        self.noise, self.width = noise, len(TONES) + 1
        t = np.arange(COLUMN) / RATE
        self.basis = torch.tensor(np.stack([np.exp(-2j * np.pi * f * t) for f in TONES.values()]), dtype=torch.complex64)

    def forward(self, wave: torch.Tensor):
        cols = wave.reshape(len(wave), -1, COLUMN).to(torch.complex64)  # (B, L, COLUMN)
        mags = (cols @ self.basis.T).abs() / COLUMN  # (B, L, classes)
        dense = torch.cat([mags, cols.real.abs().mean(-1, keepdim=True)], dim=-1)
        if self.noise:
            dense = torch.randn(dense.shape, generator=torch.Generator().manual_seed(int(wave.abs().sum() * 1e3) % 2**31))
        return dense.mean(1), dense[:, :, None]


def stub_detector(noise: bool = False, batch_size: int = 3):
    """What the probes read of a :class:`Detector`: its grid, encoder, device and label overlap."""
    det = SimpleNamespace(
        sample_rate_hz=RATE,
        column_samples=COLUMN,
        columns=COLUMNS,
        window_samples=COLUMNS * COLUMN,
        column_s=COLUMN / RATE,
        batch_size=batch_size,
        device=torch.device("cpu"),
        autocast=contextlib.nullcontext,
        model=SimpleNamespace(encoder=ToneEncoder(noise)),
        train_params=SimpleNamespace(data=SimpleNamespace(min_label_overlap=0.5)),
    )
    det.timestamps_s = lambda n: Detector.timestamps_s(det, n)
    return det


def tone_events(rng, duration_s: float) -> tuple[np.ndarray, list[dict]]:
    """Faint noise with each class's tone over one random span (or none) -> ``(wave, phrases)``."""
    n = round(duration_s * RATE)
    wave = rng.normal(scale=0.01, size=n)
    phrases = []
    for label, f in TONES.items():
        if rng.random() < 0.6:
            start = rng.uniform(0, duration_s - 0.5)
            end = min(duration_s, start + rng.uniform(0.3, 1.5))
            a, b = round(start * RATE), round(end * RATE)
            wave[a:b] += 0.3 * np.sin(2 * np.pi * f * np.arange(b - a) / RATE)
            phrases.append({"phrase": label.lower(), "label": label, "segments": [{"start_s": start, "end_s": end}]})
    return wave.astype(np.float32), phrases


class MemorySplit:
    """A :class:`~trainer.evaluation.testset.ShardSplit` held in memory: FLAC bytes per mixture."""

    def __init__(self, rng, n: int, duration_s: float = 3.0, prefix: str = "m"):
        self.ids = tuple(f"{prefix}{k:03d}" for k in range(n))
        self.durations_s, self.phrases, self.bytes = {}, {}, {}
        for i in self.ids:
            wave, self.phrases[i] = tone_events(rng, duration_s)
            buf = io.BytesIO()
            sf.write(buf, wave, RATE, format="FLAC", subtype="PCM_16")
            self.bytes[i], self.durations_s[i] = buf.getvalue(), duration_s

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(sorted({p["label"] for ps in self.phrases.values() for p in ps}))

    def audio(self):
        yield from ((i, self.bytes[i]) for i in self.ids)


def settings(**changes):
    e = dict(probe_steps=60, probe_lr=0.05, probe_heads=1, probe_pooling=("mean", "attention"), segment_s=0.5)
    return SimpleNamespace(**(e | changes))


def test_frames_follow_the_detector_grid_across_windows():
    det = stub_detector(batch_size=2)
    rng = np.random.default_rng(0)
    waves = [rng.normal(size=n).astype(np.float32) for n in (COLUMNS * COLUMN * 2 + 3 * COLUMN + 17, 5 * COLUMN, 1)]
    (frames,) = encoder_frames([det], waves)
    for wave, f in zip(waves, frames):
        assert f.shape == (len(det.timestamps_s(len(wave))) - 1, ToneEncoder().width)
        padded = np.pad(wave, (0, -len(wave) % COLUMN)).reshape(-1, COLUMN)  # each column on its own
        assert np.allclose(f[:, -1], np.abs(padded).mean(axis=1), atol=1e-6)


def test_frames_give_the_freed_heap_back_every_so_many_clips(monkeypatch):
    import trainer.evaluation.encoder_probes as EP

    released = []
    monkeypatch.setattr(EP, "RELEASE_EVERY_CLIPS", 2)
    monkeypatch.setattr(EP, "release_freed_heap", lambda: released.append(True))
    waves = [np.random.default_rng(k).normal(size=3 * COLUMN).astype(np.float32) for k in range(5)]
    (frames,) = encoder_frames([stub_detector()], waves)
    assert len(frames) == 5 and len(released) == 3  # after the 2nd and the 4th clip, and once the last is read


def test_frame_probe_scores_events_the_features_encode_and_not_noise():
    rng = np.random.default_rng(1)
    train, test = MemorySplit(rng, 16, prefix="a"), MemorySplit(rng, 12, prefix="b")
    data = probe_data(train, test, None, None, max_clips=12, seed=0)
    assert data.train_ids == train.ids[:12] and data.test_ids == test.ids
    found = run_probes({"tones": stub_detector()}, data, settings(), seed=0)["tones"]
    frame = found["frame"]
    assert frame["frame_auroc_macro"] >= 0.97 and frame["segment_f1"] >= 0.8
    assert frame["classes_scored"] == 3 and frame["train_clips"] == 12 and frame["test_clips"] == 12
    assert frame["test_frames"] == 12 * 60 and found["unreadable"] == 0
    assert found["clip_mean"] == {"skipped": "no event clips (evaluate.event_clips: null)"}
    noise = run_probes({"noise": stub_detector(noise=True)}, data, settings(), seed=0)["noise"]["frame"]
    assert abs(noise["frame_auroc_macro"] - 0.5) <= 0.1
    assert run_probes({"again": stub_detector()}, data, settings(), seed=0)["again"] == found  # a seed fixes every figure
    # probed together (one decode, heads fitted side by side on two threads), each model gets its own figures
    together = run_probes({"tones": stub_detector(), "noise": stub_detector(noise=True)}, data, settings(), seed=0)
    assert together["tones"] == found and repr(together["noise"]["frame"]) == repr(noise)  # repr: NaN == NaN


def test_frame_targets_mark_the_frames_an_event_covers():
    det = stub_detector()
    split = SimpleNamespace(
        durations_s={"x": 1.0},
        phrases={
            "x": [
                {"label": "Bark", "segments": [{"start_s": 0.1, "end_s": 0.33}]},  # frames 2..6 (0.30-0.35 half covered: in)
                {"label": "Other", "segments": [{"start_s": 0.0, "end_s": 1.0}]},
            ]
        },
    )  # not a probed class
    targets = frame_targets(det, split, ["x"], [np.zeros((20, 4))], ("Bark", "Meow"), 0.5)
    assert targets.shape == (1, 20, 2)
    assert np.flatnonzero(targets[0, :, 0]).tolist() == [2, 3, 4, 5, 6] and not targets[0, :, 1].any()


def write_clips(folder, rng, per_class: int, prefix: str) -> EventClips:
    """Tone clips of 0.4-1.2 s per class (a different length each) as WAV files."""
    audio, labels = {}, {}
    for label, f in TONES.items():
        for k in range(per_class):
            i = f"{prefix}-{label}-{k}"
            n = round(rng.uniform(0.4, 1.2) * RATE)
            wave = 0.3 * np.sin(2 * np.pi * f * np.arange(n) / RATE) + rng.normal(scale=0.05, size=n)
            sf.write(folder / f"{i}.wav", wave.astype(np.float32), RATE)
            audio[i], labels[i] = str(folder / f"{i}.wav"), label
    return EventClips(audio, labels)


def test_clip_probes_train_on_one_side_and_score_the_other(tmp_path):
    rng = np.random.default_rng(2)
    train, test = write_clips(tmp_path, rng, 6, "train"), write_clips(tmp_path, rng, 3, "test")
    # a held-out clip listed on the training side too is dropped there; a draw keeps at most max_clips
    both = EventClips(train.audio | {"test-Bark-0": test.audio["test-Bark-0"]}, train.labels | {"test-Bark-0": "Bark"})
    split = MemorySplit(rng, 2)
    data = probe_data(split, split, both, test, max_clips=15, seed=3)
    assert len(data.train_clips.audio) == 15 and not set(data.train_clips.audio) & set(test.audio)
    assert data == probe_data(split, split, both, test, max_clips=15, seed=3)
    out = run_probes({"tones": stub_detector()}, data, settings(), seed=0)["tones"]
    for pooling in ("mean", "attention"):
        probe = out[f"clip_{pooling}"]
        assert probe["top1_accuracy"] == 1.0 and probe["mean_average_precision"] == 1.0, pooling
        assert probe["train_clips"] == 15 and probe["test_clips"] == 9 and probe["classes"] == 3


def test_the_clip_probes_read_their_clips_once_the_frame_probes_features_are_gone(tmp_path, monkeypatch):
    """One probe set's features at a time: the frame probes' padded frames are freed before the
    event clips are decoded, so their memory and the clip probes' never add up."""
    from trainer.evaluation import encoder_probes

    rng = np.random.default_rng(4)
    clips = write_clips(tmp_path, rng, 4, "train"), write_clips(tmp_path, rng, 2, "test")
    data = probe_data(MemorySplit(rng, 4), MemorySplit(rng, 3, prefix="t"), *clips, max_clips=20, seed=0)
    frames_fed: list[weakref.ref] = []
    when_clips_read: list[tuple[int, int]] = []  # (frame features fed so far, still alive)
    fit, read = encoder_probes.frame_probe, encoder_probes.clip_features

    def frame_probe(xa, ya, xb, yb, **kwargs):
        frames_fed.extend(weakref.ref(x) for x in (xa, xb))
        return fit(xa, ya, xb, yb, **kwargs)

    def clip_features(*args):
        gc.collect()
        when_clips_read.append((len(frames_fed), sum(r() is not None for r in frames_fed)))
        return read(*args)

    monkeypatch.setattr(encoder_probes, "frame_probe", frame_probe)
    monkeypatch.setattr(encoder_probes, "clip_features", clip_features)
    out = run_probes({"a": stub_detector(), "b": stub_detector(noise=True)}, data, settings(), seed=0)
    assert when_clips_read == [(4, 0), (4, 0)]  # both sides' clips, after both models' frame probes, none of their frames kept
    assert all("skipped" not in out[m][probe] for m in "ab" for probe in ("frame", "clip_mean", "clip_attention"))


def test_fast_attention_pooling_is_multi_head_attention():
    torch.manual_seed(0)
    pool = AttentionPool(16, heads=4)
    x = torch.randn(5, 7, 16)
    valid = torch.rand(5, 7) > 0.4
    valid[:, 0] = True
    reference, _ = pool.attend(pool.query.expand(5, -1, -1), x, x, key_padding_mask=~valid, need_weights=False)
    assert torch.allclose(pool(x, valid), reference[:, 0], atol=1e-5)


def test_single_label_map_ranks_clips_by_softmax_probability():
    """With no training step the head is its seeded initialisation, so its scores can be redone by
    hand: the mAP is over softmax probabilities (raw logits rank these clips otherwise)."""
    from sklearn.metrics import average_precision_score

    from trainer.evaluation.probes import ClipProbeSettings, clip_probe

    rng = np.random.default_rng(7)
    x_train, x_test = rng.normal(size=(12, 3, 6)).astype(np.float32), rng.normal(size=(10, 3, 6)).astype(np.float32)
    x_test *= rng.uniform(0.2, 5.0, size=(10, 1, 1)).astype(np.float32)  # clips of very different scales
    y_train, y_test = np.arange(12) % 3, np.arange(10) % 3
    out = clip_probe(x_train, y_train, x_test, y_test, ClipProbeSettings(steps=0, seed=4))
    frames = torch.from_numpy(x_train).reshape(-1, 6)
    mean, std = frames.mean(0), frames.std(0, correction=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4)
        head = nn.Linear(6, 3)
    with torch.no_grad():
        logits = head(((torch.from_numpy(x_test) - mean) / std).mean(1))
    truth = np.eye(3, dtype=bool)[y_test]

    def map_of(scores):
        return np.mean([average_precision_score(truth[:, c], scores[:, c]) for c in range(3)])

    assert out["mean_average_precision"] == pytest.approx(map_of(logits.softmax(1).numpy()), abs=1e-9)
    assert abs(map_of(logits.numpy()) - map_of(logits.softmax(1).numpy())) > 0.01


def test_probe_heads_fit_on_one_cpu_thread():
    torch.set_num_threads(2)
    with one_cpu_thread(torch.device("cpu")):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with one_cpu_thread(torch.device("meta")):  # another device: torch's CPU threads are left alone
        assert torch.get_num_threads() == 2


def test_heads_fitted_side_by_side_match_one_after_another(monkeypatch):
    """Fits run on a pool of threads, each on one torch thread, give the figures of a sequential
    run; their seeded initialisations do not mix although they share torch's global generator."""
    from trainer.evaluation import encoder_probes
    from trainer.evaluation.probes import ClipProbeSettings, clip_probe, frame_probe

    rng = np.random.default_rng(5)
    x, x_test = rng.normal(size=(40, 6, 8)).astype(np.float32), rng.normal(size=(20, 6, 8)).astype(np.float32)
    y, y_test = np.arange(40) % 4, np.arange(20) % 4
    frames_y, frames_y_test = rng.random((40, 6, 3)) > 0.7, rng.random((20, 6, 3)) > 0.7
    threads: list[int] = []

    def fits() -> dict:
        def counted(fit):
            return lambda: (threads.append(torch.get_num_threads()), fit())[1]

        jobs = {
            (seed, "clip"): counted(
                lambda seed=seed: clip_probe(x, y, x_test, y_test, ClipProbeSettings(pooling="attention", steps=40, seed=seed))
            )
            for seed in range(3)
        }
        jobs |= {
            (seed, "frame"): counted(lambda seed=seed: frame_probe(x, frames_y, x_test, frames_y_test, steps=40, seed=seed))
            for seed in range(3)
        }
        return jobs

    torch.set_num_threads(2)
    monkeypatch.setattr(encoder_probes.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    together = encoder_probes.fit_side_by_side(fits(), torch.device("cpu"))
    assert torch.get_num_threads() == 2 and threads == [1] * 6
    alone = {key: fit() for key, fit in fits().items()}
    assert together == alone
    assert together[0, "clip"] != together[1, "clip"]  # the seed matters, so a mixed-up initialisation would show
