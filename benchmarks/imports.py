"""``sedsynth bench import``: importing an AudioSet-Strong-style corpus, per core, per format, with a peer.

Input: nothing; corpora are generated in a temporary folder: ``audioset_train_strong.tsv`` and
``audioset_eval_strong.tsv`` in the released layout, about 10 regions per clip (so ``--clips``
10,000 gives about 100,000 rows), 2% of rows with a MID no class list knows and 3% of clips
without audio. The audio is distinct 10 s files hard-linked under every segment's name, so the
disk holds a few files whatever the clip count. The MIX is the four formats in equal shares,
clip i taking format i mod 4: 16 kHz mono FLAC (kept as it is), 16 kHz mono WAV, 16 kHz stereo
WAV and 44.1 kHz stereo WAV (resampled). Identical audio in every row lets Parquet's dictionary
encoding shrink the shards far below a real corpus's; it does not change the audio work.

Figures (the SentenceBERT index is built once beforehand, as a long run amortises it; assigning
the corpus's phrases, the shards and the card are timed):

- the reader alone (TSVs -> clips, audio listed, not read);
- the whole import of the mix with 1 and 2 workers: clips/s per core (clips / wall seconds /
  workers) and clips per CPU second of every process (the honest figure on a busy machine);
- per format (a fifth of the clips each, 1 worker): the audio work alone (decode, checks,
  resample, FLAC, hash: :func:`~pipeline.imports.writer.prepare_audio`) and the whole import
  (fixed costs, about 5-8 s of phrase clustering and card, included), each against the target;
  16 kHz mono FLAC also with ``imports.keep_flac`` off (re-encoded);
- peak resident memory of this process during the import of a fifth of the clips and of all
  of them (sampled: the main process holds clip metadata and one row group, so the two stay
  close), and of the largest worker process;
- the peer: the same rows (read back from the shards, up to 2,000) written by
  ``datasets.Dataset.from_dict(...).cast_column("audio", Audio())`` then ``to_parquet``, in rows/s,
  and our whole import's rows/s over it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import resource
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import soundfile as sf

PEER_ROWS = 2000
TARGET_CLIPS_PER_S_PER_CORE = 200
FORMATS = {  # name -> (source file, sample rate in Hz, channels)
    "16 kHz mono FLAC": ("a.flac", 16000, 1),
    "16 kHz mono WAV": ("b.wav", 16000, 1),
    "16 kHz stereo WAV": ("c.wav", 16000, 2),
    "44.1 kHz stereo WAV": ("d.wav", 44100, 2),
}
PER_FORMAT = ("16 kHz mono FLAC", "16 kHz mono WAV", "44.1 kHz stereo WAV")
MIDS = (
    "/m/09x0r",
    "/m/05tny_",
    "/m/07yv9",
    "/m/0jbk",
    "/m/04rlf",
    "/m/0k4j",
    "/m/01g50p",
    "/m/06mb1",
    "/m/0838f",
    "/m/07pbtc8",
    "/m/03m9d0z",
    "/m/02zsn",
    "/m/01j3sz",
    "/m/015lz1",
    "/m/07qfr4h",
)


def _sources(folder: Path, formats: tuple[str, ...]) -> list[Path]:
    """One distinct 10 s source file per format: a tone chord over noise, in the formats AudioSet downloads come in."""
    rng = np.random.default_rng(0)
    out = []
    for name, rate, channels in (FORMATS[f] for f in formats):
        t = np.arange(10 * rate) / rate
        x = 0.1 * np.sin(2 * np.pi * 440 * t) + 0.05 * np.sin(2 * np.pi * 1234 * t) + 0.02 * rng.standard_normal(len(t))
        samples = np.stack([x, 0.8 * x], axis=1) if channels == 2 else x
        sf.write(
            str(folder / name),
            samples.astype(np.float32),
            rate,
            subtype="PCM_16",
            format="FLAC" if name.endswith(".flac") else "WAV",
        )
        out.append(folder / name)
    return out


def make_corpus(root: Path, n_clips: int, seed: int = 0, formats: tuple[str, ...] = tuple(FORMATS)) -> dict:
    """The generated corpus (see the module docstring), clip i in ``formats[i % len(formats)]``; returns its counts."""
    rng = np.random.default_rng(seed)
    audio = root / "audio"
    audio.mkdir(parents=True)
    sources = _sources(root, formats)
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


def _rss_mib() -> float:
    """This process's resident memory now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _cpu_s() -> float:
    """User + system seconds of this process and of its finished children (the dask workers)."""
    return sum(
        getattr(resource.getrusage(who), f)
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        for f in ("ru_utime", "ru_stime")
    )


class _PeakRss:
    """The highest resident memory of this process, and of its largest child (a dask worker), while the block runs."""

    def __enter__(self):
        import psutil

        self._me = psutil.Process()
        self.start_mib = _rss_mib()
        self.peak_mib, self.worker_peak_mib, self._stop = self.start_mib, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        import psutil

        while not self._stop.wait(0.02):
            self.peak_mib = max(self.peak_mib, _rss_mib())
            for child in self._me.children(recursive=True):
                try:
                    self.worker_peak_mib = max(self.worker_peak_mib, child.memory_info().rss / 2**20)
                except psutil.Error:  # it ended between listing and reading
                    pass

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak_mib = max(self.peak_mib, _rss_mib())


def _import(params, root: Path, out: Path, workers: int, index, keep_flac: bool = True) -> dict:
    """One timed import of the corpus under ``root``: wall and CPU seconds, peak RSS, clips and the summary."""
    from pipeline.config.params import ComputeParams
    from pipeline.imports.audioset_strong import read
    from pipeline.imports.writer import write_import

    p = dataclasses.replace(
        params,
        compute=ComputeParams(workers=workers, chunk_size=32),
        imports=dataclasses.replace(params.imports, keep_flac=keep_flac),
    )
    cpu, t = _cpu_s(), time.perf_counter()
    with _PeakRss() as rss:
        clips, skips = read(root, {})
        summary = write_import(clips, skips, root, out, p, "audioset-strong", index=index)
    wall = time.perf_counter() - t
    listed = summary["inputs"]
    return {
        "wall_s": wall,
        "cpu_s": _cpu_s() - cpu,
        "peak_rss_mib": rss.peak_mib,
        "rss_rise_mib": rss.peak_mib - rss.start_mib,
        "worker_peak_rss_mib": rss.worker_peak_mib,
        "clips": listed,
        "workers": workers,
        "rows": summary["outputs"],
        "summary": summary,
        "per_core": listed / wall / workers,
        "per_cpu_s": listed / (_cpu_s() - cpu),
    }


def _audio_only(params, root: Path, scratch: Path) -> dict:
    """The per-clip audio work alone (:func:`~pipeline.imports.writer.prepare_audio`), in this process."""
    from pipeline.imports.audioset_strong import read
    from pipeline.imports.writer import prepare_audio

    clips, _ = read(root, {})
    scratch.mkdir(parents=True)
    work = functools.partial(
        prepare_audio,
        root=root,
        scratch=scratch,
        sample_rate_hz=params.sample_rate_hz,
        silence_dbfs=params.imports.silence_dbfs,
        keep_flac=params.imports.keep_flac,
    )
    t = time.perf_counter()
    for task in enumerate(clips):
        work(task)
    wall = time.perf_counter() - t
    return {"wall_s": wall, "clips": len(clips), "per_core": len(clips) / wall}


def bench_import(params, n_clips: int = 10000, index=None, workers: tuple[int, ...] = (1, 2)) -> dict:
    """Every figure of the module docstring for a mix of ``n_clips`` clips; ``index``: a prepared cluster index (default: SentenceBERT)."""
    import datasets
    import pyarrow.parquet as pq

    from pipeline.schema import ShardRow, from_table
    from pipeline.shards.layout import features

    datasets.disable_progress_bars()
    os.environ.setdefault("TQDM_DISABLE", "1")
    if index is None:
        from pipeline.text.clustering import ClusterIndex, load_inventory

        index = ClusterIndex(load_inventory(params.clusters.inventory), params.clusters.model, params.clusters.batch_size)
    small_n = max(1, n_clips // 5)
    figures: dict = {"target": TARGET_CLIPS_PER_S_PER_CORE, "mix": list(FORMATS), "per_format": {}}
    with tempfile.TemporaryDirectory(prefix="sedsynth-bench-import-") as tmp:
        tmp = Path(tmp)
        corpus = make_corpus(tmp / "big", n_clips)
        small = make_corpus(tmp / "small", small_n)
        figures.update(corpus=corpus, small=small)
        t0 = time.perf_counter()
        from pipeline.imports.audioset_strong import read

        clips, skips = read(tmp / "big", {})
        figures["read_s"] = time.perf_counter() - t0
        figures["small_run"] = _import(params, tmp / "small", tmp / "small_out", 1, index)
        figures["runs"] = {w: _import(params, tmp / "big", tmp / f"out{w}", w, index) for w in workers}
        for name in PER_FORMAT:
            root = tmp / f"format{PER_FORMAT.index(name)}"
            make_corpus(root, small_n, formats=(name,))
            figures["per_format"][name] = {
                "audio": _audio_only(params, root, tmp / f"scratch{PER_FORMAT.index(name)}"),
                "import": _import(params, root, root / "out", 1, index),
            }
        flac = tmp / f"format{PER_FORMAT.index('16 kHz mono FLAC')}"
        figures["flac_reencoded"] = _import(params, flac, flac / "out_reencoded", 1, index, keep_flac=False)
        out = tmp / f"out{workers[0]}"
        records = []
        for f in sorted((out / "data").glob("*.parquet")):
            records += from_table(pq.read_table(f), ShardRow)
            if len(records) >= PEER_ROWS:
                break
        records = records[:PEER_ROWS]
        figures["rows_written"] = sum(pq.ParquetFile(f).metadata.num_rows for f in (out / "data").glob("*.parquet"))
        figures["kept"] = len(clips)  # every listed clip with audio is usable here
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


def _verdict(rate: float) -> str:
    return "meets" if rate >= TARGET_CLIPS_PER_S_PER_CORE else "below"


def print_figures(f: dict) -> None:
    c = f["corpus"]
    target = f["target"]
    print(
        f"bench import: AudioSet-Strong-style corpus, {c['clips']} clips, {c['rows']} TSV rows, {c['missing']} clips without audio; "
        f"{f['rows_written']} rows written; mix: {', '.join(f['mix'])} in equal shares; target >= {target} clips/s per core"
    )
    print(f"  reader (TSVs -> clips, audio listed)   {f['read_s']:7.2f} s  {c['rows'] / f['read_s']:9.0f} TSV rows/s")
    for w, r in f["runs"].items():
        print(
            f"  import mix, {w} worker{'s' if w > 1 else ' '}                    {r['wall_s']:7.2f} s  {r['per_core']:9.0f} clips/s per core "
            f"({r['clips'] / r['wall_s']:.0f} clips/s; {r['per_cpu_s']:.0f} clips per CPU second)  {_verdict(r['per_core'])} the target"
        )
    n = f["small"]["clips"]
    print(f"  per format, {n} clips, 1 worker: audio work alone / whole import (clustering and card included), clips/s per core")
    for name, r in f["per_format"].items():
        a, i = r["audio"]["per_core"], r["import"]["per_core"]
        print(f"    {name:22s} {a:7.0f} / {i:5.0f}   audio {_verdict(a)}, import {_verdict(i)} the target")
    re = f["flac_reencoded"]
    kept = f["per_format"]["16 kHz mono FLAC"]["import"]
    print(
        f"    16 kHz mono FLAC, keep_flac off (re-encoded): import {re['per_core']:5.0f} clips/s per core "
        f"({re['wall_s'] / kept['wall_s']:.2f}x the time of keeping the bytes)"
    )
    print(
        f"  peak RSS, main process during the import: {f['small_run']['peak_rss_mib']:.0f} MiB at {n} clips, "
        f"{f['runs'][min(f['runs'])]['peak_rss_mib']:.0f} MiB at {c['clips']} (1 worker, the SentenceBERT model and libraries included); "
        f"largest worker {max(r['worker_peak_rss_mib'] for r in f['runs'].values()):.0f} MiB"
    )
    peer = f["peer_rows"] / f["peer_s"]
    one = f["runs"][min(f["runs"])]
    ours = one["rows"] / one["wall_s"]
    print(
        f"  peer: datasets from_dict + cast Audio + to_parquet of {f['peer_rows']} written rows  {f['peer_s']:7.2f} s  {peer:9.0f} rows/s"
    )
    print(f"  import (1 worker, decoding and encoding included) / peer (rows ready) throughput  {ours / peer:6.2f}")
