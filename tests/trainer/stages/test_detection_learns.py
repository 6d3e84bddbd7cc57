"""Training makes a detector: a short CPU run on a tiny two-class corpus, taken through the real
stages (clip, ambience, mix, captions, clusters, shards, train, evaluate), lifts PSDS1 on the
held-out test split far above the same model at its initial weights, which scores about 0; and
on two classes that sound alike (two high bright tonal sounds the default model confuses) the
trained head tells them apart, not only sound from silence: each class's query fires on its own
events far above the other's."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from pipeline.config.params import ComputeParams, MixtureCounts
from pipeline.corpus import write_ambience_library
from pipeline.corpus.sound_models import synthesize
from pipeline.ontology import default_ontology, fsd50k_label_name
from pipeline.stages import ambience, captions, clip, clusters, mix, shards
from pipeline.stages.clusters import load_inventory
from pipeline.text.inventory import FORMAT_VERSION
from tests.conftest import tiny_train_params, write_fsd50k
from trainer.config import Params
from trainer.stages import evaluate, train

# A noisy and a harmonic class, far apart in band and texture: a tiny model separates them in a
# few steps, and PSDS1 (alpha_st 1) needs every class detected, not just the easier one.
CLASSES = ("Water tap, faucet", "Vehicle horn, car horn, honking")
# clips per class in FSD50K's train, val and eval splits (the mix stage's train, valid and test):
# a mixture draws up to 5 distinct clips, and every split holds both classes
CLIPS_PER_SPLIT = {"train": 20, "val": 5, "eval": 5}
SAMPLE_RATE_HZ = 16000
MIXTURES = MixtureCounts(train=40, valid=6, test=16)
STEPS, BATCH, LR = 15, 8, 3e-3
MARGIN = 0.2  # measured (seeds 0-2, 15 steps): trained 0.3-0.5, untrained 0.0


CONFUSABLE = ("Bicycle bell", "Chink, clink")  # both tonal, 3-7 kHz and 2.5-8 kHz
CONFUSABLE_STEPS, CONFUSABLE_LR = 150, 3e-3


def write_corpus(root: Path, seed: int, classes: tuple[str, ...] = CLASSES) -> Path:
    """An FSD50K-layout corpus at ``root``: per split, ``CLIPS_PER_SPLIT`` clips of each of ``classes``.

    Each clip is 0.5 s of faint noise, 1.5-3 s of the class's sound (single-label: the leaf MID
    and its non-abstract ancestors, as FSD50K lists them) and 0.5 s of faint noise again.
    """
    onto = default_ontology()
    rng = np.random.default_rng(seed)
    pad = np.zeros(SAMPLE_RATE_HZ // 2, np.float32)
    dev_rows, eval_rows, audio = [], [], {}
    for split, count in CLIPS_PER_SPLIT.items():
        for _ in range(count):
            for name in classes:
                mid = onto.by_name[name].mid
                chain = [mid] + [a for a in onto.ancestors(mid) if not onto.by_mid[a].abstract]
                fname = str(1000 + len(audio))
                event = 0.3 * synthesize(name, rng, float(rng.uniform(1.5, 3.0)), SAMPLE_RATE_HZ)
                x = np.concatenate([pad, event, pad])
                x += 1e-4 * rng.standard_normal(len(x)).astype(np.float32)
                row = (fname, ",".join(fsd50k_label_name(onto.by_mid[m].name) for m in chain), ",".join(chain))
                (eval_rows.append(row) if split == "eval" else dev_rows.append((*row, split)))
                audio[fname] = (x, SAMPLE_RATE_HZ, "PCM_16")
    return write_fsd50k(root, dev_rows, eval_rows, audio)


def write_inventory(path: Path, classes: tuple[str, ...] = CLASSES) -> Path:
    """A cluster inventory holding only the clusters of ``classes`` (flat, ids 0..n-1), copied
    from the default one: the clusters stage then embeds a handful of phrases, not ~800."""
    by_mid = {c["mid"]: c for c in load_inventory("default")}
    onto = default_ontology()
    kept = [by_mid[onto.by_name[name].mid] for name in classes]
    clusters_ = [{**c, "id": i, "parent_ids": []} for i, c in enumerate(kept)]
    path.write_text(json.dumps({"version": FORMAT_VERSION, "attribution": "test", "clusters": clusters_}))
    return path


def build_dataset(tmp: Path, seed: int, classes: tuple[str, ...] = CLASSES) -> tuple[Params, Path]:
    """The corpus through clip, ambience, mix, captions, clusters and shards, in this process.

    Returns ``(params, shard folder)``. The phrase database holds the dataset's phrases only,
    so every negative phrase names the other class.
    """
    tmp.mkdir(parents=True, exist_ok=True)
    p = replace(Params(seed=seed), compute=ComputeParams(workers=1, chunk_size=4))
    p = replace(
        p,
        clip=replace(p.clip, plot_examples=0),
        mix=replace(
            p.mix,
            mixtures=MIXTURES,
            partition_size=100,
            event_split="fsd50k",
            export=replace(p.mix.export, timelines=0),
            out_dir=str(tmp / "mix"),
        ),
        clusters=replace(
            p.clusters, inventory=str(write_inventory(tmp / "inventory.json", classes)), include_inventory_phrases=False
        ),
    )
    write_corpus(tmp / "fsd50k", seed, classes)
    write_ambience_library(tmp / "ambience", n_recordings=8, seed=seed)
    clip.run(p, tmp / "fsd50k", tmp / "events")
    ambience.run(p, tmp / "ambience", tmp / "backgrounds")
    mix.run(p, tmp / "events", tmp / "backgrounds", tmp / "mix")
    captions.run(p, tmp / "mix", tmp / "captions")
    clusters.run(p, tmp / "captions", tmp / "clusters")
    shards.run(p, tmp / "mix", tmp / "captions", tmp / "clusters", tmp / "dataset")
    return p, tmp / "dataset"


def train_and_evaluate(
    params: Params, folder: Path, out: Path, lr: float = LR, steps: int = STEPS, event_clips: Path | None = None
) -> dict:
    """Train the tiny model ``steps`` steps at ``lr`` on ``folder``, then evaluate it and its
    untrained twin on the test split (and zero-shot on ``event_clips``, a clip stage's folder);
    returns ``metrics.json``'s ``test`` block."""
    p = tiny_train_params(params, folder, out / "model")
    t = p.train
    p = replace(
        p, train=replace(t, data=replace(t.data, batch_size=BATCH), optim=replace(t.optim, lr=lr, max_steps=steps, epochs=100))
    )
    train.run(p)
    p = replace(
        p,
        evaluate=replace(
            p.evaluate,
            checkpoint=str(out / "model" / "checkpoints" / "latest.pt"),
            shards=str(folder),
            event_clips=str(event_clips) if event_clips else None,
            untrained=True,
            pictures=0,
            device="cpu",
            benchmarks={},
            out_dir=str(out / "eval"),
            probe_steps=100,
        ),
    )
    evaluate.run(p)
    return json.loads((out / "eval" / "metrics.json").read_text())["test"]


def test_training_lifts_psds1_far_above_the_untrained_model(tmp_path):
    params, folder = build_dataset(tmp_path / "data", seed=0)
    test = train_and_evaluate(params, folder, tmp_path / "run")
    trained, untrained = test["trained"]["psds1"], test["untrained"]["psds1"]
    assert untrained <= 0.02, test["untrained"]
    assert trained - untrained >= MARGIN, (trained, untrained)
    assert test["gain"]["psds1"] == trained - untrained


def test_trained_head_tells_two_confusable_classes_apart(tmp_path):
    """Zero-shot through the frame head on the held-out isolated clips (5 per class): every clip
    goes to its own class (measured on seeds 0-3: 1.0 each; untrained 0.5, chance); and in the
    test mixtures each class's query fires higher on its own events than the other's does."""
    params, folder = build_dataset(tmp_path / "data", seed=0, classes=CONFUSABLE)
    test = train_and_evaluate(
        params, folder, tmp_path / "run", lr=CONFUSABLE_LR, steps=CONFUSABLE_STEPS, event_clips=tmp_path / "data" / "events"
    )
    assert test["trained"]["zero_shot_clips"] == 10
    assert test["trained"]["zero_shot_frame_accuracy"] == 1.0 and test["untrained"]["zero_shot_frame_accuracy"] <= 0.6, test
    rows = list(csv.DictReader(open(tmp_path / "run" / "eval" / "details" / "test" / "confusion_trained.csv", encoding="utf-8")))
    classes = [r["true_class"] for r in rows]
    assert len(classes) == 2 and all(int(r["events"]) > 0 for r in rows), rows
    for r in rows:
        other = next(c for c in classes if c != r["true_class"])
        assert float(r[r["true_class"]]) > float(r[other]), rows
