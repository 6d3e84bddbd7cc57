"""The mix stage's sources: where they are, reading them, and the checks they must pass before anything is mixed.

Input: ``mix.events`` and ``mix.backgrounds`` folders, each a stage output (``manifest.parquet``
and FLAC files) or a Scaper-layout library (:mod:`pipeline.mix.scaper_library`), and the
resolved spec. Output: :class:`SourceFolders` (manifest folders to mix from, a library analysed
into a hidden folder beside the output), the :class:`~pipeline.schema.EventClip` and
:class:`~pipeline.schema.BackgroundSegment` records, and the impulse-response files a run may
use. A check that fails raises :class:`MixError` saying what to change: a library's root where
its ``foreground`` or ``background`` folder belongs, sources below the mixing rate (mixing must
not upsample), envelopes at different hops, no usable room file.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.config.mix_spec import MixSpec
from pipeline.config.params import Params
from pipeline.mix.augment import AugmentError, room_file, usable_rooms
from pipeline.mix.scaper_library import label_folders, write_libraries
from pipeline.outputs import MANIFEST, file_sha256
from pipeline.schema import BackgroundSegment, EventClip, Skip, columns, from_table

SOURCES = "sources"  # <out_dir>/sources/{events,backgrounds}: the libraries as analysed for the run


class MixError(ValueError):
    """The sources cannot satisfy the requested mixtures; the message says what to change."""


@dataclass(frozen=True)
class SourceFolders:
    """The manifest folders a run mixes from, and what reading its libraries (if any) gave.

    ``library_dir`` (None: no library) is the hidden folder beside the output that holds the
    analysed libraries during the run; it becomes ``<out_dir>/sources``.
    """

    events_dir: Path
    backgrounds_dir: Path
    library_dir: Path | None
    libraries: dict[str, dict]  # kind (events, backgrounds) -> {root, kept, skipped[, segments]}: files analysed
    skips: list[Skip]

    def final_dir(self, kind: str, out_dir: Path) -> Path:
        """Where ``kind``'s manifest folder is once the run is done (for paths written into exports)."""
        current = self.events_dir if kind == "events" else self.backgrounds_dir
        return Path(out_dir).resolve() / SOURCES / kind if kind in self.libraries else current

    def keep_libraries(self, stage: Path) -> None:
        """Move the analysed libraries (if any) into the run's output as ``<stage>/sources``."""
        if self.library_dir is not None:
            shutil.rmtree(stage / SOURCES, ignore_errors=True)  # left by a run killed after this move
            self.library_dir.rename(stage / SOURCES)

    def discard_libraries(self) -> None:
        """Remove the analysed libraries (if any): the run stops before making anything."""
        if self.library_dir is not None:
            shutil.rmtree(self.library_dir, ignore_errors=True)


LIBRARY_PARTS = {"events": "foreground", "backgrounds": "background"}  # Scaper's sub-folders of a library root


def source_layout(folder: Path, kind: str, extensions: tuple[str, ...]) -> str:
    """``manifest`` (a stage output) or ``library`` (label sub-folders of audio files); else FileNotFoundError naming both.

    A library's root (the folder holding Scaper's ``foreground/`` and ``background/``) is
    refused with :class:`MixError` naming the sub-folder to set: read as a library, its
    labels would be ``foreground`` and ``background``.
    """
    if (folder / MANIFEST).exists():
        return "manifest"
    if folder.is_dir() and all((folder / part).is_dir() for part in LIBRARY_PARTS.values()):
        setting = "mix.events" if kind == "events" else "mix.backgrounds"
        raise MixError(
            f"mix: {setting} is {folder}, a sound library's root (it holds foreground/ and background/, which would be "
            f"read as two labels): set {setting} to {folder / LIBRARY_PARTS[kind]}"
        )
    if label_folders(folder, extensions):
        return "library"
    stage, setting = ("clip", "mix.events") if kind == "events" else ("ambience", "mix.backgrounds")
    what = "does not exist" if not folder.exists() else f"holds neither {MANIFEST} nor label sub-folders of audio files"
    raise FileNotFoundError(
        f"{folder} {what}: run `sedsynth {stage}` (or `dvc repro {stage}`) to make {kind} there, or point {setting} at a "
        f"Scaper-layout library, a folder of label sub-folders of audio files (<folder>/<label>/*.wav, {', '.join(extensions)})"
    )


def prepare_sources(params: Params, spec: MixSpec, events_dir: Path, backgrounds_dir: Path, out_dir: Path) -> SourceFolders:
    """Each input as a manifest folder: a stage output as it is, a library analysed into a hidden folder beside ``out_dir``.

    A library is read afresh every run (deterministic bytes, so a killed run still resumes).
    Library files below ``sample_rate_hz`` are skipped (``low-sample-rate``): mixing must not
    upsample. A library all of whose files are below it stops the run (:class:`MixError`) naming the rate to mix at.
    """
    extensions = params.mix.library.extensions
    kinds = {
        kind: folder
        for kind, folder in (("events", events_dir), ("backgrounds", backgrounds_dir))
        if source_layout(folder, kind, extensions) == "library"
    }
    if not kinds:
        return SourceFolders(events_dir, backgrounds_dir, None, {}, [])
    library_dir = out_dir.parent / f".{out_dir.name}.{SOURCES}"
    shutil.rmtree(library_dir, ignore_errors=True)
    skips: list[Skip] = []
    folders = {"events": events_dir, "backgrounds": backgrounds_dir}
    low: list[str] = []
    counts: dict[str, dict] = {}
    analysed = write_libraries(kinds, {kind: library_dir / kind for kind in kinds}, params, float(spec.duration_s.bounds()[1]))
    for kind, (records, kind_skips) in analysed.items():
        folders[kind] = library_dir / kind
        skips += kind_skips
        files = len({r.source_path for r in records})
        counts[kind] = {
            "root": str(kinds[kind]),
            "kept": files,
            "skipped": len(kind_skips),
            **({"segments": len(records)} if len(records) != files else {}),
        }  # backgrounds cut by background_split: segment
        below = [k for k in kind_skips if k.reason == "low-sample-rate"]
        if below and not records:
            low.append(f"{len(below)} {kind} files of {kinds[kind]} (e.g. {below[0].path}), and no other usable one,")
    if low:
        shutil.rmtree(library_dir, ignore_errors=True)
        raise MixError(
            f"mix: sample_rate_hz is {params.sample_rate_hz} Hz but {' and '.join(low)} have a lower rate, and mixing must "
            f"not upsample; mix at their rate (sample_rate_hz in params.yaml) or add files at {params.sample_rate_hz} Hz or above"
        )
    return SourceFolders(folders["events"], folders["backgrounds"], library_dir, counts, skips)


def read_parquet(path: Path, names: list[str] | None = None) -> pa.Table:
    """One Parquet file as a table, all its columns or those ``names`` (``ParquetFile``: ``pq.read_table``
    would import pyarrow.dataset and pandas, 0.5 s)."""
    return pq.ParquetFile(path).read(columns=names)


WITHOUT_ENVELOPE = {"envelope_db": ()}  # records read with their envelopes kept apart (:class:`StoredEnvelopes`)


def read_sources(
    events_dir: Path, backgrounds_dir: Path, envelopes: bool = True
) -> tuple[list[EventClip], list[BackgroundSegment]]:
    """The records of two manifest folders (a clip-stage and an ambience-stage layout).

    With ``envelopes=False`` every record's ``envelope_db`` is ``()``: the mix stage reads the
    envelopes with :func:`read_envelopes`, about 4 bytes a frame instead of the 32 of a tuple of
    Python floats (on all of FSD50K, most of a worker's memory)."""
    for d, stage in ((events_dir, "clip"), (backgrounds_dir, "ambience")):
        if not (d / MANIFEST).exists():
            raise FileNotFoundError(f"{d / MANIFEST} not found: run `sedsynth {stage}` (or `dvc repro {stage}`) first")
    fill = None if envelopes else WITHOUT_ENVELOPE

    def read(folder: Path, record_type: type) -> list:
        names = None if envelopes else [name for name in columns(record_type) if name not in WITHOUT_ENVELOPE]
        return from_table(read_parquet(folder / MANIFEST, names), record_type, fill)

    return read(events_dir, EventClip), read(backgrounds_dir, BackgroundSegment)


@dataclass(frozen=True)
class StoredEnvelopes:
    """One manifest's ``envelope_db`` column as a single float32 buffer: :meth:`db` is an item's
    envelope, a read-only view (the values the record's tuple would hold)."""

    rows: dict[str, tuple[int, int]]  # item id -> (first value, frames)
    values: np.ndarray  # (all frames,) float32

    def db(self, item_id: str) -> np.ndarray:
        first, frames = self.rows[item_id]
        return self.values[first : first + frames]


def read_envelopes(folder: Path, id_column: str) -> StoredEnvelopes:
    """The envelopes of ``folder``'s manifest, keyed by ``id_column`` (``clip_id`` or ``segment_id``)."""
    table = read_parquet(folder / MANIFEST, [id_column, "envelope_db"])
    column = table.column("envelope_db").combine_chunks()
    frames = pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    firsts = np.concatenate(([0], np.cumsum(frames)[:-1])) if frames.shape[0] else frames
    values = np.asarray(pc.list_flatten(column).to_numpy(zero_copy_only=False), dtype=np.float32)
    values.flags.writeable = False
    ids = table.column(id_column).to_pylist()
    return StoredEnvelopes(dict(zip(ids, zip(firsts.tolist(), frames.tolist()))), values)


def check_sample_rates(
    spec: MixSpec, events: list[EventClip], backgrounds: list[BackgroundSegment], events_dir: Path, backgrounds_dir: Path
) -> None:
    """Raise :class:`MixError` if mixing at ``spec.sample_rate_hz`` would upsample a source.

    Upsampled audio has nothing above the source's Nyquist frequency, so a 48 kHz dataset made
    from 16 kHz clips only looks like 48 kHz. The spec's rate is the top-level
    ``sample_rate_hz``, the rate the clip and ambience stages write: a lower source rate means
    their outputs were made at another rate and must be made again.
    """
    rate = spec.sample_rate_hz
    low = [
        (folder, what, min(x.sample_rate_hz for x in items))
        for folder, what, items in ((events_dir, "clips", events), (backgrounds_dir, "background segments", backgrounds))
        if items and min(x.sample_rate_hz for x in items) < rate
    ]
    if not low:
        return
    held = " and ".join(f"{folder} holds {source_rate} Hz {what}" for folder, what, source_rate in low)
    lowest = min(source_rate for _, _, source_rate in low)
    raise MixError(
        f"mix: sample_rate_hz is {rate} Hz but {held}, and mixing must not upsample them (nothing above {lowest // 2} Hz); "
        f"re-run the clip and ambience stages at {rate} Hz (dvc repro, or sedsynth clip --set sample_rate_hz={rate} and "
        f"sedsynth ambience --set sample_rate_hz={rate}), or mix at the sources' rate with sample_rate_hz: {lowest} in params.yaml"
    )


def check_envelope_hops(events: list[EventClip], backgrounds: list[BackgroundSegment]) -> None:
    """Raise :class:`MixError` unless every event and background envelope uses the same hop (relabeling compares them frame by frame)."""
    hops = {round(x.envelope_hop_s, 9) for x in [*events, *backgrounds]}
    if len(hops) > 1:
        raise MixError(
            f"mix: event and background envelopes use different hops {sorted(hops)} s; "
            "set clip.envelope_hop_s and ambience.envelope_hop_s to the same value and re-run both stages"
        )


def room_digests(spec: MixSpec) -> tuple[dict[str, str], list[Skip]]:
    """The impulse-response files a run may use (``reverb.rirs``, when reverb is on): ``(room id ->
    sha256 of the file, skips)``. A file that does not load is skipped with its reason, as the
    workers skip it; none usable stops the run."""
    rev = spec.reverb
    if not rev.rirs or (rev.probability <= 0 and rev.background_probability <= 0):
        return {}, []
    try:
        good, bad = usable_rooms(rev.rirs, spec.sample_rate_hz)
    except AugmentError as e:
        raise MixError(f"mix: {e}") from None
    skips = []
    for rid, reason, detail in bad:
        path = str(room_file(rid))
        skips.append(Skip(path, path, reason, f"impulse response: {detail}"))
    return {rid: file_sha256(room_file(rid)) for rid in good}, skips
