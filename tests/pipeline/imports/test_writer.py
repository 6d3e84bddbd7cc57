"""Writing imported clips as shards: skips, labels, captions, validation, loading and the trainer's stream."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from dataclasses import replace

import pyarrow.parquet as pq
import pytest
import soundfile as sf
from torch.utils.data import DataLoader

from pipeline.config.params import ComputeParams
from pipeline.imports.writer import (
    PreparedAudio,
    clip_caption,
    clip_phrases,
    merge_spans,
    prepare_audio,
    row_group_table,
    write_import,
)
from pipeline.outputs import NoOutputError
from pipeline.schema import AudioFile, ImportedClip, ImportedRegion, ShardPhrase, ShardRow, TimeSpan, from_table, to_table
from pipeline.shards.layout import shard_schema
from pipeline.shards.validate import validate
from pipeline.stages.imports import CorpusImportError, run
from pipeline.text.label_phrases import default_label_phrases
from tests.conftest import tiny_train_params, tree_digest
from tests.pipeline.imports.conftest import MidIndex, write_tone

OPTIONS = {"valid_fraction": 0.5}


def _rows(folder) -> dict[str, ShardRow]:
    index = json.loads((folder / "index.json").read_text())
    return {r.id: r for f in index["files"] for r in from_table(pq.read_table(folder / f["path"]), ShardRow)}


def _skips(folder) -> set[tuple[str, str]]:
    with open(folder / "skipped.csv", newline="") as f:
        return {(r["item_id"], r["reason"]) for r in csv.DictReader(f)}


@pytest.fixture
def imported(import_params, audioset_root, tmp_path):
    out = tmp_path / "out"
    summary = run(import_params, "audioset-strong", audioset_root, out, OPTIONS, index=MidIndex())
    return import_params, audioset_root, out, summary


def test_every_skip_reason_and_the_missing_share(capsys, imported):
    _, _, out, summary = imported
    assert _skips(out) == {
        ("abc_def_30000", "unknown-label"),
        ("gone_clip_10000", "missing-file"),
        ("nounderscore", "malformed-row"),
        ("bad_time_0", "malformed-row"),
        ("corrupt_0", "unreadable"),
        ("silent_5000", "silent"),
        ("abc_def_30000#2", "bad-region"),
        ("evalclip_0", "bad-region"),
    }
    assert summary["outputs"] == 4 and summary["inputs"] == 7  # six clips with audio listed, one without
    assert summary["missing_audio"] == 1 and summary["missing_audio_share"] == pytest.approx(1 / 7, abs=1e-6)
    assert summary["skipped_by_reason"] == {
        "bad-region": 2,
        "malformed-row": 2,
        "missing-file": 1,
        "silent": 1,
        "unknown-label": 1,
        "unreadable": 1,
    }
    assert sum(summary["rows_by_split"].values()) == 4 and summary["rows_by_split"]["test"] == 1
    assert json.loads((out / "summary.json").read_text()) == summary
    assert "1 of 7 listed clips (14.3%) had no audio" in capsys.readouterr().err


def test_audio_is_mono_at_the_dataset_rate_and_plain_flac_keeps_its_bytes(imported):
    params, root, out, summary = imported
    rows = _rows(out)
    rate = params.sample_rate_hz
    stereo = rows["-0RWZT-miFs_420000"]
    x, sr = sf.read(io.BytesIO(stereo.audio.bytes), always_2d=True)
    assert sr == rate and x.shape == (10 * rate, 1) and stereo.duration_s == 10.0
    assert rows["abc_def_30000"].audio.bytes == (root / "audio" / "abc_def_30000.flac").read_bytes()
    up = rows["--dash_1000"]
    assert sf.info(io.BytesIO(up.audio.bytes)).samplerate == rate and up.duration_s == 4.0
    assert summary["source_rates_hz"] == {"8000": 1, "16000": 2, "44100": 1}
    assert summary["resampled_up"] == 1 and summary["kept_source_flac"] == 1


def test_regions_merge_clip_and_become_phrases(imported):
    _, _, out, _ = imported
    rows = _rows(out)
    dog = rows["-0RWZT-miFs_420000"]
    shipped = default_label_phrases()
    assert [(p.phrase, p.label, p.mid) for p in dog.phrases] == [
        (shipped["/m/05tny_"][0], "Bark", "/m/05tny_"),
        (shipped["/m/09x0r"][0], "Speech", "/m/09x0r"),
    ]
    bark = dog.phrases[0]
    assert bark.segments == (TimeSpan(0.5, 3.0),)  # 0.5-2.0 and 1.8-3.0 merged
    assert bark.source_clip_ids == () and bark.snr_db == ()
    late = rows["abc_def_30000"]
    assert [(p.label, p.segments) for p in late.phrases] == [("Speech", (TimeSpan(1.0, 2.0),)), ("Bark", (TimeSpan(8.0, 10.0),))]
    clusters = pq.read_table(out / "clusters" / "clusters.parquet").to_pylist()
    mid_of = {c["cluster_id"]: c["mid"] for c in clusters}
    assert all(mid_of[p.cluster_id] == p.mid for r in rows.values() for p in r.phrases)
    for r in rows.values():
        assert r.caption and all(p.phrase in r.caption for p in r.phrases)
        assert r.background_id == "" and r.license == "unknown" and r.attribution[0].startswith("YouTube video")


def test_the_folder_validates_loads_with_datasets_and_feeds_the_trainer(imported, tmp_path):
    import datasets

    params, _, out, _ = imported
    assert validate(out, decode=True)["rows"] == 4
    one = datasets.Dataset.from_parquet(str(out / "data" / "test-00000-of-00001.parquet"), cache_dir=str(tmp_path / "hf"))
    assert isinstance(one.features["audio"], datasets.Audio) and one.features["audio"].sampling_rate == params.sample_rate_hz
    ds = datasets.load_dataset("parquet", data_dir=str(out / "data"), cache_dir=str(tmp_path / "hf2"))
    assert isinstance(ds["train"].features["audio"], datasets.Audio)
    assert sum(len(ds[s]) for s in ds) == 4
    card = (out / "README.md").read_text()
    assert "audioset-strong strong labels (imported)" in card and "Hershey" in card and "timelines" not in card

    from trainer.data.stream import collate, make_stream
    from trainer.encoders import SmallEncoder

    p = tiny_train_params(params, out, tmp_path / "train")
    stream = make_stream(p, SmallEncoder(width=16), p.train.data.sources, shuffle=False)
    stream.set_epoch(0, skip_batches=0, batch_size=1)
    batches = list(DataLoader(stream, batch_size=1, num_workers=0, collate_fn=collate))
    rows = _rows(out)
    train_ids = {i for i, r in rows.items() if r.split == "train"}
    assert {b.ids[0] for b in batches} == train_ids
    for b in batches:
        row = rows[b.ids[0]]
        k = len(row.phrases)
        assert bool(b.has_frames[0]) and list(b.phrases[0][:k]) == [ph.phrase for ph in row.phrases]
        assert b.labels[0, :k].any(dim=1).all()  # every phrase is active on some frame
        assert not b.labels[0, k:].any()


def test_the_same_bytes_for_one_and_two_workers(import_params, audioset_root, tmp_path):
    run(import_params, "audioset-strong", audioset_root, tmp_path / "one", OPTIONS, index=MidIndex())
    two = replace(import_params, compute=ComputeParams(workers=2, chunk_size=1))
    run(two, "audioset-strong", audioset_root, tmp_path / "two", OPTIONS, index=MidIndex())
    assert tree_digest(tmp_path / "one") == tree_digest(tmp_path / "two")


def test_own_captions_text_phrases_and_clips_without_regions(import_params, tmp_path):
    root = tmp_path / "corpus"
    for name in ("a", "b"):
        write_tone(root / f"{name}.wav", 3.0, 16000, 440.0)
    clips = [
        ImportedClip(
            "a",
            "a.wav",
            "train",
            ("A dog barks twice.", "second caption"),
            (
                ImportedRegion("", "", "a dog barks", 0.0, 1.0),
                ImportedRegion("", "", "a dog barks", 1.0, 1.5),
                ImportedRegion("", "", "a car passes", 0.5, 2.5),
            ),
            "CC-BY 4.0",
            "a by someone",
        ),
        ImportedClip("b", "b.wav", "train", ("Rain on a roof.",), (), "CC0", ""),
    ]
    write_import(clips, [], root, tmp_path / "out", import_params, "tacos", index=MidIndex())
    rows = _rows(tmp_path / "out")
    assert rows["a"].caption == "A dog barks twice."
    assert [(p.phrase, p.segments) for p in rows["a"].phrases] == [
        ("a dog barks", (TimeSpan(0.0, 1.5),)),
        ("a car passes", (TimeSpan(0.5, 2.5),)),
    ]
    assert rows["b"].caption == "Rain on a roof." and rows["b"].phrases == ()
    assert rows["a"].license == "CC-BY" and rows["b"].license == "CC0"
    low = list(csv.reader(open(tmp_path / "out" / "clusters" / "low_similarity.csv")))
    assert sorted(r[0] for r in low[1:]) == ["a car passes", "a dog barks"]  # sbert below clusters.min_similarity
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["low_similarity"] == 2
    assert validate(tmp_path / "out")["rows"] == 2


def test_a_missing_annotation_file_is_not_a_clip_without_audio(import_params, tmp_path):
    from pipeline.schema import Skip

    root = tmp_path / "corpus"
    write_tone(root / "a.wav", 2.0, 16000, 440.0)
    clips = [ImportedClip("a", "a.wav", "test", (), (ImportedRegion("Bark", "/m/05tny_", "", 0.0, 1.0),), "", "")]
    skips = [
        Skip("metadata/eval/public.tsv", "metadata/eval/public.tsv", "missing-file", "not there"),  # a file, not a clip
        Skip("b", "audio/b.wav", "missing-file", "listed, no audio"),
    ]
    summary = write_import(clips, skips, root, tmp_path / "out", import_params, "desed", index=MidIndex())
    assert summary["missing_audio"] == 1 and summary["missing_audio_share"] == 0.5  # b of {a, b}


def test_template_captions_follow_time_and_a_per_clip_seed():
    clip = ImportedClip("x", "x.wav", "train", (), (), "", "")
    templates = ["One {}.", "Two {}.", "Three {}.", "Four {}."]
    first = clip_caption(clip, ["rain", "a dog barking"], templates, 1, "empty")
    assert first == clip_caption(clip, ["rain", "a dog barking"], templates, 1, "empty")
    assert first.endswith("rain and a dog barking.")
    other = {clip_caption(replace(clip, clip_id=f"c{i}"), ["rain"], templates, 1, "empty") for i in range(20)}
    assert len(other) > 1  # the template depends on the clip
    assert clip_caption(clip, [], templates, 1, "empty") == "empty"


def test_region_rules():
    assert merge_spans([(2.0, 3.0), (0.0, 1.0), (1.0, 1.5), (2.5, 2.6)]) == (TimeSpan(0.0, 1.5), TimeSpan(2.0, 3.0))
    clip = ImportedClip(
        "c",
        "c.wav",
        "train",
        (),
        (
            ImportedRegion("Speech", "/m/09x0r", "", -1.0, 1.0),
            ImportedRegion("Speech", "/m/09x0r", "", 2.0, 2.0),
            ImportedRegion("Speech", "/m/09x0r", "", 5.0, 6.0),
            ImportedRegion("Some_new_Label", "", "", 1.0, 9.0),
        ),
        "",
        "",
    )
    phrases, skips = clip_phrases(clip, 4.0, {})
    assert [(s.item_id, s.reason) for s in skips] == [("c#0", "bad-region"), ("c#1", "bad-region"), ("c#2", "bad-region")]
    assert phrases == [("some new label", "Some_new_Label", "", (TimeSpan(1.0, 4.0),))]


def test_nothing_usable_leaves_the_output_alone(import_params, tmp_path):
    root = tmp_path / "corpus"
    root.mkdir()
    clips = [ImportedClip("gone", "gone.wav", "train", (), (ImportedRegion("Speech", "/m/09x0r", "", 0.0, 1.0),), "", "")]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("previous")
    with pytest.raises(NoOutputError, match="missing-file 1"):
        write_import(clips, [], root, tmp_path / "out", import_params, "dcase-tsv", index=MidIndex())
    assert (tmp_path / "out" / "keep.txt").read_text() == "previous"


def test_stage_errors_name_the_kinds_and_the_root(import_params, tmp_path):
    with pytest.raises(CorpusImportError, match="unknown corpus kind 'audioset'; one of audioset-strong, tacos"):
        run(import_params, "audioset", tmp_path)
    with pytest.raises(CorpusImportError, match="is not a folder"):
        run(import_params, "audioset-strong", tmp_path / "nowhere")


def test_cli_import_reads_options_and_the_out_folder(audioset_root, tmp_path, monkeypatch, capsys):
    from sedsynth import cli

    monkeypatch.setattr(
        "pipeline.stages.imports.write_import",
        lambda clips, skips, root, out, params, kind, index=None: (
            capsys.readouterr() and print(f"{kind} {len(clips)} {out} {params.compute.workers}") or {}
        ),
    )
    code = cli.main(
        [
            "import",
            "audioset-strong",
            str(audioset_root),
            "--out",
            str(tmp_path / "o"),
            "--option",
            "valid_fraction=0.5",
            "--option",
            'patterns=["{segment_id}.wav"]',
            "--set",
            "compute.workers=1",
        ]
    )
    assert code == 0
    assert capsys.readouterr().out.strip() == f"audioset-strong 4 {tmp_path / 'o'} 1"  # .wav names only: four clips found
    assert cli.main(["import", "nope", str(audioset_root)]) == 2
    assert "unknown corpus kind 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("binary_limit", [2**31, 0])  # 0: the path for row groups beyond 32-bit offsets
def test_row_group_table_is_the_table_of_the_records(tmp_path, monkeypatch, binary_limit):
    monkeypatch.setattr("pipeline.shards.writer.BINARY_DATA_LIMIT_BYTES", binary_limit)
    clips = [
        ImportedClip("a/1", "a.wav", "train", (), (ImportedRegion("Bark", "/m/05tny_", "", 0.5, 1.0),), "CC-BY 4.0", "by x"),
        ImportedClip("b", "b.wav", "train", ("Own caption.",), (), "", ""),
    ]
    spans = (TimeSpan(0.5, 1.0), TimeSpan(2.0, 3.5))
    phrases = [[("a dog barking", "Bark", "/m/05tny_", spans)], []]
    items = []
    for n, (clip, ph) in enumerate(zip(clips, phrases)):
        data = bytes([n]) * (100 + n)
        (tmp_path / f"{n}.flac").write_bytes(data)
        items.append(
            (
                clip,
                PreparedAudio(clip.clip_id, f"{n}.flac", len(data), hashlib.sha256(data).hexdigest(), 16000 + n, 44100, 2, False),
                ph,
            )
        )
    cluster_of = {("a dog barking", "Bark", "/m/05tny_"): 7}
    schema = shard_schema(16000)
    table = row_group_table(items, tmp_path, schema, 16000, 3, cluster_of, ["One {}."], "empty")
    records = [
        ShardRow(
            id=c.clip_id,
            audio=AudioFile(bytes([n]) * (100 + n), c.clip_id.replace("/", "_") + ".flac"),
            audio_sha256=a.sha256,
            sample_rate_hz=16000,
            duration_s=a.num_frames / 16000,
            caption=clip_caption(c, [p[0] for p in ph], ["One {}."], 3, "empty"),
            phrases=tuple(ShardPhrase(p, lab, mid, cluster_of[(p, lab, mid)], segs, (), ()) for p, lab, mid, segs in ph),
            background_id="",
            split=c.split,
            license="CC-BY" if c.license else "unknown",
            licenses=("CC-BY" if c.license else "unknown",),
            attribution=(c.attribution,) if c.attribution else (),
            seed=3,
        )
        for n, (c, a, ph) in enumerate(items)
    ]
    assert table.equals(to_table(records, ShardRow).cast(schema), check_metadata=True)


def test_repeated_clips_reuse_freed_memory_instead_of_faulting_it_in(tmp_path):
    import resource

    write_tone(tmp_path / "c.wav", 10.0, 44100, 440.0, channels=2)
    clip = ImportedClip("c", "c.wav", "train", (), (), "", "")
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    def once():
        return prepare_audio((0, clip), tmp_path, scratch, 16000, -80.0, True)

    once()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        assert isinstance(once(), PreparedAudio)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5
    assert faults < 200  # glibc's default returns the clip's ~10 MB of arrays: about 2,100 page faults a clip


def test_files_linked_out_of_the_corpus_root_are_skipped_not_read(import_params, audioset_root, tmp_path):
    outside = tmp_path / "outside"
    write_tone(outside / "private.wav", 5.0, 16000, 500.0)  # audio a link in the corpus leads to: readable, and not the corpus's
    clip = audioset_root / "audio" / "evalclip_0.wav"
    clip.unlink()
    clip.symlink_to(outside / "private.wav")
    names = audioset_root / "mid_to_display_name.tsv"
    (outside / "names.tsv").write_text(names.read_text())
    names.unlink()
    names.symlink_to(outside / "names.tsv")
    out = tmp_path / "out"
    run(import_params, "audioset-strong", audioset_root, out, OPTIONS, index=MidIndex())
    assert {("evalclip_0", "outside-root"), ("mid_to_display_name.tsv", "outside-root")} <= _skips(out)
    assert "evalclip_0" not in _rows(out) and len(_rows(out)) == 3
