"""The mix stage's folder: file names the later stages read, and the record each table holds.

A mixtures folder holds ``audio/<split>/<mixture_id>.flac``; the tables :data:`MIXTURES`
(:class:`~pipeline.schema.MixtureRecipe`), :data:`OCCURRENCES`
(:class:`~pipeline.schema.EventOccurrence`) and :data:`SEGMENTS`
(:class:`~pipeline.schema.LabelSegment`); ``metadata/<split>/events.tsv`` and
``durations.tsv``; :data:`LICENSES`, :data:`ATTRIBUTION`, :data:`TIMELINES` and :data:`SPEC`.
"""

from __future__ import annotations

from pipeline.schema import EventOccurrence, LabelSegment, MixtureRecipe

MIXTURES = "mixtures.parquet"
OCCURRENCES = "occurrences.parquet"
SEGMENTS = "segments.parquet"
RECORDS = {MIXTURES: MixtureRecipe, OCCURRENCES: EventOccurrence, SEGMENTS: LabelSegment}
METADATA = "metadata"
LICENSES = "licenses.json"
ATTRIBUTION = "attribution.csv"
TIMELINES = "timelines.png"
SPEC = "spec.json"


def mixture_id(split: str, index: int) -> str:
    return f"{split}_{index:07d}"


def audio_path(split: str, index: int) -> str:
    """Where mixture ``index`` of ``split`` is stored, relative to the folder."""
    return f"audio/{split}/{mixture_id(split, index)}.flac"
