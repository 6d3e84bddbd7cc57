"""Records and their Parquet layout: shared excerpt fields, the manifests' published column order, round trips."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import pyarrow as pa
import pytest

from pipeline.schema import BackgroundSegment, EventClip, SourceExcerpt, arrow_schema, columns, from_table, to_table

# The column order of events/manifest.parquet and backgrounds/manifest.parquet as published.
EVENT_COLUMNS = [
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
    "duration_s",
    "num_samples",
    "sample_rate_hz",
    "source_sample_rate_hz",
    "source_channels",
    "rms_dbfs",
    "peak_dbfs",
    "loudness_lufs",
    "envelope_frame_s",
    "envelope_hop_s",
    "envelope_db",
    "license_url",
    "license",
    "uploader",
    "title",
]
BACKGROUND_COLUMNS = [
    "segment_id",
    "audio_path",
    "source_id",
    "source_path",
    "category",
    "offset_in_source_s",
    "duration_s",
    "num_samples",
    "sample_rate_hz",
    "source_sample_rate_hz",
    "source_channels",
    "rms_dbfs",
    "peak_dbfs",
    "loudness_lufs",
    "peak_to_median_db",
    "envelope_frame_s",
    "envelope_hop_s",
    "envelope_db",
    "license",
    "author",
]


def _shared() -> dict:
    return dict(
        audio_path="audio/x.flac",
        source_id="x",
        source_path="x.wav",
        duration_s=1.5,
        num_samples=24000,
        sample_rate_hz=16000,
        source_sample_rate_hz=44100,
        source_channels=2,
        rms_dbfs=-20.0,
        peak_dbfs=-3.0,
        loudness_lufs=-21.5,
        envelope_frame_s=0.04,
        envelope_hop_s=0.02,
        envelope_db=(-30.0, -25.5),
        license="CC0",
    )


def test_manifests_keep_their_published_column_order() -> None:
    assert arrow_schema(EventClip).names == EVENT_COLUMNS
    assert arrow_schema(BackgroundSegment).names == BACKGROUND_COLUMNS
    assert arrow_schema(EventClip).field("envelope_db").type == pa.list_(pa.float32())


def test_the_excerpt_fields_are_declared_once() -> None:
    shared = [f.name for f in dataclasses.fields(SourceExcerpt)]
    for record in (EventClip, BackgroundSegment):
        assert issubclass(record, SourceExcerpt)
        own = [f.name for f in dataclasses.fields(record) if f.name not in shared]
        assert not set(own) & set(shared), f"{record.__name__} redeclares a SourceExcerpt field"


def test_excerpt_records_round_trip_through_arrow() -> None:
    clip = EventClip(
        **_shared(),
        clip_id="fsd50k-1",
        source_dataset="fsd50k",
        source_split="train",
        label="Bark",
        mid="/m/05tny_",
        audioset_name="Bark",
        onset_in_source_s=0.25,
        offset_in_source_s=1.75,
        license_url="http://cc0",
        uploader="u",
        title="t",
    )
    segment = BackgroundSegment(
        **_shared(), segment_id="park-0000", category="ambiance", offset_in_source_s=10.0, peak_to_median_db=4.0, author="a"
    )
    assert from_table(to_table([clip], EventClip), EventClip) == [clip]
    assert from_table(to_table([segment], BackgroundSegment), BackgroundSegment) == [segment]
    assert to_table([clip], EventClip).column_names == EVENT_COLUMNS


def test_columns_must_name_every_field_exactly_once() -> None:
    @dataclass(frozen=True)
    class Plain:
        b: int
        a: int

    @dataclass(frozen=True)
    class Missing:
        a: int
        b: int
        COLUMNS: ClassVar[tuple[str, ...]] = ("a",)

    @dataclass(frozen=True)
    class Repeated:
        a: int
        b: int
        COLUMNS: ClassVar[tuple[str, ...]] = ("a", "a", "b")

    assert columns(Plain) == ("b", "a")
    for bad in (Missing, Repeated):
        with pytest.raises(TypeError, match="exactly once"):
            columns(bad)
