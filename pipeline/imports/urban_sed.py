"""Reader of URBAN-SED 2.0 (Salamon et al., WASPAA 2017; Zenodo record 1324404).

Input: the ``URBAN-SED_v2.0.0`` folder, laid out as its README states::

    annotations/{train,validate,test}/soundscape_<split>_<distribution><n>.txt   (and .jams beside them)
    audio/{train,validate,test}/soundscape_<split>_<distribution><n>.wav

The ``.txt`` files (read by default) hold one foreground event per line, ``onset<TAB>offset<TAB>label``
with no header; background sounds are not listed. With ``options["format"] = "jams"`` the JAMS
files are read instead (plain JSON, no ``jams`` package needed): the annotation in the
``scaper`` namespace (``sound_event`` in URBAN-SED 1.0) lists every event as an observation
whose ``time`` and ``duration`` place it in the soundscape and whose ``value.role`` is
``foreground`` or ``background``; only foreground events become regions. Its ``data`` is a
list of observations (JAMS 0.3) or a table of columns ``time``, ``duration``, ``value``,
``confidence`` (JAMS 0.2); a second scaper annotation is reported and not read (Scaper writes
one per soundscape). A soundscape without the chosen annotation is read from the other one.

Output: one :class:`~pipeline.schema.ImportedClip` per annotated soundscape (clip id
``urbansed-<stem>``, split ``validate`` -> ``valid``), regions labelled with the ten
UrbanSound8K classes and their AudioSet MIDs from ``pipeline/data/urbansound_classes.csv``,
licence CC BY 4.0. Skips: ``malformed-row`` (a line or observation that does not parse, a JAMS
that is not JSON, nests deeper than the JSON reader follows, or has no scaper annotation),
``outside-root`` (an annotation file a symbolic link leads out of the root), ``bad-region``, ``unknown-label``,
``missing-file`` (no audio beside the annotation: the clip is left out), ``no-label`` (a
file whose every event was skipped) and ``not-in-metadata`` (audio without an annotation).
Regions past the soundscape's end are kept for the writer.

This module is the one reader of the layout: the importer (:func:`read`) and the evaluation's
benchmark reader (:func:`trainer.evaluation.readers.read_urbansed`) both take their
soundscapes from :func:`read_folder`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.imports.dcase import (
    DATA_DIR,
    OUTSIDE_ROOT,
    load_class_map,
    outside_root,
    parse_seconds,
    region_problem,
    sort_regions,
)
from pipeline.schema import ImportedClip, ImportedRegion, Skip

URBANSOUND_CLASSES = DATA_DIR / "urbansound_classes.csv"
SPLIT_DIRS = {"train": "train", "validate": "valid", "test": "test"}  # folder -> dataset split
FORMATS = ("txt", "jams")
SCAPER_NAMESPACES = ("scaper", "sound_event")
JAMS_COLUMNS = ("time", "duration", "value", "confidence")  # JAMS 0.2 stores an annotation's data as these columns
LICENSE = "CC BY 4.0"
ATTRIBUTION = (
    "URBAN-SED (Salamon, MacConnell, Cartwright, Li and Bello, WASPAA 2017), CC BY 4.0; "
    "events from UrbanSound8K clips of freesound.org (see its FREESOUNDCREDITS.txt)"
)


def read(root: Path, options: dict) -> tuple[list[ImportedClip], list[Skip]]:
    """URBAN-SED clips under ``root`` from its txt annotations, or its JAMS with ``format=jams``.

    FileNotFoundError naming the expected folders when no split has an annotation folder.
    """
    root = Path(root)
    fmt = str(options.get("format", "txt")).lower()
    if fmt not in FORMATS:
        raise ValueError(f"urban-sed: option format={fmt!r}; one of {', '.join(FORMATS)}")
    clips: list[ImportedClip] = []
    skips: list[Skip] = []
    found = 0
    for folder, split in SPLIT_DIRS.items():
        ann_dir = root / "annotations" / folder
        if not ann_dir.is_dir():
            skips.append(
                Skip(
                    f"annotations/{folder}",
                    f"annotations/{folder}",
                    "missing-file",
                    f"annotations/{folder}/ not found; the {split} split is left out",
                )
            )
            continue
        found += 1
        soundscapes, folder_skips = read_folder(root, folder, fmt, lambda stem: f"urbansed-{stem}")
        clips += [ImportedClip(s.clip_id, s.audio_path, split, (), s.regions, LICENSE, ATTRIBUTION) for s in soundscapes]
        skips += folder_skips
    if not found:
        raise FileNotFoundError(
            f"no URBAN-SED annotations under {root}: expected annotations/{{train,validate,test}}/ "
            "(point the root at the URBAN-SED_v2.0.0 folder)"
        )
    clips.sort(key=lambda c: c.clip_id)
    return clips, skips


@dataclass(frozen=True)
class Soundscape:
    """One annotated soundscape: its clip id, its audio file (relative to the root), its foreground regions."""

    clip_id: str
    audio_path: str
    regions: tuple[ImportedRegion, ...]


def read_folder(
    root: Path, folder: str, fmt: str = "txt", clip_id_of: Callable[[str], str] = lambda stem: stem
) -> tuple[list[Soundscape], list[Skip]]:
    """The soundscapes of one split folder (``train``, ``validate`` or ``test``), sorted by clip id, and the skips.

    A soundscape is a stem with an annotation under ``annotations/<folder>/`` (``<stem>.<fmt>``,
    else the other format) and audio ``audio/<folder>/<stem>.wav``; ``clip_id_of(stem)`` names
    its clip. Audio without an annotation is a Skip ``not-in-metadata``.
    """
    root = Path(root)
    classes = load_class_map(URBANSOUND_CLASSES)
    ann_dir, audio_dir = root / "annotations" / folder, root / "audio" / folder
    annotations: dict[str, Path] = {}
    for ext in sorted(FORMATS, key=lambda e: e == fmt):  # the chosen format last, so it wins where both exist
        annotations |= {p.stem: p for p in ann_dir.glob(f"*.{ext}") if p.is_file()}
    audio = (
        {p.stem: p.name for p in audio_dir.glob("*") if p.suffix.lower() == ".wav" and p.is_file()} if audio_dir.is_dir() else {}
    )
    soundscapes: list[Soundscape] = []
    skips: list[Skip] = []
    for stem in sorted(annotations):
        soundscape, clip_skips = _read_soundscape(root, annotations[stem], folder, audio.get(stem), clip_id_of(stem), classes)
        soundscapes.extend([soundscape] if soundscape else [])
        skips.extend(clip_skips)
    for stem in sorted(set(audio) - set(annotations)):
        rel = f"audio/{folder}/{audio[stem]}"
        skips.append(
            Skip(
                clip_id_of(stem),
                rel,
                "not-in-metadata",
                f"{rel} has no annotation (annotations/{folder}/{stem}.txt or .jams); left out",
            )
        )
    soundscapes.sort(key=lambda s: s.clip_id)
    return soundscapes, skips


def _read_soundscape(
    root: Path, path: Path, folder: str, audio_name: str | None, clip_id: str, classes: dict[str, str]
) -> tuple[Soundscape | None, list[Skip]]:
    rel = f"annotations/{folder}/{path.name}"
    if problem := outside_root(root, rel):
        return None, [Skip(clip_id, rel, OUTSIDE_ROOT, problem)]
    events, skips = _jams_events(path, rel, clip_id) if path.suffix == ".jams" else _txt_events(path, rel, clip_id)
    regions: list[ImportedRegion] = []
    for item, onset_s, offset_s, label in events:
        problem = region_problem(onset_s, offset_s)
        if problem:
            skips.append(Skip(item, rel, "bad-region", f"{label}: {problem}"))
        elif label not in classes:
            skips.append(Skip(item, rel, "unknown-label", f"label {label!r} is not one of the ten UrbanSound8K classes"))
        else:
            regions.append(ImportedRegion(label, classes[label], "", onset_s, offset_s))
    if not regions and skips:
        whole_file = any(s.item_id == clip_id for s in skips)  # already one Skip for the clip
        return None, skips + (
            []
            if whole_file
            else [
                Skip(
                    clip_id,
                    rel,
                    "no-label",
                    f"every event of {rel} was skipped; left out rather than kept as a clip without events",
                )
            ]
        )
    if audio_name is None:
        audio_path = f"audio/{folder}/{path.stem}.wav"
        return None, skips + [Skip(clip_id, audio_path, "missing-file", f"{audio_path} not found ({rel} annotates it)")]
    return Soundscape(clip_id, f"audio/{folder}/{audio_name}", sort_regions(regions)), skips


Event = tuple[str, float, float, str]  # (skip item id, onset_s, offset_s, label)


def _txt_events(path: Path, rel: str, clip_id: str) -> tuple[list[Event], list[Skip]]:
    events: list[Event] = []
    skips: list[Skip] = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        item = f"{clip_id}#line{line_no}"
        fields = line.split("\t") if "\t" in line else line.split()
        fields = [x.strip() for x in fields]
        onset_s = parse_seconds(fields[0]) if len(fields) == 3 else None
        offset_s = parse_seconds(fields[1]) if len(fields) == 3 else None
        if len(fields) != 3:
            skips.append(Skip(item, rel, "malformed-row", f"line {line_no}: {len(fields)} fields, expected onset, offset, label"))
        elif onset_s is None or offset_s is None or not fields[2]:
            skips.append(
                Skip(item, rel, "malformed-row", f"line {line_no}: {line.strip()!r} is not onset, offset (numbers) and a label")
            )
        else:
            events.append((item, onset_s, offset_s, fields[2]))
    return events, skips


def _jams_events(path: Path, rel: str, clip_id: str) -> tuple[list[Event], list[Skip]]:
    try:
        jam = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as e:
        return [], [Skip(clip_id, rel, "malformed-row", f"not valid JSON ({e})")]
    except RecursionError:  # arrays or objects nested some 10^5 deep; a JAMS file nests 5 levels
        return [], [Skip(clip_id, rel, "malformed-row", "JSON nested deeper than the reader can follow; not a JAMS file")]
    annotations = jam.get("annotations") if isinstance(jam, dict) else None
    scaper = [a for a in annotations or [] if isinstance(a, dict) and a.get("namespace") in SCAPER_NAMESPACES]
    observations = _observations(scaper[0].get("data")) if scaper else None
    if observations is None:
        return [], [
            Skip(
                clip_id,
                rel,
                "malformed-row",
                "no annotation in the scaper namespace with a list of observations "
                f"(or a table of the columns {', '.join(JAMS_COLUMNS)} of equal length)",
            )
        ]
    events: list[Event] = []
    skips: list[Skip] = [
        Skip(
            f"{clip_id}#annotation{k}",
            rel,
            "malformed-row",
            f"scaper annotation {k} is not read: a soundscape has one (Scaper writes one), and the first is the one read",
        )
        for k in range(1, len(scaper))
    ]
    for n, obs in enumerate(observations):
        item = f"{clip_id}#event{n}"
        value = obs.get("value") if isinstance(obs, dict) else None
        if not isinstance(value, dict):
            skips.append(Skip(item, rel, "malformed-row", f"observation {n} has no value object"))
            continue
        if value.get("role") == "background":
            continue
        onset_s = parse_seconds(str(obs.get("time")))
        duration_s = parse_seconds(str(obs.get("duration")))
        label = str(value.get("label") or "").strip()
        if value.get("role") != "foreground" or onset_s is None or duration_s is None or not label:
            skips.append(
                Skip(
                    item,
                    rel,
                    "malformed-row",
                    f"observation {n}: role {value.get('role')!r}, time {obs.get('time')!r}, "
                    f"duration {obs.get('duration')!r}, label {label!r}; expected a foreground "
                    "event with numeric time and duration",
                )
            )
            continue
        events.append((item, onset_s, onset_s + duration_s, label))
    return events, skips


def _observations(data: object) -> list | None:
    """An annotation's observations: its ``data`` list (JAMS 0.3), or the rows of its columns (JAMS 0.2); None for neither."""
    if isinstance(data, list):
        return data
    if isinstance(data, dict) and all(isinstance(data.get(c), list) for c in JAMS_COLUMNS[:3]):
        columns = {c: data[c] for c in JAMS_COLUMNS if isinstance(data.get(c), list)}
        if len({len(v) for v in columns.values()}) == 1:
            return [dict(zip(columns, row)) for row in zip(*columns.values())]
    return None
