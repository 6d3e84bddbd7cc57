"""Readers for public evaluation benchmarks already on disk.

Input: the paths of one benchmark in its released layout (DESED, URBAN-SED, AudioSet-Strong,
AudioGrounding, AudioCaps, Clotho, ESC-50, UrbanSound8K). Nothing is downloaded; ``soundfile.info``
is read for durations when the benchmark ships none, and a sound event detection set's audio is
decoded through once, a block at a time with nothing kept (:func:`~pipeline.shards.rows.audio_fault`,
the rule the shards are read by), so a clip that does not decode is left out before the classes
are assembled: no class is scored without its ground truth. The other sets' audio is not decoded.
Output: one small frozen structure per benchmark, every dict sorted by clip id:

- :class:`SedSet` (closed-vocabulary sound event detection: DESED, URBAN-SED, AudioSet-Strong),
  with same-class overlapping or touching events merged;
- :class:`GroundingSet` (text-to-audio grounding: AudioGrounding);
- :class:`RetrievalSet` (audio-caption retrieval: AudioCaps, Clotho);
- :class:`ClassificationSet` (zero-shot classification: ESC-50, UrbanSound8K).

The sound event detection sets are parsed by the corpus readers of :mod:`pipeline.imports`, the
same code that imports them as training data, so both see the same events in the same files. A
ground-truth row or clip those readers cannot use is left out with its reason: it is kept in
``SedSet.skips`` and the count is warned about in one line (a clip whose every row was skipped
is left out rather than scored as a clip without events). So is an event whose label holds a
tab, a line break or another control character (``bad-label``,
:func:`~pipeline.shards.rows.label_problem`): the class names become cells of the score files'
TSV header.

For the other sets, clips whose audio file is absent are dropped with one warning that gives
their count, and malformed files raise :class:`BenchmarkError` naming the file, the line (or
JSON item) and the problem. When no audio file is found at all, or a given path does not
exist, :class:`BenchmarkMissing` names the path and the ``evaluate.benchmarks.<kind>.<key>``
parameter to set. :func:`read_benchmark` dispatches on the benchmark kind with the keyword
paths from params.
"""

from __future__ import annotations

import csv
import inspect
import json
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import soundfile as sf

from pipeline.imports import audioset_strong, dcase, urban_sed
from pipeline.schema import ImportedRegion, Skip
from pipeline.shards.rows import audio_fault, label_problem


class BenchmarkMissing(FileNotFoundError):
    """A benchmark's files are not where params say; message says which path and what to set."""


class BenchmarkError(ValueError):
    """Files exist but are malformed; message names the file, line/row and the problem."""


@dataclass(frozen=True)
class SedSet:
    """Closed-vocabulary sound event detection (DESED, URBAN-SED, AudioSet-Strong).

    ``skips`` lists every ground-truth row and clip the corpus reader left out, with its reason.
    """

    name: str
    audio: dict[str, str]
    ground_truth: dict[str, list[tuple[float, float, str]]]
    durations_s: dict[str, float]
    classes: tuple[str, ...]
    queries: dict[str, str]
    alpha_st: float = 1.0
    skips: tuple[Skip, ...] = ()


@dataclass(frozen=True)
class GroundingSet:
    """Text-to-audio grounding (AudioGrounding): per clip, its own phrases and their segments."""

    name: str
    audio: dict[str, str]
    phrases: dict[str, list[tuple[str, tuple[tuple[float, float], ...]]]]
    durations_s: dict[str, float]


@dataclass(frozen=True)
class RetrievalSet:
    """Audio-caption retrieval (AudioCaps, Clotho)."""

    name: str
    audio: dict[str, str]
    captions: dict[str, tuple[str, ...]]


@dataclass(frozen=True)
class ClassificationSet:
    """Zero-shot classification (ESC-50, UrbanSound8K)."""

    name: str
    audio: dict[str, str]
    labels: dict[str, str]
    classes: tuple[str, ...]
    queries: dict[str, str]


AUDIO_EXTENSIONS = (".wav", ".flac", ".mp3", ".ogg")

_PATH_HELP: dict[str, dict[str, str]] = {
    "desed": {
        "audio_dir": "the DESED eval audio folder",
        "events_tsv": "the DESED eval events TSV",
        "durations_tsv": "the DESED eval durations TSV",
    },
    "urbansed": {"root": "the URBAN-SED root folder (holding audio/ and annotations/)"},
    "audioset_strong": {
        "audio_dir": "the AudioSet-Strong eval audio folder",
        "segments_tsv": "the AudioSet-Strong eval segments TSV",
    },
    "audiogrounding": {
        "audio_dir": "the AudioGrounding test audio folder",
        "json_path": "the AudioGrounding test label JSON",
    },
    "audiocaps": {
        "audio_dir": "the AudioCaps test audio folder",
        "captions_csv": "the AudioCaps test captions CSV",
    },
    "clotho": {
        "audio_dir": "the Clotho evaluation audio folder",
        "captions_csv": "clotho_captions_evaluation.csv",
    },
    "esc50": {"root": "the ESC-50 root folder (holding meta/ and audio/)"},
    "us8k": {"root": "the UrbanSound8K root folder (holding metadata/ and audio/)"},
}


def _missing_message(kind: str, key: str, path: Path | str, problem: str = "does not exist") -> str:
    return (
        f"benchmark {kind}: {path} {problem}; set evaluate.benchmarks.{kind}.{key} "
        f"to {_PATH_HELP[kind][key]}, or remove the entry"
    )


def _need(kind: str, key: str, path: Path | str) -> Path:
    path = Path(path)
    if not path.exists():
        raise BenchmarkMissing(_missing_message(kind, key, path))
    return path


def _strip_ext(name: str) -> str:
    for ext in AUDIO_EXTENSIONS:
        if name.lower().endswith(ext):
            return name[: -len(ext)]
    return name


def _query(name: str) -> str:
    return name.replace("_", " ").lower()


def _read_table(path: Path, columns: tuple[str, ...], delimiter: str) -> list[tuple[int, dict[str, str]]]:
    """Rows of a CSV/TSV with a header as (1-based line, {column: stripped value})."""
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    rows = []
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f, delimiter=delimiter, quoting=quoting)
        try:
            header = [h.strip() for h in reader.fieldnames or []]
            reader.fieldnames = header
            absent = [c for c in columns if c not in header]
            if absent:
                raise BenchmarkError(f"{path}: line 1: missing column(s) {', '.join(absent)}; the header is {header}")
            for row in reader:
                if None in row or any(row[c] is None for c in columns):
                    n = sum(v is not None for k, v in row.items() if k is not None) + len(row.get(None) or [])
                    raise BenchmarkError(f"{path}: line {reader.line_num}: {n} fields where the header has {len(header)}")
                rows.append((reader.line_num, {c: row[c].strip() for c in columns}))
        except csv.Error as e:
            raise BenchmarkError(f"{path}: line {reader.line_num}: {e}") from e
    return rows


def _number(value: Any, path: Path, where: str, what: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise BenchmarkError(f"{path}: {where}: {what} {value!r} is not a number") from None


def _duration_s(path: str) -> float:
    try:
        info = sf.info(path)
    except RuntimeError as e:
        raise BenchmarkError(f"{path}: cannot read the audio header: {e}") from e
    return info.frames / info.samplerate


def _keep_present(kind: str, key: str, audio_dir: Path, candidates: dict[str, list[Path]]) -> dict[str, str]:
    """clip id -> the first candidate file that exists; absent clips are warned about and dropped."""
    audio = {}
    for clip in sorted(candidates):
        found = next((p for p in candidates[clip] if p.is_file()), None)
        if found is not None:
            audio[clip] = str(found)
    absent = sorted(set(candidates) - set(audio))
    if candidates and not audio:
        example = candidates[absent[0]][0]
        raise BenchmarkMissing(
            f"benchmark {kind}: none of the {len(candidates)} audio files is under {audio_dir} "
            f"(looked for e.g. {example}); set evaluate.benchmarks.{kind}.{key} to "
            f"{_PATH_HELP[kind][key]}, or remove the entry"
        )
    if absent:
        warnings.warn(
            f"benchmark {kind}: {len(absent)} of {len(candidates)} clips have no audio file under "
            f"{audio_dir} and are left out (e.g. {candidates[absent[0]][0].name})",
            stacklevel=3,
        )
    return audio


def _merge_spans(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of intervals: overlapping or touching spans become one."""
    merged: list[list[float]] = []
    for onset, offset in sorted(spans):
        if merged and onset <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], offset)
        else:
            merged.append([onset, offset])
    return [(a, b) for a, b in merged]


def _checked_span(path: Path, where: str, onset: float, offset: float) -> tuple[float, float] | None:
    """The span, None when zero-length; inverted spans raise."""
    if offset < onset:
        raise BenchmarkError(f"{path}: {where}: offset {offset} is before onset {onset}")
    return None if offset == onset else (onset, offset)


SedClip = tuple[str, str, tuple[ImportedRegion, ...]]  # (clip id, audio file, regions) as a corpus reader found them


def _skip_line(name: str, clips: int, skips: list[Skip]) -> str:
    """One line: how many rows and clips were left out, by reason, and the first of them."""
    reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(Counter(s.reason for s in skips).items()))
    first = skips[0]
    return (
        f"benchmark {name}: {clips} clips read; {len(skips)} ground-truth rows or clips left out ({reasons}), "
        f"e.g. {first.item_id}: {first.detail}; SedSet.skips lists each"
    )


def _no_clip(name: str, key: str, audio_dir: Path, skips: list[Skip]) -> None:
    """Raise for a set without a usable clip: BenchmarkMissing when files were not found, else BenchmarkError."""
    absent = [s for s in skips if s.reason == "missing-file"]
    if absent:
        problem = f"holds none of the {len(absent)} audio files the annotations name (e.g. {absent[0].detail})"
    elif all(s.reason == "not-in-metadata" for s in skips):
        problem = "holds no annotated clip"
    else:
        raise BenchmarkError(
            f"benchmark {name}: no usable clip; {len(skips)} rows or clips left out: "
            + "; ".join(f"{s.path}: {s.detail}" for s in skips[:3])
        )
    raise BenchmarkMissing(_missing_message(name, key, audio_dir, problem))


def _sed_set(
    name: str,
    key: str,
    audio_dir: Path,
    clips: list[SedClip],
    skips: list[Skip],
    durations_s: dict[str, float],
    alpha_st: float = 1.0,
) -> SedSet:
    """A :class:`SedSet` from the clips a corpus reader found and the rows and clips it skipped.

    A region whose label cannot be a TSV cell is left out (``bad-label``), and a clip all of whose
    regions were so; a clip whose audio does not decode whole is left out with the decoder's
    reason (:func:`~pipeline.shards.rows.audio_fault`). Same-class regions that overlap or touch
    are merged; durations missing from ``durations_s`` come from the audio headers (a clip whose
    header does not read is left out as ``unreadable``); classes are the labels of the clips
    kept. The skips are kept in ``skips`` and counted in one warning. ``key`` names the path
    parameter to blame when no clip is left (:func:`_no_clip`).
    """
    skips = list(skips)
    kept: dict[str, SedClip] = {}
    durations: dict[str, float] = {}
    for clip, path, regions in sorted(clips):
        if clip in kept:
            skips.append(Skip(clip, path, "malformed-row", f"clip id {clip} is already taken by {kept[clip][1]}"))
            continue
        usable = []
        for r in regions:
            problem = label_problem(r.label)
            if problem is None:
                usable.append(r)
            else:
                skips.append(Skip(clip, path, "bad-label", problem))
        if regions and not usable:
            skips.append(Skip(clip, path, "bad-label", f"every event of clip {clip} has a label that cannot be a TSV cell"))
            continue
        fault = audio_fault(path)
        if fault is not None:
            skips.append(Skip(clip, path, fault[0], f"{path}: {fault[1]}"))
            continue
        regions = tuple(usable)
        try:
            durations[clip] = durations_s[clip] if clip in durations_s else _duration_s(path)
        except BenchmarkError as e:
            skips.append(Skip(clip, path, "unreadable", str(e)))
            continue
        kept[clip] = (clip, path, regions)
    if not kept:
        _no_clip(name, key, audio_dir, skips)
    if skips:
        warnings.warn(_skip_line(name, len(kept), skips), stacklevel=3)
    classes = tuple(sorted({r.label for _, _, regions in kept.values() for r in regions}))
    return SedSet(
        name=name,
        audio={clip: path for clip, path, _ in kept.values()},
        ground_truth={clip: _merged_events(regions) for clip, _, regions in kept.values()},
        durations_s=durations,
        classes=classes,
        queries={c: _query(c) for c in classes},
        alpha_st=alpha_st,
        skips=tuple(skips),
    )


def _merged_events(regions: Iterable[ImportedRegion]) -> list[tuple[float, float, str]]:
    """``(onset, offset, class)`` sorted, with same-class regions that overlap or touch merged."""
    by_label: dict[str, list[tuple[float, float]]] = {}
    for r in regions:
        by_label.setdefault(r.label, []).append((r.onset_s, r.offset_s))
    return sorted((a, b, label) for label, spans in by_label.items() for a, b in _merge_spans(spans))


def read_desed(audio_dir: Path | str, events_tsv: Path | str, durations_tsv: Path | str | None = None) -> SedSet:
    """DESED / DCASE task 4 strong labels -> :class:`SedSet` named ``desed``, parsed by :mod:`pipeline.imports.dcase`.

    Layout: ``events_tsv`` with header ``filename  onset  offset  event_label`` (tab separated,
    filename with ``.wav``; a row with only the file name states a clip without events), audio
    ``audio_dir/<filename>``, optional ``durations_tsv`` with header ``filename  duration``
    (without it, or for a clip it lacks, durations come from the audio headers). Clips are
    those named in either TSV (clip id = filename without its audio extension); a clip without
    strong events has an empty list. Every label is a class (the project's own mixtures are
    read here too); query = label in lower case with spaces for underscores.

    Left out and reported (:attr:`SedSet.skips`): a weak label (a label without times), times
    that are not numbers, a negative time or onset >= offset, a short row, a clip whose every
    row was skipped, a clip without audio, an unusable durations row (its clip then takes the
    audio header's duration).
    """
    audio_dir = _need("desed", "audio_dir", audio_dir)
    events_tsv = _need("desed", "events_tsv", events_tsv)
    rows, skips = dcase.read_strong_tsv(events_tsv, str(events_tsv))
    found, clip_skips = dcase.annotated_audio(audio_dir, rows, str(events_tsv), ".", _strip_ext, lambda label: "")
    skips += clip_skips
    clips: list[SedClip] = [(a.clip_id, str(audio_dir / a.audio_path), a.regions) for a in found]
    durations: dict[str, float] = {}
    if durations_tsv is not None:
        durations_tsv = _need("desed", "durations_tsv", durations_tsv)
        listed, duration_skips = dcase.read_durations_tsv(durations_tsv, str(durations_tsv))
        skips += duration_skips
        named = {r.filename for r in rows}  # a file the events TSV names keeps what it says, even when that is a skip
        for filename, seconds in listed.items():
            clip = _strip_ext(filename)
            if seconds is not None:
                durations[clip] = seconds
            if filename in named:
                continue
            if (audio_dir / filename).is_file():
                clips.append((clip, str(audio_dir / filename), ()))
            else:
                skips.append(Skip(clip, filename, "missing-file", f"{filename} not found ({durations_tsv} lists it)"))
    return _sed_set("desed", "audio_dir", audio_dir, clips, skips, durations)


def read_urbansed(root: Path | str, split: str = "test", format: str = "txt") -> SedSet:
    """URBAN-SED v2.0.0 -> :class:`SedSet` named ``urbansed``, parsed by :mod:`pipeline.imports.urban_sed`.

    Layout: audio ``root/audio/<split>/<name>.wav``; annotations
    ``root/annotations/<split>/<name>.txt`` (``onset<TAB>offset<TAB>label`` per line, no
    header) or ``<name>.jams`` (the ``scaper`` annotation's foreground observations, ``time``
    and ``time + duration`` their bounds, stored as a list or as JAMS 0.2 columns); ``format``
    picks the one read where both exist, and a soundscape with only the other is read from it.
    Clip id = file stem; durations come from the audio headers. Labels are the ten
    UrbanSound8K classes; the classes are those found (all ten on the full set).

    Left out and reported (:attr:`SedSet.skips`): a line or observation that does not parse, an
    unknown label, a negative time or onset >= offset, a soundscape whose every event was
    skipped, an annotation without audio and audio without an annotation.
    """
    root = _need("urbansed", "root", root)
    audio_dir, annotation_dir = root / "audio" / split, root / "annotations" / split
    for folder in (audio_dir, annotation_dir):
        if not folder.is_dir():
            raise BenchmarkMissing(
                _missing_message(
                    "urbansed", "root", folder, f"does not exist (split {split!r}; URBAN-SED has train, validate, test)"
                )
            )
    if format not in urban_sed.FORMATS:
        raise ValueError(f"benchmark urbansed: format {format!r}; one of {', '.join(urban_sed.FORMATS)}")
    soundscapes, skips = urban_sed.read_folder(root, split, format)
    clips: list[SedClip] = [(s.clip_id, str(root / s.audio_path), s.regions) for s in soundscapes]
    return _sed_set("urbansed", "root", audio_dir, clips, skips, {})


def read_audioset_strong(audio_dir: Path | str, segments_tsv: Path | str, class_names: dict[str, str] | None = None) -> SedSet:
    """AudioSet-Strong eval -> :class:`SedSet` named ``audioset_strong`` with ``alpha_st = 0``, parsed by
    :mod:`pipeline.imports.audioset_strong`.

    Layout: ``segments_tsv`` with header
    ``segment_id  start_time_seconds  end_time_seconds  label`` (tab separated, columns found by
    name, label a MID such as ``/m/09x0r``); audio in ``audio_dir`` under the importer's default
    file-name patterns (``<segment_id>.flac`` or ``.wav``, ``Y``-prefixed, and the other
    download layouts). Class = display name of the MID from the AudioSet ontology shipped in
    ``pipeline/data`` (the strong-label class list covers MIDs the ontology lacks);
    ``class_names`` (MID -> name) overrides both. Durations come from the audio headers.

    Left out and reported (:attr:`SedSet.skips`): a row that does not parse (segment id, field
    count, times), a negative time or onset >= offset, an unknown MID, a segment without audio.
    BenchmarkError when the header lacks a column.
    """
    audio_dir = _need("audioset_strong", "audio_dir", audio_dir)
    segments_tsv = _need("audioset_strong", "segments_tsv", segments_tsv)
    names = {**audioset_strong.class_names(None), **(class_names or {})}
    try:
        regions, skips = audioset_strong.read_segments_tsv(
            segments_tsv, names, "the AudioSet-Strong class list, the ontology nor class_names"
        )
    except audioset_strong.AudioSetStrongError as e:
        raise BenchmarkError(str(e)) from None
    finder = audioset_strong.AudioFinder(list(audioset_strong.DEFAULT_OPTIONS["patterns"]))
    clips: list[SedClip] = []
    for segment_id in sorted(regions):
        path, missing = audioset_strong.segment_audio(finder, audio_dir, segment_id, audio_dir)
        if path is None:
            skips.append(missing)
        else:
            clips.append((segment_id, str(path), tuple(regions[segment_id])))
    return _sed_set("audioset_strong", "audio_dir", audio_dir, clips, skips, {}, alpha_st=0.0)


def _grounding_records(path: Path) -> list[tuple[str, dict]]:
    """(where, record) of an AudioGrounding label file: JSON list, pandas column JSON or JSON lines."""
    text = path.read_text(encoding="utf-8")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        records = []
        for i, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    records.append((f"line {i}", json.loads(line)))
                except json.JSONDecodeError as e:
                    raise BenchmarkError(f"{path}: line {i}: not valid JSON ({e.msg})") from e
        return records
    if isinstance(doc, dict) and all(isinstance(v, dict) for v in doc.values()):
        index = list(next(iter(doc.values()), {}))
        return [(f"row {k}", {col: values.get(k) for col, values in doc.items()}) for k in index]
    if isinstance(doc, dict):
        return [("line 1", doc)]
    if isinstance(doc, list):
        return [(f"item {i}", r) for i, r in enumerate(doc, start=1)]
    raise BenchmarkError(f"{path}: expected a JSON list of objects, a column-oriented JSON object or JSON lines")


def _grounding_phrases(path: Path, where: str, record: object) -> tuple[str, list[tuple[str, str, list]]]:
    """(audio id, [(where, phrase, raw segments)]) of one record in either release layout."""
    if not isinstance(record, dict):
        raise BenchmarkError(f"{path}: {where}: expected a JSON object")
    audio_id = record.get("audio_id", record.get("filename"))
    if not isinstance(audio_id, str) or not audio_id:
        raise BenchmarkError(f"{path}: {where}: no 'audio_id' (or 'filename')")
    if "phrases" in record:
        items = [(f"{where}, phrase {j}", p) for j, p in enumerate(record["phrases"] or [], start=1)]
    else:
        items = [(where, record)]
    out = []
    for at, item in items:
        phrase = item.get("phrase") if isinstance(item, dict) else None
        if isinstance(phrase, list):
            phrase = " ".join(map(str, phrase))
        segments = item.get("segments", item.get("timestamps")) if isinstance(item, dict) else None
        if not isinstance(phrase, str) or not phrase.strip():
            raise BenchmarkError(f"{path}: {at}: no 'phrase'")
        if not isinstance(segments, list):
            raise BenchmarkError(f"{path}: {at}: no 'segments' or 'timestamps' list")
        out.append((at, phrase.strip(), segments))
    return audio_id, out


def read_audiogrounding(audio_dir: Path | str, json_path: Path | str) -> GroundingSet:
    """AudioGrounding (Xu et al., ICASSP 2021) -> :class:`GroundingSet` named ``audiogrounding``.

    Accepted label layouts (``json_path``):

    - v2 (Zenodo 10.5281/zenodo.7269161): a JSON list of audio items, each with ``audio_id``
      (``Y<youtube_id>.wav``) and ``phrases``, a list of ``{"phrase", "start_index",
      "end_index", "segments": [[onset, offset], ...]}``;
    - v1 (the original release): one record per phrase with ``audio_id`` or ``filename``,
      ``phrase`` and ``timestamps`` (``[[onset, offset], ...]``), either as a JSON list of
      records, as the column-oriented JSON pandas writes (``{"filename": {"0": ...}, ...}``),
      or as JSON lines.

    Audio is ``audio_dir/<audio_id>`` (``.wav`` added when the id has no audio extension);
    clip id = audio id without extension. Phrases keep the file order, one entry per
    phrase occurrence (several captions of one clip give several entries). Segments of a
    phrase are merged where they overlap or touch; zero-length segments such as ``[0, 0]``
    (the release's "not localised") are dropped, possibly leaving an empty tuple.
    Durations come from the audio headers.
    """
    audio_dir = _need("audiogrounding", "audio_dir", audio_dir)
    json_path = _need("audiogrounding", "json_path", json_path)
    files: dict[str, str] = {}
    phrases: dict[str, list[tuple[str, tuple[tuple[float, float], ...]]]] = {}
    for where, record in _grounding_records(json_path):
        audio_id, items = _grounding_phrases(json_path, where, record)
        clip = _strip_ext(audio_id)
        files.setdefault(clip, audio_id if clip != audio_id else f"{audio_id}.wav")
        for at, phrase, raw in items:
            spans = []
            for k, seg in enumerate(raw, start=1):
                if not isinstance(seg, list) or len(seg) != 2:
                    raise BenchmarkError(f"{json_path}: {at}: segment {k} is not [onset, offset]")
                where = f"{at}, segment {k}"
                onset, offset = _number(seg[0], json_path, where, "onset"), _number(seg[1], json_path, where, "offset")
                span = _checked_span(json_path, where, onset, offset)
                if span is not None:
                    spans.append(span)
            phrases.setdefault(clip, []).append((phrase, tuple(_merge_spans(spans))))
    audio = _keep_present("audiogrounding", "audio_dir", audio_dir, {c: [audio_dir / f] for c, f in files.items()})
    return GroundingSet(
        name="audiogrounding",
        audio=audio,
        phrases={clip: phrases[clip] for clip in audio},
        durations_s={clip: _duration_s(path) for clip, path in audio.items()},
    )


def read_audiocaps(audio_dir: Path | str, captions_csv: Path | str) -> RetrievalSet:
    """AudioCaps test captions -> :class:`RetrievalSet` named ``audiocaps``.

    Layout: ``captions_csv`` with header ``audiocap_id,youtube_id,start_time,caption``;
    audio ``audio_dir/<youtube_id>``, ``audio_dir/Y<youtube_id>`` or
    ``audio_dir/<audiocap_id>`` with ``.wav`` or ``.flac`` (first that exists). Clip id =
    youtube_id; its captions keep the row order.
    """
    audio_dir = _need("audiocaps", "audio_dir", audio_dir)
    captions_csv = _need("audiocaps", "captions_csv", captions_csv)
    captions: dict[str, list[str]] = {}
    candidates: dict[str, list[Path]] = {}
    for line, r in _read_table(captions_csv, ("audiocap_id", "youtube_id", "start_time", "caption"), ","):
        if not r["youtube_id"] or not r["caption"]:
            raise BenchmarkError(f"{captions_csv}: line {line}: empty youtube_id or caption")
        clip = r["youtube_id"]
        captions.setdefault(clip, []).append(r["caption"])
        stems = [clip, f"Y{clip}"] if clip not in candidates else []
        stems += [r["audiocap_id"]] if r["audiocap_id"] else []
        candidates.setdefault(clip, []).extend(audio_dir / f"{s}{ext}" for s in stems for ext in (".wav", ".flac"))
    audio = _keep_present("audiocaps", "audio_dir", audio_dir, candidates)
    return RetrievalSet(name="audiocaps", audio=audio, captions={c: tuple(captions[c]) for c in audio})


def read_clotho(audio_dir: Path | str, captions_csv: Path | str) -> RetrievalSet:
    """Clotho evaluation split -> :class:`RetrievalSet` named ``clotho``.

    Layout: ``captions_csv`` (``clotho_captions_evaluation.csv``) with header
    ``file_name,caption_1,...,caption_5``; audio ``audio_dir/<file_name>``. Clip id =
    file_name without extension; its five captions in column order.
    """
    audio_dir = _need("clotho", "audio_dir", audio_dir)
    captions_csv = _need("clotho", "captions_csv", captions_csv)
    columns = ("file_name",) + tuple(f"caption_{i}" for i in range(1, 6))
    captions: dict[str, tuple[str, ...]] = {}
    files: dict[str, str] = {}
    for line, r in _read_table(captions_csv, columns, ","):
        if not r["file_name"] or not all(r[c] for c in columns[1:]):
            raise BenchmarkError(f"{captions_csv}: line {line}: empty file_name or caption")
        clip = _strip_ext(r["file_name"])
        files[clip] = r["file_name"]
        captions[clip] = tuple(r[c] for c in columns[1:])
    audio = _keep_present("clotho", "audio_dir", audio_dir, {c: [audio_dir / f] for c, f in files.items()})
    return RetrievalSet(name="clotho", audio=audio, captions={c: captions[c] for c in audio})


def _classification_set(name: str, audio: dict[str, str], labels: dict[str, str]) -> ClassificationSet:
    classes = tuple(sorted(set(labels.values())))
    return ClassificationSet(
        name=name,
        audio=audio,
        labels={clip: labels[clip] for clip in audio},
        classes=classes,
        queries={c: _query(c) for c in classes},
    )


def _classification_csv(
    kind: str,
    root: Path,
    meta: Path,
    file_col: str,
    label_col: str,
    path_of: Callable[[int, dict], Path],
    required: tuple[str, ...] = (),
) -> ClassificationSet:
    """Rows of a classification metadata CSV -> :class:`ClassificationSet` (clip id = file name without extension)."""
    files: dict[str, Path] = {}
    labels: dict[str, str] = {}
    for line, r in _read_table(meta, (file_col, label_col, *required), ","):
        if not r[file_col] or not r[label_col]:
            raise BenchmarkError(f"{meta}: line {line}: empty {file_col} or {label_col}")
        clip = _strip_ext(r[file_col])
        files[clip] = path_of(line, r)
        labels[clip] = r[label_col]
    audio = _keep_present(kind, "root", root / "audio", {c: [p] for c, p in files.items()})
    return _classification_set(kind, audio, labels)


def read_esc50(root: Path | str) -> ClassificationSet:
    """ESC-50 -> :class:`ClassificationSet` named ``esc50``.

    Layout: ``root/meta/esc50.csv`` with header
    ``filename,fold,target,category,esc10,src_file,take``; audio ``root/audio/<filename>``.
    Clip id = filename without extension, label = category; classes are all categories of
    the CSV; query = category with spaces for underscores (``crying_baby`` -> ``crying baby``).
    """
    root = _need("esc50", "root", root)
    meta = _need("esc50", "root", root / "meta" / "esc50.csv")
    return _classification_csv(
        "esc50", root, meta, "filename", "category", lambda _, r: root / "audio" / r["filename"], ("fold",)
    )


def read_us8k(root: Path | str) -> ClassificationSet:
    """UrbanSound8K -> :class:`ClassificationSet` named ``us8k``.

    Layout: ``root/metadata/UrbanSound8K.csv`` with header
    ``slice_file_name,fsID,start,end,salience,fold,classID,class``; audio
    ``root/audio/fold<fold>/<slice_file_name>``. Clip id = slice_file_name without extension,
    label = class; query = class with spaces for underscores.
    """
    root = _need("us8k", "root", root)
    meta = _need("us8k", "root", root / "metadata" / "UrbanSound8K.csv")

    def path_of(line: int, r: dict) -> Path:
        if not r["fold"].isdigit():
            raise BenchmarkError(f"{meta}: line {line}: fold {r['fold']!r} is not a fold number")
        return root / "audio" / f"fold{int(r['fold'])}" / r["slice_file_name"]

    return _classification_csv("us8k", root, meta, "slice_file_name", "class", path_of, ("fold",))


Benchmark = SedSet | GroundingSet | RetrievalSet | ClassificationSet

READERS: dict[str, Callable[..., Benchmark]] = {
    "desed": read_desed,
    "urbansed": read_urbansed,
    "audioset_strong": read_audioset_strong,
    "audiogrounding": read_audiogrounding,
    "audiocaps": read_audiocaps,
    "clotho": read_clotho,
    "esc50": read_esc50,
    "us8k": read_us8k,
}


def read_benchmark(kind: str, **paths: Any) -> Benchmark:
    """Read benchmark ``kind`` with the keyword arguments of its reader (the params entry).

    Unknown kinds, unexpected or missing keys raise ``ValueError`` naming the accepted ones;
    every given path is checked before reading, a missing one raises :class:`BenchmarkMissing`.
    """
    if kind not in READERS:
        raise ValueError(f"unknown benchmark {kind!r}; known benchmarks: {', '.join(sorted(READERS))}")
    params = inspect.signature(READERS[kind]).parameters
    accepted = ", ".join(params)
    unexpected = sorted(set(paths) - set(params))
    if unexpected:
        raise ValueError(
            f"benchmark {kind}: unexpected key(s) {', '.join(unexpected)} in evaluate.benchmarks.{kind}; accepted keys: {accepted}"
        )
    absent = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in paths]
    if absent:
        raise ValueError(
            f"benchmark {kind}: missing key(s) {', '.join(absent)} in evaluate.benchmarks.{kind}; accepted keys: {accepted}"
        )
    for key in _PATH_HELP[kind]:
        if paths.get(key) is not None:
            _need(kind, key, paths[key])
    return READERS[kind](**paths)
