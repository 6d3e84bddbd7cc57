"""The evaluate stage's probes of the frozen encoder and its caption scores, on the tiny shards."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from trainer.config import load_params
from trainer.evaluation.captioning import NO_DECODER
from trainer.stages.evaluate import PROBE_HEADLINE
from trainer.stages.evaluate import run as evaluate

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def evaluate_params(smoke_run, mixed, out: Path, **changes):
    p, model_dir, _ = smoke_run
    e = replace(
        p.evaluate,
        checkpoint=str(model_dir / "checkpoints" / "latest.pt"),
        shards=p.train.data.sources[0].path,
        event_clips=str(mixed[2]),
        pictures=0,
        device="cpu",
        out_dir=str(out),
        probe_steps=20,
        probe_clips=8,
        **changes,
    )
    return replace(p, evaluate=e)


def test_probes_of_both_models_and_no_caption_decoder(smoke_run, mixed, tmp_path, capsys):
    summary = evaluate(evaluate_params(smoke_run, mixed, tmp_path / "eval"))
    written = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    probes = written["probes"]
    assert set(probes) == {"protocol", "trained", "untrained", "gain"}
    protocol = probes["protocol"]
    assert (protocol["train_split"], protocol["test_split"], protocol["steps"], protocol["max_clips"]) == ("train", "test", 20, 8)
    assert protocol["features"].startswith("audio encoder's final-layer frames") and protocol["feature_dim"] == 128
    assert protocol["mixtures"] == {"train": 8, "test": 5} and protocol["event_clips"]["train"] == 8
    for model in ("trained", "untrained"):
        p = probes[model]
        for pooling in ("mean", "attention"):
            clip = p[f"clip_{pooling}"]
            assert 0 <= clip["top1_accuracy"] <= 1 and 0 <= clip["mean_average_precision"] <= 1 and clip["train_clips"] == 8
        assert 0 <= p["frame"]["frame_auroc_macro"] <= 1 and p["frame"]["test_clips"] == 5 and p["frame"]["train_clips"] == 8
        assert p["frame"]["test_frames"] == 5 * 125 and p["unreadable"] == 0  # 10 s mixtures, 80 ms frames
    for probe, k in PROBE_HEADLINE:
        assert probes["gain"][f"{probe}_{k}"] == pytest.approx(
            probes["trained"][probe][k] - probes["untrained"][probe][k], nan_ok=True
        )
    assert written["captions"] == {"skipped": NO_DECODER} and summary["captions"] == written["captions"]
    report = capsys.readouterr().out
    assert "probes on the frozen encoder (train -> test)" in report and "captions: skipped" in report
    timing = json.loads((tmp_path / "eval" / "timing.json").read_text())["time"]
    assert timing["probes_s"] > 0 and timing["probes_s"] + timing["metrics_s"] <= timing["total_s"]


def test_a_missing_probe_split_is_skipped_and_caption_scores_can_be_off(smoke_run, mixed, tmp_path):
    p = evaluate_params(smoke_run, mixed, tmp_path / "eval", probe_split="nosuch", caption_metrics=False, untrained=False)
    summary = evaluate(p)
    assert "no nosuch-*.parquet files" in summary["probes"]["skipped"] and "captions" not in summary
    off = evaluate(replace(p, evaluate=replace(p.evaluate, probes=False, out_dir=str(tmp_path / "off"))))
    assert "probes" not in off and off["test"] == summary["test"]


def test_probe_settings_are_checked():
    from pipeline.config.params import ParamsError

    with pytest.raises(ParamsError, match="evaluate.probe_split"):
        load_params(overrides={"evaluate": {"probe_split": "test"}})
    with pytest.raises(ParamsError, match="evaluate.probe_pooling"):
        load_params(overrides={"evaluate": {"probe_pooling": ["max"]}})
    with pytest.raises(ParamsError, match="evaluate.probe_steps"):
        load_params(overrides={"evaluate": {"probe_steps": 0}})


def test_caption_scores_of_a_checkpoint_with_a_decoder(shard_folder, mixed, tmp_path):
    """A tiny run trained with the captioning loss: evaluate captions the test mixtures with the
    checkpoint's decoder and its stored word vocabulary, and scores them against their captions."""
    from tests.conftest import tiny_train_params
    from trainer import checkpoint
    from trainer.evaluation.detector import Detector
    from trainer.stages.train import run as train

    params, folder = shard_folder
    base = tiny_train_params(params, folder, tmp_path / "model")
    t = base.train
    decoder = replace(t.model.caption_decoder, dim=16, depth=1, heads=2, ffn=32, vocabulary_words=300)
    p = replace(
        base,
        train=replace(
            t,
            model=replace(t.model, caption_decoder=decoder),
            loss=replace(t.loss, caption_weight=1.0),
            optim=replace(t.optim, max_steps=2),
        ),
    )
    train(p)
    p = evaluate_params((p, tmp_path / "model", None), mixed, tmp_path / "eval", probes=False, untrained=False)
    summary = evaluate(p)
    scores = summary["captions"]
    assert scores["captions"] == 5 and scores["decoding"] == "greedy" and scores["unreadable"] == 0
    assert all(0 <= scores[k] <= 1 for k in ("bleu_1", "bleu_4", "rouge_l")) and 0 <= scores["cider_d"] <= 10
    rows = (tmp_path / "eval" / "details" / "test" / "captions_trained.csv").read_text().splitlines()
    assert rows[0] == "id,prediction,reference" and len(rows) == 6
    stored = checkpoint.read(p.evaluate.checkpoint)["config"]["caption_vocabulary"]["words"]
    assert Detector.from_checkpoint(p.evaluate.checkpoint, device="cpu").objective.captioner.tokenizer.words == stored


def test_models_probed_together_get_the_frames_each_gives_alone(smoke_run):
    """One decode and one log-mel for both models (their front ends are alike): each model's frames
    are bit for bit those it gives read on its own."""
    import numpy as np

    from trainer.evaluation.detector import Detector
    from trainer.evaluation.encoder_probes import encoder_frames

    p, model_dir, _ = smoke_run
    trained = Detector.from_checkpoint(model_dir / "checkpoints" / "latest.pt", device="cpu", batch_size=3)
    untrained = Detector.untrained(trained.train_params, 0, device="cpu", batch_size=3)
    rng = np.random.default_rng(0)
    waves = [
        rng.normal(scale=0.1, size=n).astype(np.float32)
        for n in (trained.window_samples + 5000, 16000, 3 * trained.window_samples // 2)
    ]
    together = encoder_frames([trained, untrained], waves)
    alone = [encoder_frames([det], waves)[0] for det in (trained, untrained)]
    for a, b in zip(together, alone):
        assert len(a) == len(b) == 3 and all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(together[0][0], together[1][0])  # two models, two sets of frames
