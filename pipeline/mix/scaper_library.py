"""Scaper-layout sound libraries as mix sources: label folders of audio files -> analysed excerpts.

Input: a library root holding label sub-folders of audio files (``<root>/<label>/*.wav``, the
layout of Scaper's ``foreground`` and ``background`` folders, of the DESED soundbank and of
URBAN-SED's sources; files deeper inside a label folder take that label), and
:class:`~pipeline.config.params.Params` (``mix.library`` for the reading rules, ``clip`` for
the events' checks, segmentation and envelope, ``ambience`` for the backgrounds').

Output (:func:`write_libraries`): per library a folder in the layout of the clip stage's
(events) or the ambience stage's (backgrounds) output, so the mix stage reads it like one: ``audio/<id>.flac`` (mono, 16-bit, at the pipeline rate), ``manifest.parquet``
(:class:`~pipeline.schema.EventClip` / :class:`~pipeline.schema.BackgroundSegment` rows whose
``source_path`` is the file's path relative to the library root) and ``skipped.csv``; the
functions also return the records and the skips.

- An event is a whole file (Scaper's use), or with ``trim_events`` its first high-energy
  segment found as the clip stage finds it; label = its label folder; MID and AudioSet name
  from the ontology where the label is a class name (case, ``_`` and spaces ignored), else
  ``""`` and the label's words. Library events have no split of their own (``source_split``
  is empty): the mix stage assigns them by source file.
- A background is a whole file (category = its label folder); one shorter than
  ``min_background_s`` (the longest mixture) is looped to that length, as Scaper loops a short
  background, because the mix engine pads a short background with silence. With
  ``mix.background_split: segment`` a file is cut into segments of ``min_background_s`` (the
  last one keeps the rest, a file shorter than two is one segment), each its own record
  ``<id>-<k>`` with its ``offset_in_source_s``, so that one recording can serve several splits.
- A file that cannot be used (unreadable, empty, silent, clipped, out of the duration limits)
  is a :class:`~pipeline.schema.Skip` with the reason; the others go on. A label folder whose
  name holds a tab, a line break or another control character is one Skip (``bad-label``) and
  its files are left out: the label would break the rows of the DCASE TSV files. Each file's work is
  independent, so the bytes do not depend on the number of workers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from pipeline.audio import (
    AudioError,
    clipped_fraction,
    downmix,
    int16_to_float,
    quantize_int16,
    read_audio,
    remove_dc,
    resample,
    write_flac,
)
from pipeline.compute import map_ordered
from pipeline.config.params import AmbienceParams, ClipParams, Params, SoundLibraryParams
from pipeline.licenses import license_name
from pipeline.loudness import a_weighted_envelope, integrated_lufs, peak_dbfs, peak_to_median_db, rms_dbfs
from pipeline.ontology import Ontology, default_ontology
from pipeline.outputs import MANIFEST, SKIPPED, write_manifest, write_skips
from pipeline.schema import BackgroundSegment, EventClip, Skip, readable_id, text_problem
from pipeline.segmentation import find_segment

AUDIO_DIR = "audio"
LIBRARY_DATASET = "library"  # EventClip.source_dataset of a library's events


@dataclass(frozen=True)
class LibraryFile:
    """One audio file of a library: its path relative to the root (POSIX) and its label folder."""

    rel_path: str
    path: Path
    label: str

    @property
    def item_id(self) -> str:
        """A readable, filesystem-safe id, unique through a hash of the relative path."""
        return readable_id(self.rel_path)


# audio extensions a library may hold: one not in mix.library.extensions is reported, not passed over in silence
AUDIO_EXTENSIONS = frozenset(
    {"wav", "wave", "flac", "ogg", "oga", "opus", "aif", "aiff", "aifc", "mp3", "au", "caf", "w64", "rf64"}
)


def _is_audio(path: Path, extensions: tuple[str, ...]) -> bool:
    return path.is_file() and path.suffix.lower().lstrip(".") in {e.lower().lstrip(".") for e in extensions}


def _visible(rel: Path) -> bool:
    return not any(part.startswith(".") for part in rel.parts)


def label_folders(root: Path, extensions: tuple[str, ...]) -> list[str]:
    """The sub-folders of ``root`` that hold at least one audio file (at any depth), sorted."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(
        d.name
        for d in root.iterdir()
        if d.is_dir() and not d.name.startswith(".") and any(_is_audio(f, extensions) for f in d.rglob("*"))
    )


def label_problem(label: str) -> str | None:
    """Why a label folder's name cannot be a label (a ``bad-label`` detail), or None.

    Tabs, line breaks and other control characters would split or end a row of the DCASE TSV
    files (``filename onset offset event_label``) the mix stage writes.
    """
    if text_problem(label) is not None:
        return (
            f"the label folder {label!r} has a tab, line break or other control character in its name, which would break "
            "the rows of the DCASE TSV files; its files are left out: rename the folder"
        )
    return None


def list_library(root: Path, extensions: tuple[str, ...]) -> tuple[list[LibraryFile], list[Skip]]:
    """Every audio file inside a label folder (sorted by path), a Skip for audio files outside one,
    and one Skip per label folder whose name cannot be a label (:func:`label_problem`)."""
    root = Path(root)
    files: list[LibraryFile] = []
    skips: list[Skip] = []
    refused: set[str] = set()
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not _visible(rel):
            continue
        if not _is_audio(path, extensions):
            if _is_audio(path, tuple(AUDIO_EXTENSIONS)) and len(rel.parts) > 1:
                skips.append(
                    Skip(
                        readable_id(rel.as_posix()),
                        rel.as_posix(),
                        "other-extension",
                        f"{path.suffix} is not in mix.library.extensions [{', '.join(extensions)}]; add it to read the file",
                    )
                )
            continue
        if len(rel.parts) == 1:
            skips.append(
                Skip(rel.as_posix(), rel.as_posix(), "no-label", "the file is not inside a label folder (<root>/<label>/file)")
            )
            continue
        label = rel.parts[0]
        problem = label_problem(label)
        if problem:
            if label not in refused:  # one report per folder, not one per file
                refused.add(label)
                shown = json.dumps(label, ensure_ascii=False)[
                    1:-1
                ]  # the name with \t and \n written out: the report stays one line per skip
                skips.append(Skip(shown, shown, "bad-label", problem))
            continue
        files.append(LibraryFile(rel.as_posix(), path, label))
    return files, skips


def _name_key(text: str) -> str:
    return " ".join(text.replace("_", " ").split()).lower()


def label_class(label: str, ontology: Ontology) -> tuple[str, str]:
    """(MID, AudioSet name) of the ontology class named like ``label`` (case, ``_`` and spaces ignored), else ("", label's words)."""
    key = _name_key(label)
    for c in ontology.by_mid.values():
        if _name_key(c.name) == key:
            return c.mid, c.name
    return "", label.replace("_", " ").strip()


def _decode(f: LibraryFile) -> tuple[np.ndarray, np.ndarray, int]:
    """(samples (n, channels), mono without DC (n,), rate)."""
    decoded = read_audio(f.path)
    return decoded.samples, remove_dc(downmix(decoded.samples)), decoded.sample_rate_hz


def low_rate_skip(f: LibraryFile, source_hz: int, sample_rate_hz: int) -> Skip | None:
    """A Skip for a file below the mixing rate (upsampled audio would hold nothing above its
    Nyquist frequency and only look like ``sample_rate_hz``), else None."""
    if source_hz >= sample_rate_hz:
        return None
    return Skip(
        f.item_id,
        f.rel_path,
        "low-sample-rate",
        f"{source_hz} Hz < sample_rate_hz {sample_rate_hz} Hz: mixing does not upsample (sample_rate_hz: {source_hz} keeps it)",
    )


def analyse_event(
    f: LibraryFile, lib: SoundLibraryParams, clip: ClipParams, sample_rate_hz: int, audio_dir: Path, mid: str, audioset_name: str
) -> EventClip | Skip:
    """One event file -> its stored excerpt (``audio_dir/<id>.flac``) and record, or a Skip saying why not."""
    try:
        samples, x, sr = _decode(f)
        if low := low_rate_skip(f, sr, sample_rate_hz):
            return low
        seg = find_segment(x, sr, clip.segmentation)
        loudest = float(seg.frame_energy_db.max())
        if loudest < clip.silence_dbfs:
            return Skip(
                f.item_id,
                f.rel_path,
                "silent",
                f"loudest frame {loudest:.1f} dBFS < {clip.silence_dbfs} dBFS (clip.silence_dbfs)",
            )
        start, end = 0, x.shape[0]
        if lib.trim_events:
            if not seg.found:
                return Skip(f.item_id, f.rel_path, "no-segment", "no window reaches the threshold (mix.library.trim_events)")
            start, end = int(seg.start), int(seg.end)
        duration_s = (end - start) / sr
        if duration_s < lib.min_event_s:
            return Skip(f.item_id, f.rel_path, "too-short", f"{duration_s:.3f} s < mix.library.min_event_s {lib.min_event_s} s")
        if lib.max_event_s is not None and duration_s > lib.max_event_s:
            return Skip(f.item_id, f.rel_path, "too-long", f"{duration_s:.3f} s > mix.library.max_event_s {lib.max_event_s} s")
        clipped = clipped_fraction(samples[start:end], clip.clip_level)
        if clipped > clip.max_clipped_fraction:
            return Skip(
                f.item_id,
                f.rel_path,
                "clipped",
                f"{clipped:.2%} of samples at |x| >= {clip.clip_level} (clip.max_clipped_fraction)",
            )
        q = quantize_int16(resample(x[start:end], sr, sample_rate_hz))
        y = int16_to_float(q)  # the statistics describe exactly what is stored
        envelope = a_weighted_envelope(y, sample_rate_hz, clip.envelope_frame_s, clip.envelope_hop_s)
        write_flac(audio_dir / f"{f.item_id}.flac", q, sample_rate_hz)
    except AudioError as e:
        return Skip(f.item_id, f.rel_path, e.reason, e.detail)
    except Exception as e:  # one bad file must not stop the library; the report keeps it
        (audio_dir / f"{f.item_id}.flac").unlink(missing_ok=True)
        return Skip(f.item_id, f.rel_path, "unexpected-error", f"{type(e).__name__}: {e}")
    return EventClip(
        clip_id=f.item_id,
        audio_path=f"{AUDIO_DIR}/{f.item_id}.flac",
        source_dataset=LIBRARY_DATASET,
        source_id=f.rel_path,
        source_split="",
        source_path=f.rel_path,
        label=f.label,
        mid=mid,
        audioset_name=audioset_name,
        onset_in_source_s=start / sr,
        offset_in_source_s=end / sr,
        duration_s=q.shape[0] / sample_rate_hz,
        num_samples=int(q.shape[0]),
        sample_rate_hz=sample_rate_hz,
        source_sample_rate_hz=sr,
        source_channels=int(samples.shape[1]),
        rms_dbfs=rms_dbfs(y),
        peak_dbfs=peak_dbfs(y),
        loudness_lufs=integrated_lufs(y, sample_rate_hz),
        envelope_frame_s=envelope.frame_s,
        envelope_hop_s=envelope.hop_s,
        envelope_db=envelope.energy_db,
        license_url=lib.license if "://" in lib.license else "",
        license=license_name(lib.license),
        uploader="",
        title=Path(f.rel_path).stem,
    )


def loop_to(q: np.ndarray, num_samples: int) -> np.ndarray:
    """``q`` repeated end to end and cut to ``num_samples`` (``q`` itself when already that long)."""
    if q.shape[0] >= num_samples:
        return q
    return np.tile(q, -(-num_samples // q.shape[0]))[:num_samples]


def segment_spans(num_samples: int, segment_samples: int) -> list[tuple[int, int]]:
    """``[start, end)`` of the mixture-length segments a background of ``num_samples`` is cut into.

    Segments of ``segment_samples`` end to end; the last one also keeps the rest (shorter than
    a segment), so no audio is left out and none is shorter than a mixture.
    """
    k = max(1, num_samples // max(1, segment_samples))
    return [(i * segment_samples, (i + 1) * segment_samples if i < k - 1 else num_samples) for i in range(k)]


def analyse_background(
    f: LibraryFile, amb: AmbienceParams, sample_rate_hz: int, min_background_s: float, audio_dir: Path, license_text: str
) -> BackgroundSegment | Skip:
    """One background file -> its stored excerpt (looped up to ``min_background_s``) and record, or a Skip."""
    out = background_segments(f, amb, sample_rate_hz, min_background_s, audio_dir, license_text, cut=False)
    return out if isinstance(out, Skip) else out[0]


def background_segments(
    f: LibraryFile,
    amb: AmbienceParams,
    sample_rate_hz: int,
    min_background_s: float,
    audio_dir: Path,
    license_text: str,
    cut: bool,
) -> list[BackgroundSegment] | Skip:
    """One background file -> its stored excerpts and records, or a Skip.

    The file is looped up to ``min_background_s``; with ``cut`` it is then cut into segments of
    that length (:func:`segment_spans`), each stored as ``<id>-<k>.flac``; else it is one
    record, ``<id>.flac``.
    """
    written: list[Path] = []
    try:
        samples, x, sr = _decode(f)
        if low := low_rate_skip(f, sr, sample_rate_hz):
            return low
        clipped = clipped_fraction(samples, amb.clip_level)
        if clipped > amb.max_clipped_fraction:
            return Skip(
                f.item_id,
                f.rel_path,
                "clipped",
                f"{clipped:.3%} of samples at |x| >= {amb.clip_level} (ambience.max_clipped_fraction)",
            )
        q = quantize_int16(resample(x, sr, sample_rate_hz))
        level = rms_dbfs(int16_to_float(q))
        if level < amb.silence_dbfs:
            return Skip(
                f.item_id, f.rel_path, "silent", f"RMS {level:.1f} dBFS < {amb.silence_dbfs} dBFS (ambience.silence_dbfs)"
            )
        segment_samples = int(round(min_background_s * sample_rate_hz))
        q = loop_to(q, segment_samples)
        spans = segment_spans(q.shape[0], segment_samples) if cut else [(0, q.shape[0])]
        out = []
        for k, (start, end) in enumerate(spans):
            segment_id = f"{f.item_id}-{k:04d}" if cut else f.item_id
            piece = q[start:end]
            y = int16_to_float(piece)
            envelope = a_weighted_envelope(y, sample_rate_hz, amb.envelope_frame_s, amb.envelope_hop_s)
            salience = peak_to_median_db(y, sample_rate_hz, amb.salience_frame_s)
            written.append(audio_dir / f"{segment_id}.flac")
            write_flac(written[-1], piece, sample_rate_hz)
            out.append(
                BackgroundSegment(
                    segment_id=segment_id,
                    audio_path=f"{AUDIO_DIR}/{segment_id}.flac",
                    source_id=f.rel_path,
                    source_path=f.rel_path,
                    category=f.label,
                    offset_in_source_s=start / sample_rate_hz,
                    duration_s=piece.shape[0] / sample_rate_hz,
                    num_samples=int(piece.shape[0]),
                    sample_rate_hz=sample_rate_hz,
                    source_sample_rate_hz=sr,
                    source_channels=int(samples.shape[1]),
                    rms_dbfs=rms_dbfs(y),
                    peak_dbfs=peak_dbfs(y),
                    loudness_lufs=integrated_lufs(y, sample_rate_hz),
                    peak_to_median_db=salience,
                    envelope_frame_s=envelope.frame_s,
                    envelope_hop_s=envelope.hop_s,
                    envelope_db=envelope.energy_db,
                    license=license_text,
                    author="",
                )
            )
    except AudioError as e:
        for path in written:
            path.unlink(missing_ok=True)
        return Skip(f.item_id, f.rel_path, e.reason, e.detail)
    except Exception as e:
        for path in [*written, audio_dir / f"{f.item_id}.flac"]:
            path.unlink(missing_ok=True)
        return Skip(f.item_id, f.rel_path, "unexpected-error", f"{type(e).__name__}: {e}")
    return out


def _write(folder: Path, records: list, record_type: type, skips: list[Skip]) -> None:
    (folder / AUDIO_DIR).mkdir(parents=True, exist_ok=True)
    write_manifest(folder / MANIFEST, records, record_type)
    write_skips(folder / SKIPPED, skips)


@dataclass(frozen=True)
class _Task:
    kind: str  # events | backgrounds
    file: LibraryFile
    classes: tuple[str, str]  # (MID, AudioSet name) of an event's label


def _analyse(
    task: _Task, params: Params, min_background_s: float, folders: dict[str, Path]
) -> EventClip | list[BackgroundSegment] | Skip:
    audio_dir = folders[task.kind] / AUDIO_DIR
    if task.kind == "events":
        return analyse_event(task.file, params.mix.library, params.clip, params.sample_rate_hz, audio_dir, *task.classes)
    return background_segments(
        task.file,
        params.ambience,
        params.sample_rate_hz,
        min_background_s,
        audio_dir,
        params.mix.library.license,
        cut=params.mix.background_split == "segment",
    )


def write_libraries(
    roots: dict[str, Path], folders: dict[str, Path], params: Params, min_background_s: float
) -> dict[str, tuple[list, list[Skip]]]:
    """Analyse every file of each library (``roots``: kind ``events`` / ``backgrounds`` -> library root) into ``folders[kind]``.

    ``events`` folders get the clip stage's layout, ``backgrounds`` folders the ambience
    stage's. All files go through one pass of workers. Returns kind -> (records, skips).
    """
    ontology = default_ontology()
    listed = {kind: list_library(root, params.mix.library.extensions) for kind, root in roots.items()}
    tasks = [
        _Task(kind, f, label_class(f.label, ontology) if kind == "events" else ("", ""))
        for kind, (files, _) in listed.items()
        for f in files
    ]
    work = partial(_analyse, params=params, min_background_s=min_background_s, folders=folders)
    results = map_ordered(work, tasks, params.compute, desc="library files")
    out: dict[str, tuple[list, list[Skip]]] = {}
    for kind, (_, skips) in listed.items():
        mine = [x for t, r in zip(tasks, results) if t.kind == kind for x in (r if isinstance(r, list) else [r])]
        record_type = EventClip if kind == "events" else BackgroundSegment
        records = [r for r in mine if isinstance(r, record_type)]
        skips = skips + [r for r in mine if isinstance(r, Skip)]
        (folders[kind] / AUDIO_DIR).mkdir(parents=True, exist_ok=True)
        write_manifest(folders[kind] / MANIFEST, records, record_type)
        write_skips(folders[kind] / SKIPPED, skips)
        out[kind] = (records, skips)
    return out
