"""What a shard file's columns and a row's phrases must hold before anything trains or scores on
them: one rule for ``sedsynth validate``, the trainer and the evaluator.

:func:`column_problem`: an Arrow schema and a column name -> why the readers cannot read that
column (its type), or ``None``. :func:`phrase_problems`: a row's ``phrases`` as pyarrow's
``to_pylist`` gives them (dicts, any of which a damaged or hand-made file may have left null),
its ``duration_s`` (``math.inf`` when the file has no such column) and the cluster ids the
inventory knows (``None``: not checked) -> the problems found, each a message without the file
and row prefix (none: the phrases are usable).
"""

from __future__ import annotations

import math
from collections.abc import Container

import pyarrow as pa

END_SLACK_S = 1e-6  # an end at the mixture's last sample may round past duration_s


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def segment_ok(segment: object, duration_s: float) -> bool:
    """A segment ``{start_s, end_s}`` of numbers with ``0 <= start_s < end_s <= duration_s``."""
    if not isinstance(segment, dict):
        return False
    start, end = segment.get("start_s"), segment.get("end_s")
    return _finite(start) and _finite(end) and 0.0 <= start < end <= duration_s + END_SLACK_S


def phrase_problems(phrases: object, duration_s: object, cluster_ids: Container[int] | None = None) -> list[str]:
    """Every fault of a row's phrases: nulls, segments that are not numbers, negative, empty,
    reversed or past ``duration_s``, and cluster ids outside ``cluster_ids``."""
    if not (isinstance(duration_s, (int, float)) and not isinstance(duration_s, bool) and duration_s > 0):  # NaN fails too
        return [f"malformed row: duration_s is {duration_s!r}, not a positive number of seconds"]
    if not isinstance(phrases, list):
        return ["malformed row: phrases is null"]
    problems = []
    for ph in phrases:
        if not isinstance(ph, dict):
            problems.append("malformed row: a phrase is null")
            continue
        label = ph.get("label")
        if not isinstance(label, str):
            problems.append(f"malformed row: the label of phrase {ph.get('phrase')!r} is null")
        if not isinstance(ph.get("phrase"), str) or not ph["phrase"].strip():
            problems.append(f"malformed row: the phrase of {label!r} is null or empty")
        segments = ph.get("segments")
        if not isinstance(segments, list):
            problems.append(f"malformed row: the segments of {label!r} are null")
        else:
            problems += [f"segment {s} of {label!r} is outside [0, {duration_s}] s, empty, reversed or not a number"
                         for s in segments if not segment_ok(s, duration_s)]
        if cluster_ids is not None and ph.get("cluster_id") not in cluster_ids:
            problems.append(f"cluster id {ph.get('cluster_id')} of {label!r} is not in clusters/clusters.parquet")
    return problems


def _text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _id(t: pa.DataType) -> bool:
    return _text(t) or pa.types.is_integer(t)  # a caption corpus on the hub may number its clips


def _fields(t: pa.DataType, of_list: bool = False) -> dict[str, pa.DataType]:
    """A struct's (``of_list``: a list of structs') field types by name; empty for any other type."""
    if of_list:
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
            return {}
        t = t.value_type
    return {f.name: f.type for f in t} if pa.types.is_struct(t) else {}


def _audio(t: pa.DataType) -> bool:
    b = _fields(t).get("bytes", pa.null())
    return pa.types.is_binary(b) or pa.types.is_large_binary(b)


def _phrases(t: pa.DataType) -> bool:
    f = _fields(t, of_list=True)
    segments = _fields(f.get("segments", pa.null()), of_list=True)
    return (_text(f.get("phrase", pa.null())) and _text(f.get("label", pa.string())) and pa.types.is_integer(f.get("cluster_id", pa.null()))
            and all(_number(segments.get(k, pa.null())) for k in ("start_s", "end_s")))


COLUMN_TYPES = {  # the columns the readers use: a test of the Arrow type, and what it should be
    "id": (_id, "a string or an integer"),
    "caption": (_text, "a string"),
    "duration_s": (_number, "a number"),
    "phrases": (_phrases, "a list of {phrase: string, label: string, cluster_id: integer, segments: [{start_s, end_s}]}"),
    "audio": (_audio, "a struct {bytes: binary, path: string} (datasets' Audio)"),
}


def column_problem(schema: pa.Schema, name: str, audio_column: str = "audio") -> str | None:
    """Why column ``name`` of ``schema`` cannot be read (one line naming it), else ``None``.

    ``audio_column`` is read as ``audio``; a column of no known role (a caption corpus's caption
    columns) must be a string. An absent column is ``None`` here: whether it is needed is the reader's call.
    """
    if name not in schema.names:
        return None
    test, want = COLUMN_TYPES.get("audio" if name == audio_column else name, (_text, "a string"))
    t = schema.field(name).type
    return None if test(t) else f"column {name!r} is {t}, not {want}"
