"""Masked-autoencoder pretraining end to end on CPU: a folder of audio (one corrupt file, other
rates and channel counts) -> a weights-only encoder file that one seed reproduces byte for byte,
that ``build_encoder`` loads strictly into the encoder it was made for (and refuses for another),
and that a training run starts from; the held-out audio of a mix folder is never read."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf
import torch

from pipeline.config.params import ParamsError
from sedsynth.cli import main
from tests.conftest import ROOT, tiny_train_params
from trainer import distributed
from trainer.checkpoint import read_torch_file
from trainer.config import Params, PretrainParams, load_params
from trainer.encoders import EncoderError, build_encoder
from trainer.mae import MaskedAutoencoder
from trainer.model import build_model
from trainer.stages.pretrain import CropDataset, audio_patches, cropped_encoder, list_clips, run

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tone(seconds: float, rate: int, freq_hz: float, channels: int = 1) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    x = 0.3 * np.sin(2 * np.pi * freq_hz * t) + 0.01 * np.random.default_rng(int(freq_hz)).standard_normal(len(t))
    return np.stack([x] * channels, axis=1).astype(np.float32) if channels > 1 else x.astype(np.float32)


@pytest.fixture(scope="module")
def audio_folder(tmp_path_factory) -> Path:
    """Six usable files (16 kHz, 22.05 kHz stereo, one shorter than a crop) and one corrupt file."""
    folder = tmp_path_factory.mktemp("audio")
    (folder / "sub").mkdir()
    for i, freq in enumerate((220, 330, 440, 550)):
        sf.write(folder / f"tone{i}.wav", tone(1.6, 16000, freq), 16000)
    sf.write(folder / "sub" / "stereo.flac", tone(1.3, 22050, 660, channels=2), 22050)
    sf.write(folder / "short.wav", tone(0.4, 16000, 770), 16000)
    (folder / "broken.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot really audio")
    return folder


def tiny_params(audio: Path, out: Path, seed: int = 7, **changes) -> Params:
    m = PretrainParams(
        audio=(str(audio),),
        heldout_mix=None,
        crop_s=1.0,
        batch_size=3,
        steps=3,
        warmup_steps=1,
        log_every_steps=1,
        device="cpu",
        out_dir=str(out),
    )
    return replace(Params(), seed=seed, pretrain=replace(m, **changes))


@pytest.fixture(scope="module")
def pretrained(audio_folder, tmp_path_factory) -> tuple[Path, dict]:
    """One run through the command, as DVC starts it: ``(out_dir, metrics)``. On one torch thread, as
    the tests' own runs (``one_torch_thread``): torch's CPU kernels may sum in another order on
    another number of threads, and the byte comparisons are about the loader's workers."""
    out = tmp_path_factory.mktemp("pretrain")
    params_yaml = out.parent / f"{out.name}-params.yaml"
    params_yaml.write_text(
        json.dumps(
            {
                "seed": 7,
                "pretrain": {
                    "audio": [str(audio_folder)],
                    "heldout_mix": None,
                    "crop_s": 1.0,
                    "batch_size": 3,
                    "steps": 3,
                    "warmup_steps": 1,
                    "log_every_steps": 1,
                    "device": "cpu",
                    "out_dir": str(out),
                },
            }
        )
    )
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["pretrain", "--params", str(params_yaml)]) == 0
    finally:
        torch.set_num_threads(before)
    return out, json.loads((out / "metrics.json").read_text())


def test_a_run_writes_a_weights_only_encoder_and_its_logs(pretrained, audio_folder):
    out, metrics = pretrained
    for name in ("checkpoints/encoder.pt", "pretrain_log.csv", "metrics.json", "curves.png", "config.json", "skipped.csv"):
        assert (out / name).is_file(), name
    saved = read_torch_file(out / "checkpoints" / "encoder.pt", "test", "a pretrained encoder")  # weights_only=True
    assert saved["encoder"] == "small" and saved["steps"] == 3
    assert set(saved["state"]) == set(build_encoder("small").state_dict())  # the encoder alone: no decoder
    rows = list(csv.DictReader((out / "pretrain_log.csv").open()))
    assert [int(r["step"]) for r in rows] == [1, 2, 3] and all(np.isfinite(float(r["loss"])) for r in rows)
    assert float(rows[0]["lr"]) == pytest.approx(1e-3)  # one warm-up step, then the cosine
    assert metrics["steps"] == 3 and metrics["clips"] == 7 and metrics["flops_per_step"] > 0 and metrics["mfu"] is None
    skipped = list(csv.DictReader((out / "skipped.csv").open()))
    assert [(r["item_id"], r["reason"]) for r in skipped] == [("broken.wav", "unreadable")]
    clips, _ = list_clips((str(audio_folder),), None)
    draws = CropDataset(clips, 7, 16000, 16000)
    broken = sum(clips[draws.clip_at(k)[1]].id == "broken.wav" for k in range(3 * 3))  # 3 steps of 3 clips
    assert metrics["skipped"] == 1 and broken >= 1 and metrics["clips_seen"] == 3 * 3 - broken  # its batches are one clip short
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_one_seed_gives_the_same_bytes_whatever_the_workers(pretrained, audio_folder, tmp_path):
    out, _ = pretrained
    first = (out / "checkpoints" / "encoder.pt").read_bytes()
    run(tiny_params(audio_folder, tmp_path / "again", num_workers=1))
    assert (tmp_path / "again" / "checkpoints" / "encoder.pt").read_bytes() == first
    run(tiny_params(audio_folder, tmp_path / "other", seed=8))
    other = torch.load(tmp_path / "other" / "checkpoints" / "encoder.pt", weights_only=True)["state"]
    same = torch.load(out / "checkpoints" / "encoder.pt", weights_only=True)["state"]
    assert not all(torch.equal(other[k], same[k]) for k in same)


def test_the_file_loads_strictly_into_its_encoder_only(pretrained, tmp_path):
    out, _ = pretrained
    path = str(out / "checkpoints" / "encoder.pt")
    state = torch.load(path, weights_only=True)["state"]
    loaded = build_encoder("small", path).state_dict()
    assert all(torch.equal(loaded[k], state[k]) for k in state)
    for other in ("tiny-vit", "eat-base"):  # eat-base too: a pretrain file is not taken for an EAT checkpoint
        with pytest.raises(EncoderError, match=f"pretrained 'small' weights, but train.model.encoder is '{other}'"):
            build_encoder(other, path)
    with pytest.raises(EncoderError, match="a `sedsynth pretrain` encoder file, not an EAT checkpoint.*the file itself"):
        build_encoder("eat-base", str(out / "checkpoints"))  # a folder is read as EAT's
    foreign = tmp_path / "foreign.pt"
    torch.save({"model": {"blocks.0.weight": torch.zeros(2)}}, foreign)
    with pytest.raises(EncoderError, match="not a `sedsynth pretrain` encoder checkpoint.*EAT checkpoint fits eat-base only"):
        build_encoder("small", str(foreign))
    with pytest.raises(EncoderError, match="not found.*sedsynth pretrain"):
        build_encoder("small", str(tmp_path / "missing.pt"))
    trimmed = torch.load(path, weights_only=True)
    trimmed["state"].pop(next(iter(trimmed["state"])))
    torch.save(trimmed, tmp_path / "trimmed.pt")
    with pytest.raises(EncoderError, match="does not fit 'small' \\(missing"):
        build_encoder("small", str(tmp_path / "trimmed.pt"))


def test_a_vit_pretrains_and_loads(audio_folder, tmp_path):
    run(
        tiny_params(
            audio_folder, tmp_path, encoder="tiny-vit", decoder_dim=32, decoder_depth=1, decoder_heads=2, steps=2, batch_size=2
        )
    )
    path = str(tmp_path / "checkpoints" / "encoder.pt")
    state = torch.load(path, weights_only=True)["state"]
    loaded = build_encoder("tiny-vit", path).state_dict()
    assert set(loaded) == set(state) and all(torch.equal(loaded[k], state[k]) for k in state)


def test_training_starts_from_the_pretrained_encoder(pretrained, shard_folder, tmp_path):
    from trainer.stages.train import set_up

    out, _ = pretrained
    path = str(out / "checkpoints" / "encoder.pt")
    state = torch.load(path, weights_only=True)["state"]
    params, folder = shard_folder
    p = tiny_train_params(params, folder, tmp_path / "train")
    p = replace(p, train=replace(p.train, model=replace(p.train.model, encoder_checkpoint=path)))
    start = set_up(
        p, distributed.setup("cpu"), tmp_path / "train"
    ).objective.model.encoder.state_dict()  # what the training loop starts from
    assert all(torch.equal(start[k], state[k]) for k in state)
    scratch = set_up(
        tiny_train_params(params, folder, tmp_path / "scratch"), distributed.setup("cpu"), tmp_path / "scratch"
    ).objective.model.encoder.state_dict()
    assert not all(torch.equal(scratch[k], state[k]) for k in state)
    assert build_model(p.train.model).encoder.state_dict().keys() == state.keys()


def write_parquet(path: Path, rows: list[dict]) -> None:
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_the_held_out_audio_of_a_mix_folder_is_left_out(tmp_path):
    events, backgrounds, mix = tmp_path / "events", tmp_path / "backgrounds", tmp_path / "mix"
    for folder in (events, backgrounds, mix):
        folder.mkdir()
    write_parquet(events / "manifest.parquet", [{"clip_id": c, "audio_path": f"audio/{c}.flac"} for c in ("e1", "e2", "e3")])
    write_parquet(backgrounds / "manifest.parquet", [{"segment_id": b, "audio_path": f"audio/{b}.flac"} for b in ("b1", "b2")])
    write_parquet(
        mix / "mixtures.parquet",
        [
            {"mixture_id": "train_0", "split": "train", "background_id": "b1", "audio_path": "audio/train/train_0.flac"},
            {"mixture_id": "test_0", "split": "test", "background_id": "b2", "audio_path": "audio/test/test_0.flac"},
        ],
    )
    write_parquet(
        mix / "occurrences.parquet",
        [
            {"mixture_id": "train_0", "clip_id": "e1"},
            {"mixture_id": "test_0", "clip_id": "e2"},
            {"mixture_id": "test_0", "clip_id": "e3"},
        ],
    )
    folders = (str(events), str(backgrounds), str(mix))
    clips, left_out = list_clips(folders, str(mix))
    assert sorted(c.id for c in clips) == ["b1", "e1", "train_0"] and left_out == 4
    assert {c.path for c in clips} >= {str(mix / "audio" / "train" / "train_0.flac"), str(events / "audio" / "e1.flac")}
    assert len(list_clips(folders, None)[0]) == 7
    with pytest.raises(FileNotFoundError, match="heldout_mix"):
        list_clips(folders, str(events))
    with pytest.raises(FileNotFoundError, match="pretrain.audio"):
        list_clips((str(tmp_path / "nowhere"),), None)


def test_padding_is_not_scored_and_the_fbank_fits_the_crop():
    torch.manual_seed(0)
    mae = MaskedAutoencoder(cropped_encoder(build_encoder("small"), 1.0))
    assert mae.encoder.fbank.params.target_frames == 96 and (mae.time_patches, mae.freq_patches) == (6, 4)
    assert set(build_encoder("small").state_dict()) == set(mae.encoder.state_dict())  # the fbank holds no weights
    real = audio_patches(mae, torch.tensor([16000, 4000, 1]))  # 16 frames a patch, 160 samples a frame
    assert real.shape == (3, 24) and real[0].all()
    assert real[1].tolist() == [True] * 8 + [False] * 16  # 25 frames start inside 4000 samples: 2 time patches
    assert real[2].tolist() == [True] * 4 + [False] * 20
    with pytest.raises(ValueError, match="pretrain.crop_s"):
        cropped_encoder(build_encoder("small"), 0.05)


def test_a_folder_that_never_decodes_is_refused(tmp_path):
    (tmp_path / "audio").mkdir()
    (tmp_path / "audio" / "a.wav").write_bytes(b"not audio")
    (tmp_path / "audio" / "b.wav").write_bytes(b"")
    with pytest.raises(ValueError, match="none of the 2 audio files decodes"):
        run(tiny_params(tmp_path / "audio", tmp_path / "out"))


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("mask_ratio", 1.0, "pretrain.mask_ratio"),
        ("decoder_dim", 130, "pretrain.decoder_dim"),
        ("audio", [], "pretrain.audio"),
        ("final_lr", 1.0, "pretrain.lr"),
        ("betas", [0.9], "pretrain.betas"),
        ("steps", 0, "pretrain.steps"),
    ],
)
def test_params_are_checked(key, value, message):
    with pytest.raises(ParamsError, match=message):
        load_params(ROOT / "params.yaml", {"pretrain": {key: value}})


def test_the_cacophony_overrides_pretrain_eat_base_and_train_from_it():
    from pipeline.config.params import read_yaml_mapping

    p = load_params(ROOT / "params.yaml", read_yaml_mapping(ROOT / "configs" / "train" / "cacophony.yaml", "overrides file"))
    assert (p.pretrain.encoder, p.pretrain.batch_size, p.pretrain.steps, p.pretrain.lr) == ("eat-base", 512, 200_000, 2e-4)
    assert (
        p.train.model.encoder == "eat-base" and p.train.model.encoder_checkpoint == f"{p.pretrain.out_dir}/checkpoints/encoder.pt"
    )
    assert Params().train.model.encoder_checkpoint is None  # the default training does not read it
