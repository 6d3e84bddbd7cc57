"""The mixing source: replayed recipes equal the stored FLAC, drawn rows carry the stage's labels,
rows depend on (seed, epoch, index) only, a training run reads it, and nothing is written."""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf
from torch.utils.data import DataLoader

from pipeline.audio import decode_mono, encode_flac, int16_to_float, quantize_int16
from pipeline.config.params import ParamsError
from pipeline.mix.bank import FileSources
from pipeline.mix.instantiate import MixContext, relabel_mixture
from pipeline.mix.render import render
from pipeline.mix.sources import read_sources
from pipeline.schema import LabelSegment, from_table
from tests.conftest import tiny_train_params, tree_digest
from trainer.config import SourceParams, check
from trainer.data.labels import frame_labels
from trainer.data.mixing import MixingSource
from trainer.data.negatives import ClusterTables, NegativeSampler
from trainer.data.sources import Piece, SourceError, open_source
from trainer.data.stream import ItemBuilder, ItemParams, TrainStream, collate
from trainer.encoders import SmallEncoder

SR = 16000


def mixing_params(mixed, **changes) -> SourceParams:
    _, _, events, backgrounds = mixed
    return SourceParams(kind="mixing", events=str(events), backgrounds=str(backgrounds), **changes)


def rows_of(source: MixingSource, start: int, stop: int) -> list[dict]:
    return source.read(Piece(source.index, source.name, 0, start, stop))


def builder_for(folder: Path, seed: int) -> ItemBuilder:
    sampler = NegativeSampler(ClusterTables.read(str(folder / "clusters")))
    return ItemBuilder(ItemParams(SR, 10 * SR, 8, random_crop=False), SmallEncoder(width=16).frame_spans_s(), sampler, seed)


def shard_rows(folder: Path, split: str) -> dict[str, dict]:
    files = sorted((folder / "data").glob(f"{split}-*.parquet"))
    return {r["id"]: r for f in files for r in pq.read_table(f).to_pylist()}


def test_replayed_recipes_equal_the_stored_flac_and_rows(mixed, shard_folder, tmp_path, monkeypatch):
    params, folder = shard_folder
    _, mix_dir, events, backgrounds = mixed
    before = {d: tree_digest(d) for d in (mix_dir, events, backgrounds)}
    monkeypatch.chdir(tmp_path)
    source = MixingSource(0, mixing_params(mixed, replay=str(mix_dir), split="valid"), params, str(folder / "clusters"))
    assert source.rows == params.mix.mixtures.valid
    rows = rows_of(source, 0, source.rows)
    stored_rows = shard_rows(folder, "valid")
    stored_segments = from_table(pq.read_table(mix_dir / "segments.parquet"), LabelSegment)
    builder = builder_for(folder, params.seed)
    for i, row in enumerate(rows):
        recipe = source.recipes[i]
        assert row["id"] == recipe.mixture_id and recipe.index == i
        q, rate = sf.read(mix_dir / recipe.audio_path, dtype="int16")
        assert rate == row["audio"]["sample_rate_hz"] == SR
        assert np.array_equal(quantize_int16(row["audio"]["array"]), q)  # the 16-bit samples the stage wrote
        mine = [(s["start_s"], s["end_s"]) for ph in row["phrases"] for s in ph["segments"]]
        theirs = [(s.onset_s, s.offset_s) for s in stored_segments if s.mixture_id == recipe.mixture_id]
        assert sorted(mine) == sorted(theirs)  # relabeled from the sources: the stored derived labels
        shard = stored_rows[row["id"]]
        assert row["caption"] == shard["caption"] and row["phrases"] == shard["phrases"]
        a, b = builder(row, 0, 3), builder(shard, 0, 3)  # the same item as from the stored shard row
        assert np.array_equal(a.wave, b.wave) and np.array_equal(a.labels, b.labels) and a.phrases == b.phrases
    assert list(tmp_path.iterdir()) == [] and all(tree_digest(d) == digest for d, digest in before.items())


def test_drawn_rows_carry_the_stages_labels(mixed, shard_folder):
    params, folder = shard_folder
    _, mix_dir, events_dir, backgrounds_dir = mixed
    source = MixingSource(0, mixing_params(mixed, epoch_size=6), params, str(folder / "clusters"))
    stored = shard_rows(folder, "train")
    first = rows_of(source, 0, 3)  # epoch 0 of the stage's own size would be the stored train split
    assert [r["id"] for r in first] == ["train_0000000", "train_0000001", "train_0000002"]
    for row in first:
        x, _ = sf.read(io.BytesIO(stored[row["id"]]["audio"]["bytes"]), dtype="float32")
        assert row["audio"]["array"].dtype == np.float32 and row["audio"]["array"].tobytes() == x.tobytes()  # as decoded, +0.0 included
        assert row["caption"] == stored[row["id"]]["caption"] and row["phrases"] == stored[row["id"]]["phrases"]

    source.set_epoch(1)  # a mixture no stage run stored: re-render and relabel its recipe through the stage's functions
    drawn = source.mixture(2)
    assert drawn.recipe.index == 6 + 2
    events, backgrounds = read_sources(events_dir, backgrounds_dir)
    by_id = {e.clip_id: e for e in events}
    files = FileSources(events_dir, backgrounds_dir, SR, {e.clip_id: e.audio_path for e in events},
                        {b.segment_id: b.audio_path for b in backgrounds})
    assert int16_to_float(render(drawn.recipe, drawn.occurrences, files)).tobytes() == drawn.audio.tobytes()
    ctx = MixContext(source.spec, params.seed, params.mix.relabel, files, {}, {})
    background = next(b for b in backgrounds if b.segment_id == drawn.recipe.background_id)
    segments = relabel_mixture(ctx, drawn.recipe, drawn.occurrences, background, {o.clip_id: by_id[o.clip_id] for o in drawn.occurrences})
    assert segments and segments == drawn.segments
    row = source.row_of(drawn)
    item = builder_for(folder, params.seed)(row, 0, 1)
    spans = SmallEncoder(width=16).frame_spans_s()
    assert row["phrases"] and len(row["phrases"]) <= len(item.phrases)
    for k, phrase in enumerate(row["phrases"]):
        expected = frame_labels([(s.onset_s, s.offset_s) for s in segments if s.label == phrase["label"]], 0.0, spans, 0.5)
        assert item.phrases[k] == phrase["phrase"] and np.array_equal(item.labels[k], expected) and expected.any()


def test_rows_depend_on_seed_epoch_and_index_only(mixed, shard_folder):
    params, folder = shard_folder
    builder = builder_for(folder, params.seed)

    def epoch(num_workers: int, e: int) -> dict[str, tuple]:
        stream = TrainStream([mixing_params(mixed, epoch_size=8)], builder, params.seed, shuffle_buffer=4, piece_rows=2,
                             run_params=params, clusters=str(folder / "clusters"))
        stream.set_epoch(e)
        items = {}
        for batch in DataLoader(stream, batch_size=1, num_workers=num_workers, collate_fn=collate):
            items[batch.ids[0]] = (batch.wave[0].numpy(), batch.captions[0], batch.phrases[0], batch.labels[0].numpy())
        return items

    one, two = epoch(0, 0), epoch(2, 0)
    assert len(one) == len(two) == 8 and set(one) == set(two)
    for i in one:
        a, b = one[i], two[i]
        assert np.array_equal(a[0], b[0]) and a[1:3] == b[1:3] and np.array_equal(a[3], b[3])
    later = epoch(0, 1)
    assert set(later).isdisjoint(one) and sorted(later) == [f"train_{i:07d}" for i in range(8, 16)]
    assert not any(np.array_equal(one[f"train_{i:07d}"][0], later[f"train_{i + 8:07d}"][0]) for i in range(8))


def test_a_short_run_trains_on_a_mixing_source(mixed, shard_folder, tmp_path):
    from trainer.stages.train import run

    params, folder = shard_folder
    p = tiny_train_params(params, folder, tmp_path / "run")
    source = replace(mixing_params(mixed, epoch_size=8), path=str(folder))
    p = replace(p, train=replace(p.train, data=replace(p.train.data, sources=(source,), valid=None),
                                 optim=replace(p.train.optim, max_steps=2, epochs=1)))
    check(p)
    summary = run(p)
    assert summary["steps"] == 2 and summary["skipped"] == 0 and summary["source_shares"]["source0"]["clip_share"] == 1.0
    losses = [float(r["loss"]) for r in csv.DictReader((tmp_path / "run" / "train_log.csv").open())]
    assert len(losses) == 2 and np.isfinite(losses).all()
    assert not list(tmp_path.glob("**/*.flac"))


def test_decoded_samples_become_the_same_item_as_their_flac():
    rng = np.random.default_rng(0)
    q = quantize_int16(0.1 * rng.standard_normal(32000 * 2).astype(np.float32))
    flac = encode_flac(q, 32000)
    builder = ItemBuilder(ItemParams(SR, SR), SmallEncoder(width=16).frame_spans_s(), None, 0)
    decoded, _ = sf.read(io.BytesIO(flac), dtype="float32")
    from_array = builder.decode({"array": decoded, "sample_rate_hz": 32000})
    assert np.array_equal(from_array, builder.decode({"bytes": flac, "path": None}))
    assert np.array_equal(from_array, decode_mono(flac, SR))
    with pytest.raises(Exception, match="zero samples"):
        builder.decode({"array": np.zeros(0, np.float32), "sample_rate_hz": SR})


def test_a_sources_own_knobs_change_its_rows_only(mixed, shard_folder):
    """``spec`` on a mixing source (time stretch by varispeed) lies over mix.spec for that source: its rows
    are stretched, the same rows without it are the stored split's, and the stage's spec is untouched."""
    params, folder = shard_folder
    knobs = {"time_stretch_factor": ["uniform", 1.2, 1.3], "stretch_method": "varispeed"}
    plain = MixingSource(0, mixing_params(mixed, epoch_size=6), params, str(folder / "clusters"))
    stretched = MixingSource(0, mixing_params(mixed, epoch_size=6, spec=knobs), params, str(folder / "clusters"))
    assert plain.spec.time_stretch_factor is None and stretched.spec.time_stretch_factor.to_list() == ["uniform", 1.2, 1.3]
    assert stretched.spec.events_per_mixture == plain.spec.events_per_mixture  # mix.spec's knobs still beneath
    a, b = plain.mixture(0), stretched.mixture(0)
    assert all(o.time_stretch_factor == 1.0 for o in a.occurrences)
    assert b.occurrences and all(1.2 <= o.time_stretch_factor <= 1.3 for o in b.occurrences)
    with pytest.raises(ParamsError, match=r"sources\[\]\.spec"):
        check(replace(params, train=replace(params.train, data=replace(params.train.data, sources=(
            mixing_params(mixed, spec={"time_strech_factor": ["const", 1.1]}),)))))


def test_mixing_keys_are_checked(mixed):
    params = mixed[0]

    def with_source(source: SourceParams):
        return replace(params, train=replace(params.train, data=replace(params.train.data, sources=(source,))))

    check(with_source(mixing_params(mixed, epoch_size=4)))
    for bad, key in ((SourceParams(epoch_size=4), "epoch_size"), (SourceParams(replay="x"), "replay"),
                     (mixing_params(mixed, replay="x", epoch_size=4), "epoch_size"), (mixing_params(mixed, preset="finelapp"), "preset"),
                     (mixing_params(mixed, split="dev"), "split")):
        with pytest.raises(ParamsError, match=key):
            check(with_source(bad))
    with pytest.raises(SourceError, match="mixing"):
        open_source(0, mixing_params(mixed))
    with pytest.raises(SourceError, match="run's params"):
        MixingSource(0, mixing_params(mixed), None)


def test_a_library_folder_is_refused_not_analysed(mixed, tmp_path):
    params = mixed[0]
    (tmp_path / "library" / "Bark").mkdir(parents=True)
    sf.write(tmp_path / "library" / "Bark" / "a.wav", np.zeros(SR, np.float32), SR)
    with pytest.raises(SourceError, match="sound library"):
        MixingSource(0, replace(mixing_params(mixed), events=str(tmp_path / "library")), params)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["library"]


def test_the_sources_are_decoded_once_per_machine_and_given_back(mixed, shard_folder, tmp_path, monkeypatch):
    """Two sources over the same pool map one bank, built once, holding the FLAC files' samples;
    another split's pool gets its own; a process gives the bank's pages back every RELEASE_EVERY
    mixtures; a folder the bank cannot be written to is one line that says what to do."""
    from pipeline.mix import bank as bank_module
    from pipeline.mix.bank import SourceBank, load_source
    from trainer.data import mixing

    params, folder = shard_folder
    _, _, events_dir, backgrounds_dir = mixed
    monkeypatch.setattr(mixing, "banks_folder", lambda: tmp_path / "banks")
    builds = []
    build = bank_module.build_bank
    monkeypatch.setattr(bank_module, "build_bank", lambda *a: builds.append(a[0]) or build(*a))

    def source(split: str = "train") -> MixingSource:
        return MixingSource(0, mixing_params(mixed, split=split, epoch_size=8), params, str(folder / "clusters"))

    a, b = source(), source()
    assert a.bank_key == b.bank_key and source("valid").bank_key != a.bank_key
    a.bank()
    shared = b.bank()
    assert builds == [tmp_path / "banks" / a.bank_key]
    for e in a.event_pools["train"]:
        assert np.array_equal(shared.event(e.clip_id), load_source(events_dir / e.audio_path, SR))
    for g in a.background_pools["train"]:
        assert np.array_equal(shared.background(g.segment_id), load_source(backgrounds_dir / g.audio_path, SR))

    released = []
    monkeypatch.setattr(mixing, "RELEASE_EVERY", 3)
    monkeypatch.setattr(SourceBank, "release", lambda self: released.append(1))
    assert len(rows_of(a, 0, 7)) == 7
    assert len(released) == 2

    (tmp_path / "a-file").write_text("")
    monkeypatch.setattr(mixing, "banks_folder", lambda: tmp_path / "a-file" / "banks")
    with pytest.raises(SourceError, match=r"cannot keep its decoded sources in .*: .*; free space there or point TMPDIR") as e:
        source().bank()
    assert "\n" not in str(e.value)
