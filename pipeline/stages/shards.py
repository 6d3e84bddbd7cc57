"""The shards stage: mixtures, captions and clusters -> a Hugging Face dataset folder.

Input: the mix stage's folder (recipes, FLAC audio, licences), the captions stage's folder
(captions and label phrases) and the clusters stage's folder (phrase database). Output, in
``shards.out_dir`` (layout in :mod:`pipeline.shards.layout`): Parquet shards of
:class:`~pipeline.schema.ShardRow`, one row per mixture in (split, index) order with the
sha256 of its FLAC bytes (which ``validate`` checks), in the schema ``datasets`` itself writes;
a new shard when the audio in one reaches ``shards.shard_size_mb`` and a new row group at
``shards.row_group_size_mb``, every column compressed with ``shards.compression`` but the
FLAC bytes (stored as they are: they do not compress); ``index.json``; the dataset card; the phrase database and
cluster relations under ``clusters/``; licences, attribution and pictures.

Every label phrase of a row carries its cluster id, taken from the phrase database by
(phrase, label, MID); its segments are the label's relabeled segments. The folder is built
under a staging name and swapped in whole.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import sys
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq

from pipeline.mix.layout import ATTRIBUTION, LICENSES, MIXTURES
from pipeline.config.params import folders_besides
from pipeline.outputs import check_out_dir, staged_dir
from pipeline.schema import (
    SPLITS,
    AudioFile,
    Caption,
    LabelPhrase,
    MixtureRecipe,
    PhraseAssignment,
    ShardPhrase,
    ShardRow,
    from_table,
)
from pipeline.shards import card
from pipeline.shards.writer import MB, plan_chunks, write_shards

__all__ = ["ShardError", "build_rows", "plan_chunks", "run", "shard_phrase"]


class ShardError(ValueError):
    """A shards problem the user must fix; the message says how."""


def _need(path: Path, stage: str) -> Path:
    if not path.exists():
        raise ShardError(f"{path} not found: run `sedsynth {stage}` (or `dvc repro {stage}`) first")
    return path


_KEPT_PHRASE_FIELDS = tuple(f.name for f in dataclasses.fields(ShardPhrase) if f.name != "cluster_id")


def shard_phrase(ph: LabelPhrase, cluster_id: int) -> ShardPhrase:
    """A caption phrase with its cluster: every field of the :class:`LabelPhrase` a shard row keeps, by name."""
    return ShardPhrase(**{name: getattr(ph, name) for name in _KEPT_PHRASE_FIELDS}, cluster_id=cluster_id)


def build_rows(mix_dir: Path, seed: int, captions: dict[str, Caption], phrases: dict[str, list[LabelPhrase]],
               cluster_of: dict[tuple[str, str, str], int]):
    """Row builder: recipe -> :class:`ShardRow` (reads the mixture's FLAC bytes)."""

    def row(r: MixtureRecipe) -> ShardRow:
        if r.mixture_id not in captions:
            raise ShardError(f"mixture {r.mixture_id} has no caption: the captions stage is older than the mix stage; re-run `dvc repro`")
        shard_phrases = []
        for ph in phrases.get(r.mixture_id, []):
            key = (ph.phrase, ph.label, ph.mid)
            if key not in cluster_of:
                raise ShardError(f"phrase {ph.phrase!r} ({ph.label}) has no cluster: re-run `sedsynth clusters` after `sedsynth captions`")
            shard_phrases.append(shard_phrase(ph, cluster_of[key]))
        audio = AudioFile(bytes=(mix_dir / r.audio_path).read_bytes(), path=Path(r.audio_path).name)
        return ShardRow(
            id=r.mixture_id, audio=audio, audio_sha256=hashlib.sha256(audio.bytes).hexdigest(), sample_rate_hz=r.sample_rate_hz,
            duration_s=r.duration_s, caption=captions[r.mixture_id].caption, phrases=tuple(shard_phrases),
            background_id=r.background_id, split=r.split, license=r.license, licenses=r.licenses, attribution=r.attribution, seed=seed,
        )

    return row


def run(params, mix_dir: Path | None = None, captions_dir: Path | None = None, clusters_dir: Path | None = None,
        out_dir: Path | None = None) -> dict:
    """Write the dataset folder; returns the index (also written to ``index.json``)."""
    p = params.shards
    mix_dir = Path(mix_dir or params.mix.out_dir)
    captions_dir = Path(captions_dir or params.captions.out_dir)
    clusters_dir = Path(clusters_dir or params.clusters.out_dir)
    out_dir = Path(out_dir or p.out_dir)
    check_out_dir(out_dir, "shards.out_dir", {**folders_besides(params, "shards.out_dir"), "mix.out_dir": mix_dir,
                                              "captions.out_dir": captions_dir, "clusters.out_dir": clusters_dir})
    recipes = from_table(pq.read_table(_need(mix_dir / MIXTURES, "mix")), MixtureRecipe)
    captions = {c.mixture_id: c for c in from_table(pq.read_table(_need(captions_dir / "captions.parquet", "captions")), Caption)}
    phrases: dict[str, list[LabelPhrase]] = defaultdict(list)
    for ph in from_table(pq.read_table(_need(captions_dir / "phrases.parquet", "captions")), LabelPhrase):
        phrases[ph.mixture_id].append(ph)
    database = from_table(pq.read_table(_need(clusters_dir / "phrases.parquet", "clusters")), PhraseAssignment)
    cluster_of = {(a.phrase, a.label, a.mid): a.cluster_id for a in database}
    rates = {r.sample_rate_hz for r in recipes}
    if len(rates) != 1:
        raise ShardError(f"mixtures have sample rates {sorted(rates)}; one dataset needs one rate (the Audio feature has one)")
    rate = rates.pop()
    row_of = build_rows(mix_dir, params.seed, captions, phrases, cluster_of)

    by_split: dict[str, list[MixtureRecipe]] = defaultdict(list)
    for r in sorted(recipes, key=lambda r: (SPLITS.index(r.split), r.index)):
        by_split[r.split].append(r)
    with staged_dir(out_dir) as staging:
        index = write_shards(staging, rate, by_split, lambda r: (mix_dir / r.audio_path).stat().st_size, row_of=row_of,
                             shard_size_mb=p.shard_size_mb, row_group_size_mb=p.row_group_size_mb, compression=p.compression,
                             desc="shards")
        files = index["files"]
        (staging / "clusters").mkdir()
        for name in ("clusters.parquet", "phrases.parquet", "labels.csv"):
            shutil.copyfile(_need(clusters_dir / name, "clusters"), staging / "clusters" / name)
        for name in (LICENSES, ATTRIBUTION):
            shutil.copyfile(_need(mix_dir / name, "mix"), staging / name)
        card.write(staging, params, mix_dir, index)
    per_split = ", ".join(f"{s} {v['num_rows']}" for s, v in index["splits"].items())
    print(f"shards: {len(recipes)} rows in {len(files)} shards ({per_split}), "
          f"{sum(f['num_bytes'] for f in files) / MB:.1f} MB -> {out_dir}", file=sys.stderr)
    return index

