"""The training stream: sources -> per-worker pieces -> shuffle buffer -> model-ready items.

Each epoch, every source's pieces are dealt to the global workers (DDP ranks x DataLoader
workers, :func:`~trainer.data.sources.plan_epoch`); a worker reads its pieces, keeps its
quota, interleaves the sources by weight, shuffles through a buffer of undecoded rows, and
turns each row into an :class:`Item`: FLAC (or any file soundfile reads, or a mixing source's
samples) decoded, downmixed, resampled to the encoder's rate, cropped or padded to the input
length, frame labels at the encoder's frame times, and N phrases (positives first, then cluster-based negatives).
Encoded audio is decoded only for its crop (:func:`~pipeline.audio.decode_crop`: the header gives
the length the crop is placed in), so memory does not grow with a cell's length; a row with a
``duration_s`` whose audio header states more than that is skipped as ``too-long`` before any
frame is decoded.

Everything random about one item (crop, negatives, caption choice, tag replacement) comes from
a generator seeded by (seed, epoch, source, id), so an item does not depend on which worker
made it. With ``captions_per_clip`` (the captioning loss) an item also carries its decoder
targets, drawn from its own generator (seeded the same way, on a stream of its own) out of
:func:`caption_pool`: a caption corpus row's own captions, else the row's caption and the other
caption templates filled with its phrases in temporal order. Rows of a shard or caption source
are untrusted: a malformed one (nulls, segments that are not numbers or not inside the clip,
unknown cluster ids, an audio cell without bytes: :meth:`ItemBuilder.check`), one with a label
holding a tab or line break (``bad-label``) and one whose audio cannot be decoded or is longer
than its ``duration_s`` are skipped, each reported on stderr with its file, row and reason (``skips``
rides on the next item to the training loop, which writes them to ``skipped.csv`` and counts them).
:func:`make_stream` builds the stream ``train.data`` describes for an encoder.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from pipeline.audio import AudioError, decode_crop, decode_mono, mono_at
from pipeline.schema import Skip
from pipeline.shards.rows import Fault, combined, phrase_faults
from pipeline.text.llm import Completer
from pipeline.text.templates import fill, load_templates
from trainer.config import SourceParams
from trainer.data.labels import frame_labels
from trainer.data.mixing import MixingSource
from trainer.data.negatives import ClusterTables, NegativeSampler, default_clusters_folder
from trainer.data.sources import (
    ParquetSource,
    SourceError,
    open_source,
    piece_rows_for,
    pieces_of,
    plan_epoch,
    stable_hash,
)
from trainer.memory import HeapReleaser


@dataclass(frozen=True)
class ItemParams:
    """How rows become items (the parts of ``train.data`` the stream needs)."""

    sample_rate_hz: int = 16000
    input_samples: int = 160000  # crop or pad to this (10 s at 16 kHz)
    num_phrases: int = 20  # N: positives plus negatives per clip
    random_crop: bool = True  # False: always the start (evaluation)
    tag_replacement_p: float = 0.0  # FLAM: replace the caption with one of the clip's phrases
    min_label_overlap: float = 0.5
    captions_per_clip: int = 0  # decoder targets drawn per item (the captioning loss); 0: none
    templates: tuple[str, ...] = ()  # caption templates a row's phrases fill (its decoder caption pool)


@dataclass
class Item:
    id: str
    wave: np.ndarray  # (S,) float32
    caption: str
    phrases: list[str]  # N strings; "" where no phrase
    labels: np.ndarray  # (N, L) bool
    mask: np.ndarray  # (N,) bool: a real phrase of a frame-labelled clip
    has_frames: bool
    source: int = 0  # index in train.data.sources
    skips: list[Skip] = field(default_factory=list)
    target_captions: list[str] = field(default_factory=list)  # the decoder's targets (captions_per_clip of them)


class RowError(Exception):
    """A row that cannot become an item; ``reason`` is the skip reason, ``detail`` says what is wrong."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


class ItemBuilder:
    """One row (a dict from a source) -> :class:`Item`; raises ``AudioError`` on unusable audio
    (and, from :meth:`check`, ``RowError`` on a malformed row)."""

    def __init__(self, params: ItemParams, spans_s: np.ndarray, sampler: NegativeSampler | None, seed: int):
        self.p, self.spans, self.sampler, self.seed = params, spans_s, sampler, seed

    def decode(self, audio: dict) -> np.ndarray:
        """Encoded audio (a cell's ``bytes``, or the ``file`` a caption CSV names) or decoded samples
        (``array`` at ``sample_rate_hz``, as a mixing source gives them) -> mono float32 at the
        encoder's rate, the same way either way, whole (an item decodes only its crop: :meth:`load`).
        A cell's ``path`` is never opened."""
        if audio.get("array") is not None:
            return mono_at(audio["array"], audio["sample_rate_hz"], self.p.sample_rate_hz)
        return decode_mono(self._encoded(audio), self.p.sample_rate_hz)

    @staticmethod
    def _encoded(audio: dict) -> bytes | str:
        source = audio["bytes"] if audio.get("bytes") is not None else audio.get("file")
        if source is None:
            raise AudioError("unreadable", "the audio cell has no bytes (a shard's audio is read from its bytes only)")
        return source

    def load(self, row: dict, rng: np.random.Generator) -> tuple[np.ndarray, float]:
        """A row's audio cropped or padded to ``input_samples`` at the encoder's rate, and the crop's
        offset in s: what :meth:`crop` makes of :meth:`decode`'s wave, the same draw from ``rng``.

        Encoded audio is decoded only for the crop (:func:`~pipeline.audio.decode_crop`, placed by
        the header's length), so a cell of hours costs what its crop does; one whose row has a
        ``duration_s`` may state no more frames than that in its header (``too-long``)."""
        audio = row["audio"]
        if audio.get("array") is not None:
            return self.crop(self.decode(audio), rng)
        duration = row.get("duration_s")
        number = isinstance(duration, (int, float)) and not isinstance(duration, bool)
        max_s = float(duration) if number and 0 < duration < math.inf else None  # a clip-level row's may be anything
        n = self.p.input_samples
        wave, start = decode_crop(self._encoded(audio), self.p.sample_rate_hz, n, lambda total: self.start(total, rng), max_s)
        return (wave if len(wave) == n else np.pad(wave, (0, n - len(wave)))), start / self.p.sample_rate_hz

    def check(self, row: dict, frame_level: bool = True) -> None:
        """Raise ``RowError`` when a source's row cannot become an item: a null id or audio cell, a
        cell without bytes, a null caption, or (a frame-level row) phrases failing
        :func:`~pipeline.shards.rows.phrase_faults`, the rule ``sedsynth validate`` applies: nulls,
        segments not numbers, negative, empty, reversed or past ``duration_s``, cluster ids the
        negatives' inventory lacks (reason ``malformed-row``), labels holding a tab, line break or
        other control character (``bad-label``); the reason is the first fault's. A mixing
        source's rows need no check (they are made here)."""
        faults: list[Fault] = []
        if not isinstance(row.get("id"), (str, int)):
            faults.append(("malformed-row", "the id is null"))
        audio = row.get("audio")
        if not isinstance(audio, dict):
            faults.append(("malformed-row", "the audio cell is null"))
        elif audio.get("bytes") is None and audio.get("file") is None:
            faults.append(("malformed-row", "the audio cell has no bytes (a shard's audio is read from its bytes only, never from its path)"))
        if "captions" in row and not row["captions"]:
            faults.append(("malformed-row", "no caption in the caption columns"))
        elif "captions" not in row and "caption" in row and not isinstance(row["caption"], str):
            faults.append(("malformed-row", "the caption is null"))
        if frame_level and "phrases" in row:
            clusters = self.sampler.related if self.sampler is not None else None
            faults += phrase_faults(row["phrases"], row.get("duration_s", math.inf), clusters)
        fault = combined(faults)
        if fault is not None:
            raise RowError(*fault)

    def start(self, total: int, rng: np.random.Generator) -> int:
        """Where a crop of ``input_samples`` starts in a wave of ``total`` samples (``total`` larger):
        drawn from ``rng`` with ``random_crop``, else 0."""
        return int(rng.integers(0, total - self.p.input_samples + 1)) if self.p.random_crop else 0

    def crop(self, x: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, float]:
        n = self.p.input_samples
        if len(x) > n:
            start = self.start(len(x), rng)
            return x[start:start + n], start / self.p.sample_rate_hz
        return (x if len(x) == n else np.pad(x, (0, n - len(x)))), 0.0

    def __call__(self, row: dict, source: int, epoch: int, frame_level: bool = True) -> Item:
        """``frame_level`` False: the row's phrases are not used (a clip-level item, as a caption corpus gives)."""
        key = [self.seed, epoch, source, stable_hash(str(row["id"]))] + ([row["_pass"]] if row.get("_pass") else [])
        rng = np.random.default_rng(key)
        wave, offset_s = self.load(row, rng)
        end_s = offset_s + self.p.input_samples / self.p.sample_rate_hz  # frames past this see only padding
        n, L = self.p.num_phrases, len(self.spans)
        phrases, labels, mask = [""] * n, np.zeros((n, L), bool), np.zeros(n, bool)
        positives = (row.get("phrases") or []) if frame_level else []
        has_frames = frame_level and "phrases" in row and self.sampler is not None
        if has_frames:
            if len(positives) > n:
                positives = [positives[i] for i in sorted(rng.choice(len(positives), n, replace=False))]
            for k, ph in enumerate(positives):
                phrases[k] = ph["phrase"]
                labels[k] = frame_labels([(s["start_s"], min(s["end_s"], end_s)) for s in ph["segments"]], offset_s, self.spans, self.p.min_label_overlap)
            negatives = self.sampler.sample([ph["cluster_id"] for ph in positives], n - len(positives), rng)
            for k, (phrase, _) in enumerate(negatives, start=len(positives)):
                phrases[k] = phrase
            mask[: len(positives) + len(negatives)] = True
        captions = row.get("captions") or [row.get("caption") or ""]
        caption = captions[int(rng.integers(len(captions)))]
        if positives and rng.random() < self.p.tag_replacement_p:
            caption = positives[int(rng.integers(len(positives)))]["phrase"]
        targets = []
        if self.p.captions_per_clip:
            pool = caption_pool(row, self.p.templates, frame_level)
            pick = np.random.default_rng([*key, TARGET_STREAM]).choice(len(pool), self.p.captions_per_clip,
                                                                        replace=len(pool) < self.p.captions_per_clip)
            targets = [pool[int(i)] for i in pick]
        return Item(str(row["id"]), wave.astype(np.float32, copy=False), caption, phrases, labels, mask, has_frames, source,
                    target_captions=targets)


TARGET_STREAM = 0xDEC  # the decoder targets' generator: (seed, epoch, source, id[, pass], TARGET_STREAM)


def temporal_phrases(row: dict) -> list[str]:
    """A row's phrases in temporal order (first segment's start, then label), each once."""
    def first(ph: dict) -> tuple[float, str]:
        return min((s["start_s"] for s in ph.get("segments") or []), default=float("inf")), ph.get("label") or ""

    return list(dict.fromkeys(ph["phrase"] for ph in sorted(row.get("phrases") or [], key=first) if ph.get("phrase")))


def caption_pool(row: dict, templates: tuple[str, ...] | list[str], frame_level: bool = True) -> list[str]:
    """Every caption a row's decoder targets are drawn from, without repeats.

    A row with its own captions (``captions``: a caption corpus, several per clip) gives those.
    Otherwise the row's stored caption comes first, followed, when the row is frame-level and has
    phrases, by each template filled with its phrases in temporal order (the captions stage's
    :func:`~pipeline.text.templates.fill`), the stored caption's own template thereby included once.
    """
    own = [c for c in row.get("captions") or [] if c and c.strip()]
    if own:
        return list(dict.fromkeys(own))
    stored = row.get("caption") or ""
    words = temporal_phrases(row) if frame_level else []
    return list(dict.fromkeys([stored, *(fill(t, words) for t in templates if words)]))


def caption_texts(stream: TrainStream) -> list[str]:
    """The texts a word vocabulary for the decoder is built from (no audio is read): every caption
    and phrase of the stream's sources (a mixing source: its templates, label phrases and empty
    caption), and the templates its items fill."""
    texts = list(stream.builder.p.templates)
    for src in stream.sources:
        if isinstance(src, MixingSource):
            texts += [*src.templates, src.empty_caption, *(ph for phrases in src.by_label.values() for ph in phrases)]
        else:
            texts += src.texts()
    return texts


def world() -> tuple[int, int]:
    """(rank, world size) from torch.distributed when it is set up, else a single process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class TrainStream(IterableDataset):
    """Items for this rank and DataLoader worker, one epoch per ``iter`` (call :meth:`set_epoch`)."""

    def __init__(self, sources: list[SourceParams], builder: ItemBuilder, seed: int, *, shuffle_buffer: int = 256,
                 piece_rows: int = 128, rank: int | None = None, world_size: int | None = None, shuffle: bool = True,
                 run_params=None, clusters: str | None = None):
        self.params, self.builder, self.seed = sources, builder, seed
        self.shuffle_buffer, self.piece_rows, self.shuffle = shuffle_buffer, piece_rows, shuffle
        # a mixing source draws from the run's mix settings; its phrases take their cluster ids from ``clusters``
        self.sources = [MixingSource(i, s, run_params, clusters) if s.kind == "mixing" else open_source(i, s)
                        for i, s in enumerate(sources)]
        self.skips: list[Skip] = [s for src in self.sources for s in src.skips]
        self.checked = [not isinstance(src, MixingSource) for src in self.sources]  # rows read from files are untrusted
        self.epoch = 0
        self._rank, self._world = rank, world_size
        self.skip_batches, self.batch_size = 0, 1

    def set_epoch(self, epoch: int, skip_batches: int = 0, batch_size: int = 1) -> None:
        """Start ``epoch``; a resume passes the batches this rank already trained on in it."""
        self.epoch, self.skip_batches, self.batch_size = epoch, skip_batches, batch_size

    def topology(self) -> tuple[int, int]:
        """(this global worker, number of global workers)."""
        rank, size = world()
        rank = self._rank if self._rank is not None else rank
        size = self._world if self._world is not None else size
        info = get_worker_info()
        wid, nw = ((info.id + self.skip_batches) % info.num_workers, info.num_workers) if info else (0, 1)
        return rank * nw + wid, size * nw

    def plan(self, num_workers: int) -> list:
        """Per source: its epoch deal and the rows each worker yields from it.

        The first source sets the epoch's length: each worker yields all of its share. Every
        other source yields ``weight / first weight`` times as many rows, so each source's share
        of the batches is its share of the weights: a source with more rows than that leaves
        the rest for later epochs (the deal differs), one with fewer repeats its rows.
        """
        deals = []
        for i, src in enumerate(self.sources):
            total = sum(r for _, _, r in src.row_groups())
            pieces = pieces_of(src, piece_rows_for(total, num_workers, self.piece_rows))
            deals.append(plan_epoch(pieces, num_workers, self.seed + i, self.epoch if self.shuffle else 0))
        primary = deals[0].quota
        for i, d in enumerate(deals[1:], start=1):
            d.quota = round(primary * self.params[i].weight / max(self.params[0].weight, 1e-9)) if d.quota else 0
        return deals

    def rows_per_worker(self, num_workers: int) -> int:
        return sum(d.quota for d in self.plan(num_workers))

    def _rows(self, source, pieces, quota):
        """``quota`` rows from ``pieces``, going round them again as often as needed.

        A repeated row carries ``_pass`` (1, 2, ...), which gives it its own crop and negatives.
        Between pieces, what reading and decoding freed goes back to the system every 30 s or so
        (:class:`~trainer.memory.HeapReleaser`: a loader worker's heap and Arrow pool grow otherwise).
        """
        left, repeat, heap = quota, 0, HeapReleaser()
        try:
            while left > 0 and pieces:
                for piece in pieces:
                    heap.poll()
                    for row in source.read(piece):
                        if left == 0:
                            return
                        left -= 1
                        yield {**row, "_pass": repeat} if repeat else row
                repeat += 1
        finally:  # a held-out stream's source lives on in the training process: its last row group goes now
            if isinstance(source, ParquetSource):
                source.release()

    def _already_done(self) -> int:
        """Items this worker made before a resume point (the DataLoader takes batches from its
        workers in turn, so worker w made batches w, w + nw, ...; a resumed DataLoader starts again
        at its worker 0, so worker ids are rotated by ``skip_batches`` to continue with batch ``skip_batches``)."""
        info = get_worker_info()
        wid, nw = ((info.id + self.skip_batches) % info.num_workers, info.num_workers) if info else (0, 1)
        return max(0, -(-(self.skip_batches - wid) // nw)) * self.batch_size

    def __iter__(self):
        me, count = self.topology()
        done = self._already_done()
        for src in self.sources:
            if isinstance(src, MixingSource):  # its rows are drawn afresh each epoch (a held-out stream keeps epoch 0's)
                src.set_epoch(self.epoch if self.shuffle else 0)
        deals = self.plan(count)
        streams = [self._rows(src, d.pieces[me], d.quota) for src, d in zip(self.sources, deals)]
        left = np.array([d.quota for d in deals], dtype=np.float64)
        weights = np.array([s.weight for s in self.params], dtype=np.float64)
        rng = np.random.default_rng([self.seed, self.epoch, me, 0xB0F])
        buffer: list[tuple[int, dict]] = []
        skips: list[Skip] = []
        # The last batch_size items made are held back: skips found after the last item, and those riding
        # on items of the shorter tail a drop_last DataLoader drops, then move to the last item of the
        # last full batch, which it keeps.
        held: list[Item] = []
        made, batch = 0, max(1, self.batch_size)

        def hold(item: Item):
            nonlocal made
            made += 1
            held.append(item)
            if len(held) > batch:
                yield held.pop(0)

        def emit(entry):
            nonlocal done
            source, row = entry
            if done > 0:
                done -= 1
                return None
            frame_level = self.params[source].level == "frame"
            try:
                if self.checked[source]:
                    self.builder.check(row, frame_level)
                item = self.builder(row, source, self.epoch, frame_level)
            except (AudioError, RowError) as e:
                skips.append(report_skip(row, e.reason, e.detail))
                return None
            item.skips, skips[:] = list(skips), []
            return item

        while left.sum() > 0:
            p = weights * (left > 0)
            s = int(rng.choice(len(p), p=p / p.sum()))
            left[s] -= 1
            row = next(streams[s], None)
            if row is None:
                left[s] = 0
                continue
            buffer.append((s, row))
            if len(buffer) >= max(1, self.shuffle_buffer):
                j = int(rng.integers(len(buffer))) if self.shuffle else 0
                buffer[j], buffer[-1] = buffer[-1], buffer[j]
                item = emit(buffer.pop())
                if item is not None:
                    yield from hold(item)
        order = rng.permutation(len(buffer)) if self.shuffle else range(len(buffer))
        for j in order:
            item = emit(buffer[j])
            if item is not None:
                yield from hold(item)
        if held:
            last_full = (made - made % batch) - 1 - (made - len(held))  # its place in held; < 0: no full batch
            keeper = last_full if last_full >= 0 else len(held) - 1
            tail = held[keeper + 1:]
            held[keeper].skips += [skip for item in tail for skip in item.skips] + skips  # in the order found
            for item in tail:
                item.skips = []
        yield from held


def report_skip(row: dict, reason: str, detail: str) -> Skip:
    """A row the stream leaves out -> its :class:`Skip`, after one line on stderr naming where it came
    from (a shard's file and row position, or a caption CSV's audio file) and why."""
    rid, audio = str(row.get("id")), row.get("audio") or {}
    if "_from" in row:
        file, position = row["_from"]
        where, recorded = f"row {position} of {file} (id {rid})", f"row {position}: {detail}"
        todo = "fix or re-create that shard (`sedsynth validate <folder>` lists every bad row)"
    elif audio.get("file"):
        file, where, recorded, todo = audio["file"], f"{rid} ({audio['file']})", detail, "replace or remove that file"
    else:  # a mixing source's mixture
        file, where, recorded, todo = "", rid, detail, "see the mix settings"
    print(f"train: skipping {where}: {reason}: {detail}; {todo}; it is listed in skipped.csv", file=sys.stderr)
    return Skip(rid, file, reason, recorded)


def check_inventories(tables: ClusterTables, folder: str, sources: list[SourceParams]) -> None:
    """Raise ``SourceError`` when a frame-level shard source carries a cluster inventory other than ``tables``'.

    Every row's phrases carry cluster ids, and negatives come from one folder's clusters: a source
    whose ids mean other clusters would get negatives that contradict its positives.
    """
    import fsspec
    import pyarrow.parquet as pq

    ours = {int(c["cluster_id"]): c["mid"] for c in tables.clusters}
    for s in sources:
        if s.kind != "shards" or s.level != "frame":
            continue
        other = default_clusters_folder(s.path)
        fs, root = fsspec.core.url_to_fs(other)
        path = f"{root.rstrip('/')}/clusters.parquet"
        if other == folder or not fs.exists(path):
            continue
        with fs.open(path, "rb") as f:
            theirs = {int(i): m for i, m in zip(*pq.read_table(f, columns=["cluster_id", "mid"]).to_pydict().values())}
        if theirs != ours:
            raise SourceError(f"train: {s.path} was labelled with another cluster inventory than {folder} ({len(theirs)} against "
                              f"{len(ours)} clusters, or other MIDs); write every source with the same clusters.inventory "
                              "(re-import it with --set clusters.inventory=...), or set that source's level: clip")


def make_stream(params, encoder, sources: list[SourceParams], shuffle: bool, rank: int = 0, world_size: int = 1) -> TrainStream:
    """The stream ``params.train.data`` describes over ``sources``, shaped for ``encoder``.

    ``shuffle``: a training stream (random crops, tag replacement, shuffled pieces); otherwise
    a held-out one (fixed crops, rows in order). ``rank`` / ``world_size``: this process's share
    of a DDP run. Negatives come from ``train.data.clusters`` (default: the first source's
    ``clusters/`` folder), drawn as ``train.data.negative_sampling`` says. With
    ``train.loss.caption_weight > 0`` every item carries ``caption_decoder.captions_per_clip``
    decoder targets, template fills drawn from the ``captions.templates`` set.
    """
    d = params.train.data
    captions_per_clip, templates = 0, ()
    if params.train.loss.caption_weight > 0:
        c = params.captions
        captions_per_clip = params.train.model.caption_decoder.captions_per_clip
        templates = tuple(load_templates(c.templates, lambda: Completer(c.llm), c.llm_templates))
    folder = d.clusters or default_clusters_folder(d.sources[0].path)
    tables = ClusterTables.read(folder)
    check_inventories(tables, folder, sources)
    sampler = NegativeSampler(tables, d.negative_sampling, d.inventory_negative_share)
    items = ItemParams(encoder.sample_rate_hz, encoder.input_samples(d.crop_s), d.num_phrases, random_crop=shuffle,
                       tag_replacement_p=d.tag_replacement_p if shuffle else 0.0, min_label_overlap=d.min_label_overlap,
                       captions_per_clip=captions_per_clip, templates=templates)
    builder = ItemBuilder(items, encoder.frame_spans_s(), sampler, params.seed)
    return TrainStream(list(sources), builder, params.seed, shuffle_buffer=d.shuffle_buffer if shuffle else 1, piece_rows=d.piece_rows,
                       rank=rank, world_size=world_size, shuffle=shuffle, run_params=params, clusters=folder)


@dataclass
class Batch:
    ids: list[str]
    wave: torch.Tensor  # (B, S)
    captions: list[str]
    phrases: list[list[str]]  # B x N
    labels: torch.Tensor  # (B, N, L) bool
    mask: torch.Tensor  # (B, N) bool
    has_frames: torch.Tensor  # (B,) bool
    skips: list[Skip]
    sources: list[int] = field(default_factory=list)  # each clip's index in train.data.sources
    target_captions: list[list[str]] = field(default_factory=list)  # B x captions_per_clip: the decoder's targets

    def to(self, device) -> Batch:
        self.wave, self.labels, self.mask, self.has_frames = (t.to(device, non_blocking=True) for t in (self.wave, self.labels, self.mask, self.has_frames))
        return self


def collate(items: list[Item]) -> Batch:
    return Batch(
        ids=[i.id for i in items],
        wave=torch.from_numpy(np.stack([i.wave for i in items])),
        captions=[i.caption for i in items],
        phrases=[i.phrases for i in items],
        labels=torch.from_numpy(np.stack([i.labels for i in items])),
        mask=torch.from_numpy(np.stack([i.mask for i in items])),
        has_frames=torch.tensor([i.has_frames for i in items]),
        skips=[s for i in items for s in i.skips],
        sources=[i.source for i in items],
        target_captions=[i.target_captions for i in items],
    )
