"""Imported clips -> the same shard folder the synthetic pipeline writes.

Input: a corpus reader's :class:`~pipeline.schema.ImportedClip` records and skips, the corpus
root their ``audio_path`` is relative to, the params (``sample_rate_hz``, ``imports``,
``captions``, ``clusters``, ``shards``, ``compute``) and the corpus kind. Output, in one folder
swapped in whole (layout of :mod:`pipeline.shards.layout`):

- ``data/<split>-*.parquet``: one :class:`~pipeline.schema.ShardRow` per usable clip, in
  (split, clip id) order; ``index.json``; ``README.md`` (the dataset card) and ``images/``;
- ``clusters/``: ``clusters.parquet``, ``phrases.parquet`` (every phrase with its cluster),
  ``labels.csv`` and ``low_similarity.csv`` (nearest-centroid assignments below
  ``clusters.min_similarity``, for a person to review);
- ``licenses.json``, ``attribution.csv``, ``skipped.csv`` (the reader's skips and the
  writer's, with reasons) and ``summary.json`` (rows per split, skips per reason,
  low-similarity phrases, the share of listed clips without audio).

Audio, per clip and in parallel (:func:`pipeline.compute.map_ordered`, the same bytes for any
worker count): decoded, refused with a skip when a symbolic link leads it out of the corpus
root (``outside-root``), missing, unreadable, empty, non-finite or
silent (RMS below ``imports.silence_dbfs``), downmixed to mono and resampled to
``sample_rate_hz`` (one dataset has one rate; a file below it is resampled up, which adds no
content above its own Nyquist, and ``summary.json`` counts clips per source rate), stored as
16-bit FLAC. A file that already is mono 16-bit FLAC at the rate keeps its own bytes
(``imports.keep_flac``): re-encoding would cost as much again as decoding and change nothing.
The workers also hash the stored bytes; the main process then only joins each row group's
columns (:func:`row_group_table`) and writes the shards (:func:`~pipeline.shards.writer.write_shards`).

Labels: regions are cut to the decoded duration; one with a negative time, onset >= offset or
entirely past the end is skipped as ``bad-region`` (item ``<clip_id>#<n>``, ``n`` its position
in the clip's regions) and the clip kept. A label-only corpus's phrase is its label's first
phrase (:func:`~pipeline.text.label_phrases.phrases_for` by MID, else the label lower-cased
with ``_`` as spaces); a strong-caption corpus's is each region's own text. Overlapping or
touching regions of one phrase merge into one segment. The caption is the clip's own first
caption, else a caption template (drawn by a generator seeded by (seed, clip id)) filled with
the phrases in temporal order, else ``captions.empty_caption``. Every phrase gets a cluster of
the inventory as the clusters stage assigns them (MID first, nearest centroid otherwise).
Imported rows have no background, no source clips and no SNR: those fields are empty.
"""

from __future__ import annotations

import csv
import ctypes
import functools
import hashlib
import io
import shutil
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import soundfile as sf

from pipeline.audio import AudioError, downmix, encode_flac, quantize_int16, read_audio, resample
from pipeline.compute import map_ordered
from pipeline.imports.dcase import OUTSIDE_ROOT, outside_root, region_problem
from pipeline.licenses import license_name, most_restrictive
from pipeline.loudness import rms_dbfs
from pipeline.outputs import refuse_empty, staged_dir, summarize, write_atomic, write_json, write_manifest, write_skips
from pipeline.schema import (
    SPLITS,
    Cluster,
    ImportedClip,
    PhraseAssignment,
    Skip,
    TimeSpan,
)
from pipeline.shards import card
from pipeline.shards.layout import shard_schema
from pipeline.shards.writer import MB, audio_column, write_shards
from pipeline.text.clustering import cluster_rows, phrase_database
from pipeline.text.label_phrases import default_label_phrases, phrases_for
from pipeline.text.templates import fill, load_templates

CAPTION_STREAM = 0xCA  # the captions stage's stream number: one template draw per caption
SCRATCH = ".audio"  # FLACs waiting for their shard, inside the staging folder
LICENSES = "licenses.json"
ATTRIBUTION = "attribution.csv"
SKIPPED = "skipped.csv"
SUMMARY = "summary.json"


@dataclass(frozen=True)
class PreparedAudio:
    """A clip's stored audio: ``scratch_name`` in the scratch folder, ``num_frames`` at the dataset rate."""

    clip_id: str
    scratch_name: str
    num_bytes: int
    sha256: str
    num_frames: int
    source_sample_rate_hz: int
    source_channels: int
    kept_source_bytes: bool


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
KEEP_FREED_BYTES = 1 << 30  # freed heap kept for reuse, at most
HEAP_ARRAYS_BELOW_BYTES = 1 << 26  # arrays below 64 MiB come from the reused heap, not fresh mappings


@functools.cache
def keep_freed_memory() -> bool:
    """Let glibc reuse freed memory for the next clip's arrays instead of returning it to the kernel; True where it took.

    By default every array above a few MiB (a 10 s 44.1 kHz stereo clip as float32 is 3.5 MB) is
    a fresh mapping or is trimmed off the heap when freed, so each clip faults all its pages in
    again: in a virtual machine that cost more than the decoding itself (about 4 ms of the 7 ms
    of reading and measuring a 44.1 kHz stereo clip). Memory stays bounded by the largest clip's arrays.
    Called once per process (the dask workers' and, with one worker, the main process).
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_TRIM_THRESHOLD, KEEP_FREED_BYTES)) and bool(
            libc.mallopt(M_MMAP_THRESHOLD, HEAP_ARRAYS_BELOW_BYTES)
        )
    except (OSError, AttributeError):  # not glibc: its allocator's own policy applies
        return False


def _is_plain_flac(path: Path, sample_rate_hz: int) -> bool:
    try:
        info = sf.info(str(path))
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError):
        return False
    return info.format == "FLAC" and info.subtype == "PCM_16" and info.channels == 1 and info.samplerate == sample_rate_hz


def prepare_audio(
    task: tuple[int, ImportedClip], root: Path, scratch: Path, sample_rate_hz: int, silence_dbfs: float, keep_flac: bool
) -> PreparedAudio | Skip:
    """One clip's audio -> a FLAC in ``scratch`` named by the clip's position, or the :class:`Skip` saying why not."""
    position, clip = task
    keep_freed_memory()
    path = Path(root) / clip.audio_path
    if problem := outside_root(root, clip.audio_path):
        return Skip(clip.clip_id, clip.audio_path, OUTSIDE_ROOT, problem)
    try:
        decoded = read_audio(path)
        samples = downmix(decoded.samples)
        level = rms_dbfs(samples)
        if level < silence_dbfs:
            raise AudioError("silent", f"RMS {level:.1f} dBFS is below imports.silence_dbfs {silence_dbfs} dBFS")
        name = f"{position:08d}.flac"
        if keep_flac and _is_plain_flac(path, sample_rate_hz):
            data, frames, kept = path.read_bytes(), len(samples), True
        else:
            q = quantize_int16(resample(samples, decoded.sample_rate_hz, sample_rate_hz))
            if len(q) == 0:
                raise AudioError("empty", f"shorter than one sample at {sample_rate_hz} Hz")
            data, frames, kept = encode_flac(q, sample_rate_hz), len(q), False
    except AudioError as e:
        return Skip(clip.clip_id, clip.audio_path, e.reason, e.detail)
    (scratch / name).write_bytes(data)
    return PreparedAudio(
        clip.clip_id, name, len(data), hashlib.sha256(data).hexdigest(), frames, decoded.sample_rate_hz, decoded.channels, kept
    )


def label_phrase(label: str, mid: str, by_mid: dict[str, list[str]]) -> str:
    """A label-only region's phrase: the label's first phrase by MID, else its own name lower-cased."""
    if mid in by_mid:
        return phrases_for(label, mid, by_mid)[0]
    return " ".join(label.replace("_", " ").split()).lower()


def merge_spans(spans: list[tuple[float, float]]) -> tuple[TimeSpan, ...]:
    """Overlapping or touching ``[start, end)`` spans -> disjoint ones, in time order."""
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return tuple(TimeSpan(a, b) for a, b in out)


def clip_phrases(
    clip: ImportedClip, duration_s: float, by_mid: dict[str, list[str]]
) -> tuple[list[tuple[str, str, str, tuple[TimeSpan, ...]]], list[Skip]]:
    """A clip's regions -> ``(phrase, label, mid, segments)`` in temporal order (then phrase), and the bad regions' skips."""
    spans: dict[tuple[str, str, str], list[tuple[float, float]]] = defaultdict(list)
    by_text: dict[str, tuple[str, str, str]] = {}  # a strong-caption phrase is named by its first region's label
    skips = []
    for n, r in enumerate(clip.regions):
        problem = region_problem(r.onset_s, r.offset_s)
        if problem is None and r.onset_s >= duration_s:
            problem = f"starts at or after the end of the decoded audio ({duration_s:g} s)"
        if problem:
            skips.append(
                Skip(
                    f"{clip.clip_id}#{n}",
                    clip.audio_path,
                    "bad-region",
                    f"region {n} [{r.onset_s:g}, {r.offset_s:g}) s of {r.label or r.text!r}: {problem}",
                )
            )
            continue
        text = " ".join(r.text.split())
        key = by_text.setdefault(text, (text, r.label, r.mid)) if text else (label_phrase(r.label, r.mid, by_mid), r.label, r.mid)
        spans[key].append((r.onset_s, min(r.offset_s, duration_s)))
    phrases = [(k[0], k[1], k[2], merge_spans(v)) for k, v in spans.items()]
    phrases.sort(key=lambda p: (p[3][0].start_s, p[0], p[1]))
    return phrases, skips


def clip_seed(seed: int, clip_id: str) -> list[int]:
    """The caption generator's seed for one clip: (seed, stream, a stable 64-bit hash of the id)."""
    return [seed, CAPTION_STREAM, int.from_bytes(hashlib.sha256(clip_id.encode("utf-8")).digest()[:8], "big")]


def clip_caption(clip: ImportedClip, phrases: list[str], templates: list[str], seed: int, empty_caption: str) -> str:
    """The clip's own first caption, else a template filled with its phrases, else ``empty_caption``."""
    own = next((" ".join(c.split()) for c in clip.captions if c.strip()), "")
    if own:
        return own
    if not phrases:
        return empty_caption
    rng = np.random.default_rng(clip_seed(seed, clip.clip_id))
    return fill(templates[int(rng.integers(len(templates)))], list(dict.fromkeys(phrases)))


def _csv_bytes(header: list[str], rows: list[list]) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue().encode("utf-8")


def _templates(params) -> list[str]:
    def completer():
        from pipeline.text.llm import Completer

        return Completer(params.captions.llm)

    return load_templates(params.captions.templates, completer, params.captions.llm_templates)


def _assign_clusters(keys: Counter, params, index) -> tuple[list[Cluster], list[PhraseAssignment], list[list], dict]:
    """Clusters, the phrase database, the low-similarity rows and (phrase, label, mid) -> cluster id."""
    p = params.clusters
    clusters = index.clusters
    rows, pairs = phrase_database(index, {k: "dataset" for k in sorted(keys)}, keys, p.include_inventory_phrases)
    low = [
        [k[0], k[1], a[0], clusters[a[0]]["name"], a[1], a[3], clusters[a[3]]["name"], a[4]]
        for (k, a), row in zip(pairs, rows)
        if row.source == "dataset" and a[2] == "sbert" and a[1] < p.min_similarity
    ]
    relations = cluster_rows(clusters, index, p.near_synonym_similarity)
    return relations, rows, low, {k: a[0] for k, a in pairs}


def row_group_table(
    items: list[tuple[ImportedClip, PreparedAudio, list]],
    scratch: Path,
    schema: pa.Schema,
    sample_rate_hz: int,
    seed: int,
    cluster_of: dict,
    templates: list[str],
    empty_caption: str,
) -> pa.Table:
    """Kept clips ``(clip, audio, phrases)`` -> one row group of :class:`~pipeline.schema.ShardRow` rows in ``schema``.

    The columns are built straight from the clips (no record per row): the same table as
    ``to_table([ShardRow(...) ...], ShardRow).cast(schema)``, at a small part of the cost.
    ``cluster_of`` maps (phrase, label, mid) to a cluster id; the audio bytes come from ``scratch``.
    """
    licences = [license_name(c.license) if c.license else "unknown" for c, _, _ in items]
    columns = {
        "id": [c.clip_id for c, _, _ in items],
        "audio_sha256": [a.sha256 for _, a, _ in items],
        "sample_rate_hz": [sample_rate_hz] * len(items),
        "duration_s": [a.num_frames / sample_rate_hz for _, a, _ in items],
        "caption": [clip_caption(c, [ph for ph, *_ in phrases], templates, seed, empty_caption) for c, _, phrases in items],
        "phrases": [
            [
                {
                    "phrase": ph,
                    "label": label,
                    "mid": mid,
                    "cluster_id": cluster_of[(ph, label, mid)],
                    "segments": [{"start_s": s.start_s, "end_s": s.end_s} for s in segs],
                    "source_clip_ids": [],
                    "snr_db": [],
                }
                for ph, label, mid, segs in phrases
            ]
            for _, _, phrases in items
        ],
        "background_id": [""] * len(items),
        "split": [c.split for c, _, _ in items],
        "license": licences,
        "licenses": [[lic] for lic in licences],
        "attribution": [[c.attribution] if c.attribution else [] for c, _, _ in items],
        "seed": [seed] * len(items),
    }
    audio = audio_column(
        [scratch / a.scratch_name for _, a, _ in items],
        [a.num_bytes for _, a, _ in items],
        [c.clip_id.replace("/", "_") + ".flac" for c, _, _ in items],
        schema.field("audio").type,
    )
    arrays = [audio if f.name == "audio" else pa.array(columns[f.name], f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def write_import(clips: list[ImportedClip], skips: list[Skip], root: Path, out_dir: Path, params, kind: str, index=None) -> dict:
    """Write the shard folder of an imported corpus (see the module docstring); returns the summary.

    ``index``: a :class:`~pipeline.text.clustering.ClusterIndex` (default: built from
    ``params.clusters``; tests pass a small one). Raises
    :class:`~pipeline.outputs.NoOutputError`, leaving ``out_dir`` as it was, when no clip is usable.
    """
    root, out_dir = Path(root), Path(out_dir)
    p = params.imports
    rate = params.sample_rate_hz
    clips = sorted(clips, key=lambda c: (SPLITS.index(c.split), c.clip_id))
    writer_skips: list[Skip] = []
    by_mid = default_label_phrases()
    templates = _templates(params)
    with staged_dir(out_dir) as staging:
        scratch = staging / SCRATCH
        scratch.mkdir()
        work = functools.partial(
            prepare_audio, root=root, scratch=scratch, sample_rate_hz=rate, silence_dbfs=p.silence_dbfs, keep_flac=p.keep_flac
        )
        prepared = map_ordered(work, list(enumerate(clips)), params.compute, desc=f"import {kind}")
        kept: list[tuple[ImportedClip, PreparedAudio, list]] = []
        for clip, result in zip(clips, prepared):
            if isinstance(result, Skip):
                writer_skips.append(result)
                continue
            phrases, bad = clip_phrases(clip, result.num_frames / rate, by_mid)
            writer_skips += bad
            kept.append((clip, result, phrases))
        all_skips = skips + writer_skips
        # a clip without audio; a skip whose item is its path is a missing annotation file, not a clip
        no_audio = {s.item_id for s in all_skips if s.reason == "missing-file" and s.item_id != s.path}
        listed = len(clips) + len({s.item_id for s in skips if s.reason == "missing-file" and s.item_id != s.path})
        missing = len(no_audio)
        if not kept:
            summary = summarize(listed, 0, all_skips)
            refuse_empty(
                out_dir,
                summary,
                all_skips,
                "rows",
                f"listed {kind} clips",
                f"; check the corpus root {root} and its audio folder",
            )
        if index is None:
            from pipeline.text.clustering import ClusterIndex, load_inventory

            index = ClusterIndex(load_inventory(params.clusters.inventory), params.clusters.model, params.clusters.batch_size)
        keys = Counter((ph, label, mid) for _, _, phrases in kept for ph, label, mid, _ in phrases)
        relations, database, low, cluster_of = _assign_clusters(keys, params, index)

        by_split: dict[str, list] = {s: [k for k in kept if k[0].split == s] for s in SPLITS}
        by_split = {s: items for s, items in by_split.items() if items}
        table_of = functools.partial(
            row_group_table,
            scratch=scratch,
            schema=shard_schema(rate),
            sample_rate_hz=rate,
            seed=params.seed,
            cluster_of=cluster_of,
            templates=templates,
            empty_caption=params.captions.empty_caption,
        )
        shard_index = write_shards(
            staging,
            rate,
            by_split,
            lambda item: item[1].num_bytes,
            row_of=None,
            shard_size_mb=params.shards.shard_size_mb,
            row_group_size_mb=params.shards.row_group_size_mb,
            compression=params.shards.compression,
            desc=f"shards {kind}",
            table_of=table_of,
        )
        shutil.rmtree(scratch)

        (staging / "clusters").mkdir()
        write_manifest(staging / "clusters" / "clusters.parquet", relations, Cluster)
        write_manifest(staging / "clusters" / "phrases.parquet", database, PhraseAssignment)
        first = {}
        for r in database:
            if r.source == "dataset":
                first.setdefault(r.label, r)
        write_atomic(
            staging / "clusters" / "labels.csv",
            _csv_bytes(
                ["label", "mid", "phrase", "cluster_id", "cluster_name", "cluster_mid", "method", "similarity"],
                [
                    [
                        r.label,
                        r.mid,
                        r.phrase,
                        r.cluster_id,
                        r.cluster_name,
                        index.clusters[r.cluster_id]["mid"],
                        r.method,
                        r.similarity,
                    ]
                    for _, r in sorted(first.items())
                ],
            ),
        )
        write_atomic(
            staging / "clusters" / "low_similarity.csv",
            _csv_bytes(
                [
                    "phrase",
                    "label",
                    "cluster_id",
                    "cluster_name",
                    "similarity",
                    "runner_up_id",
                    "runner_up_name",
                    "runner_up_similarity",
                ],
                low,
            ),
        )

        licences = [license_name(c.license) if c.license else "unknown" for c, _, _ in kept]
        licenses = {
            "dataset_license": most_restrictive(licences),
            "rule": "a clip carries its source's licence; the dataset the most restrictive of its clips'",
            "clips_by_license": dict(sorted(Counter(licences).items())),
            "splits": {
                s: {
                    "license": most_restrictive([lic for (c, _, _), lic in zip(kept, licences) if c.split == s]),
                    "clips_by_license": dict(
                        sorted(Counter(lic for (c, _, _), lic in zip(kept, licences) if c.split == s).items())
                    ),
                }
                for s in by_split
            },
            "attribution": ATTRIBUTION,
        }
        write_json(staging / LICENSES, licenses)
        write_atomic(
            staging / ATTRIBUTION,
            _csv_bytes(
                ["role", "id", "dataset", "source_id", "title", "author", "license", "license_url", "occurrences"],
                [
                    ["clip", c.clip_id, kind, c.clip_id, c.attribution, "", lic, c.license if "://" in c.license else "", 1]
                    for (c, _, _), lic in zip(kept, licences)
                ],
            ),
        )
        write_skips(staging / SKIPPED, all_skips)
        summary = summarize(
            listed,
            len(kept),
            all_skips,
            kind=kind,
            rows_by_split={s: len(items) for s, items in by_split.items()},
            phrases=sum(len(ph) for _, _, ph in kept),
            distinct_phrases=len(keys),
            low_similarity=len(low),
            missing_audio=missing,
            missing_audio_share=round(missing / listed, 6) if listed else 0.0,
            source_rates_hz={str(r): n for r, n in sorted(Counter(a.source_sample_rate_hz for _, a, _ in kept).items())},
            resampled_up=sum(a.source_sample_rate_hz < rate for _, a, _ in kept),
            kept_source_flac=sum(a.kept_source_bytes for _, a, _ in kept),
            sample_rate_hz=rate,
        )
        write_json(staging / SUMMARY, summary)
        card.write_imported(staging, params, shard_index, kind, summary)
    size = sum(f["num_bytes"] for f in shard_index["files"]) / MB
    per_split = ", ".join(f"{s} {n}" for s, n in summary["rows_by_split"].items())
    print(
        f"import {kind}: {len(kept)} rows ({per_split}) from {listed} listed clips, {len(all_skips)} skipped, "
        f"{len(low)} phrases below similarity {params.clusters.min_similarity}, {size:.1f} MB -> {out_dir}"
    )
    if missing:
        print(
            f"import {kind}: {missing} of {listed} listed clips ({100 * missing / listed:.1f}%) had no audio; "
            f"they are listed in {out_dir / SKIPPED}",
            file=sys.stderr,
        )
    return summary
