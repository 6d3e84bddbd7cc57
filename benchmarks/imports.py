"""``sedsynth bench import``: importing an AudioSet-Strong-style corpus, with a peer.

Input: nothing; a corpus is generated in a temporary folder: ``audioset_train_strong.tsv`` and
``audioset_eval_strong.tsv`` in the released layout, about 10 regions per clip (so ``--clips``
10,000 gives about 100,000 rows), 2% of rows with a MID no class list knows and 3% of clips
without audio. The audio is four distinct 10 s files (16 kHz mono FLAC, which the writer keeps
as it is; 16 kHz mono WAV; 16 kHz stereo WAV; 44.1 kHz stereo WAV, resampled) hard-linked under
every segment's name, so the disk holds four files whatever the clip count.

Figures, each from one timed pass (the SentenceBERT index is built once beforehand, as a long
run amortises it; assigning the corpus's phrases is timed):

- the reader alone (TSVs -> clips, audio listed, not read);
- the whole import (read, decode, resample, FLAC, labels, clusters, shards, card) with 1 and 2
  workers, as clips/s per core; a fifth of the clips with ``imports.keep_flac`` on and off,
  which shows what keeping plain FLAC bytes saves;
- peak resident memory of this process after the small and the full run (the main process
  holds clip metadata only: audio goes through files, one row group at a time) and of the
  worker processes;
- the peer: the same rows (read back from the shards, up to 2,000) written by
  ``datasets.Dataset.from_dict(...).cast_column("audio", Audio())`` then ``to_parquet``, in rows/s.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import soundfile as sf

PEER_ROWS = 2000
MIDS = ("/m/09x0r", "/m/05tny_", "/m/07yv9", "/m/0jbk", "/m/04rlf", "/m/0k4j", "/m/01g50p", "/m/06mb1", "/m/0838f", "/m/07pbtc8",
        "/m/03m9d0z", "/m/02zsn", "/m/01j3sz", "/m/015lz1", "/m/07qfr4h")


def _sources(folder: Path) -> list[Path]:
    """The four distinct 10 s source files: a tone chord over noise, in the formats AudioSet downloads come in."""
    rng = np.random.default_rng(0)
    out = []
    for name, rate, channels in (("a.flac", 16000, 1), ("b.wav", 16000, 1), ("c.wav", 16000, 2), ("d.wav", 44100, 2)):
        t = np.arange(10 * rate) / rate
        x = 0.1 * np.sin(2 * np.pi * 440 * t) + 0.05 * np.sin(2 * np.pi * 1234 * t) + 0.02 * rng.standard_normal(len(t))
        samples = np.stack([x, 0.8 * x], axis=1) if channels == 2 else x
        sf.write(str(folder / name), samples.astype(np.float32), rate, subtype="PCM_16", format="FLAC" if name.endswith(".flac") else "WAV")
        out.append(folder / name)
    return out


def make_corpus(root: Path, n_clips: int, seed: int = 0) -> dict:
    """The generated corpus (see the module docstring); returns its counts."""
    rng = np.random.default_rng(seed)
    audio = root / "audio"
    audio.mkdir(parents=True)
    sources = _sources(root)
    rows = {"train": [], "eval": []}
    missing = 0
    for i in range(n_clips):
        segment = f"{'-' if i % 7 == 0 else ''}vid{i:07d}_x_{(i % 30) * 1000}"
        part = "eval" if i % 10 == 9 else "train"
        for _ in range(int(rng.integers(8, 13))):
            onset = round(float(rng.uniform(0, 9)), 3)
            mid = "/m/zzz_unknown" if rng.random() < 0.02 else MIDS[int(rng.integers(len(MIDS)))]
            rows[part].append(f"{segment}\t{onset}\t{round(min(10.0, onset + float(rng.uniform(0.2, 3))), 3)}\t{mid}")
        if rng.random() < 0.03:
            missing += 1
            continue
        src = sources[i % len(sources)]
        os.link(src, audio / f"{segment}{src.suffix}")
    header = "segment_id\tstart_time_seconds\tend_time_seconds\tlabel\n"
    for part, lines in rows.items():
        (root / f"audioset_{part}_strong.tsv").write_text(header + "\n".join(lines) + "\n", encoding="utf-8")
    return {"clips": n_clips, "rows": sum(len(v) for v in rows.values()), "missing": missing}


def _peak_mib(who: int) -> float:
    return resource.getrusage(who).ru_maxrss / 1024


def bench_import(params, n_clips: int = 10000) -> dict:
    import datasets
    import pyarrow.parquet as pq

    from pipeline.config.params import ComputeParams
    from pipeline.imports.audioset_strong import read
    from pipeline.imports.writer import write_import
    from pipeline.schema import ShardRow, from_table
    from pipeline.shards.layout import features
    from pipeline.text.clustering import ClusterIndex, load_inventory

    datasets.disable_progress_bars()
    os.environ.setdefault("TQDM_DISABLE", "1")
    index = ClusterIndex(load_inventory(params.clusters.inventory), params.clusters.model, params.clusters.batch_size)
    figures: dict = {}
    with tempfile.TemporaryDirectory(prefix="sedsynth-bench-import-") as tmp:
        tmp = Path(tmp)
        corpus = make_corpus(tmp / "big", n_clips)
        small = make_corpus(tmp / "small", max(1, n_clips // 5))
        figures.update(corpus=corpus, small_clips=small["clips"])
        t0 = time.perf_counter()
        clips, skips = read(tmp / "big", {})
        figures["read_s"] = time.perf_counter() - t0

        def timed(root: Path, out: str, workers: int, keep_flac: bool = True) -> float:
            p = replace(params, compute=ComputeParams(workers=workers, chunk_size=32), imports=replace(params.imports, keep_flac=keep_flac))
            t = time.perf_counter()
            c, s = read(root, {})
            write_import(c, s, root, tmp / out, p, "audioset-strong", index=index)
            return time.perf_counter() - t

        figures["small_keep_s"] = timed(tmp / "small", "small_keep", 1)
        figures["small_reencode_s"] = timed(tmp / "small", "small_reencode", 1, keep_flac=False)
        figures["rss_small_mib"] = _peak_mib(resource.RUSAGE_SELF)
        figures["one_worker_s"] = timed(tmp / "big", "one", 1)
        figures["rss_full_mib"] = _peak_mib(resource.RUSAGE_SELF)
        figures["two_workers_s"] = timed(tmp / "big", "two", 2)
        figures["rss_workers_mib"] = _peak_mib(resource.RUSAGE_CHILDREN)
        figures["kept"] = len(clips) - sum(1 for s in skips if s.reason == "missing-file")
        out = tmp / "one"
        records = []
        for f in sorted((out / "data").glob("*.parquet")):
            records += from_table(pq.read_table(f), ShardRow)
            if len(records) >= PEER_ROWS:
                break
        records = records[:PEER_ROWS]
        figures["rows_written"] = sum(pq.ParquetFile(f).metadata.num_rows for f in (out / "data").glob("*.parquet"))
        feats = features(params.sample_rate_hz)
        raw = feats.copy()
        raw["audio"] = datasets.Features({"bytes": datasets.Value("binary"), "path": datasets.Value("string")})
        columns = {f.name: [getattr(r, f.name) for r in records] for f in dataclasses.fields(ShardRow)}
        columns["audio"] = [{"bytes": r.audio.bytes, "path": r.audio.path} for r in records]
        columns["phrases"] = [[dataclasses.asdict(p) for p in r.phrases] for r in records]
        t0 = time.perf_counter()
        # Audio.encode_example needs torchcodec even for ready bytes: structs in, then a storage cast to Audio
        ds = datasets.Dataset.from_dict(columns, features=raw)
        ds.cast_column("audio", feats["audio"]).to_parquet(str(tmp / "peer.parquet"))
        figures["peer_s"], figures["peer_rows"] = time.perf_counter() - t0, len(records)
    return figures


def print_figures(f: dict) -> None:
    c = f["corpus"]
    kept = f["rows_written"]
    print(f"bench import: AudioSet-Strong-style corpus, {c['clips']} clips, {c['rows']} TSV rows, {c['missing']} clips without audio; "
          f"{kept} rows written")
    print(f"  reader (TSVs -> clips, audio listed)   {f['read_s']:7.2f} s  {c['rows'] / f['read_s']:9.0f} TSV rows/s")
    one, two = c["clips"] / f["one_worker_s"], c["clips"] / f["two_workers_s"]
    print(f"  import, 1 worker                        {f['one_worker_s']:7.2f} s  {one:9.0f} clips/s per core")
    print(f"  import, 2 workers                       {f['two_workers_s']:7.2f} s  {two / 2:9.0f} clips/s per core ({two:.0f} clips/s)"
          "   (target >= 200 per core)")
    n = f["small_clips"]
    print(f"  {n} clips, plain FLAC kept / re-encoded {f['small_keep_s']:7.2f} s / {f['small_reencode_s']:.2f} s "
          f"({f['small_reencode_s'] / f['small_keep_s']:.2f}x)")
    print(f"  peak RSS, main process: {f['rss_small_mib']:.0f} MiB after {n} clips, {f['rss_full_mib']:.0f} MiB after {c['clips']}; "
          f"workers {f['rss_workers_mib']:.0f} MiB")
    peer = f["peer_rows"] / f["peer_s"]
    ours = kept / f["one_worker_s"]
    print(f"  peer: datasets from_dict + cast Audio + to_parquet of {f['peer_rows']} written rows  {f['peer_s']:7.2f} s  {peer:9.0f} rows/s")
    print(f"  import (1 worker, decoding and encoding included) / peer (rows ready) throughput  {ours / peer:6.2f}")
