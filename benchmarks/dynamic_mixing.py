"""Mixing while training against reading stored shards: items per second for one loader worker.

Input: the params (``mix``/``clip``/``ambience`` folders the mixing source draws from, the first
``train.data.sources`` entry's shards, ``train.data.clusters``), and ``rows``, the items each pass
makes. Output (a dict, printed by :func:`print_figures`), all in this process, one core:

- ``shards, cold`` / ``warm``: ``rows`` stored rows of the first shards source's ``train`` split
  read and made into items (FLAC decoded, cropped, frame labels, negatives), the peer; cold
  includes reading their row groups (a whole row group is read for its first row), warm reads
  them again with the last row group cached (``rows`` within one row group: a long run's rate);
- ``mixing, cold``: ``rows`` rows of a ``kind: mixing`` source (epoch 0: drawn, rendered,
  relabeled, captioned), made into the same items, its bank built first in a fresh folder (every
  source of the split decoded: the first rows on a machine that has no bank for them yet);
- ``mixing, warm``: the next epoch's ``rows`` rows from that bank (a long run's rate), the best of
  ``repeat`` passes over the following epochs, each followed by a Scaper pass (below);
- ``mixing + reverb`` / ``mixing + pitch/stretch``: the same, warm, with every event in a
  simulated room (``mix.spec.reverb.probability: 1``) and with every event pitch-shifted and
  stretched by Rubber Band (``pitch_shift_semitones``, ``time_stretch_factor``; a quarter of
  ``rows``, as it is slow);
- bytes stored: the shards' Parquet bytes for those rows against 0 for the mixing source;
- the Scaper peer, interleaved with the warm passes: Scaper 1.6.5 in its own environment (``scaper_python``,
  default ``.venv-scaper/bin/python`` if present; without one the peer is skipped with one line) makes ``rows``
  soundscapes from the folders the mixing source reads (all their clips and backgrounds, not only the
  train split's) with the same spec, one process, one core (:func:`benchmarks.mix_stage.run_scaper`), the
  best of ``repeat`` passes. It writes a WAV + JAMS + txt per mixture, the mixing source nothing; the
  ratios divide the mixing source's items/s (one item per mixture) by Scaper's mixtures/s.

This machine's speed can drift by a third within minutes, so each round times the two side by side
and the best of each is kept, as ``bench mix`` does; every pass's figure is printed. Scaper's files
are flushed to disk after its pass, so their writeback does not run during the next timed pass.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from pathlib import Path

from benchmarks.mix_stage import NO_SCAPER, find_scaper_python, run_scaper

TARGET_SCAPER_RATIO = 20  # mixing warm items/s over Scaper's mixtures/s, both one core

AUGMENTED = {
    "reverb": {"reverb": {"probability": 1.0}},
    "pitch/stretch": {"pitch_shift_semitones": ["uniform", -2.0, 2.0], "time_stretch_factor": ["uniform", 0.8, 1.25]},
}


def _items_per_s(make_rows, builder, epoch: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    rows = make_rows()
    for row in rows:
        builder(row, 0, epoch)
    return len(rows) / max(time.perf_counter() - t0, 1e-9), len(rows)


def bench_dynamic_mixing(params, rows: int = 200, scaper_python: str | None = None, repeat: int = 3) -> dict:
    """Items/s of one worker for a mixing source and for the same number of stored shard rows, and Scaper's
    mixtures/s for as many mixtures from the same folders, ``repeat`` rounds of the warm pass and Scaper
    interleaved; returns the figures (:func:`print_figures`)."""
    from trainer.config import SourceParams
    from trainer.data.negatives import ClusterTables, NegativeSampler, default_clusters_folder
    from trainer.data.sources import ParquetSource, Piece
    from trainer.data.stream import ItemBuilder, ItemParams
    from trainer.encoders import build_encoder

    d = params.train.data
    shards = next((s for s in d.sources if s.kind == "shards"), SourceParams())
    clusters = d.clusters or default_clusters_folder(shards.path)
    encoder = build_encoder(params.train.model.encoder)  # no weights needed: its rate, input length and frame times
    builder = ItemBuilder(
        ItemParams(encoder.sample_rate_hz, encoder.input_samples(d.crop_s), d.num_phrases),
        encoder.frame_spans_s(),
        NegativeSampler(ClusterTables.read(clusters), d.negative_sampling),
        params.seed,
    )

    stored = ParquetSource(0, SourceParams(path=shards.path, split="train"))
    groups = stored.row_groups()

    def shard_rows() -> list[dict]:
        out: list[dict] = []
        for file, group, n in groups:
            out += stored.read(Piece(0, file, group, 0, min(n, rows - len(out))))
            if len(out) == rows:
                break
        return out

    shard_cold, n_shard = _items_per_s(shard_rows, builder, 0)
    shard_warm, _ = _items_per_s(shard_rows, builder, 1)
    stored_bytes = sum(len(r["audio"]["bytes"]) for r in shard_rows())
    python = find_scaper_python(scaper_python)

    with tempfile.TemporaryDirectory(prefix="sedsynth-bench-banks-") as banks:
        figures = _mixing_figures(params, rows, builder, clusters, banks, python, max(1, repeat))
    figures.update(
        {
            "rows": rows,
            "encoder": params.train.model.encoder,
            "sample_rate_hz": encoder.sample_rate_hz,
            "shard_rows": n_shard,
            "shards_cold_items_per_s": shard_cold,
            "shards_warm_items_per_s": shard_warm,
            "shard_audio_bytes": stored_bytes,
            "ratio_warm_mixing_to_shards": figures["mixing_warm_items_per_s"] / shard_warm,
        }
    )
    if "scaper" in figures:
        peer = figures["scaper"]["mixtures_per_s"]
        figures.update(
            ratio_warm_mixing_to_scaper=figures["mixing_warm_items_per_s"] / peer,
            ratio_cold_mixing_to_scaper=figures["mixing_cold_items_per_s"] / peer,
        )
    return figures


def _mixing_figures(params, rows: int, builder, clusters: str, banks: str, scaper: str | None, repeat: int) -> dict:
    """The mixing source's passes (cold; ``repeat`` warm ones, each followed by a Scaper pass when ``scaper``
    names its python; augmented), its banks in the folder ``banks``."""
    from trainer.config import SourceParams
    from trainer.data.mixing import MixingSource
    from trainer.data.sources import Piece

    t0 = time.perf_counter()
    mixing = MixingSource(0, SourceParams(kind="mixing", split="train", epoch_size=rows), params, clusters, banks)
    open_s = time.perf_counter() - t0

    def mixed_rows() -> list[dict]:
        return mixing.read(Piece(0, mixing.name, 0, 0, rows))

    mixing_cold, n_mixed = _items_per_s(mixed_rows, builder, 0)
    warm, peers = [], []
    for epoch in range(1, repeat + 1):  # each warm pass makes the next epoch's rows: new mixtures from the built bank
        mixing.set_epoch(epoch)
        warm.append(_items_per_s(mixed_rows, builder, epoch)[0])
        if scaper:
            with tempfile.TemporaryDirectory(prefix="sedsynth-bench-mixing-") as tmp:
                peers.append(run_scaper(scaper, mixing.events_dir, mixing.backgrounds_dir, params, rows, Path(tmp)))
            os.sync()  # Scaper's files reach the disk now, not in the background of the next timed pass
    augmented = {}
    for name, knobs in AUGMENTED.items():
        n = rows if name == "reverb" else max(1, rows // 4)
        mix = dataclasses.replace(params.mix, spec={**params.mix.spec, **knobs})
        source = MixingSource(
            0, SourceParams(kind="mixing", split="train", epoch_size=n), dataclasses.replace(params, mix=mix), clusters, banks
        )
        _items_per_s(lambda: source.read(Piece(0, source.name, 0, 0, n)), builder, 0)  # rooms simulated
        source.set_epoch(1)
        augmented[name], _ = _items_per_s(lambda: source.read(Piece(0, source.name, 0, 0, n)), builder, 1)
    figures = {
        "mixed_rows": n_mixed,
        "mixing_cold_items_per_s": mixing_cold,
        "mixing_warm_items_per_s": max(warm),
        "mixing_warm_passes": warm,
        "mixing_open_s": open_s,
        "mixing_bytes": 0,
        "augmented_warm_items_per_s": augmented,
    }
    if peers:
        figures["scaper"] = max(peers, key=lambda p: p["mixtures_per_s"])
        figures["scaper_passes"] = [p["mixtures_per_s"] for p in peers]
    return figures


def print_figures(f: dict) -> None:
    print(
        f"bench mixing: {f['rows']} items per pass, one loader worker (this process), encoder {f['encoder']} "
        f"at {f['sample_rate_hz']} Hz; warm and Scaper: best of {len(f['mixing_warm_passes'])} interleaved rounds"
    )
    print(f"  shards, cold (row groups read)         {f['shards_cold_items_per_s']:8.1f} items/s   <- peer")
    print(
        f"  shards, warm (row group cached)        {f['shards_warm_items_per_s']:8.1f} items/s   <- peer; "
        f"{f['shard_audio_bytes'] / 2**20:.1f} MiB of FLAC stored"
    )
    print(
        f"  mixing, cold (bank built first)        {f['mixing_cold_items_per_s']:8.1f} items/s   "
        f"(opening the source: {f['mixing_open_s']:.2f} s)"
    )
    print(
        f"  mixing, warm (next epoch, from bank)   {f['mixing_warm_items_per_s']:8.1f} items/s   0 bytes stored  "
        f"(passes: {', '.join(f'{v:.1f}' for v in f['mixing_warm_passes'])})"
    )
    for name, v in f["augmented_warm_items_per_s"].items():
        print(f"  mixing + {name:<30}{v:8.1f} items/s   (warm)")
    print(f"  mixing warm / shards warm              {f['ratio_warm_mixing_to_shards']:8.2f}")
    if "scaper" not in f:
        print(f"  {NO_SCAPER}")
        return
    s = f["scaper"]
    print(
        f"  Scaper 1.6.5 (1 process, 1 core)       {s['mixtures_per_s']:8.1f} mixtures/s   <- peer; {s['mixtures']} mixtures "
        f"in {s['seconds']:.1f} s, each written as WAV + JAMS + txt (the mixing source writes nothing)  "
        f"(passes: {', '.join(f'{v:.1f}' for v in f['scaper_passes'])})"
    )
    rounds = [w / p for w, p in zip(f["mixing_warm_passes"], f["scaper_passes"])]
    print(
        f"  mixing warm / Scaper (per core)        {f['ratio_warm_mixing_to_scaper']:8.1f}x  (target >= {TARGET_SCAPER_RATIO}x; "
        f"round by round: {', '.join(f'{r:.1f}x' for r in rounds)})"
    )
    print(f"  mixing cold / Scaper (per core)        {f['ratio_cold_mixing_to_scaper']:8.1f}x")
