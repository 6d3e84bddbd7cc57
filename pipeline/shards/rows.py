"""What a shard file's columns and a row's phrases must hold before anything trains or scores on
them: one rule for ``sedsynth validate``, the trainer and the evaluator.

:func:`column_problem`: an Arrow schema and a column name -> why the readers cannot read that
column (its type), or ``None``. :func:`phrase_faults`: a row's ``phrases`` as pyarrow's
``to_pylist`` gives them (dicts, any of which a damaged or hand-made file may have left null),
its ``duration_s`` (``math.inf`` when the file has no such column) and the cluster ids the
inventory knows (``None``: not checked) -> the faults found, each ``(skip reason, message)``
without the file and row prefix (none: the phrases are usable); :func:`phrase_problems` gives
the messages alone. A label holding a tab, a line break or another control character
(:func:`text_problem`) is a ``bad-label`` fault: labels become cells of DCASE TSV files, which
are read line by line. :func:`audio_fault`: an audio cell's bytes and the row's ``duration_s``
-> ``(reason, message)`` when they do not decode whole, or hold more than ``duration_s``
(told from the header, before any frame is decoded), else ``None``. :func:`name_problem`: why
a row id cannot name the files a reader writes for it. :func:`combined` joins a row's faults
into the one skip it becomes.
"""

from __future__ import annotations

import math
from collections.abc import Container
from pathlib import Path

import pyarrow as pa

from pipeline.audio import AudioError, decoded_frames
from pipeline.schema import text_problem

END_SLACK_S = 1e-6  # an end at the mixture's last sample may round past duration_s


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def segment_ok(segment: object, duration_s: float) -> bool:
    """A segment ``{start_s, end_s}`` of numbers with ``0 <= start_s < end_s <= duration_s``."""
    if not isinstance(segment, dict):
        return False
    start, end = segment.get("start_s"), segment.get("end_s")
    return _finite(start) and _finite(end) and 0.0 <= start < end <= duration_s + END_SLACK_S


Fault = tuple[str, str]  # (skip reason, message without the file and row prefix)

SHOWN_CHARS = 80  # of an untrusted text quoted in a message


def shown(text: object) -> str:
    """``repr(text)`` cut to :data:`SHOWN_CHARS` characters, for a one-line message (a label may be megabytes)."""
    if isinstance(text, str) and len(text) > SHOWN_CHARS:
        return repr(text[:SHOWN_CHARS]) + f"... ({len(text)} characters)"
    return repr(text)


def label_problem(label: str) -> str | None:
    """A ``bad-label`` message for a label that cannot be a DCASE TSV cell (:func:`text_problem`), else ``None``."""
    problem = text_problem(label)
    return (
        None
        if problem is None
        else (f"the label {shown(label)} {problem}, which would forge rows of the DCASE TSV files; rename it")
    )


def phrase_faults(phrases: object, duration_s: object, cluster_ids: Container[int] | None = None) -> list[Fault]:
    """Every fault of a row's phrases, as ``(reason, message)``: nulls, segments that are not numbers,
    negative, empty, reversed or past ``duration_s``, cluster ids outside ``cluster_ids``
    (``malformed-row``), and labels that cannot be a TSV cell (``bad-label``)."""
    if not (isinstance(duration_s, (int, float)) and not isinstance(duration_s, bool) and duration_s > 0):  # NaN fails too
        return [("malformed-row", f"malformed row: duration_s is {duration_s!r}, not a positive number of seconds")]
    if not isinstance(phrases, list):
        return [("malformed-row", "malformed row: phrases is null")]
    faults: list[Fault] = []
    for ph in phrases:
        if not isinstance(ph, dict):
            faults.append(("malformed-row", "malformed row: a phrase is null"))
            continue
        label = ph.get("label")
        if not isinstance(label, str):
            faults.append(("malformed-row", f"malformed row: the label of phrase {shown(ph.get('phrase'))} is null"))
        elif (problem := label_problem(label)) is not None:
            faults.append(("bad-label", problem))
        if not isinstance(ph.get("phrase"), str) or not ph["phrase"].strip():
            faults.append(("malformed-row", f"malformed row: the phrase of {shown(label)} is null or empty"))
        segments = ph.get("segments")
        if not isinstance(segments, list):
            faults.append(("malformed-row", f"malformed row: the segments of {shown(label)} are null"))
        else:
            faults += [
                (
                    "malformed-row",
                    f"segment {s} of {shown(label)} is outside [0, {duration_s}] s, empty, reversed or not a number",
                )
                for s in segments
                if not segment_ok(s, duration_s)
            ]
        if cluster_ids is not None and ph.get("cluster_id") not in cluster_ids:
            faults.append(
                ("malformed-row", f"cluster id {ph.get('cluster_id')} of {shown(label)} is not in clusters/clusters.parquet")
            )
    return faults


def phrase_problems(phrases: object, duration_s: object, cluster_ids: Container[int] | None = None) -> list[str]:
    """The messages of :func:`phrase_faults`."""
    return [message for _, message in phrase_faults(phrases, duration_s, cluster_ids)]


def audio_fault(data: object, duration_s: float | None = None) -> Fault | None:
    """Why a row's audio cannot be used, as ``(reason, message)``, else ``None``.

    ``data``: the cell's bytes (a path: a file, for readers of files); ``duration_s``: the most it
    may hold (the row's mixture), checked from the header before any frame is decoded
    (``too-long``). The audio is then decoded through a block at a time, nothing kept
    (:func:`~pipeline.audio.decoded_frames`): ``unreadable`` (garbage, a truncated FLAC),
    ``empty``, ``non-finite``. A cell without bytes is ``malformed-row``.
    """
    if not isinstance(data, (bytes, str, Path)):
        return ("malformed-row", "the audio cell has no bytes")
    try:
        decoded_frames(data, duration_s)
    except AudioError as e:
        return (e.reason, e.detail)
    return None


NAME_MAX_BYTES = 240  # of an id in UTF-8: with ".tsv" or ".png" it stays inside a file name's 255 bytes


def name_problem(name: object) -> str | None:
    """Why a row id cannot name the files a reader writes for it (``<id>.tsv``, ``<id>.png``) and
    be a TSV cell: not a non-empty string, a path separator, ``.`` or ``..``, longer than
    :data:`NAME_MAX_BYTES`, or :func:`text_problem`."""
    if not isinstance(name, str) or not name:
        return "the id is null or empty"
    if "/" in name or "\\" in name or name in (".", ".."):
        return f"the id {shown(name)} is not a plain file name (a path separator, '.' or '..')"
    if len(name) > NAME_MAX_BYTES or len(name.encode("utf-8", "replace")) > NAME_MAX_BYTES:
        return f"the id {shown(name)} is longer than the {NAME_MAX_BYTES} bytes a file name can take"
    problem = text_problem(name)
    return None if problem is None else f"the id {shown(name)} {problem}"


def combined(faults: list[Fault]) -> Fault | None:
    """A row's faults as one skip: the first fault's reason and every message, in order; ``None`` for none."""
    return (faults[0][0], "; ".join(m for _, m in faults)) if faults else None


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
    return (
        _text(f.get("phrase", pa.null()))
        and _text(f.get("label", pa.string()))
        and pa.types.is_integer(f.get("cluster_id", pa.null()))
        and all(_number(segments.get(k, pa.null())) for k in ("start_s", "end_s"))
    )


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
