"""A training source that mixes its rows as it reads them: the mix stage's mixtures, never stored.

Input: an entry of ``train.data.sources`` with ``kind: mixing`` (:class:`~trainer.config.SourceParams`:
``events``, ``backgrounds``, ``preset``, ``spec``, ``split``, ``epoch_size``, ``replay``), the run's params
(``seed``, ``sample_rate_hz``, the ``mix`` and ``captions`` sections) and the folder of the
cluster tables the negatives come from. Output: rows as a shard source yields them, ``{"id",
"audio", "caption", "phrases"}``, with ``audio = {"array": float32 samples, "sample_rate_hz":
the mix rate}`` (the 16-bit samples the stage would store, as decoding its FLAC gives them) for
:class:`~trainer.data.stream.ItemBuilder` to crop and label. Nothing is written.

Every step is the stages' own code: the spec is resolved as the mix stage resolves it (the
preset, ``mix.spec``'s knobs on top, the source's own ``spec`` knobs over those, at
``sample_rate_hz``); the sources are split as the mix
stage splits them (:func:`~pipeline.mix.selection.assign_splits` after the same licence filter), so
a ``train`` source never draws a valid or test clip or background recording; one mixture is
drawn, rendered and relabeled by :func:`~pipeline.mix.instantiate.instantiate`; its phrases and
caption are drawn as the captions stage draws them (:func:`~pipeline.stages.captions.label_phrases_of`,
the ``captions.templates`` set, ``captions.empty_caption`` when nothing is audible).

Two modes:

- drawing (default): row ``i`` of epoch ``e`` is the stage's mixture ``n = e * epoch_size + i``
  of the split, from the generator seeded by ``(seed, split, n)`` (and its caption from
  ``(seed, captions, split, n)``); it depends on nothing else (not on the worker or rank that
  makes it). Epoch 0 with ``epoch_size`` equal to ``mix.mixtures.<split>`` is the stored
  dataset itself; every later epoch is new mixtures.
- ``replay: <mix out_dir>``: the rows are that folder's recipes of the split (``mixtures.parquet``
  and ``occurrences.parquet``, in index order), re-rendered by :func:`~pipeline.mix.render.render`
  (bit for bit the stored FLAC's samples) and relabeled from the sources; the same every epoch.

Cluster ids: a phrase's id is looked up in ``<clusters>/phrases.parquet`` by (phrase, label,
MID), as the shards stage does; a phrase the database lacks (a label no stored mixture used)
takes the cluster whose MID is the label's; with neither, it keeps cluster id -1: it is still a
positive with its frame labels, but no cluster is excluded for it, so a negative may be one of
its relatives (the labels concerned are printed once when the source opens).

Sources: the split's pool is decoded once per machine into a source bank, as the mix stage's
(:mod:`pipeline.mix.bank`), under ``$TMPDIR/sedsynth-mixing-banks/<key>``: the key hashes what
fixes its samples (the two manifests, their folders, the rate, the pool's ids), so later runs
and the other ranks and workers on the machine map the same one. The first process to need it
builds it, under a file lock; every loader worker maps it read-only (the operating system
shares the pages) and gives its pages back every :data:`RELEASE_EVERY` mixtures, so no worker's
memory grows with the corpus. The banks are a cache: nothing removes them; delete the folder
to reclaim the space.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from filelock import FileLock

from pipeline.audio import int16_to_float
from pipeline.config.distributions import SpecError
from pipeline.config.loading import merge
from pipeline.config.mix_spec import resolve_spec
from pipeline.mix.bank import SourceBank, bank_sources, ensure_bank
from pipeline.mix.instantiate import Mixture, MixContext, instantiate, relabel_mixture
from pipeline.mix.layout import MIXTURES, OCCURRENCES, audio_path, mixture_id
from pipeline.mix.render import render
from pipeline.mix.selection import assign_splits, filter_licenses
from pipeline.mix.sources import SOURCES, MixError, check_sample_rates, read_sources, source_layout
from pipeline.outputs import MANIFEST, file_sha256
from pipeline.schema import SPLITS, EventOccurrence, MixtureRecipe, from_table
from pipeline.stages.captions import CAPTION_STREAM, label_phrases_of
from pipeline.stages.shards import shard_phrase
from pipeline.text.label_phrases import default_label_phrases, phrases_for
from pipeline.text.llm import Completer
from pipeline.text.templates import CaptionError, fill, load_templates
from trainer.config import SourceParams
from trainer.data.negatives import ClusterTables, NegativeError
from trainer.data.sources import Piece, SourceError


BANKS = "sedsynth-mixing-banks"
RELEASE_EVERY = 100  # mixtures a worker makes between giving its bank pages back (the mix stage's partition size)


def banks_folder() -> Path:
    """Where mixing sources keep their banks: ``sedsynth-mixing-banks`` in the temp folder (``TMPDIR``)."""
    return Path(tempfile.gettempdir()) / BANKS


def source_folders(params: SourceParams, run_params) -> tuple[Path, Path]:
    """The events and backgrounds folders, resolved as the mix stage resolves them.

    ``events`` / ``backgrounds`` of the source, else ``mix.events`` / ``mix.backgrounds``, else
    ``clip.out_dir`` / ``ambience.out_dir``; with ``replay``, the mix folder's ``sources/<kind>``
    (a library run's analysed files) wins when it exists.
    """
    m = run_params.mix
    events = Path(params.events or m.events or run_params.clip.out_dir)
    backgrounds = Path(params.backgrounds or m.backgrounds or run_params.ambience.out_dir)
    if params.replay:
        stored = Path(params.replay) / SOURCES
        events = stored / "events" if (stored / "events" / MANIFEST).exists() else events
        backgrounds = stored / "backgrounds" if (stored / "backgrounds" / MANIFEST).exists() else backgrounds
    for folder, kind in ((events, "events"), (backgrounds, "backgrounds")):
        try:
            layout = source_layout(folder, kind, m.library.extensions)
        except FileNotFoundError as e:
            raise SourceError(f"train: mixing source: {e}") from None
        if layout != "manifest":
            raise SourceError(f"train: mixing source: {folder} is a sound library; a mixing source reads stage outputs only (it "
                              f"writes nothing): point {kind} at a `sedsynth mix` run's {SOURCES}/{kind} folder, or at a "
                              f"`sedsynth {'clip' if kind == 'events' else 'ambience'}` output")
    return events.resolve(), backgrounds.resolve()


def cluster_lookup(folder: str | None) -> tuple[dict[tuple[str, str, str], int], dict[str, int]]:
    """``(phrase, label, MID) -> cluster id`` and ``MID -> cluster id`` from a clusters folder (empty when there is none)."""
    if not folder:
        return {}, {}
    try:
        tables = ClusterTables.read(folder)
    except NegativeError:
        return {}, {}
    by_phrase = {(r["phrase"], r["label"], r["mid"]): int(r["cluster_id"]) for r in tables.phrases}
    by_mid: dict[str, int] = {}
    for c in sorted(tables.clusters, key=lambda c: int(c["cluster_id"])):
        by_mid.setdefault(c["mid"], int(c["cluster_id"]))
    return by_phrase, by_mid


class MixingSource:
    """Rows mixed on the fly (see the module docstring); one row group of ``rows`` rows.

    ``index``: its place in ``train.data.sources``; ``params``: its entry; ``run_params``: the
    run's params; ``clusters``: the cluster tables' folder (cluster ids of the phrases); ``banks``:
    where its source bank is kept (default: :func:`banks_folder`).
    :meth:`set_epoch` picks the epoch the rows are drawn for (the stream calls it).
    """

    def __init__(self, index: int, params: SourceParams, run_params, clusters: str | None = None, banks: str | None = None):
        if run_params is None:
            raise SourceError("train: a mixing source needs the run's params (make_stream passes them)")
        self.index, self.params, self.seed, self.epoch = index, params, run_params.seed, 0
        self.split = params.split
        if self.split not in SPLITS:
            raise SourceError(f"train: mixing source split {self.split!r} is not one of {', '.join(SPLITS)}")
        self.skips: list = []
        self.recipes: list[MixtureRecipe] = []  # replay only
        m, c = run_params.mix, run_params.captions
        self.relabel, self.empty_caption = m.relabel, c.empty_caption
        self.events_dir, self.backgrounds_dir = source_folders(params, run_params)
        try:
            spec = resolve_spec(params.preset or m.preset, merge(m.spec, params.spec or {}), sample_rate_hz=run_params.sample_rate_hz)
        except SpecError as e:
            raise SourceError(f"train: mixing source: {e}") from None
        events, backgrounds = read_sources(self.events_dir, self.backgrounds_dir)
        self.event_by_id = {e.clip_id: e for e in events}
        self.background_by_id = {b.segment_id: b for b in backgrounds}
        try:
            if params.replay:
                self.recipes, self.occurrences = self._read_replay(Path(params.replay))
                spec = dataclasses.replace(spec, sample_rate_hz=self.recipes[0].sample_rate_hz) if self.recipes else spec
                pools = ({self.split: events}, {self.split: backgrounds})  # recipes name their sources by id
            else:
                check_sample_rates(spec, events, backgrounds, self.events_dir, self.backgrounds_dir)
                kept_events, kept_backgrounds, _, _ = filter_licenses(events, backgrounds, m.allowed_licenses)
                hops = {round(x.envelope_hop_s, 9) for x in [*kept_events, *kept_backgrounds]}
                if len(hops) > 1:
                    raise MixError(f"event and background envelopes use different hops {sorted(hops)} s")
                pools = assign_splits(kept_events, kept_backgrounds, m, spec, self.seed)
        except MixError as e:
            raise SourceError(f"train: mixing source: {e}") from None
        self.spec, self.event_pools, self.background_pools = spec, *pools
        self.rows = len(self.recipes) if params.replay else (params.epoch_size or getattr(m.mixtures, self.split))
        if self.rows < 1:
            raise SourceError(f"train: mixing source ({self.split}) has no rows: set its epoch_size")
        try:
            self.templates = load_templates(c.templates, lambda: Completer(c.llm), c.llm_templates)
        except CaptionError as e:
            raise SourceError(f"train: mixing source: {e}") from None
        defaults = default_label_phrases()
        labels = sorted({(e.label, e.mid) for e in self.event_pools[self.split]})
        self.by_label = {label: list(phrases_for(label, mid, defaults)) for label, mid in labels}
        self.cluster_of, self.cluster_of_mid = cluster_lookup(clusters)
        self._report_unclustered(labels, clusters)
        manifests = file_sha256(self.events_dir / MANIFEST), file_sha256(self.backgrounds_dir / MANIFEST)
        self.name = f"mixing:{self.split}:{self._fingerprint(manifests)}"
        self.bank_key, self.banks = self._bank_key(manifests), banks
        self._context: MixContext | None = None
        self._made = 0  # mixtures this process made since its bank last gave its pages back

    def _read_replay(self, folder: Path) -> tuple[list[MixtureRecipe], dict[str, list[EventOccurrence]]]:
        missing = [n for n in (MIXTURES, OCCURRENCES) if not (folder / n).exists()]
        if missing:
            raise SourceError(f"train: mixing source replay folder {folder} lacks {', '.join(missing)}: point replay at a `sedsynth mix` out_dir")
        recipes = sorted((r for r in from_table(pq.read_table(folder / MIXTURES), MixtureRecipe) if r.split == self.split),
                         key=lambda r: r.index)
        occurrences: dict[str, list[EventOccurrence]] = defaultdict(list)
        for o in from_table(pq.read_table(folder / OCCURRENCES), EventOccurrence):
            occurrences[o.mixture_id].append(o)
        unknown = sorted({o.clip_id for r in recipes for o in occurrences[r.mixture_id]} - set(self.event_by_id)
                         | {r.background_id for r in recipes} - set(self.background_by_id))
        if unknown:
            raise SourceError(f"train: {folder} was mixed from sources {self.events_dir} and {self.backgrounds_dir} do not hold "
                              f"(e.g. {unknown[0]}); set the mixing source's events and backgrounds to the folders it was mixed from")
        return recipes, occurrences

    def _report_unclustered(self, labels: list[tuple[str, str]], clusters: str | None) -> None:
        lost = [label for label, mid in labels if mid not in self.cluster_of_mid
                and not any((ph, label, mid) in self.cluster_of for ph in self.by_label[label])]
        if lost and clusters:
            print(f"train: mixing source: {len(lost)} labels of the {self.split} pool have no cluster in {clusters} (e.g. {lost[0]}); "
                  "their phrases get cluster id -1, so their negatives are not checked against relatives", file=sys.stderr)

    def _fingerprint(self, manifests: tuple[str, str]) -> str:
        """What the rows are made from: inputs, spec, seed, relabeling, pools (a resume never continues on other rows)."""
        h = hashlib.sha256()
        h.update(json.dumps({"events": manifests[0], "backgrounds": manifests[1],
                             "spec": self.spec.to_dict(), "seed": self.seed, "relabel": dataclasses.asdict(self.relabel),
                             "templates": self.templates, "replay": [r.mixture_id for r in self.recipes] if self.params.replay else None,
                             "events_pool": [e.clip_id for e in self.event_pools[self.split]],
                             "backgrounds_pool": [b.segment_id for b in self.background_pools[self.split]]},
                            sort_keys=True, default=str).encode())
        return h.hexdigest()[:16]

    def _bank_key(self, manifests: tuple[str, str]) -> str:
        """What fixes the bank's samples: the manifests, their folders, the rate and the pool's ids."""
        return hashlib.sha256(json.dumps({
            "manifests": manifests, "folders": [str(self.events_dir), str(self.backgrounds_dir)], "sample_rate_hz": self.spec.sample_rate_hz,
            "events": sorted({e.clip_id for e in self.event_pools[self.split]}),
            "backgrounds": sorted({b.segment_id for b in self.background_pools[self.split]})}).encode()).hexdigest()[:24]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_context": None, "_made": 0}  # each worker maps the bank itself

    def bank(self) -> SourceBank:
        """The split's sources, decoded once per machine (see the module docstring); built here if no process has yet."""
        folder = Path(self.banks or banks_folder()) / self.bank_key
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(f"{folder}.lock"):
                ensure_bank(folder, self.spec.sample_rate_hz,
                            *bank_sources({self.split: self.event_pools[self.split]}, {self.split: self.background_pools[self.split]},
                                          self.events_dir, self.backgrounds_dir))
        except OSError as e:
            raise SourceError(f"train: mixing source: cannot keep its decoded sources in {folder}: {e.strerror or e}; "
                              "free space there or point TMPDIR at a disk with room") from None
        return SourceBank(folder)

    def context(self) -> MixContext:
        """The mix stage's context over this source's pools and bank, built once per process."""
        if self._context is None:
            self._context = MixContext(self.spec, self.seed, self.relabel, self.bank(), self.event_pools, self.background_pools)
        return self._context

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def row_groups(self) -> list[tuple[str, int, int]]:
        return [(self.name, 0, self.rows)]

    def mixture(self, row: int) -> Mixture:
        """Row ``row`` of the current epoch as the mix stage makes it: recipe, occurrences, label segments, and its
        audio as the float32 samples the stored int16 decode to."""
        ctx = self.context()
        self._made += 1
        if self._made >= RELEASE_EVERY:
            ctx.sources.release()
            self._made = 0
        if self.params.replay:
            recipe = self.recipes[row]
            occurrences = sorted(self.occurrences[recipe.mixture_id], key=lambda o: o.occurrence_index)
            clips = {o.clip_id: self.event_by_id[o.clip_id] for o in occurrences}
            segments = relabel_mixture(ctx, recipe, occurrences, self.background_by_id.get(recipe.background_id), clips)
            return Mixture(recipe, occurrences, segments, int16_to_float(render(recipe, occurrences, ctx.sources)), 0)
        n = self.epoch * self.rows + row
        return instantiate(ctx, self.split, n, mixture_id(self.split, n), audio_path(self.split, n), decoded=True)

    def row_of(self, mixture: Mixture) -> dict:
        """A mixture -> the row a shard source yields for it (caption and phrases as the captions stage draws them)."""
        recipe = mixture.recipe
        rng = np.random.default_rng([self.seed, CAPTION_STREAM, SPLITS.index(recipe.split), recipe.index])
        phrases = label_phrases_of(recipe, mixture.occurrences, mixture.segments, self.by_label, rng)
        template = self.templates[int(rng.integers(len(self.templates)))]
        words = list(dict.fromkeys(ph.phrase for ph in phrases))
        return {
            "id": recipe.mixture_id,
            "audio": {"array": mixture.audio, "sample_rate_hz": recipe.sample_rate_hz},
            "caption": fill(template, words) if words else self.empty_caption,
            "phrases": [_as_read(shard_phrase(ph, self.cluster_id(ph.phrase, ph.label, ph.mid))) for ph in phrases],
        }

    def cluster_id(self, phrase: str, label: str, mid: str) -> int:
        """By (phrase, label, MID), else the label's MID cluster, else -1 (see the module docstring)."""
        return self.cluster_of.get((phrase, label, mid), self.cluster_of_mid.get(mid, -1))

    def read(self, piece: Piece) -> list[dict]:
        return [self.row_of(self.mixture(i)) for i in range(piece.start, piece.stop)]


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _as_read(value):
    """A record as Parquet reads it back (dataclasses as dicts, tuples as lists), so a mixed row equals the shard row
    of the same mixture (as ``dataclasses.asdict`` would give, without its deep copies)."""
    if isinstance(value, (str, int, float)) or value is None:
        return value
    cls = type(value)
    names = _FIELD_NAMES.get(cls)
    if names is None and dataclasses.is_dataclass(cls):
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    if names is not None:
        return {name: _as_read(getattr(value, name)) for name in names}
    if isinstance(value, dict):
        return {k: _as_read(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_read(v) for v in value]
    return value
