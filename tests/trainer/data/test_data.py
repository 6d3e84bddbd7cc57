"""Training data: frame labels at the encoders' frame times, cluster-based negatives, the epoch
deal across ranks and DataLoader workers, per-id determinism, mid-epoch resume, caption corpora
and the errors a wrong source or clusters folder gives."""

from __future__ import annotations

import csv
import io
import time
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf
import torch
from torch.utils.data import DataLoader

from trainer.config import SourceParams
from tests.conftest import tiny_train_params
from trainer.data.labels import frame_labels
from trainer.data.negatives import ClusterTables, NegativeError, NegativeSampler
from trainer.data.sources import (
    CaptionCsvSource,
    ParquetSource,
    Piece,
    SourceError,
    piece_rows_for,
    plan_epoch,
)
from trainer.data.stream import ItemBuilder, ItemParams, TrainStream, collate, make_stream
from trainer.encoders import EATEncoder, SmallEncoder

SR = 16000
N_PHRASES = 20


# --------------------------------------------------------------------------- helpers


def small_encoder() -> SmallEncoder:
    return SmallEncoder(width=16)  # the width does not change the frame times


def eat_encoder() -> EATEncoder:
    return EATEncoder(dim=64, depth=1, heads=2)


ENCODERS = pytest.mark.parametrize("make", [small_encoder, eat_encoder], ids=["small", "eat"])


def run(stream: TrainStream, epoch: int, num_workers: int = 0, batch_size: int = 1, skip_batches: int = 0) -> list:
    """One epoch of ``stream`` through a real DataLoader: the list of batches."""
    stream.set_epoch(epoch, skip_batches=skip_batches, batch_size=batch_size)
    return list(DataLoader(stream, batch_size=batch_size, num_workers=num_workers, collate_fn=collate))


def items_of(batches: list) -> list[SimpleNamespace]:
    out = []
    for b in batches:
        for i, item_id in enumerate(b.ids):
            out.append(SimpleNamespace(id=item_id, wave=b.wave[i].numpy(), caption=b.captions[i], phrases=list(b.phrases[i]),
                                       labels=b.labels[i].numpy(), mask=b.mask[i].numpy(), has_frames=bool(b.has_frames[i]),
                                       skips=list(b.skips) if len(b.ids) == 1 else None))
    return out


def segments_of(phrase: dict) -> list[tuple[float, float]]:
    return [(s["start_s"], s["end_s"]) for s in phrase["segments"]]


def decode_flac(audio: dict) -> np.ndarray:
    x, rate = sf.read(io.BytesIO(audio["bytes"]), dtype="float32", always_2d=True)
    assert rate == SR and x.shape[1] == 1
    return x[:, 0]


def crop_offset(full: np.ndarray, wave: np.ndarray) -> int:
    """Where ``wave`` was cut from ``full`` (found by its samples, not by asking the stream)."""
    head = 64
    windows = np.lib.stride_tricks.sliding_window_view(full, head)
    hits = np.flatnonzero((windows == wave[:head]).all(axis=1))
    hits = [int(h) for h in hits if h + len(wave) <= len(full) and np.array_equal(full[h:h + len(wave)], wave)]
    assert len(hits) == 1, f"crop found {len(hits)} times"
    return hits[0]


def reference_active(start: float, end: float, offset: float, spans: np.ndarray, min_overlap: float) -> np.ndarray:
    """The rule, frame by frame: the event covers >= min_overlap of the frame or of itself."""
    a, b = start - offset, end - offset
    out = []
    for s, e in spans.tolist():
        overlap = max(0.0, min(e, b) - max(s, a))
        out.append(overlap > 0 and overlap >= min_overlap * min(e - s, b - a))
    return np.array(out, dtype=bool)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def shards(shard_folder) -> Path:
    return shard_folder[1]


@pytest.fixture(scope="module")
def rows(shards) -> dict[str, dict]:
    """The train split's rows, read straight from the Parquet files."""
    out = {}
    for f in sorted((shards / "data").glob("train-*.parquet")):
        for r in pq.read_table(f, columns=["id", "audio", "caption", "phrases"]).to_pylist():
            out[r["id"]] = r
    assert len(out) >= 12
    return out


@pytest.fixture(scope="module")
def ontology(shards):
    """From clusters.parquet and phrases.parquet directly: each cluster's relatives, each phrase's clusters."""
    clusters = pq.read_table(shards / "clusters" / "clusters.parquet").to_pylist()
    phrases = pq.read_table(shards / "clusters" / "phrases.parquet").to_pylist()
    related = {c["cluster_id"]: {c["cluster_id"], *c["ancestor_ids"], *c["descendant_ids"], *c["near_synonym_ids"]} for c in clusters}
    clusters_of = defaultdict(set)
    for p in phrases:
        clusters_of[p["phrase"]].add(p["cluster_id"])
    return SimpleNamespace(related=related, clusters_of=dict(clusters_of))


@pytest.fixture(scope="module")
def tables(shards) -> ClusterTables:
    return ClusterTables.read(str(shards / "clusters"))


@pytest.fixture(scope="module")
def spans() -> np.ndarray:
    return small_encoder().frame_spans_s()


@pytest.fixture(scope="module")
def builder(tables, spans) -> ItemBuilder:
    return ItemBuilder(ItemParams(input_samples=4 * SR), spans, NegativeSampler(tables), seed=3)


def contradicts(a: int, b: int, related: dict) -> bool:
    return a == b or a in related.get(b, {b}) or b in related.get(a, {a})


# --------------------------------------------------------------------------- 1. frame times and labels


@ENCODERS
def test_frame_spans_are_the_fbank_frames_each_column_pools(make):
    enc = make()
    p = enc.fbank.params
    stride = enc.time_stride_frames
    spans = enc.frame_spans_s()
    assert stride == (8 if isinstance(enc, SmallEncoder) else 16)
    assert spans.shape == (p.target_frames // stride, 2)
    assert spans[0, 0] == 0.0
    np.testing.assert_allclose(np.diff(spans[:, 0]), stride * 0.010, atol=1e-12)
    np.testing.assert_allclose(spans[:, 1] - spans[:, 0], (stride - 1) * 0.010 + 0.025, atol=1e-12)
    # The same numbers from the fbank's own frame times: first window's start to last window's end.
    cols = np.arange(len(spans))
    first, _ = p.frame_span_s(torch.from_numpy(cols * stride))
    _, last_end = p.frame_span_s(torch.from_numpy(cols * stride + stride - 1))
    np.testing.assert_allclose(spans[:, 0], first.numpy(), atol=1e-12)
    np.testing.assert_allclose(spans[:, 1], last_end.numpy(), atol=1e-12)
    # One span per time column the encoder really outputs.
    torch.manual_seed(0)
    with torch.no_grad():
        _, dense = enc.eval()(0.1 * torch.randn(1, enc.input_samples(10.0)))
    assert dense.shape[1] == len(spans)


@ENCODERS
def test_frame_spans_cover_exactly_the_columns_whose_fbank_frames_hear_a_sound(make):
    """A noise burst in silence: the columns with a frame above the silence floor are exactly
    the columns whose span overlaps the burst."""
    enc = make()
    p = enc.fbank.params
    stride = enc.time_stride_frames
    n = enc.input_samples(10.0)
    # Burst edges half a hop off the frame grid, so every touching window overlaps it by >= 80 samples;
    # the burst starts 5 ms after a column's last hop, so only that column's window tail hears its onset.
    a, b = 160 * 304 + 80, 160 * 377 + 80
    x = torch.zeros(1, n)
    x[0, a:b] = 0.1 * torch.randn(b - a, generator=torch.Generator().manual_seed(1))
    fb = enc.fbank(x)[0]  # (T, F)
    real = 1 + (n - p.window_samples) // p.shift_samples  # the frames Kaldi computes (snip_edges)
    floor = (np.log(np.finfo(np.float32).eps) - p.norm_mean) / (2 * p.norm_std)
    heard_frames = np.flatnonzero(fb[:real].max(dim=1).values.numpy() > floor + 0.5)
    expected_frames = [f for f in range(real) if f * 160 < b and f * 160 + 400 > a]
    assert heard_frames.tolist() == expected_frames
    heard_columns = sorted({int(f) // stride for f in heard_frames})
    spans = enc.frame_spans_s()
    overlapping = np.flatnonzero((spans[:, 0] < b / SR) & (spans[:, 1] > a / SR)).tolist()
    assert heard_columns == overlapping


def test_frame_labels_by_hand_for_80_and_160_ms_columns():
    small, eat = small_encoder().frame_spans_s(), eat_encoder().frame_spans_s()

    def active(segments, offset, spans):
        return np.flatnonzero(frame_labels(segments, offset, spans)).tolist()

    # 80 ms columns of 95 ms: column k spans [0.08k, 0.08k + 0.095].
    assert active([(1.0, 2.0)], 0.0, small) == list(range(12, 25))
    assert active([(1.01, 2.0)], 0.0, small) == list(range(13, 25))  # column 12 holds 45 ms < 47.5 ms
    assert active([(1.51, 2.5)], 0.5, small) == list(range(13, 25))  # the crop offset shifts the event
    assert active([(1.0, 1.02)], 0.0, small) == [12]  # 20 ms event: the column it falls in
    assert active([(1.045, 1.05)], 0.0, small) == [12, 13]  # 5 ms, inside two overlapping columns
    assert active([(1.0, 2.0)], 1.5, small) == list(range(6))  # starts before the crop
    assert active([(1.0, 2.0)], 5.0, small) == []  # ends before the crop
    assert active([(20.0, 21.0)], 0.0, small) == []  # past the last column
    assert active([(3.0, 3.0), (4.0, 3.5)], 0.0, small) == []  # empty and reversed segments
    assert active([], 0.0, small) == []
    assert active([(1.0, 2.0), (5.0, 5.3)], 0.0, small) == list(range(12, 25)) + list(range(62, 66))
    # 160 ms columns of 175 ms: column k spans [0.16k, 0.16k + 0.175].
    assert active([(1.0, 2.0)], 0.0, eat) == list(range(6, 12))  # column 12 holds 80 ms < 87.5 ms
    assert active([(2.0, 3.0)], 1.0, eat) == list(range(6, 12))
    assert active([(1.0, 1.05)], 0.0, eat) == [6]  # 50 ms event: the column it falls in
    assert active([(0.962, 0.972)], 0.0, eat) == [5, 6]  # 10 ms, inside two overlapping columns
    assert active([(0.0, 10.0)], 0.0, eat) == list(range(62))  # column 62 [9.92, 10.095] holds 80 ms


@ENCODERS
@pytest.mark.parametrize("min_overlap", [0.5, 1.0])
def test_frame_labels_mark_the_frames_an_event_covers_enough(make, min_overlap):
    spans = make().frame_spans_s()
    rng = np.random.default_rng(7)
    marked_short = 0
    for _ in range(300):
        length = float(rng.choice([rng.uniform(0.005, 0.06), rng.uniform(0.06, 0.3), rng.uniform(0.3, 4.0)]))
        start = float(rng.uniform(-1.0, 11.0))
        offset = float(rng.uniform(0.0, 2.0))
        got = frame_labels([(start, start + length)], offset, spans, min_overlap)
        want = reference_active(start, start + length, offset, spans, min_overlap)
        np.testing.assert_array_equal(got, want, err_msg=f"event [{start}, {start + length}] at offset {offset}")
        a, b = start - offset, start + length - offset
        if min_overlap == 0.5 and a >= 0 and b <= spans[-1, 0]:
            assert got.any(), "an event inside the input marks at least one frame"
            marked_short += length < 0.06
    assert marked_short > 10 or min_overlap != 0.5


# --------------------------------------------------------------------------- 2. negatives


@pytest.mark.parametrize("mode", ["cluster", "phrase"])
def test_negatives_never_contradict_a_positive(tables, ontology, rows, mode):
    sampler = NegativeSampler(tables, mode)
    all_clusters = sorted(ontology.related)
    in_data = sorted({ph["cluster_id"] for r in rows.values() for ph in r["phrases"]})
    ambiguous = sorted(c for cs in ontology.clusters_of.values() if len(cs) > 1 for c in cs)
    assert ambiguous, "the phrase database has phrases in several clusters"
    rng = np.random.default_rng(11)
    for trial in range(400):
        k = int(rng.integers(1, 7))
        pool = (all_clusters, in_data, ambiguous)[trial % 3]
        positives = [int(c) for c in rng.choice(pool, size=min(k, len(pool)), replace=False)]
        want = N_PHRASES - len(positives)
        negatives = sampler.sample(positives, want, np.random.default_rng(trial))
        assert len(negatives) == want
        phrases = [ph for ph, _ in negatives]
        assert len(set(phrases)) == len(phrases), f"repeated negatives {Counter(phrases).most_common(2)}"
        for phrase, cid in negatives:
            assert cid in ontology.clusters_of[phrase]
            for pos in positives:
                # Neither the drawn cluster nor any cluster the same text names may be a positive or a relative of one.
                bad = [c for c in ontology.clusters_of[phrase] if contradicts(c, pos, ontology.related)]
                assert not bad, f"negative {phrase!r} (clusters {bad}) contradicts positive cluster {pos}"


@pytest.mark.parametrize("mode", ["cluster", "phrase"])
def test_negatives_exhaust_exactly_the_open_phrases(tables, ontology, mode):
    sampler = NegativeSampler(tables, mode)
    for positives in ([354], [440], [442, 254], [151, 368]):  # Dog; Inside, large room; Outside + Howl; Music + Human sounds
        banned = {c for p in positives for c in ontology.related[p]} | {p for p in positives}
        banned |= {c for c in ontology.related if any(p in ontology.related[c] for p in positives)}
        open_phrases = {ph for ph, cs in ontology.clusters_of.items() if not cs & banned}
        got = [ph for ph, _ in sampler.sample(positives, 10**6, np.random.default_rng(0))]
        assert len(got) == len(set(got))
        assert set(got) == open_phrases


def test_inventory_phrases_take_at_most_their_share_of_negatives():
    """A database with inventory phrases (``source: inventory``) gives them at most
    ``inventory_share`` of a clip's negatives; the corpus's phrases fill the rest."""
    t = hand_tables()
    corpus_clusters = {1, 2, 3, 4, 5, 6, 8}  # rain (7) never sounds in this corpus
    phrases = [{**p, "source": "dataset" if p["cluster_id"] in corpus_clusters else "inventory"} for p in t.phrases]
    tables = ClusterTables(t.clusters, phrases)
    rain = {p["phrase"] for p in t.phrases if p["cluster_id"] == 7}
    for share, most in ((0.0, 0), (0.25, 2), (1.0, 8)):
        sampler = NegativeSampler(tables, "cluster", inventory_share=share)
        for seed in range(20):
            got = [ph for ph, _ in sampler.sample([2], 8, np.random.default_rng(seed))]
            assert len(got) == len(set(got)) and sum(ph in rain for ph in got) == most, (share, got)
    # without a source column every phrase is the corpus's: the share does not apply
    assert sum(ph in rain for ph, _ in NegativeSampler(t, "cluster", 0.0).sample([2], 8, np.random.default_rng(0))) > 0


def hand_tables(rain_phrases: int = 10) -> ClusterTables:
    """Dog (1) is the parent of Bark (2), Cat (3) of Meow (4); Knock (5) and Tap (6) are near-synonyms;
    Rain (7) has many phrases; Door (8) shares the phrase "knock" with Knock."""
    rel = {1: ([], [2], []), 2: ([1], [], []), 3: ([], [4], []), 4: ([3], [], []), 5: ([], [], [6]), 6: ([], [], [5]),
           7: ([], [], []), 8: ([], [], [])}
    clusters = [{"cluster_id": c, "ancestor_ids": a, "descendant_ids": d, "near_synonym_ids": s} for c, (a, d, s) in rel.items()]
    texts = {1: ["dog", "a dog"], 2: ["bark", "barking"], 3: ["cat"], 4: ["meow"], 5: ["knock", "knocking"], 6: ["tap", "tapping"],
             7: [f"rain {i}" for i in range(rain_phrases)], 8: ["door", "knock"]}
    phrases = [{"phrase": t, "cluster_id": c} for c, ts in texts.items() for t in ts]
    return ClusterTables(clusters, phrases)


@pytest.mark.parametrize("mode", ["cluster", "phrase"])
def test_negatives_on_a_hand_made_ontology(mode):
    sampler = NegativeSampler(hand_tables(), mode)
    assert sampler.excluded([2]) == {1, 2}
    assert sampler.excluded([1]) == {1, 2}
    assert sampler.excluded([4]) == {3, 4}
    assert sampler.excluded([5]) == {5, 6}
    assert sampler.excluded([2, 6]) == {1, 2, 5, 6}
    rain = {f"rain {i}" for i in range(10)}

    def everything(positives):
        got = [ph for ph, _ in sampler.sample(positives, 1000, np.random.default_rng(1))]
        assert len(got) == len(set(got))
        return set(got)

    assert everything([2]) == {"cat", "meow", "knock", "knocking", "tap", "tapping", "door"} | rain  # "knock" once
    assert everything([5]) == {"dog", "a dog", "bark", "barking", "cat", "meow", "door"} | rain  # not Door's "knock"
    assert everything([8]) == {"dog", "a dog", "bark", "barking", "cat", "meow", "knocking", "tap", "tapping"} | rain
    assert everything([1, 3, 5, 7, 8]) == set()
    for seed in range(200):
        negatives = sampler.sample([2], 3, np.random.default_rng(seed))
        assert len(negatives) == 3 and {c for _, c in negatives}.isdisjoint({1, 2})
        if mode == "cluster":  # one phrase per open cluster before any cluster gives a second
            assert len({c for _, c in negatives}) == 3
    # cluster: Rain is one of six open clusters; phrase: it holds 10 of the 18 open phrases.
    first = Counter(sampler.sample([2], 1, np.random.default_rng(s))[0][1] for s in range(3000))
    share = first[7] / 3000
    assert (0.12 < share < 0.22) if mode == "cluster" else (0.45 < share < 0.7)
    assert sampler.sample([2], 0, np.random.default_rng(0)) == []


def test_negative_sampler_needs_two_clusters():
    with pytest.raises(NegativeError):
        NegativeSampler(ClusterTables([{"cluster_id": 1, "ancestor_ids": [], "descendant_ids": [], "near_synonym_ids": []}],
                                      [{"phrase": "dog", "cluster_id": 1}]))


# --------------------------------------------------------------------------- 3. the epoch deal


def test_plan_epoch_deals_every_piece_once_and_balances_rows():
    rng = np.random.default_rng(3)
    for trial in range(60):
        sizes = rng.integers(1, 6, size=int(rng.integers(1, 40)))
        pieces = [Piece(0, f"f{i % 3}", i, 0, int(s)) for i, s in enumerate(sizes)]
        workers = int(rng.integers(1, 9))
        deal = plan_epoch(pieces, workers, seed=5, epoch=trial)
        assert len(deal.pieces) == workers
        dealt = [p for w in deal.pieces for p in w]
        assert sorted(dealt, key=lambda p: p.row_group) == pieces  # each piece exactly once
        loads = [sum(p.rows for p in w) for w in deal.pieces]
        assert deal.quota == min(loads)
        assert max(loads) - min(loads) <= max(sizes)
        assert sum(loads) - workers * deal.quota < workers * max(sizes)  # rows that wait for another epoch
        again = plan_epoch(pieces, workers, seed=5, epoch=trial)
        assert again.pieces == deal.pieces and again.quota == deal.quota
    pieces = [Piece(0, "f", i, 0, 2) for i in range(30)]
    assert plan_epoch(pieces, 4, 5, 0).pieces != plan_epoch(pieces, 4, 5, 1).pieces
    assert plan_epoch(pieces, 4, 5, 0).pieces != plan_epoch(pieces, 4, 6, 0).pieces
    assert plan_epoch(pieces[:2], 3, 5, 0).quota == 0  # more workers than pieces: nobody may run ahead


@pytest.mark.parametrize("world_size, epochs", [(2, (0, 1)), (3, (0,))])
def test_ranks_and_workers_split_an_epoch_without_overlap(shards, builder, rows, world_size, epochs):
    workers = 2
    source = [SourceParams(path=str(shards), split="train")]
    layouts = []
    for epoch in epochs:
        per_worker, per_rank = {}, []
        for rank in range(world_size):
            stream = TrainStream(source, builder, seed=21, shuffle_buffer=4, piece_rows=1, rank=rank, world_size=world_size)
            ids = [b.ids[0] for b in run(stream, epoch, num_workers=workers)]
            per_rank.append(ids)
            for w in range(workers):  # the DataLoader takes one batch from each worker in turn
                per_worker[rank, w] = ids[w::workers]
        everything = [i for ids in per_rank for i in ids]
        assert len(everything) == len(set(everything)), "an id was dealt to two ranks or workers"
        assert len({len(ids) for ids in per_rank}) == 1, "ranks must yield the same number of items"
        assert len({len(ids) for ids in per_worker.values()}) == 1
        assert len(per_rank[0]) == stream.rows_per_worker(world_size * workers) * workers
        assert set(everything) <= set(rows)
        biggest_piece = piece_rows_for(len(rows), world_size * workers, 1)
        assert len(set(rows) - set(everything)) < world_size * workers * biggest_piece
        layouts.append({k: set(v) for k, v in per_worker.items()})
    if len(layouts) > 1:
        assert layouts[0] != layouts[1], "every epoch should deal the rows afresh"


def one_row_group(shards: Path, out: Path, rows: int, audio_bytes: int | None = None) -> ParquetSource:
    """The fixture's train rows, repeated to ``rows``, written by the shard writer as one row group
    (each audio cell ``audio_bytes`` random bytes where given); a source reading it."""
    import pyarrow as pa

    from pipeline.shards.layout import shard_schema
    from pipeline.shards.writer import write_shards

    fixture = pa.concat_tables([pq.read_table(f) for f in sorted((shards / "data").glob("train-*.parquet"))])
    table = pa.concat_tables([fixture] * -(-rows // fixture.num_rows)).slice(0, rows)
    if audio_bytes:
        blobs = np.random.default_rng(0).integers(0, 256, (rows, audio_bytes), dtype=np.uint8)
        audio = pa.StructArray.from_arrays([pa.array(list(map(bytes, blobs)), pa.binary()), pa.nulls(rows, pa.string())],
                                           fields=list(table.schema.field("audio").type))
        table = table.set_column(table.schema.get_field_index("audio"), "audio", audio)
    out.mkdir(exist_ok=True)
    sizes = [len(c["bytes"].as_py()) for c in table.column("audio")]
    write_shards(out, SR, {"train": list(range(rows))}, sizes.__getitem__, row_of=None, shard_size_mb=1000, row_group_size_mb=1000,
                 compression="zstd", table_of=lambda items: table.slice(items[0], len(items)).cast(shard_schema(SR)))
    source = ParquetSource(0, SourceParams(path=str(out), split="train"))
    assert [n for _, _, n in source.row_groups()] == [rows]
    return source


def test_a_piece_is_the_rows_of_its_row_group_in_any_reading_order(shards, builder, tmp_path, monkeypatch):
    """Pieces read in order (a held-out stream: each goes on where the last stopped), skipping
    ahead, backwards and shuffled give the rows ``read_row_group`` gives, across the reader's
    batches; the last pass is closed once a stream ends, since a held-out stream's source lives
    on in the training process."""
    import trainer.data.sources as sources

    monkeypatch.setattr(sources, "READ_BATCH_ROWS", 3)  # pieces of 2 rows start and end inside batches
    source = one_row_group(shards, tmp_path / "one", 23)
    file = source.row_groups()[0][0]
    whole = pq.ParquetFile(file).read_row_group(0).to_pylist()
    pieces = [Piece(0, file, 0, start, min(23, start + 2)) for start in range(0, 23, 2)]
    shuffled = [pieces[i] for i in np.random.default_rng(0).permutation(len(pieces))]
    for order in (pieces, pieces[::3] + pieces[1::3], pieces[::-1], shuffled, [Piece(0, file, 0, 23, 25)]):
        for piece in order:
            got, want = source.read(piece), whole[piece.start:piece.stop]
            assert [r["_from"] for r in got] == [(file, i) for i in range(piece.start, min(23, piece.stop))]
            assert [r["audio"]["bytes"] for r in got] == [r["audio"]["bytes"] for r in want]
            assert [(r["id"], r["caption"], r["phrases"]) for r in got] == [(r["id"], r["caption"], r["phrases"]) for r in want]
    source.release()
    stream = TrainStream([SourceParams(path=str(shards), split="train")], builder, seed=3, shuffle_buffer=4, piece_rows=2)
    assert run(stream, epoch=0)
    assert stream.sources[0]._cursor is None


def test_a_shard_reader_holds_about_a_page_of_audio_not_its_row_group(shards, tmp_path):
    """A row group's audio is written in pages of about ``PAGE_BYTES`` and read a piece at a time,
    so what Arrow allocates to read one piece follows the page and the piece, not the row group
    (190 MB in a default shard's, which a reader once held whole, and twice while reading it)."""
    import pyarrow as pa

    from pipeline.shards.writer import PAGE_BYTES
    from trainer.data.sources import READ_BATCH_ROWS

    rows, size = 240, 150_000  # one row group of 36 MB, rows of a 10 s FLAC's size
    source = one_row_group(shards, tmp_path, rows, audio_bytes=size)
    file = source.row_groups()[0][0]

    pools = []  # a pool must outlive every buffer it gave out

    def peak_bytes(read) -> int:
        """The most Arrow held at once while ``read()`` ran (all of it freed by its end)."""
        pools.append(pa.proxy_memory_pool(pa.default_memory_pool()))
        before = pa.default_memory_pool()
        pa.set_memory_pool(pools[-1])
        try:
            read()
        finally:
            pa.set_memory_pool(before)
        deadline = time.monotonic() + 10  # Arrow's I/O threads may free the last read-ahead buffers just after the call
        while pools[-1].bytes_allocated() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pools[-1].bytes_allocated() == 0
        return pools[-1].max_memory()

    got = []

    def read_a_piece():
        got.extend(source.read(Piece(0, file, 0, 200, 204)))
        source.release()

    streamed = peak_bytes(read_a_piece)
    assert [r["audio"]["bytes"] for r in got] == [bytes(b) for b in np.random.default_rng(0).integers(0, 256, (rows, size), dtype=np.uint8)[200:204]]
    whole = peak_bytes(lambda: pq.ParquetFile(file).read_row_group(0))
    assert whole > rows * size
    assert streamed < 4 * PAGE_BYTES + 2 * READ_BATCH_ROWS * size < rows * size / 4, (streamed, whole)  # a page or two, the read buffer, a batch and its slice


# --------------------------------------------------------------------------- 4. items


def test_an_item_does_not_depend_on_the_worker_layout(shards, tables, spans, rows):
    crop = 6 * SR
    builder = ItemBuilder(ItemParams(input_samples=crop, random_crop=True, tag_replacement_p=0.5), spans, NegativeSampler(tables), seed=5)
    source = [SourceParams(path=str(shards), split="train")]
    single = items_of(run(TrainStream(source, builder, seed=8, shuffle_buffer=8, piece_rows=1, rank=0, world_size=1), epoch=2))
    split = []
    for rank in (0, 1):
        stream = TrainStream(source, builder, seed=8, shuffle_buffer=8, piece_rows=1, rank=rank, world_size=2)
        split += items_of(run(stream, epoch=2, num_workers=2))
    a, b = {i.id: i for i in single}, {i.id: i for i in split}
    assert set(a) == set(b) == set(rows)
    for item_id, x in a.items():
        y = b[item_id]
        np.testing.assert_array_equal(x.wave, y.wave)
        np.testing.assert_array_equal(x.labels, y.labels)
        np.testing.assert_array_equal(x.mask, y.mask)
        assert (x.phrases, x.caption, x.has_frames) == (y.phrases, y.caption, y.has_frames)
    # The labels sit where the crop that was really taken puts the events, and stop where it ends.
    offsets = set()
    inside, past = spans[:, 1] <= crop / SR - 0.1, spans[:, 0] >= crop / SR
    for item in single:
        row = rows[item.id]
        assert item.wave.shape == (crop,) and item.wave.dtype == np.float32
        offset = crop_offset(decode_flac(row["audio"]), item.wave)
        offsets.add(offset)
        positives = row["phrases"]
        assert item.phrases[: len(positives)] == [ph["phrase"] for ph in positives]
        for k, ph in enumerate(positives):
            np.testing.assert_array_equal(item.labels[k, inside], frame_labels(segments_of(ph), offset / SR, spans)[inside])
            assert not item.labels[k, past].any()
        assert not item.labels[len(positives):].any()
        assert item.caption in {row["caption"]} | {ph["phrase"] for ph in positives}
    assert len(offsets) > 3, "random crops should differ between clips"
    assert any(i.caption != rows[i.id]["caption"] for i in single), "tag replacement at p=0.5 should replace some captions"
    # Another epoch draws other crops for the same ids.
    later = {i.id: i for i in items_of(run(TrainStream(source, builder, seed=8, shuffle_buffer=8, piece_rows=1), epoch=3))}
    assert sum(not np.array_equal(later[k].wave, a[k].wave) for k in a) > len(a) // 2


def test_labels_follow_the_recipe_segments(shard_folder, tmp_path, rows, ontology):
    params, folder = shard_folder
    p = tiny_train_params(params, folder, tmp_path)
    encoder = small_encoder()
    spans = encoder.frame_spans_s()
    items = items_of(run(make_stream(p, encoder, p.train.data.sources, shuffle=False), epoch=0))
    assert {i.id for i in items} == set(rows)
    active = 0
    for item in items:
        row = rows[item.id]
        positives = row["phrases"]
        k = len(positives)
        assert item.has_frames and item.caption == row["caption"]
        full = decode_flac(row["audio"])
        np.testing.assert_array_equal(item.wave, np.pad(full, (0, max(0, len(item.wave) - len(full))))[: len(item.wave)])
        assert item.phrases[:k] == [ph["phrase"] for ph in positives]
        for j, ph in enumerate(positives):
            np.testing.assert_array_equal(item.labels[j], frame_labels(segments_of(ph), 0.0, spans, p.train.data.min_label_overlap))
            active += int(item.labels[j].sum())
        assert not item.labels[k:].any()
        assert item.mask.tolist() == [True] * p.train.data.num_phrases  # positives + N - K negatives
        assert all(item.phrases)
        for phrase in item.phrases[k:]:
            assert phrase not in item.phrases[:k]
            for pos in positives:
                assert not any(contradicts(c, pos["cluster_id"], ontology.related) for c in ontology.clusters_of[phrase])
    assert active > 100


def test_labels_stop_at_the_end_of_a_short_crop(shard_folder, tmp_path, rows):
    """With crop_s shorter than the encoder's input, frames past the crop see padding: no event there."""
    params, folder = shard_folder
    p = tiny_train_params(params, folder, tmp_path)
    crop_s = 4.0
    p = replace(p, train=replace(p.train, data=replace(p.train.data, crop_s=crop_s)))
    encoder = small_encoder()
    spans = encoder.frame_spans_s()
    items = items_of(run(make_stream(p, encoder, p.train.data.sources, shuffle=False), epoch=0))
    late = [ph for r in rows.values() for ph in r["phrases"] if any(e > crop_s + 0.5 for _, e in segments_of(ph))]
    assert late, "some events should lie past the crop"
    past, inside = spans[:, 0] >= crop_s, spans[:, 1] <= crop_s - 0.1
    for item in items:
        assert item.wave.shape == (int(crop_s * SR),)
        assert not item.labels[:, past].any(), f"{item.id}: labels on frames past the {crop_s} s crop"
        for j, ph in enumerate(rows[item.id]["phrases"]):
            np.testing.assert_array_equal(item.labels[j, inside], frame_labels(segments_of(ph), 0.0, spans)[inside])


# --------------------------------------------------------------------------- 5. resume


def test_resume_skips_exactly_the_batches_already_trained(shards, builder):
    stream = TrainStream([SourceParams(path=str(shards), split="train")], builder, seed=9, shuffle_buffer=4, piece_rows=1)
    batch = 3
    full = [b.ids for b in run(stream, epoch=1, num_workers=2, batch_size=batch)]
    assert len(full) >= 6
    assert len({i for ids in full for i in ids}) == sum(len(ids) for ids in full)
    for skip in (1, 2, 3, 5):
        rest = [b.ids for b in run(stream, epoch=1, num_workers=2, batch_size=batch, skip_batches=skip)]
        assert rest == full[skip:], f"resume after {skip} batches"


# --------------------------------------------------------------------------- 6. caption corpora


def tone(freq: float, seconds: float, rate: int, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    x = (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)
    return np.stack([x] * channels, axis=1) if channels > 1 else x


def dominant_hz(x: np.ndarray, rate: int = SR) -> float:
    spectrum = np.abs(np.fft.rfft(x))
    return float(np.fft.rfftfreq(len(x), 1 / rate)[int(np.argmax(spectrum))])


def write_csv(path: Path, rows: list[list[str]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["file_name", "caption_1", "caption_2"])
        w.writerows(rows)
    return path


@pytest.fixture
def caption_corpus(tmp_path):
    audio = tmp_path / "audio"
    audio.mkdir()
    sf.write(audio / "stereo44k.wav", tone(440, 3.0, 44100, channels=2) * np.array([1.0, 0.2], dtype=np.float32), 44100)
    sf.write(audio / "mono8k.wav", tone(1000, 7.0, 8000), 8000)
    sf.write(audio / "mono16k.flac", tone(2000, 2.0, SR), SR)
    (audio / "corrupt.wav").write_bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    for i in range(20):
        sf.write(audio / f"short{i:02d}.wav", tone(300 + 50 * i, 0.5, SR), SR)
    return SimpleNamespace(dir=tmp_path, audio=audio)


def caption_source(path: Path, audio: Path, **changes) -> SourceParams:
    return SourceParams(kind="captions", path=str(path), audio_dir=str(audio), caption_columns=("caption_1", "caption_2"), **changes)


def test_caption_csv_reports_missing_and_malformed_rows(caption_corpus):
    c = caption_corpus
    csv_path = write_csv(c.dir / "captions.csv", [
        ["stereo44k.wav", "a tone", "a high tone"],
        ["missing.wav", "not there", ""],
        ["mono8k.wav", "", "a whistle"],
        ["mono16k.flac", "", ""],
    ])
    source = CaptionCsvSource(0, caption_source(csv_path, c.audio))
    assert [r["id"] for r in source.rows] == ["stereo44k.wav", "mono8k.wav"]
    assert source.rows[0]["captions"] == ["a tone", "a high tone"] and source.rows[1]["captions"] == ["a whistle"]
    reasons = {(s.item_id, s.reason) for s in source.skips}
    assert reasons == {("missing.wav", "missing-file"), ("line 5", "malformed-row")}
    assert all(s.detail for s in source.skips)
    # A path_format naming a column the CSV lacks leaves every row malformed: a clear error, not an empty source.
    with pytest.raises(SourceError, match="no usable rows"):
        CaptionCsvSource(0, caption_source(csv_path, c.audio, path_format="{youtube_id}.wav"))
    with pytest.raises(SourceError, match="caption_3"):
        CaptionCsvSource(0, replace(caption_source(csv_path, c.audio), caption_columns=("caption_3",)))
    with pytest.raises(SourceError, match="audio_dir"):
        CaptionCsvSource(0, replace(caption_source(csv_path, c.audio), audio_dir=None))


def test_caption_items_are_mono_16k_crops_without_frame_labels(caption_corpus, spans, tables):
    c = caption_corpus
    csv_path = write_csv(c.dir / "captions.csv", [
        ["stereo44k.wav", "a tone", ""], ["mono8k.wav", "a whistle", "a beep"], ["mono16k.flac", "a chirp", ""],
    ])
    crop = 5 * SR
    builder = ItemBuilder(ItemParams(input_samples=crop, num_phrases=4), spans, NegativeSampler(tables), seed=2)
    stream = TrainStream([caption_source(csv_path, c.audio)], builder, seed=4, shuffle_buffer=2, piece_rows=1)
    items = {i.id: i for i in items_of(run(stream, epoch=0))}
    assert set(items) == {"stereo44k.wav", "mono8k.wav", "mono16k.flac"}
    for item in items.values():
        assert item.wave.shape == (crop,) and item.wave.dtype == np.float32
        assert not item.has_frames and not item.mask.any() and not item.labels.any()
        assert item.labels.shape == (4, len(spans)) and item.phrases == [""] * 4
        assert not item.skips
    assert items["mono8k.wav"].caption in {"a whistle", "a beep"}
    # Resampled to 16 kHz (the tone keeps its pitch), stereo downmixed, short files padded with silence.
    stereo, low, flac = items["stereo44k.wav"].wave, items["mono8k.wav"].wave, items["mono16k.flac"].wave
    assert abs(dominant_hz(stereo[: 3 * SR]) - 440) < 2
    assert abs(np.abs(stereo[SR:2 * SR]).max() - 0.3) < 0.01  # the mean of channels at 0.5 and 0.1
    assert not stereo[3 * SR + 100:].any()
    assert abs(dominant_hz(low) - 1000) < 2  # 7 s cropped to 5 s: tone throughout
    assert np.abs(low[-SR:]).max() > 0.4
    assert abs(dominant_hz(flac[: 2 * SR]) - 2000) < 2 and not flac[2 * SR:].any()


def test_unreadable_audio_is_skipped_and_reported(caption_corpus, spans):
    c = caption_corpus
    csv_path = write_csv(c.dir / "captions.csv", [[f"short{i:02d}.wav", f"tone {i}", ""] for i in range(3)] + [["corrupt.wav", "noise", ""]])
    builder = ItemBuilder(ItemParams(input_samples=SR), spans, None, seed=2)
    stream = TrainStream([caption_source(csv_path, c.audio)], builder, seed=4, shuffle_buffer=1, piece_rows=1)
    assert not stream.skips
    places = set()
    for epoch in range(8):
        # With a buffer of one row, rows come in the order of this epoch's deal.
        stream.set_epoch(epoch)
        order = [r["id"] for piece in stream.plan(1)[0].pieces[0] for r in stream.sources[0].read(piece)]
        items = items_of(run(stream, epoch))
        assert [i.id for i in items] == [i for i in order if i != "corrupt.wav"]
        skips = [(i.id, s) for i in items for s in i.skips]
        assert len(skips) == 1, f"epoch {epoch}: the unreadable file must be reported once, got {skips}"
        carrier, skip = skips[0]
        assert (skip.item_id, skip.reason) == ("corrupt.wav", "unreadable")
        assert skip.path.endswith("corrupt.wav") and skip.detail
        place = order.index("corrupt.wav")
        places.add(place == len(order) - 1)
        # It rides on the next item; after the last item it rides on that one rather than being lost.
        assert carrier == (order[place + 1] if place + 1 < len(order) else items[-1].id)
    assert places == {True, False}, "the unreadable row should come both mid-epoch and last"


def test_two_sources_mix_by_weight(shards, caption_corpus, builder, rows):
    c = caption_corpus
    csv_path = write_csv(c.dir / "captions.csv", [[f"short{i:02d}.wav", f"tone {i}", ""] for i in range(20)])
    sources = [SourceParams(path=str(shards), split="train", weight=1.0), replace(caption_source(csv_path, c.audio), weight=0.5)]
    stream = TrainStream(sources, builder, seed=6, shuffle_buffer=4, piece_rows=1)
    items = items_of(run(stream, epoch=0, num_workers=2))
    ids = [i.id for i in items]
    assert len(ids) == len(set(ids))
    shard_items = [i for i in items if i.id in rows]
    caption_items = [i for i in items if i.id.startswith("short")]
    assert len(shard_items) + len(caption_items) == len(items)
    assert len(shard_items) == len(rows)
    assert abs(len(caption_items) - 0.5 * len(shard_items)) <= 1  # weight 0.5 of the first source, not all 20 rows
    assert all(i.has_frames for i in shard_items) and not any(i.has_frames for i in caption_items)
    # Sources are drawn by weight all through the epoch, not one after the other.
    third = len(items) // 3
    assert sum(not i.has_frames for i in items[:third]) >= 1 and sum(i.has_frames for i in items[-third:]) >= 1


def test_a_small_source_repeats_its_rows_to_keep_its_weight(shards, caption_corpus, builder, rows):
    c = caption_corpus
    csv_path = write_csv(c.dir / "captions.csv", [[f"short{i:02d}.wav", f"tone {i}", "a tone"] for i in range(6)])
    sources = [SourceParams(path=str(shards), split="train", weight=1.0), replace(caption_source(csv_path, c.audio), weight=2.0)]
    stream = TrainStream(sources, builder, seed=6, shuffle_buffer=4, piece_rows=1)
    batches = run(stream, epoch=0, num_workers=2, batch_size=4)
    shares = np.bincount([s for b in batches for s in b.sources], minlength=2)
    assert shares[0] == len(rows) and abs(shares[1] - 2 * len(rows)) <= 2  # 6 caption rows, each used about 2 * rows / 6 times
    caption_items = [i for i in items_of(batches) if i.id.startswith("short")]
    assert {i.id for i in caption_items} == {f"short{i:02d}.wav" for i in range(6)}
    # A repeated row is its own draw (caption, crop): the repeats of one file are not all identical.
    captions = {}
    for i in caption_items:
        captions.setdefault(i.id, set()).add(i.caption)
    assert any(len(v) == 2 for v in captions.values())


def test_a_clip_level_source_uses_no_frame_labels(shards, builder, rows):
    stream = TrainStream([SourceParams(path=str(shards), split="train", level="clip")], builder, seed=6, shuffle_buffer=4, piece_rows=2)
    items = items_of(run(stream, epoch=0))
    assert len(items) == len(rows) and not any(i.has_frames or i.mask.any() or i.labels.any() for i in items)


# --------------------------------------------------------------------------- 7. errors


def test_shard_paths_without_parquet_files_fail_clearly(tmp_path, shards, builder):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SourceError, match=r"no train-\*\.parquet"):
        ParquetSource(0, SourceParams(path=str(empty)))
    with pytest.raises(SourceError):
        TrainStream([SourceParams(path=str(empty))], builder, seed=0)
    with pytest.raises(SourceError, match="not found"):
        ParquetSource(0, SourceParams(path=str(tmp_path / "nothing.parquet")))
    # A split the folder does not have (a typo of "valid") is an error, not an empty epoch.
    with pytest.raises(SourceError, match="validation"):
        ParquetSource(0, SourceParams(path=str(shards), split="validation"))


def test_broken_parquet_files_are_named_skipped_and_the_rest_read(tmp_path, shards, builder, capsys):
    import shutil

    from trainer.data.sources import pieces_of

    copy = tmp_path / "shards"
    shutil.copytree(shards, copy)
    files = sorted((copy / "data").glob("train-*.parquet"))
    assert len(files) >= 3
    empty, cut, good = files[0], files[1], files[2:]
    empty.write_bytes(b"")  # an interrupted download
    cut.write_bytes(cut.read_bytes()[:1000])  # cut short: no footer
    capsys.readouterr()
    source = ParquetSource(0, SourceParams(path=str(copy)))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and str(empty) in err[0] and str(cut) in err[1]
    assert all("re-create it" in line for line in err)
    assert [(s.path, s.reason) for s in source.skips] == [(str(empty), "unreadable"), (str(cut), "unreadable")]
    assert "0 bytes" in source.skips[0].detail
    assert sorted({f for f, _, _ in source.row_groups()}) == [str(f) for f in good]
    want = sum(pq.ParquetFile(f).metadata.num_rows for f in good)
    assert sum(len(source.read(p)) for p in pieces_of(source, 4)) == want
    stream = TrainStream([SourceParams(path=str(copy))], builder, seed=0)
    assert {s.path for s in stream.skips} == {str(empty), str(cut)}  # they reach skipped.csv
    # a file that breaks after its footer was read: one line naming it and the row group
    fresh = ParquetSource(0, SourceParams(path=str(copy)))
    good[0].write_bytes(b"")
    with pytest.raises(SourceError, match="cannot read row group 0 of") as caught:
        fresh.read(Piece(0, str(good[0]), 0, 0, 1))
    assert str(good[0]) in str(caught.value) and "\n" not in str(caught.value)
    # nothing readable: one line that names the files
    for f in good:
        f.write_bytes(b"")
    with pytest.raises(SourceError, match="no readable train Parquet file") as caught:
        ParquetSource(0, SourceParams(path=str(copy)))
    assert str(empty) in str(caught.value) and "\n" not in str(caught.value)


def test_missing_clusters_fail_clearly(tmp_path, shard_folder):
    params, folder = shard_folder
    with pytest.raises(NegativeError, match="clusters.parquet"):
        ClusterTables.read(str(tmp_path / "no-clusters"))
    half = tmp_path / "half"
    half.mkdir()
    (half / "clusters.parquet").write_bytes((folder / "clusters" / "clusters.parquet").read_bytes())
    with pytest.raises(NegativeError, match="phrases.parquet"):
        ClusterTables.read(str(half))
    p = tiny_train_params(params, folder, tmp_path / "out")
    p = replace(p, train=replace(p.train, data=replace(p.train.data, clusters=str(tmp_path / "no-clusters"))))
    with pytest.raises(NegativeError):
        make_stream(p, small_encoder(), p.train.data.sources, shuffle=True)


def test_a_shard_source_with_another_cluster_inventory_is_refused(shard_folder, tmp_path):
    import shutil

    import pyarrow.parquet as pq

    from trainer.data.stream import check_inventories

    params, folder = shard_folder
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    tables = ClusterTables.read(str(folder / "clusters"))
    sources = [SourceParams(path=str(folder)), SourceParams(path=str(other))]
    check_inventories(tables, str(folder / "clusters"), sources)  # the same inventory: accepted
    table = pq.read_table(other / "clusters" / "clusters.parquet")
    pq.write_table(table.slice(0, table.num_rows - 1), other / "clusters" / "clusters.parquet")
    with pytest.raises(SourceError, match="another cluster inventory"):
        check_inventories(tables, str(folder / "clusters"), sources)
    check_inventories(tables, str(folder / "clusters"), [sources[0], replace(sources[1], level="clip")])  # clip level: no phrases used


def test_the_data_fingerprint_names_files_within_their_folder_not_where_the_checkout_sits(shards, tmp_path, monkeypatch):
    import shutil

    from trainer.data.sources import ParquetSource
    from trainer.stages.train import data_fingerprint

    here, there = tmp_path / "a" / "dataset", tmp_path / "b" / "deeper" / "dataset"
    shutil.copytree(shards, here)
    shutil.copytree(shards, there)

    def fingerprint(path) -> str:
        return data_fingerprint(SimpleNamespace(sources=[ParquetSource(0, SourceParams(path=str(path), split="train"))]))

    assert fingerprint(here) == fingerprint(there)  # absolute paths would change every checkpoint's bytes with the clone's folder
    monkeypatch.chdir(tmp_path / "b")
    assert fingerprint("deeper/dataset") == fingerprint(here)  # params name folders relative to the checkout
    one = sorted((here / "data").glob("train-*.parquet"))[0]
    assert fingerprint(one) == fingerprint(sorted((there / "data").glob("train-*.parquet"))[0])
    table = pq.read_table(one)
    pq.write_table(table.slice(0, table.num_rows - 1), one)  # other data: another fingerprint
    assert fingerprint(here) != fingerprint(there)


def test_a_stream_gives_the_freed_heap_back_between_pieces(shards, builder, monkeypatch):
    """Each piece after the first polls the releaser (a loader worker's heap and Arrow pool would
    grow over an epoch otherwise); with a period of 0 every poll releases."""
    import trainer.data.sources as sources
    import trainer.memory as memory

    released, reads = [], []
    monkeypatch.setattr(memory, "RELEASE_EVERY_S", 0.0)
    monkeypatch.setattr(memory, "release_freed_heap", lambda: released.append(len(reads)))
    read = sources.ParquetSource.read
    monkeypatch.setattr(sources.ParquetSource, "read", lambda self, piece: reads.append(piece) or read(self, piece))
    stream = TrainStream([SourceParams(path=str(shards), split="train")], builder, seed=3, shuffle_buffer=4, piece_rows=2)
    assert run(stream, epoch=0)
    assert len(reads) > 2 and released == list(range(1, len(reads)))
