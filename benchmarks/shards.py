"""``sedsynth bench shards``: the text and shard stages on the configured mixtures, with peers.

Input: the mix stage's output at ``mix.out_dir`` (run ``dvc repro mix`` first). Times, best
of ``--repeat`` passes, on one core in this process:

- ``captions`` and ``clusters`` stages (the latter with the SentenceBERT model loaded once
  beforehand, as a long run would amortise it);
- ``shards`` stage: writing the Parquet shards, index and card;
- the peer: ``datasets.Dataset.from_generator`` over the same rows, the ``audio`` column cast
  to ``Audio`` over the same FLAC bytes, and ``Dataset.to_parquet``: what a user writing the
  same rows through ``datasets`` would run (``Audio`` encoding itself needs torchcodec);
- ``validate`` (schema, hashes, metadata) and ``validate --decode`` (every FLAC cell), and
  ``datasets.load_dataset`` of the folder with ``Audio(decode=False)`` reading every row.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_shards(params, repeat: int = 3) -> dict:
    import datasets

    from pipeline.mix.layout import MIXTURES
    from pipeline.schema import ShardRow, from_table
    from pipeline.shards import card
    from pipeline.shards.layout import features
    from pipeline.shards.validate import validate
    from pipeline.stages import captions, clusters
    from pipeline.stages.shards import run as shards

    mix_dir = Path(params.mix.out_dir)
    if not (mix_dir / MIXTURES).exists():
        raise FileNotFoundError(f"{mix_dir / MIXTURES}: run `dvc repro mix` (or `sedsynth mix`) first")
    datasets.disable_progress_bars()
    os.environ.setdefault("TQDM_DISABLE", "1")
    with tempfile.TemporaryDirectory(prefix="sedsynth-bench-") as tmp:
        tmp = Path(tmp)
        os.environ["HF_DATASETS_CACHE"] = str(tmp / "hf-cache")
        cap, clu, out = tmp / "captions", tmp / "clusters", tmp / "dataset"
        t_captions = _best(lambda: captions.run(params, mix_dir, cap), repeat)
        clusters.load_encoder(params.clusters.model)
        t_clusters = _best(lambda: clusters.run(params, cap, clu), repeat)
        t_shards = _best(lambda: shards(params, mix_dir, cap, clu, out), repeat)
        t_card = _best(lambda: card.write(out, params, mix_dir, json.loads((out / "index.json").read_text())), repeat)
        index = json.loads((out / "index.json").read_text())
        rows = sum(f["num_rows"] for f in index["files"])
        size = sum(f["num_bytes"] for f in index["files"])
        rate = index["sample_rate_hz"]
        records = [r for f in index["files"] for r in from_table(pq.read_table(out / f["path"]), ShardRow)]
        feats = features(rate)
        raw = feats.copy()
        raw["audio"] = datasets.Features({"bytes": datasets.Value("binary"), "path": datasets.Value("string")})

        def peer() -> None:
            def gen():
                for r in records:
                    d = {f.name: getattr(r, f.name) for f in dataclasses.fields(ShardRow)}
                    d["audio"] = {"bytes": r.audio.bytes, "path": r.audio.path}
                    d["phrases"] = [dataclasses.asdict(p) for p in r.phrases]
                    yield d

            # Audio.encode_example needs torchcodec even for ready bytes, so the rows go in as
            # structs and the column is cast to Audio (a storage cast) before writing
            ds = datasets.Dataset.from_generator(gen, features=raw, cache_dir=str(tmp / "hf-cache"), keep_in_memory=True)
            ds.cast_column("audio", feats["audio"]).to_parquet(str(tmp / "peer.parquet"))

        t_peer = _best(peer, repeat)
        t_validate = _best(lambda: validate(out), repeat)
        t_decode = _best(lambda: validate(out, decode=True), repeat)

        def load() -> None:
            ds = datasets.load_dataset(str(out), cache_dir=str(tmp / f"load-{time.perf_counter_ns()}"))
            for split in ds:
                for _ in ds[split].cast_column("audio", datasets.Audio(decode=False)):
                    pass

        t_load = _best(load, repeat)
    return {
        "rows": rows,
        "mb": size / 1e6,
        "captions_s": t_captions,
        "clusters_s": t_clusters,
        "shards_s": t_shards,
        "card_s": t_card,
        "peer_s": t_peer,
        "validate_s": t_validate,
        "validate_decode_s": t_decode,
        "load_s": t_load,
    }


def print_figures(f: dict) -> None:
    n, mb = f["rows"], f["mb"]
    print(f"bench shards: {n} mixtures, {mb:.1f} MB of FLAC, one core, best of passes")
    print(f"  captions stage                 {f['captions_s']:7.2f} s  {n / f['captions_s']:9.0f} mixtures/s")
    print(f"  clusters stage (model loaded)  {f['clusters_s']:7.2f} s")
    print(
        f"  shards stage                   {f['shards_s']:7.2f} s  {n / f['shards_s']:9.0f} rows/s  {mb / f['shards_s']:7.0f} MB/s"
    )
    print(f"    of which the dataset card and its plot {f['card_s']:7.2f} s")
    rows_s = f["shards_s"] - f["card_s"]
    print(f"  shards without the card        {rows_s:7.2f} s  {n / rows_s:9.0f} rows/s  {mb / rows_s:7.0f} MB/s")
    print(
        f"  datasets from_generator + to_parquet (peer) {f['peer_s']:7.2f} s  {n / f['peer_s']:9.0f} rows/s  {mb / f['peer_s']:7.0f} MB/s"
    )
    print(f"  shards (without card) / peer throughput {f['peer_s'] / rows_s:7.2f}x")
    print(f"  validate                       {f['validate_s']:7.2f} s")
    print(f"  validate --decode              {f['validate_decode_s']:7.2f} s  {n / f['validate_decode_s']:9.0f} rows/s")
    print(f"  load_dataset + read all rows   {f['load_s']:7.2f} s  {n / f['load_s']:9.0f} rows/s")
