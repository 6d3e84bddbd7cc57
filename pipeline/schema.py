"""Every record the pipeline writes, with units in the field names.

Each record is a frozen dataclass; :func:`arrow_schema` derives its Parquet schema from the
annotations, so a manifest column exists if and only if the dataclass has the field.

Conventions: times in seconds (``_s``), rates in hertz (``_hz``), levels in decibels
(``_db``, ``_dbfs`` relative to digital full scale, ``_lufs`` per ITU-R BS.1770). Paths in
manifests are relative to the manifest's own folder (outputs) or to the source root (inputs).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
import typing
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import ClassVar

import pyarrow as pa

Float32 = typing.NewType("Float32", float)  # a float stored in 32 bits (envelopes)

SkipReason = typing.Literal[
    "malformed-row",  # a metadata row that does not parse
    "missing-file",  # the row names a file that does not exist
    "unreadable",  # the decoder rejects the file (corrupt, unknown format)
    "empty",  # zero samples
    "non-finite",  # NaN or infinite samples
    "silent",  # RMS below the silence floor
    "digital-silence",  # a run of exact zeros longer than allowed
    "clipped",  # too many samples at full scale
    "multi-label",  # more than one leaf label (clipping takes single-label clips only)
    "no-label",  # an empty label list
    "no-segment",  # no window above the energy threshold
    "too-short",  # segment or recording shorter than the minimum
    "too-long",  # segment longer than the maximum
    "low-sample-rate",  # a library file below sample_rate_hz (mixing does not upsample)
    "other-extension",  # an audio file whose extension mix.library.extensions does not list
    "filtered-category",  # the ambience filter does not select this recording
    "not-in-metadata",  # an audio file the metadata CSV does not list
    "salient-event",  # a background segment with a transient above the salience limit
    "license-not-allowed",  # the source's licence is not in mix.allowed_licenses
    "unknown-label",  # an imported region whose label or MID the corpus's class list does not know
    "bad-region",  # an imported region with onset >= offset, a negative time, or entirely past the clip's end
    "empty-caption",  # an imported caption or region text that is empty
    "bad-label",  # a label holding a tab, line break or other control character (it would forge TSV rows)
    "unexpected-error",  # anything else; the detail holds the exception
]


# what ends a TSV cell or its line for some reader: C0 and C1 controls (tab, LF, CR, NEL U+0085, ...),
# U+2028 and U+2029 (str.splitlines breaks on each of them)
CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be a cell of a TSV file read line by line: the first tab, line break
    (LF, CR, NEL, U+2028, U+2029) or other control character it holds; ``None`` when it has none."""
    bad = CONTROL_CHARACTERS.search(text)
    if bad is None:
        return None
    return f"holds U+{ord(bad.group()):04X} at character {bad.start()} (a tab or line break or another control character)"


SPLITS = ("train", "valid", "test")  # the dataset's splits, in the order every output lists them

# Runs of SourceExcerpt columns that both excerpt manifests hold in this order.
_LEVEL_COLUMNS = (
    "duration_s",
    "num_samples",
    "sample_rate_hz",
    "source_sample_rate_hz",
    "source_channels",
    "rms_dbfs",
    "peak_dbfs",
    "loudness_lufs",
)
_ENVELOPE_COLUMNS = ("envelope_frame_s", "envelope_hop_s", "envelope_db")


def readable_id(rel_path: str) -> str:
    """A source file's id from its POSIX path relative to its root: readable (the path's words,
    at most 60 characters) and filesystem-safe, unique through a hash of the whole path."""
    stem = re.sub(r"[^A-Za-z0-9]+", "-", PurePosixPath(rel_path).with_suffix("").as_posix()).strip("-").lower()
    digest = hashlib.sha1(rel_path.encode("utf-8")).hexdigest()[:8]
    return f"{stem[:60]}-{digest}" if stem else digest


@dataclass(frozen=True)
class Skip:
    """One input a stage did not turn into an output, and why."""

    item_id: str
    path: str
    reason: SkipReason
    detail: str


@dataclass(frozen=True)
class EnergyEnvelope:
    """Frame energies of a signal: frame ``k`` covers ``[k * hop_s, k * hop_s + frame_s)``."""

    frame_s: float
    hop_s: float
    energy_db: tuple[Float32, ...]


@dataclass(frozen=True)
class SourceExcerpt:
    """What every stored excerpt of a source recording records (:class:`EventClip`, :class:`BackgroundSegment`).

    ``audio_path`` is the excerpt, downmixed and resampled from the source's
    ``source_sample_rate_hz`` and ``source_channels`` to ``sample_rate_hz``; the levels describe
    that stored audio. ``envelope_db`` is its A-weighted frame energy in dB re full scale,
    frame ``k`` starting at ``k * envelope_hop_s``; mixing scales it by the gain
    (``+ gain_db``) instead of re-analysing the audio. ``license`` is the source's licence.
    """

    audio_path: str
    source_id: str
    source_path: str
    duration_s: float
    num_samples: int
    sample_rate_hz: int
    source_sample_rate_hz: int
    source_channels: int
    rms_dbfs: float
    peak_dbfs: float
    loudness_lufs: float
    envelope_frame_s: float
    envelope_hop_s: float
    envelope_db: tuple[Float32, ...]
    license: str


@dataclass(frozen=True)
class EventClip(SourceExcerpt):
    """One clean single-event clip cut from a source clip (row of ``events/manifest.parquet``).

    The clip is ``[onset_in_source_s, offset_in_source_s)`` of the source.
    """

    clip_id: str
    source_dataset: str
    source_split: str
    label: str
    mid: str
    audioset_name: str
    onset_in_source_s: float
    offset_in_source_s: float
    license_url: str
    uploader: str
    title: str

    COLUMNS: ClassVar[tuple[str, ...]] = (
        "clip_id",
        "audio_path",
        "source_dataset",
        "source_id",
        "source_split",
        "source_path",
        "label",
        "mid",
        "audioset_name",
        "onset_in_source_s",
        "offset_in_source_s",
        *_LEVEL_COLUMNS,
        *_ENVELOPE_COLUMNS,
        "license_url",
        "license",
        "uploader",
        "title",
    )


@dataclass(frozen=True)
class BackgroundSegment(SourceExcerpt):
    """One background segment cut from an ambience recording (row of ``backgrounds/manifest.parquet``).

    The segment starts ``offset_in_source_s`` into the recording.
    """

    segment_id: str
    category: str
    offset_in_source_s: float
    peak_to_median_db: float
    author: str

    COLUMNS: ClassVar[tuple[str, ...]] = (
        "segment_id",
        "audio_path",
        "source_id",
        "source_path",
        "category",
        "offset_in_source_s",
        *_LEVEL_COLUMNS,
        "peak_to_median_db",
        *_ENVELOPE_COLUMNS,
        "license",
        "author",
    )


@dataclass(frozen=True)
class MixtureRecipe:
    """Everything needed to re-render one mixture (row of ``mixtures/mixtures.parquet``).

    The occurrences live in ``occurrences.parquet`` (joined on ``mixture_id``). Levels: the
    background is scaled by ``background_gain_db``, each occurrence by its ``gain_db``, their
    sum by ``mixture_gain_db`` (normalisation); ``peak_dbfs`` is that of the stored audio. ``license`` is the most restrictive licence among the sources.
    A ``background_id`` of ``brownian-<k>`` is generated noise; a ``background_rir_id`` names
    the room the background is heard in (:mod:`pipeline.mix.augment`).
    """

    mixture_id: str
    split: str
    index: int
    audio_path: str
    duration_s: float
    num_samples: int
    sample_rate_hz: int
    level_mode: str
    background_id: str
    background_offset_s: float
    background_gain_db: float
    background_level_db: float
    mixture_gain_db: float
    peak_dbfs: float
    num_events: int
    num_occurrences: int
    max_polyphony: int
    labels: tuple[str, ...]
    license: str
    licenses: tuple[str, ...]
    attribution: tuple[str, ...]
    background_rir_id: str = ""  # the room the background is heard in ("" dry)
    background_wet_db: float = 0.0
    background_dry_db: float = 0.0


@dataclass(frozen=True)
class EventOccurrence:
    """One placement of (part of) an event clip in a mixture (row of ``occurrences.parquet``).

    Samples ``[source_in_s, source_out_s)`` of clip ``clip_id`` sound at ``[onset_s, offset_s)``
    of the mixture, scaled by ``gain_db``. Occurrences of one sampled event (repeats, or the
    pieces of a split event) share ``event_index`` and ``gain_db``. ``snr_db`` is the value
    drawn; ``realised_snr_db`` is measured on the rendered signals in the spec's level mode
    (for pieces, the draw applies to the whole event, so a piece's realised value may differ).

    Augmented occurrences (:mod:`pipeline.mix.augment`): the span is pitch-shifted and
    stretched to ``time_stretch_factor`` times its length, then heard in room ``rir_id`` (dry at
    ``reverb_dry_db`` plus wet at ``reverb_wet_db``); ``[onset_s, offset_s)`` is then where it
    sounds, its reverb tail included (cut at the mixture's end). The SNR refers to the span
    after pitch and stretch, before reverb.
    """

    mixture_id: str
    occurrence_index: int
    event_index: int
    role: str  # whole | repeat | piece
    clip_id: str
    label: str
    mid: str
    source_in_s: float
    source_out_s: float
    onset_s: float
    offset_s: float
    fade_in_s: float
    fade_out_s: float
    gain_db: float
    snr_db: float
    realised_snr_db: float
    license: str
    pitch_shift_semitones: float = 0.0
    time_stretch_factor: float = 1.0  # output duration / input duration
    stretch_method: str = ""  # rubberband | varispeed ("" unchanged)
    rir_id: str = ""  # the room the occurrence is heard in ("" dry)
    reverb_wet_db: float = 0.0
    reverb_dry_db: float = 0.0


@dataclass(frozen=True)
class LabelSegment:
    """Where one label is audible in a mixture, derived by relabeling (``segments.parquet``).

    Segments of the same label never overlap or touch: they are merged first.
    """

    mixture_id: str
    label: str
    mid: str
    onset_s: float
    offset_s: float


@dataclass(frozen=True)
class TimeSpan:
    """A half-open interval ``[start_s, end_s)`` of a mixture's timeline."""

    start_s: float
    end_s: float


@dataclass(frozen=True)
class LabelPhrase:
    """One label of a mixture as a phrase (row of ``captions/phrases.parquet``).

    One row per distinct label with audible segments; ``segments`` are that label's rows of
    ``segments.parquet`` (derived by relabeling), ``source_clip_ids`` and ``snr_db`` list the
    label's sampled events in event order. ``phrase`` is the words used for the label in this
    mixture's caption.
    """

    mixture_id: str
    label: str
    mid: str
    phrase: str
    segments: tuple[TimeSpan, ...]
    source_clip_ids: tuple[str, ...]
    snr_db: tuple[float, ...]


@dataclass(frozen=True)
class Caption:
    """The caption of one mixture (row of ``captions/captions.parquet``).

    ``template`` is the template with its one ``{}`` slot (empty for an LLM timeline caption);
    ``source`` says where the text came from: ``template``, ``timeline`` (LLM, cached) or
    ``empty`` (no audible event).
    """

    mixture_id: str
    caption: str
    template: str
    source: str


@dataclass(frozen=True)
class Cluster:
    """One cluster of the phrase inventory (row of ``clusters/clusters.parquet``).

    ``parent_ids`` and ``child_ids`` are the nearest inventory clusters up and down the
    AudioSet hierarchy; ``ancestor_ids``/``descendant_ids`` close them transitively;
    ``near_synonym_ids`` are clusters whose centroids are at least the configured cosine
    similarity apart. A negative sampler must avoid all three for a positive cluster.
    """

    cluster_id: int
    mid: str
    name: str
    alternatives: tuple[str, ...]
    sources: tuple[str, ...]
    parent_ids: tuple[int, ...]
    child_ids: tuple[int, ...]
    ancestor_ids: tuple[int, ...]
    descendant_ids: tuple[int, ...]
    near_synonym_ids: tuple[int, ...]


@dataclass(frozen=True)
class PhraseAssignment:
    """One phrase of the phrase database and its cluster (row of ``clusters/phrases.parquet``).

    ``method`` is ``mid`` (the label's MID is a cluster of the inventory) or ``sbert``
    (nearest centroid by cosine); ``similarity`` is the cosine to the cluster's centroid in
    both cases. ``count`` is how many mixtures use the phrase; inventory alternatives that no
    mixture uses have ``count`` 0 and ``source`` ``inventory``.
    """

    phrase: str
    label: str
    mid: str
    cluster_id: int
    cluster_name: str
    similarity: float
    method: str
    count: int
    source: str


@dataclass(frozen=True)
class AudioFile:
    """The Hugging Face ``Audio`` storage: encoded file bytes and a file name."""

    bytes: bytes
    path: str


@dataclass(frozen=True)
class ShardPhrase:
    """One labelled phrase of a shard row: a :class:`LabelPhrase` with its cluster."""

    phrase: str
    label: str
    mid: str
    cluster_id: int
    segments: tuple[TimeSpan, ...]
    source_clip_ids: tuple[str, ...]
    snr_db: tuple[float, ...]


@dataclass(frozen=True)
class ImportedRegion:
    """One annotated time region of a real clip, as a corpus reader parses it.

    ``label`` and ``mid`` name the class (``mid`` empty where the corpus has none); ``text``
    is the region's free-text caption for strong-caption corpora (TACOS) and empty for
    label-only corpora, whose phrase then comes from the label. ``[onset_s, offset_s)`` is in
    seconds from the clip's start.
    """

    label: str
    mid: str
    text: str
    onset_s: float
    offset_s: float


@dataclass(frozen=True)
class ImportedClip:
    """One clip of a real strong-label corpus, as a corpus reader parses it (before any audio is read).

    ``audio_path`` is relative to the corpus root given to the reader; ``split`` is one of
    :data:`SPLITS`; ``captions`` are the clip's own (weak, clip-level) captions, empty for a
    label-only corpus (its caption then comes from the templates); ``license`` and
    ``attribution`` as the corpus states them (empty if it does not).
    """

    clip_id: str
    audio_path: str
    split: str
    captions: tuple[str, ...]
    regions: tuple[ImportedRegion, ...]
    license: str
    attribution: str


@dataclass(frozen=True)
class ShardRow:
    """One mixture as a row of the published Parquet shards (``data/<split>-*.parquet``).

    ``audio_sha256`` is the hex sha256 of ``audio.bytes`` taken when the row was written, so a
    damaged cell is found without decoding it.
    """

    id: str
    audio: AudioFile
    audio_sha256: str
    sample_rate_hz: int
    duration_s: float
    caption: str
    phrases: tuple[ShardPhrase, ...]
    background_id: str
    split: str
    license: str
    licenses: tuple[str, ...]
    attribution: tuple[str, ...]
    seed: int


_ARROW_TYPES: dict[object, pa.DataType] = {
    str: pa.string(),
    int: pa.int64(),
    float: pa.float64(),
    bool: pa.bool_(),
    bytes: pa.binary(),
    tuple[Float32, ...]: pa.list_(pa.float32()),
    tuple[float, ...]: pa.list_(pa.float64()),
    tuple[str, ...]: pa.list_(pa.string()),
    tuple[int, ...]: pa.list_(pa.int64()),
}


def _arrow_type(hint: object) -> pa.DataType:
    if typing.get_origin(hint) is typing.Literal:
        return pa.string()
    if dataclasses.is_dataclass(hint):
        return pa.struct(arrow_schema(hint))
    if typing.get_origin(hint) is tuple and dataclasses.is_dataclass(typing.get_args(hint)[0]):
        return pa.list_(pa.struct(arrow_schema(typing.get_args(hint)[0])))
    return _ARROW_TYPES[hint]


def columns(record_type: type) -> tuple[str, ...]:
    """A record's column names in file order: its ``COLUMNS`` if it has them, else its field order.

    A record that shares fields through a base class lists ``COLUMNS``, because a base's fields
    come first in field order and the published manifests have their own order.
    """
    names = tuple(f.name for f in dataclasses.fields(record_type))
    order = getattr(record_type, "COLUMNS", names)
    if sorted(order) != sorted(names):
        raise TypeError(
            f"{record_type.__name__}.COLUMNS {list(order)} must name each of its fields exactly once: {sorted(names)}"
        )
    return order


def arrow_schema(record_type: type) -> pa.Schema:
    """The Parquet schema of a record dataclass (columns in :func:`columns` order, none nullable).

    Nested records become structs, tuples of records lists of structs; floats are float64
    except :data:`Float32` (envelopes).
    """
    hints = typing.get_type_hints(record_type)
    return pa.schema([pa.field(name, _arrow_type(hints[name]), nullable=False) for name in columns(record_type)])


@functools.cache
def _hints(record_type: type) -> dict:
    return typing.get_type_hints(record_type)


def _identity(value: object) -> object:
    return value


@functools.cache
def _converter(hint: object):
    """The function that turns a value read back from Arrow (dicts and lists) into ``hint``'s Python type.

    Built once per annotation: records recurse field by field, tuples of records or tuples element by
    element, and a tuple of plain values (an envelope's thousands of floats) is one ``tuple(list)``.
    """
    if dataclasses.is_dataclass(hint):
        hints = _hints(hint)
        fields = [(f.name, _converter(hints[f.name])) for f in dataclasses.fields(hint)]
        return lambda value: hint(**{name: convert(value[name]) for name, convert in fields})
    if typing.get_origin(hint) is tuple:
        inner = typing.get_args(hint)[0]
        if dataclasses.is_dataclass(inner) or typing.get_origin(inner) is tuple:
            convert = _converter(inner)
            return lambda value: tuple(convert(v) for v in value)
        return tuple
    return _identity


def _as_record(hint: object, value: object) -> object:
    """A value read back from Arrow (dicts and lists) -> the annotation's Python type."""
    return _converter(hint)(value)


def _as_arrow(value: object) -> object:
    if dataclasses.is_dataclass(value):
        return {f.name: _as_arrow(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return [_as_arrow(v) for v in value]
    return value


def to_table(records: list, record_type: type) -> pa.Table:
    """Records of one dataclass type -> an Arrow table with the type's schema."""
    schema = arrow_schema(record_type)
    columns = {name: [_as_arrow(getattr(r, name)) for r in records] for name in schema.names}
    return pa.Table.from_pydict(columns, schema=schema)


FROM_TABLE_BATCH_ROWS = 4096


def from_table(table: pa.Table, record_type: type, fill: typing.Mapping[str, object] | None = None) -> list:
    """An Arrow table written by :func:`to_table` -> records (lists become tuples, structs records).

    ``fill`` gives fields that are not read but set to the value given in every record (a column
    the caller keeps in another form, e.g. ``{"envelope_db": ()}``)."""
    fill = dict(fill or {})
    names = [f.name for f in dataclasses.fields(record_type) if f.name not in fill]
    # a batch of rows at a time: the whole table's row dicts at once would double the peak beside the records
    return [
        _as_record(record_type, {**row, **fill})
        for batch in table.select(names).to_batches(max_chunksize=FROM_TABLE_BATCH_ROWS)
        for row in batch.to_pylist()
    ]
