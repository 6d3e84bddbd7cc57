"""The evaluate stage end to end on real shards and a tiny trained model; the ablation table."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from sed_scores_eval import collar_based, intersection_based
from sed_scores_eval.base_modules.io import read_audio_durations

from tests.conftest import tiny_train_params
from trainer import ablations, checkpoint
from trainer.stages.evaluate import HEADLINE
from trainer.stages.evaluate import run as evaluate
from trainer.stages.train import run as train


def read_rows(path: Path, reader=csv.DictReader, **kwargs) -> list:
    """Every row of a CSV/TSV file, the file closed after."""
    with open(path, newline="", encoding="utf-8") as f:
        return list(reader(f, **kwargs))


def write_desed(root: Path, corrupt: bool = False) -> dict:
    """A tiny DESED-layout eval set: 3 clips (one with no event), events and durations TSVs; the
    events TSV's last row (line 5) has an onset that is not a number."""
    audio = root / "audio"
    audio.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in ("a", "b", "c"):
        sf.write(audio / f"{name}.wav", (rng.standard_normal(44100 * 4) * 0.05).astype(np.float32), 44100)
    if corrupt:
        (audio / "c.wav").write_bytes(b"not audio at all")
    (root / "events.tsv").write_text(
        "filename\tonset\toffset\tevent_label\n"
        "a.wav\t0.5\t2.0\tDog\nb.wav\t1.0\t3.5\tSpeech\nb.wav\t0.2\t0.9\tDog\na.wav\tsoon\t3.0\tDog\n"
    )
    (root / "durations.tsv").write_text("filename\tduration\na.wav\t4.0\nb.wav\t4.0\nc.wav\t4.0\n")
    return {
        "kind": "desed",
        "audio_dir": str(audio),
        "events_tsv": str(root / "events.tsv"),
        "durations_tsv": str(root / "durations.tsv"),
    }


@pytest.fixture(scope="module")
def evaluated(shard_folder, mixed, tmp_path_factory):
    params, folder = shard_folder
    events_dir = mixed[2]
    tmp = tmp_path_factory.mktemp("evaluate")
    base = tiny_train_params(params, folder, tmp / "model")
    p = replace(base, train=replace(base.train, optim=replace(base.train.optim, max_steps=4)))
    train(p)
    desed = write_desed(tmp / "desed", corrupt=True)
    (tmp / "unusable.tsv").write_text("filename\tonset\toffset\tevent_label\na.wav\tsoon\t2.0\tDog\n")  # its one clip's only row
    benchmarks = {
        "desed": desed,
        "desed_unusable": {"kind": "desed", "audio_dir": desed["audio_dir"], "events_tsv": str(tmp / "unusable.tsv")},
        "urbansed_absent": {"kind": "urbansed", "root": str(tmp / "no-such-folder")},
    }
    p = replace(
        p,
        evaluate=replace(
            p.evaluate,
            checkpoint=str(tmp / "model" / "checkpoints" / "latest.pt"),
            shards=str(folder),
            event_clips=str(events_dir),
            pictures=2,
            device="cpu",
            out_dir=str(tmp / "eval"),
            benchmarks=benchmarks,
            probe_steps=20,
            probe_clips=8,
        ),
    )
    summary = evaluate(p)
    return p, tmp / "eval", summary


def test_metrics_cover_every_task_for_both_models(evaluated):
    _, out, summary = evaluated
    written = json.loads((out / "metrics.json").read_text())
    assert written["test"]["trained"] == pytest.approx(summary["test"]["trained"], nan_ok=True)
    test = written["test"]
    assert set(test) == {"trained", "untrained", "gain"}
    for model in ("trained", "untrained"):
        m = test[model]
        assert m["clips"] == 5 and m["zero_shot_clips"] > 0
        for key in HEADLINE:
            assert 0.0 <= m[key] <= 1.0 or (key == "alignment" and -1.0 <= m[key] <= 1.0), (model, key, m[key])
        assert m["a2t_r1"] <= m["a2t_r5"] <= m["a2t_r10"] and m["t2a_r1"] <= m["t2a_r5"] <= m["t2a_r10"]
    assert test["gain"]["auroc"] == pytest.approx(test["trained"]["auroc"] - test["untrained"]["auroc"])
    assert test["trained"]["psds1"] <= test["trained"]["psds1_astat0"]  # the same curves, with and without the penalty
    # timing lives beside the metrics, so metrics.json depends on the checkpoint and the data alone
    assert "time" not in written and not any("clips_per_s" in m for m in test.values())
    timing = json.loads((out / "timing.json").read_text())
    t = timing["time"]
    assert t["sed_scores_eval_s"] > 0 and 0 <= t["outside_sed_scores_eval_share"] < 1
    assert set(timing["clips_per_s"]) == {"trained", "untrained"} and all(v > 0 for v in timing["clips_per_s"].values())


@pytest.mark.parametrize("model", ["trained", "untrained"])
def test_psds_recomputed_from_the_written_files_matches(evaluated, model):
    _, out, summary = evaluated
    folder = out / "details" / "test"
    durations = read_audio_durations(folder / "durations.tsv")
    for key, kwargs in (
        ("psds1", {"dtc_threshold": 0.7, "gtc_threshold": 0.7, "alpha_ct": 0.0, "alpha_st": 1.0}),
        ("psds1_astat0", {"dtc_threshold": 0.7, "gtc_threshold": 0.7, "alpha_ct": 0.0, "alpha_st": 0.0}),
        ("psds2", {"dtc_threshold": 0.1, "gtc_threshold": 0.1, "cttc_threshold": 0.3, "alpha_ct": 0.5, "alpha_st": 1.0}),
    ):
        value, *_ = intersection_based.psds(
            str(folder / "scores" / model), str(folder / "ground_truth.tsv"), durations, max_efpr=100.0, **kwargs
        )
        assert value == pytest.approx(summary["test"][model][key], abs=1e-12), key


@pytest.mark.parametrize("model", ["trained", "untrained"])
def test_collar_f1_is_at_the_threshold_stored_in_the_trained_checkpoint(evaluated, model):
    """Both models at the threshold `sedsynth train` chose on the valid split; the F1 recomputes from the files."""
    p, out, summary = evaluated
    stored = checkpoint.read_entry(p.evaluate.checkpoint, "calibration")
    f1 = summary["protocol"]["collar_f1"]
    assert p.evaluate.f1_threshold == "checkpoint" and stored is not None
    assert f1["threshold"] == stored["threshold"] and f1["calibration"] == stored
    assert f1["threshold_source"].startswith("stored in the checkpoint: chosen on the valid split")
    folder = out / "details" / "test"
    value, *_ = collar_based.fscore(
        str(folder / "scores" / model),
        str(folder / "ground_truth.tsv"),
        stored["threshold"],
        onset_collar=0.2,
        offset_collar=0.2,
        offset_collar_rate=0.2,
    )
    assert value["macro_average"] == pytest.approx(summary["test"][model]["f1"], abs=1e-12)
    assert summary["benchmarks"]["desed"]["protocol"]["collar_f1"]["threshold"] == stored["threshold"]


def test_the_threshold_by_hand_or_the_fallback(evaluated, tmp_path, capsys):
    from trainer.stages.evaluate import collar_threshold

    p, _, _ = evaluated
    t, source, stored = collar_threshold(replace(p.evaluate, f1_threshold=0.3))
    assert (t, stored) == (0.3, None) and source.startswith("evaluate.f1_threshold")
    state = torch.load(p.evaluate.checkpoint, weights_only=True)
    del state["calibration"]  # as checkpoints were written before calibration
    old = tmp_path / "old.pt"
    torch.save(state, old)
    capsys.readouterr()
    t, source, stored = collar_threshold(replace(p.evaluate, checkpoint=str(old)))
    assert (t, stored) == (0.5, None) and source.startswith("fallback 0.5")
    assert "warning:" in capsys.readouterr().out


def test_protocol_states_how_the_numbers_were_computed(evaluated, shard_folder):
    from importlib.metadata import version

    from trainer.evaluation.testset import read_split

    p, out, summary = evaluated
    written = json.loads((out / "metrics.json").read_text())
    assert written["protocol"] == summary["protocol"]
    proto = written["protocol"]
    split = read_split(str(shard_folder[1]), "test")
    assert proto["sed_scores_eval"] == version("sed_scores_eval")
    assert proto["classes"] == list(split.classes) and proto["num_classes"] == len(split.classes)
    assert proto["clips"] == 5 and proto["events"] == sum(len(v) for v in split.ground_truth().values())
    assert proto["median_filter_frames"] == p.evaluate.median_filter_frames == 3
    assert (proto["psds1"]["alpha_st"], proto["psds1_astat0"]["alpha_st"], proto["psds2"]["cttc"]) == (1.0, 0.0, 0.3)
    assert (
        proto["segment_auroc"]["segment_s"] == p.evaluate.segment_s
        and proto["segment_auroc"]["pauroc_max_fpr"] == p.evaluate.max_fpr
    )
    onsets = read_rows(sorted((out / "details" / "test" / "scores" / "trained").glob("*.tsv"))[0], delimiter="\t")
    assert proto["frame_hop_s"] == pytest.approx(float(onsets[1]["onset"]) - float(onsets[0]["onset"]), abs=1e-6)
    desed = written["benchmarks"]["desed"]["protocol"]
    assert (desed["kind"], desed["classes"], desed["clips"], desed["events"], desed["published_psds1"]) == (
        "SedSet",
        ["Dog", "Speech"],
        2,
        3,
        "psds1",
    )
    assert "protocol" not in written["benchmarks"]["urbansed_absent"]


def test_ground_truth_and_per_class_tables(evaluated, shard_folder):
    _, out, _ = evaluated
    _, folder = shard_folder
    from trainer.evaluation.testset import read_split

    split = read_split(str(folder), "test")
    rows = read_rows(out / "details" / "test" / "ground_truth.tsv", delimiter="\t")
    expected = sorted((f"{i}.wav", on, off, c) for i, evs in split.ground_truth().items() for on, off, c in evs)
    assert sorted((r["filename"], float(r["onset"]), float(r["offset"]), r["event_label"]) for r in rows) == expected
    per_class = read_rows(out / "details" / "test" / "per_class_trained.csv")
    assert [r["class"] for r in per_class] == list(split.classes)
    assert sum(int(r["events"]) for r in per_class) == len(expected)
    scores = sorted((out / "details" / "test" / "scores" / "trained").glob("*.tsv"))
    assert [s.stem for s in scores] == sorted(split.ids)
    header = scores[0].read_text().splitlines()[0].split("\t")
    assert header == ["onset", "offset", *split.classes]


def test_plots_and_pictures(evaluated):
    _, out, _ = evaluated
    for name in ("roc_trained", "roc_untrained", "psds1_roc_trained", "psds2_roc_untrained"):
        rows = read_rows(out / "plots" / f"{name}.csv", csv.reader)
        assert rows[0] in (["fpr", "tpr"], ["efpr", "etpr"]) and len(rows) > 2
    assert (out / "plots" / "curves.png").stat().st_size > 10_000
    pictures = sorted((out / "details" / "pictures").glob("*.png"))
    assert len(pictures) == 2 and all(p.stat().st_size > 10_000 for p in pictures)
    confusion = read_rows(out / "details" / "test" / "confusion_trained.csv", csv.reader)
    assert confusion[0][:2] == ["true_class", "events"] and len(confusion) == len(confusion[0]) - 1  # a row per class
    assert (out / "details" / "test" / "confusion_trained.png").stat().st_size > 10_000


def test_benchmarks_present_absent_unusable_and_bad_audio(evaluated):
    _, out, summary = evaluated
    absent = summary["benchmarks"]["urbansed_absent"]
    assert "skipped" in absent and "no-such-folder" in absent["skipped"]
    unusable = summary["benchmarks"]["desed_unusable"]  # one line for the benchmark; the stage goes on
    assert set(unusable) == {"skipped"} and "no usable clip" in unusable["skipped"] and "unusable.tsv" in unusable["skipped"]
    desed = summary["benchmarks"]["desed"]
    assert set(desed) == {"trained", "untrained", "protocol"}
    assert desed["trained"]["clips"] == 2 and 0 <= desed["trained"]["auroc"] <= 1
    assert sorted(p.name for p in (out / "details" / "benchmarks" / "desed" / "scores" / "trained").glob("*.tsv")) == [
        "a.tsv",
        "b.tsv",
    ]
    skipped = read_rows(out / "details" / "skipped.csv")
    # the reader's skipped row and the clip no model could decode, each once, under the benchmark's name
    assert sorted((r["item_id"], r["reason"]) for r in skipped) == [("desed/a#line5", "malformed-row"), ("desed/c", "unreadable")]
    assert summary["skipped"] == len(skipped)


def test_same_params_same_metrics_file(evaluated, tmp_path):
    """metrics.json is a function of the checkpoint and the data: byte for byte the same on a second run."""
    p, out, summary = evaluated
    again = replace(p, evaluate=replace(p.evaluate, out_dir=str(tmp_path / "again"), pictures=0))
    second = evaluate(again)
    assert second["test"] == summary["test"]
    assert (tmp_path / "again" / "metrics.json").read_bytes() == (out / "metrics.json").read_bytes()
    for f in sorted((out / "details" / "test" / "scores" / "trained").glob("*.tsv")):
        assert (tmp_path / "again" / "details" / "test" / "scores" / "trained" / f.name).read_bytes() == f.read_bytes()


def test_a_failed_run_leaves_the_previous_outputs(evaluated, tmp_path):
    p, out, _ = evaluated
    before = {f: f.read_bytes() for f in (out / "details" / "test").rglob("*.tsv")}
    broken = {
        "desed": {"kind": "desed", "audio_dir": str(tmp_path), "events_tsv": str(tmp_path), "nope": 1}
    }  # a params mistake stops the run
    with pytest.raises(ValueError, match="unexpected key\\(s\\) nope"):
        evaluate(replace(p, evaluate=replace(p.evaluate, benchmarks=broken, pictures=0)))
    assert {f: f.read_bytes() for f in (out / "details" / "test").rglob("*.tsv")} == before
    assert not list(out.glob(".*.partial"))


def test_missing_checkpoint_says_what_to_do(evaluated, tmp_path):
    p, _, _ = evaluated
    with pytest.raises(FileNotFoundError, match="sedsynth train"):
        evaluate(replace(p, evaluate=replace(p.evaluate, checkpoint=str(tmp_path / "none.pt"), out_dir=str(tmp_path / "x"))))


# --------------------------------------------------------------------------- ablations


def test_variant_params_change_only_what_the_variant_names(params):
    base = replace(params, ablations=replace(params.ablations, out_dir="models/abl"))
    p = ablations.variant_params(base, "no_frame_loss", 7)
    assert p.train.loss.frame_weight == 0.0 and p.train.loss.clip_weight == base.train.loss.clip_weight and p.seed == 7
    assert (
        p.train.out_dir == "models/abl/no_frame_loss/seed7"
        and p.evaluate.checkpoint == "models/abl/no_frame_loss/seed7/checkpoints/latest.pt"
    )
    assert p.evaluate.out_dir == "models/abl/no_frame_loss/seed7/evaluation" and p.evaluate.untrained is False
    assert ablations.variant_params(base, "shared_projector", 7).train.model.adapter == "shared"
    assert ablations.variant_params(base, "infonce", 7).train.loss.clip == "infonce"
    assert ablations.variant_params(base, "full", 7).train.model == base.train.model
    with pytest.raises(ValueError, match="no_frame_loss"):
        ablations.variant_params(base, "nope", 7)


def test_ablation_table_layout_and_directions(tmp_path):
    def metrics(**changes):
        m = {"psds1": 0.2, "psds2": 0.4, "auroc": 0.9, "alignment": 0.5, "t2a_r1": 0.3, "a2t_r1": 0.35, "zero_shot_accuracy": 0.5}
        return {"test": {"trained": m | changes}}

    made = {
        "full": metrics(),
        "no_frame_loss": metrics(psds1=0.0, psds2=0.05, auroc=0.6, alignment=0.1),
        "no_clip_loss": metrics(t2a_r1=0.02, a2t_r1=0.02, zero_shot_accuracy=0.1),
        "shared_projector": metrics(),
        "infonce": metrics(),
    }
    for v, m in made.items():  # one seed each, in the folders of before seeds
        (tmp_path / v / "evaluation").mkdir(parents=True)
        (tmp_path / v / "evaluation" / "metrics.json").write_text(json.dumps(m))
    text = ablations.write_table(tmp_path)
    lines = text.splitlines()
    assert lines[0].startswith("| Methods | T2A R@1 | A2T R@1 | PSDS1 | PSDS2 |") and "paper DESED" in lines[0]
    assert (
        lines[2].startswith("| FineLAP (Ours) (n=1/3) | 30.0 | 35.0 | 0.200 | 0.400 |") and "| 45.7 | 62.5 | 0.344 |" in lines[2]
    )
    frame = next(line for line in lines if line.startswith("- w/o Frame-level Loss"))
    assert "PSDS1 down;" in frame and "AUROC down;" in frame
    clip = next(line for line in lines if line.startswith("- w/o Clip-level Loss"))
    assert "T2A R@1 down;" in clip and "A2T R@1 down;" in clip
    rows = read_rows(tmp_path / "table.csv")
    assert [r["variant"] for r in rows] == list(ablations.TABLE5)  # the extra rows (caption_loss, sam) only once they ran
    (tmp_path / "infonce" / "evaluation" / "metrics.json").unlink()
    with pytest.raises(FileNotFoundError, match="sedsynth ablate infonce"):
        ablations.table(tmp_path)


def test_grounding_retrieval_and_classification_benchmarks(shard_folder, tmp_path):
    from trainer.evaluation.detector import Detector
    from trainer.evaluation.metrics import Timer
    from trainer.evaluation.readers import ClassificationSet, GroundingSet, RetrievalSet
    from trainer.stages.evaluate import evaluate_benchmark

    params, folder = shard_folder
    p = tiny_train_params(params, folder, tmp_path / "m")
    det = Detector.untrained(p.train, seed=0, device="cpu")
    rng = np.random.default_rng(1)
    audio = {}
    for name, seconds, sr, channels in (("a", 3.0, 22050, 1), ("b", 12.5, 16000, 2), ("c", 1.0, 48000, 1)):
        path = tmp_path / f"{name}.wav"
        sf.write(path, (rng.standard_normal((int(seconds * sr), channels)) * 0.05).astype(np.float32), sr)
        audio[name] = str(path)
    skips = []
    grounding = GroundingSet(
        "g",
        audio,
        {
            "a": [("a dog barks", ((0.5, 1.5),))],
            "b": [("rain", ((0.0, 4.0), (8.0, 12.0))), ("a bell", ())],
            "c": [("a click", ((0.2, 0.3),))],
        },
        {"a": 3.0, "b": 12.5, "c": 1.0},
    )
    g, protocol = evaluate_benchmark(
        det, "g", grounding, p.evaluate, details=tmp_path, model="untrained", timer=Timer(), skips=skips
    )
    assert g["clips"] == 3 and 0 <= g["frame_auroc"] <= 1 and -1 <= g["alignment"] <= 1
    assert protocol == {"kind": "GroundingSet", "clips": 3, "phrases": 4, "frame_hop_s": pytest.approx(det.column_s)}
    retrieval = RetrievalSet("r", audio, {"a": ("dogs bark", "a dog"), "b": ("rain falls",), "c": ("a click",)})
    r, protocol = evaluate_benchmark(
        det, "r", retrieval, p.evaluate, details=tmp_path, model="untrained", timer=Timer(), skips=skips
    )
    assert protocol == {"kind": "RetrievalSet", "clips": 3, "captions": 4}
    assert r["a2t_r5"] == 1.0 and r["t2a_r5"] == 1.0 and r["a2t_r1"] <= 1.0  # 4 texts, 3 clips: all within 5
    labels = {"a": "dog", "b": "rain", "c": "dog"}
    classes = ClassificationSet("z", audio, labels, ("dog", "rain"), {"dog": "dog", "rain": "rain"})
    z, protocol = evaluate_benchmark(
        det, "z", classes, p.evaluate, details=tmp_path, model="untrained", timer=Timer(), skips=skips
    )
    assert protocol == {"kind": "ClassificationSet", "clips": 3, "template": "The sound of {}", "num_classes": 2}
    assert z["accuracy"] in (0.0, 1 / 3, 2 / 3, 1.0) and z["clips"] == 3 and not skips
