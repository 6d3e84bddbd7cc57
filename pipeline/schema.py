"""Every record the pipeline writes, with units in the field names.

Each record is a frozen dataclass; :func:`arrow_schema` derives its Parquet schema from the
annotations, so a manifest column exists if and only if the dataclass has the field.

Conventions: times in seconds (``_s``), rates in hertz (``_hz``), levels in decibels
(``_db``, ``_dbfs`` relative to digital full scale, ``_lufs`` per ITU-R BS.1770). Paths in
manifests are relative to the manifest's own folder (outputs) or to the source root (inputs).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

import pyarrow as pa

SkipReason = typing.Literal[
    "malformed-row",      # a metadata row that does not parse
    "missing-file",       # the row names a file that does not exist
    "unreadable",         # the decoder rejects the file (corrupt, unknown format)
    "empty",              # zero samples
    "non-finite",         # NaN or infinite samples
    "silent",             # RMS below the silence floor
    "digital-silence",    # a run of exact zeros longer than allowed
    "clipped",            # too many samples at full scale
    "multi-label",        # more than one leaf label (clipping takes single-label clips only)
    "no-label",           # an empty label list
    "no-segment",         # no window above the energy threshold
    "too-short",          # segment or recording shorter than the minimum
    "too-long",           # segment longer than the maximum
    "filtered-category",  # the ambience filter does not select this recording
    "not-in-metadata",    # an audio file the metadata CSV does not list
    "salient-event",      # a background segment with a transient above the salience limit
    "license-not-allowed",  # the source's licence is not in mix.allowed_licenses
    "unexpected-error",   # anything else; the detail holds the exception
]


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
    energy_db: tuple[float, ...]


@dataclass(frozen=True)
class EventClip:
    """One clean single-event clip cut from a source clip (row of ``events/manifest.parquet``).

    ``envelope_db`` is the A-weighted frame energy of the stored audio in dB re full scale,
    frame ``k`` starting at ``k * envelope_hop_s``; mixing scales it by the event gain
    (``+ gain_db``) instead of re-analysing the audio.
    """

    clip_id: str
    audio_path: str
    source_dataset: str
    source_id: str
    source_split: str
    source_path: str
    label: str
    mid: str
    audioset_name: str
    onset_in_source_s: float
    offset_in_source_s: float
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
    envelope_db: tuple[float, ...]
    license_url: str
    license: str
    uploader: str
    title: str


@dataclass(frozen=True)
class BackgroundSegment:
    """One background segment cut from an ambience recording (row of ``backgrounds/manifest.parquet``)."""

    segment_id: str
    audio_path: str
    source_id: str
    source_path: str
    category: str
    offset_in_source_s: float
    duration_s: float
    num_samples: int
    sample_rate_hz: int
    source_sample_rate_hz: int
    source_channels: int
    rms_dbfs: float
    peak_dbfs: float
    loudness_lufs: float
    peak_to_median_db: float
    envelope_frame_s: float
    envelope_hop_s: float
    envelope_db: tuple[float, ...]
    license: str
    author: str


@dataclass(frozen=True)
class MixtureRecipe:
    """Everything needed to re-render one mixture (row of ``mixtures/mixtures.parquet``).

    The occurrences live in ``occurrences.parquet`` (joined on ``mixture_id``). Levels: the
    background is scaled by ``background_gain_db``, each occurrence by its ``gain_db``, their
    sum by ``mixture_gain_db`` (normalisation); ``peak_dbfs`` is that of the stored audio. ``license`` is the most restrictive licence among the sources.
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


@dataclass(frozen=True)
class EventOccurrence:
    """One placement of (part of) an event clip in a mixture (row of ``occurrences.parquet``).

    Samples ``[source_in_s, source_out_s)`` of clip ``clip_id`` sound at ``[onset_s, offset_s)``
    of the mixture, scaled by ``gain_db``. Occurrences of one sampled event (repeats, or the
    pieces of a split event) share ``event_index`` and ``gain_db``. ``snr_db`` is the value
    drawn; ``realised_snr_db`` is measured on the rendered signals in the spec's level mode
    (for pieces, the draw applies to the whole event, so a piece's realised value may differ).
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


_ARROW_TYPES: dict[object, pa.DataType] = {
    str: pa.string(),
    int: pa.int64(),
    float: pa.float64(),
    bool: pa.bool_(),
    tuple[float, ...]: pa.list_(pa.float32()),
    tuple[str, ...]: pa.list_(pa.string()),
}


def arrow_schema(record_type: type) -> pa.Schema:
    """The Parquet schema of a record dataclass (field order kept, none nullable)."""
    hints = typing.get_type_hints(record_type)
    fields = []
    for f in dataclasses.fields(record_type):
        hint = hints[f.name]
        if typing.get_origin(hint) is typing.Literal:
            hint = str
        fields.append(pa.field(f.name, _ARROW_TYPES[hint], nullable=False))
    return pa.schema(fields)


def to_table(records: list, record_type: type) -> pa.Table:
    """Records of one dataclass type -> an Arrow table with the type's schema."""
    schema = arrow_schema(record_type)
    columns = {name: [getattr(r, name) for r in records] for name in schema.names}
    return pa.Table.from_pydict(columns, schema=schema)


def from_table(table: pa.Table, record_type: type) -> list:
    """An Arrow table written by :func:`to_table` -> records (list columns become tuples)."""
    names = [f.name for f in dataclasses.fields(record_type)]
    rows = table.select(names).to_pylist()
    return [record_type(**{k: tuple(v) if isinstance(v, list) else v for k, v in r.items()}) for r in rows]
