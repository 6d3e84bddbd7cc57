"""Training on a mixed list of sources: synthetic shards, an imported AudioSet-Strong-style corpus, an
imported TACOS-style corpus and a captions CSV, each taking its weight's share of the batches."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pipeline.config.params import ComputeParams
from pipeline.stages import imports
from tests.conftest import tiny_train_params
from tests.pipeline.imports.conftest import MidIndex, write_audioset_strong, write_tone
from trainer.config import SourceParams
from trainer.stages.train import run as train

WEIGHTS = (1.0, 0.5, 0.25, 0.75)  # synthetic, AudioSet-Strong-style, TACOS-style, captions CSV
TACOS_STRONG = """filename,onset,offset,caption
t1.wav,0.5,2.0,A dog barks twice.
t1.wav,1.5,4.0,A car passes by slowly.
t2.wav,0.0,3.0,Rain falls on a tin roof.
t3.wav,2.0,2.5,A door slams shut.
"""


@pytest.fixture(scope="module")
def sources(shard_folder, tmp_path_factory):
    params, synthetic = shard_folder
    tmp = tmp_path_factory.mktemp("mixed")
    p = replace(params, compute=ComputeParams(workers=1, chunk_size=4))
    audioset = tmp / "audioset-strong"
    imports.run(p, "audioset-strong", write_audioset_strong(tmp / "as_root"), audioset, {"valid_fraction": 0.0}, index=MidIndex())
    tacos_root = tmp / "tacos_root"
    tacos_root.mkdir()
    (tacos_root / "annotations_strong.csv").write_text(TACOS_STRONG, encoding="utf-8")
    for i, freq in enumerate((300.0, 500.0, 700.0), start=1):
        write_tone(tacos_root / "audio" / f"t{i}.wav", 6.0, 16000, freq)
    tacos = tmp / "tacos"
    imports.run(p, "tacos", tacos_root, tacos, {"split": "train"}, index=MidIndex())
    captions = tmp / "captions"
    for i in range(5):
        write_tone(captions / "audio" / f"c{i}.wav", 3.0, 16000, 200.0 + 100 * i)
    (captions / "captions.csv").write_text(
        "file_name,caption\n" + "".join(f"c{i}.wav,a steady tone number {i}\n" for i in range(5))
    )
    return (
        params,
        [
            SourceParams(path=str(synthetic), weight=WEIGHTS[0]),
            SourceParams(path=str(audioset), weight=WEIGHTS[1]),
            SourceParams(path=str(tacos), weight=WEIGHTS[2]),
            SourceParams(
                kind="captions",
                path=str(captions / "captions.csv"),
                audio_dir=str(captions / "audio"),
                level="clip",
                weight=WEIGHTS[3],
            ),
        ],
        synthetic,
    )


def test_each_source_takes_its_weight_of_the_batches(sources, tmp_path):
    params, listed, synthetic = sources
    base = tiny_train_params(params, synthetic, tmp_path / "run")
    t = base.train
    p = replace(
        base,
        train=replace(
            t, data=replace(t.data, sources=tuple(listed), valid=None, batch_size=8), loss=replace(t.loss, region_weight=1.0)
        ),
    )
    summary = train(p)
    shares = json.loads((tmp_path / "run" / "metrics.json").read_text())["source_shares"]
    assert summary["steps"] >= 5, summary
    for i, weight in enumerate(WEIGHTS):
        entry = shares[f"source{i}"]
        assert entry["weight_share"] == pytest.approx(weight / sum(WEIGHTS), abs=1e-4)
        assert abs(entry["clip_share"] - entry["weight_share"]) <= 0.05, shares
