"""Parquet shards: datasets round trip, exact audio, phrases against the recipe, sharding,
determinism, validation of corrupted and foreign folders, the card, publishing."""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf
import yaml

from pipeline.mix.bank import FileSources
from pipeline.mix.render import render
from pipeline.schema import (
    SPLITS,
    AudioFile,
    BackgroundSegment,
    Caption,
    EventClip,
    EventOccurrence,
    LabelPhrase,
    MixtureRecipe,
    PhraseAssignment,
    ShardRow,
    from_table,
    to_table,
)
from pipeline.shards import publish as pub
from pipeline.shards.layout import shard_schema
from pipeline.shards.validate import ValidationError, validate
from pipeline.stages.shards import INDEX_FIELDS, ShardError, mixture_index, plan_chunks, row_group_table, shard_phrase
from pipeline.stages.shards import run as shards
from tests.conftest import tree_digest


@pytest.fixture(scope="module")
def dataset(mixed, shard_folder):
    """``(params, mix_dir, events_dir, backgrounds_dir, tmp)``; ``tmp`` holds captions/, clusters/ and dataset/."""
    _, mix_dir, events_dir, backgrounds_dir = mixed
    p, folder = shard_folder
    return p, mix_dir, events_dir, backgrounds_dir, folder.parent


def test_plan_chunks() -> None:
    assert plan_chunks([3, 3, 3, 3, 3], 6) == [(0, 2), (2, 4), (4, 5)]
    assert plan_chunks([10, 1], 5) == [(0, 1), (1, 2)]
    assert plan_chunks([], 5) == [(0, 0)]


def test_datasets_loads_the_folder_and_audio_is_the_rendered_audio(dataset, tmp_path: Path, monkeypatch) -> None:
    import datasets

    p, mix_dir, events_dir, backgrounds_dir, tmp = dataset
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ds = datasets.load_dataset(str(tmp / "dataset"))
    assert {s: len(ds[s]) for s in ds} == {"train": 20, "valid": 5, "test": 5}
    assert isinstance(ds["train"].features["audio"], datasets.Audio)
    assert ds["train"].features["audio"].sampling_rate == p.sample_rate_hz
    ds = ds.cast_column("audio", datasets.Audio(decode=False))

    recipes = {m.mixture_id: m for m in from_table(pq.read_table(mix_dir / "mixtures.parquet"), MixtureRecipe)}
    occurrences = from_table(pq.read_table(mix_dir / "occurrences.parquet"), EventOccurrence)
    clips = from_table(pq.read_table(events_dir / "manifest.parquet"), EventClip)
    bgs = from_table(pq.read_table(backgrounds_dir / "manifest.parquet"), BackgroundSegment)
    files = FileSources(
        events_dir,
        backgrounds_dir,
        p.sample_rate_hz,
        {c.clip_id: c.audio_path for c in clips},
        {b.segment_id: b.audio_path for b in bgs},
    )
    seen = 0
    for split in ds:
        for row in ds[split]:
            m = recipes[row["id"]]
            audio, rate = sf.read(io.BytesIO(row["audio"]["bytes"]), dtype="int16")
            assert rate == m.sample_rate_hz == row["sample_rate_hz"] and row["split"] == split == m.split
            assert row["audio"]["bytes"] == (mix_dir / m.audio_path).read_bytes()
            if seen % 3 == 0:  # re-render from the recipe alone
                assert np.array_equal(audio, render(m, [o for o in occurrences if o.mixture_id == m.mixture_id], files))
            assert row["background_id"] == m.background_id and row["license"] == m.license
            assert tuple(row["attribution"]) == m.attribution and row["seed"] == p.seed
            seen += 1
    assert seen == len(recipes)


def test_phrases_match_the_recipe_and_clusters(dataset) -> None:
    _, mix_dir, _, _, tmp = dataset
    segments = pq.read_table(mix_dir / "segments.parquet").to_pylist()
    occurrences = pq.read_table(mix_dir / "occurrences.parquet").to_pylist()
    database = {
        (r["phrase"], r["label"], r["mid"]): r["cluster_id"]
        for r in pq.read_table(tmp / "clusters" / "phrases.parquet").to_pylist()
    }
    want: dict = {}
    for s in segments:
        want.setdefault(s["mixture_id"], {}).setdefault(s["label"], []).append((s["onset_s"], s["offset_s"]))
    index = json.loads((tmp / "dataset" / "index.json").read_text())
    for f in index["files"]:
        for row in from_table(pq.read_table(tmp / "dataset" / f["path"]), ShardRow):
            got = {ph.label: [(t.start_s, t.end_s) for t in ph.segments] for ph in row.phrases}
            assert got == {k: sorted(v) for k, v in want.get(row.id, {}).items()}
            for ph in row.phrases:
                assert database[(ph.phrase, ph.label, ph.mid)] == ph.cluster_id
                mine = [o for o in occurrences if o["mixture_id"] == row.id and o["label"] == ph.label]
                assert set(ph.source_clip_ids) == {o["clip_id"] for o in mine}
                assert set(ph.snr_db) == {o["snr_db"] for o in mine}
                assert ph.phrase in row.caption


def test_shards_and_row_groups_follow_the_size_params(dataset) -> None:
    _, _, _, _, tmp = dataset
    index = json.loads((tmp / "dataset" / "index.json").read_text())
    train = [f for f in index["files"] if f["split"] == "train"]
    assert len(train) >= 2
    for i, f in enumerate(train):
        assert f["path"] == f"data/train-{i:05d}-of-{len(train):05d}.parquet"
        meta = pq.read_metadata(tmp / "dataset" / f["path"])
        assert meta.num_rows == f["num_rows"] and meta.num_row_groups == f["num_row_groups"]
        for g in range(meta.num_row_groups):  # the FLAC bytes: plain pages, no codec, no dictionary to decode first
            columns = {meta.row_group(g).column(c).path_in_schema: meta.row_group(g).column(c) for c in range(meta.num_columns)}
            audio = columns["audio.bytes"]
            assert (
                audio.compression == "UNCOMPRESSED" and not audio.has_dictionary_page and "RLE_DICTIONARY" not in audio.encodings
            )
            assert columns["audio.path"].has_dictionary_page  # the other columns keep theirs
    assert any(f["num_row_groups"] > 1 for f in train)
    assert sum(f["num_rows"] for f in train) == index["splits"]["train"]["num_rows"] == 20


def test_same_bytes_on_a_second_run(dataset, tmp_path: Path) -> None:
    p, mix_dir, _, _, tmp = dataset
    shards(p, mix_dir, tmp / "captions", tmp / "clusters", tmp_path / "again")
    assert tree_digest(tmp_path / "again") == tree_digest(tmp / "dataset")


def records_the_record_way(mix_dir: Path, captions_dir: Path, clusters_dir: Path, seed: int) -> list[ShardRow]:
    """Every row as a :class:`ShardRow` record in row order, built from every recipe, caption and phrase held
    as a Python record: how the stage built its rows before its columnar index, kept here as the reference."""
    recipes = sorted(
        from_table(pq.read_table(mix_dir / "mixtures.parquet"), MixtureRecipe), key=lambda r: (SPLITS.index(r.split), r.index)
    )
    captions = {c.mixture_id: c.caption for c in from_table(pq.read_table(captions_dir / "captions.parquet"), Caption)}
    phrases = defaultdict(list)
    for ph in from_table(pq.read_table(captions_dir / "phrases.parquet"), LabelPhrase):
        phrases[ph.mixture_id].append(ph)
    database = from_table(pq.read_table(clusters_dir / "phrases.parquet"), PhraseAssignment)
    cluster_of = {(a.phrase, a.label, a.mid): a.cluster_id for a in database}
    rows = []
    for r in recipes:
        data = (mix_dir / r.audio_path).read_bytes()
        rows.append(
            ShardRow(
                id=r.mixture_id,
                audio=AudioFile(data, Path(r.audio_path).name),
                audio_sha256=hashlib.sha256(data).hexdigest(),
                sample_rate_hz=r.sample_rate_hz,
                duration_s=r.duration_s,
                caption=captions[r.mixture_id],
                phrases=tuple(shard_phrase(ph, cluster_of[(ph.phrase, ph.label, ph.mid)]) for ph in phrases[r.mixture_id]),
                background_id=r.background_id,
                split=r.split,
                license=r.license,
                licenses=r.licenses,
                attribution=r.attribution,
                seed=seed,
            )
        )
    return rows


@pytest.mark.parametrize("binary_limit", [2**31, 0])  # 0: the audio path for row groups beyond 32-bit offsets
def test_row_groups_built_from_the_columnar_index_are_the_records(dataset, monkeypatch, binary_limit) -> None:
    monkeypatch.setattr("pipeline.shards.writer.BINARY_DATA_LIMIT_BYTES", binary_limit)
    p, mix_dir, _, _, tmp = dataset
    records = records_the_record_way(mix_dir, tmp / "captions", tmp / "clusters", p.seed)
    index = mixture_index(mix_dir, tmp / "captions", tmp / "clusters")
    assert index.column_names == list(INDEX_FIELDS) and index.num_rows == len(records), (
        "metadata only: no audio, one row per mixture"
    )
    assert index["id"].to_pylist() == [r.id for r in records]
    schema = shard_schema(p.sample_rate_hz)
    for rows in (range(0, 1), range(3, 11), range(len(records) - 4, len(records))):  # a row group starts and ends anywhere
        want = to_table(records[rows.start : rows.stop], ShardRow).cast(schema)
        assert row_group_table(index, rows, mix_dir, schema, p.seed).equals(want, check_metadata=True)
    files = json.loads((tmp / "dataset" / "index.json").read_text())["files"]
    assert [r for f in files for r in from_table(pq.read_table(tmp / "dataset" / f["path"]), ShardRow)] == records


def test_a_mixture_without_a_caption_or_a_phrase_without_a_cluster_is_refused(dataset, tmp_path: Path) -> None:
    _, mix_dir, _, _, tmp = dataset
    for name in ("captions", "clusters"):
        shutil.copytree(tmp / name, tmp_path / name)
    captions = pq.read_table(tmp / "captions" / "captions.parquet")
    pq.write_table(captions.slice(1), tmp_path / "captions" / "captions.parquet")
    with pytest.raises(ShardError, match=f"mixture {captions['mixture_id'][0]} has no caption"):
        mixture_index(mix_dir, tmp_path / "captions", tmp_path / "clusters")
    shutil.copyfile(tmp / "captions" / "captions.parquet", tmp_path / "captions" / "captions.parquet")
    phrase = pq.read_table(tmp / "captions" / "phrases.parquet").slice(0, 1).to_pylist()[0]
    database = pq.read_table(tmp / "clusters" / "phrases.parquet")
    other = [
        (a["phrase"], a["label"], a["mid"]) != (phrase["phrase"], phrase["label"], phrase["mid"]) for a in database.to_pylist()
    ]
    pq.write_table(database.filter(pa.array(other)), tmp_path / "clusters" / "phrases.parquet")
    with pytest.raises(ShardError, match=re.escape(f"phrase {phrase['phrase']!r} ({phrase['label']}) has no cluster")):
        mixture_index(mix_dir, tmp_path / "captions", tmp_path / "clusters")


def test_card_yaml_matches_the_index(dataset) -> None:
    _, _, _, _, tmp = dataset
    text = (tmp / "dataset" / "README.md").read_text()
    meta = yaml.safe_load(text.split("---", 2)[1])
    index = json.loads((tmp / "dataset" / "index.json").read_text())
    assert [c["config_name"] for c in meta["configs"]] == ["default"]
    assert {d["split"]: d["path"] for d in meta["configs"][0]["data_files"]} == {s: f"data/{s}-*" for s in index["splits"]}
    assert {s["name"]: s["num_examples"] for s in meta["dataset_info"]["splits"]} == {
        s: v["num_rows"] for s, v in index["splits"].items()
    }
    assert {"name": "audio", "dtype": {"audio": {"sampling_rate": 16000}}} in meta["dataset_info"]["features"]
    assert meta["license"] in {"cc0-1.0", "cc-by-4.0", "cc-by-nc-4.0", "other"}
    assert (
        "![statistics](images/statistics.png)" in text and (tmp / "dataset" / "images" / "statistics.png").stat().st_size > 1000
    )
    assert (tmp / "dataset" / "attribution.csv").exists() and (tmp / "dataset" / "clusters" / "phrases.parquet").exists()


# --------------------------------------------------------------------------- validation


@pytest.fixture
def copy(dataset, tmp_path: Path) -> Path:
    shutil.copytree(dataset[4] / "dataset", tmp_path / "ds")
    return tmp_path / "ds"


def shard_of(folder: Path, split: str) -> Path:
    index = json.loads((folder / "index.json").read_text())
    return folder / next(f["path"] for f in index["files"] if f["split"] == split)


def test_validate_accepts_the_written_folder(dataset) -> None:
    summary = validate(dataset[4] / "dataset", decode=True)
    assert summary["rows"] == 30 and summary["splits"] == ["test", "train", "valid"]


def _problems(folder: Path) -> str:
    with pytest.raises(ValidationError) as e:
        validate(folder, decode=True)
    return str(e.value)


def test_validate_rejects_a_corrupted_shard(copy: Path) -> None:
    shard = shard_of(copy, "valid")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert "sha256 differs" in _problems(copy)


def test_validate_rejects_a_truncated_shard(copy: Path) -> None:
    shard = shard_of(copy, "test")
    shard.write_bytes(shard.read_bytes()[:1000])
    message = _problems(copy)
    assert "sha256 differs" in message and "not a readable Parquet file" in message


def test_validate_rejects_a_foreign_shard(copy: Path) -> None:
    foreign = pa.table({"id": ["x"], "audio": [b"\x00"]})
    pq.write_table(foreign, copy / "data" / "train-00009-of-00010.parquet")
    assert "not listed in index.json" in _problems(copy)
    index = json.loads((copy / "index.json").read_text())
    target = copy / index["files"][0]["path"]
    pq.write_table(foreign, target)
    index["files"][0].update(sha256=hashlib.sha256(target.read_bytes()).hexdigest(), num_rows=1)
    (copy / "index.json").write_text(json.dumps(index))
    assert "columns differ from the shard schema" in _problems(copy)


def test_validate_rejects_missing_metadata_and_bad_audio(copy: Path) -> None:
    index = json.loads((copy / "index.json").read_text())
    f = index["files"][-1]
    path = copy / f["path"]
    table = pq.read_table(path)
    audio = table.column("audio").combine_chunks()
    broken = pa.StructArray.from_arrays(
        [pa.array([b"not flac"] * len(table), pa.binary()), audio.field("path")], fields=list(audio.type)
    )
    table = table.set_column(table.schema.get_field_index("audio"), table.schema.field("audio"), broken).replace_schema_metadata(
        None
    )
    pq.write_table(table, path)
    f.update(sha256=hashlib.sha256(path.read_bytes()).hexdigest(), num_row_groups=1)
    (copy / "index.json").write_text(json.dumps(index))
    message = _problems(copy)
    assert "no 'huggingface' schema metadata" in message


def test_validate_rejects_a_missing_shard_and_card(copy: Path) -> None:
    shard_of(copy, "valid").unlink()
    (copy / "README.md").unlink()
    message = _problems(copy)
    assert "listed in index.json but missing" in message and "dataset card" in message
    shutil.rmtree(copy / "data")
    (copy / "index.json").unlink()
    assert "no index.json" in _problems(copy)


# --------------------------------------------------------------------------- publishing


class FakeHub:
    """The HfApi calls publish makes, keeping the "hub" in a local folder (LFS sha256 for shards)."""

    def __init__(self, remote: Path):
        self.remote, self.commits = remote, []

    def list_repo_tree(self, repo_id, repo_type, recursive):
        from huggingface_hub.errors import RepositoryNotFoundError

        if not self.remote.exists():
            raise RepositoryNotFoundError("no repo", response=SimpleNamespace(headers={}, status_code=404, request=None))
        return [
            SimpleNamespace(
                path=p.relative_to(self.remote).as_posix(),
                size=p.stat().st_size,
                lfs=SimpleNamespace(sha256=hashlib.sha256(p.read_bytes()).hexdigest()) if p.suffix == ".parquet" else None,
            )
            for p in self.remote.rglob("*")
            if p.is_file()
        ]

    def create_repo(self, repo_id, repo_type, private, exist_ok):
        self.remote.mkdir(exist_ok=True)

    def upload_folder(self, repo_id, folder_path, repo_type, allow_patterns, commit_message):
        self.commits.append(list(allow_patterns))
        for rel in allow_patterns:
            (self.remote / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(folder_path) / rel, self.remote / rel)


def test_publish_dry_run_lists_everything_without_a_token(dataset, monkeypatch, capsys) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    folder = dataset[4] / "dataset"
    listed = pub.publish(folder, "me/sed", dry_run=True)
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert sorted(listed) == files
    index = json.loads((folder / "index.json").read_text())
    assert listed[: len(index["files"])] == [f["path"] for f in index["files"]], "shards go first"
    assert "README.md" in capsys.readouterr().out
    with pytest.raises(pub.PublishError, match="HF_TOKEN"):
        pub.publish(folder, "me/sed")


def test_publish_resumes_and_uploads_only_what_changed(dataset, tmp_path: Path) -> None:
    folder = dataset[4] / "dataset"
    hub = FakeHub(tmp_path / "remote")
    shard_paths = [f["path"] for f in json.loads((folder / "index.json").read_text())["files"]]
    assert pub.publish(folder, "me/sed", api=hub, dry_run=True) == pub.local_files(folder), "a new repo lacks everything"
    # an interrupted upload: the first batch of shards landed, then the connection dropped
    hub.create_repo("me/sed", "dataset", False, True)
    hub.upload_folder("me/sed", folder, "dataset", shard_paths[:2], "batch 1")
    uploaded = pub.publish(folder, "me/sed", batch_files=2, api=hub)
    assert [p for p in uploaded if p.startswith("data/")] == shard_paths[2:]
    assert tree_digest(tmp_path / "remote") == tree_digest(folder)
    assert "README.md" in hub.commits[-1] and not any(p.startswith("data/") for p in hub.commits[-1]), "card last"
    assert all(len([p for p in c if p.startswith("data/")]) <= 2 for c in hub.commits)
    assert not any(p.startswith("data/") for p in pub.publish(folder, "me/sed", api=hub, dry_run=True)), "nothing left"
