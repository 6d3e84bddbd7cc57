"""Benchmarks that print figures next to a peer measured in the same run.

``sedsynth bench clip``: clipping throughput against plain decoding of the same files, both
on one core in this process, in seconds of source audio per second. The peer is
``soundfile.read(path, dtype="float32")`` of every single-label candidate file, which is
the least any clipping tool has to do; the clipping pass does the whole per-file work of
the stage (decode, downmix, segment, resample, measure, encode and write FLAC). Files are
read once before timing so both passes see a warm page cache; each pass runs ``--repeat``
times, alternating, and the best time of each is reported.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import soundfile as sf

from pipeline.params import Params


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_clip(params: Params, corpus: Path | None, n_clips: int, repeat: int) -> dict:
    from pipeline.clip import EventClip, clip_one, plan
    from pipeline.corpus import write_fsd50k_corpus

    with tempfile.TemporaryDirectory(prefix="sedsynth-bench-") as tmp:
        tmp_path = Path(tmp)
        if corpus is None:
            corpus = tmp_path / "fsd50k"
            t0 = time.perf_counter()
            write_fsd50k_corpus(corpus, n_clips=n_clips, seed=params.corpus.seed)
            print(f"generated {n_clips} FSD50K-layout clips in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        tasks, _ = plan(params, corpus)
        paths = [t.clip.audio_path for t in tasks if t.clip.audio_path.exists()]
        source_s = sum(sf.info(str(p)).duration for p in paths)
        for p in paths:  # warm the page cache for both passes
            p.read_bytes()
        audio_dir = tmp_path / "audio"

        def decode() -> None:
            for p in paths:
                sf.read(str(p), dtype="float32")

        results: list = []

        def clipping() -> None:
            results.clear()
            results.extend(clip_one(t, params.clip, params.sample_rate_hz, audio_dir) for t in tasks)

        decode_s = clip_s = float("inf")
        for _ in range(repeat):
            decode_s = min(decode_s, _best(decode, 1))
            clip_s = min(clip_s, _best(clipping, 1))
        kept = sum(isinstance(r, EventClip) for r in results)
        figures = {
            "files": len(paths),
            "source_hours": source_s / 3600,
            "kept_clips": kept,
            "decode_source_s_per_s": source_s / decode_s,
            "clip_source_s_per_s": source_s / clip_s,
            "clip_files_per_s": len(paths) / clip_s,
            "ratio_clip_to_decode": decode_s / clip_s,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
    return figures


def main(args: argparse.Namespace) -> int:
    from pipeline.cli import _params

    params = _params(args)
    if args.what == "clip":
        f = bench_clip(params, Path(args.corpus) if args.corpus else None, args.clips, args.repeat)
        print(f"bench clip: {f['files']} single-label files, {f['source_hours'] * 60:.1f} min of source audio, one core")
        print(f"  plain decode (soundfile.read, float32): {f['decode_source_s_per_s']:10.0f} s of audio per s")
        print(f"  clipping stage, per file             : {f['clip_source_s_per_s']:10.0f} s of audio per s ({f['clip_files_per_s']:.0f} files/s, {f['kept_clips']} kept)")
        print(f"  clipping / decode                    : {f['ratio_clip_to_decode']:10.2f}  (target >= 0.70)")
        print(f"  peak RSS                             : {f['peak_rss_mib']:10.0f} MiB")
    return 0


if __name__ == "__main__":
    from pipeline.cli import main as cli_main

    raise SystemExit(cli_main(["bench", *sys.argv[1:]]))
