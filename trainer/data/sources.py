"""Where training rows come from, and how they are cut into pieces for ranks and workers.

Two kinds of source here (a third, ``mixing``, mixes its rows as it reads them: :mod:`trainer.data.mixing`):

- ``shards``: Parquet files in the Hugging Face layout (``data/<split>-*.parquet``; a local folder
  or any fsspec URL such as ``hf://datasets/you/name`` or ``s3://bucket/set``). Rows carry FLAC
  bytes, a caption and frame-labelled phrases; a Parquet file of clip-only captions (an audio
  struct column and a caption column, as AudioCaps or Clotho on the hub) reads the same way.
- ``captions``: a CSV of captions beside an audio folder (AudioCaps, Clotho, WavCaps as users
  keep them); ``path_format`` names each row's file from its columns, e.g. ``{youtube_id}.wav``.

A source is cut into :class:`Piece` s (a row range inside one Parquet row group, or of the CSV)
that :func:`plan_epoch` deals to the global workers (ranks x DataLoader workers): every row
goes to exactly one worker per epoch, and every worker gets the same number of rows (the few
left over by uneven pieces wait for a later epoch, where the deal differs).

Parquet files are untrusted input: every listed path must lie in the folder and be a regular
file (:func:`list_parquet`), a file with a column of the wrong type is left out whole and named
(:meth:`ParquetSource.row_groups`), and a cell's audio is its bytes alone (:meth:`ParquetSource.read`).
"""

from __future__ import annotations

import csv
import os
import sys
import zlib
from dataclasses import dataclass, field

import numpy as np

from trainer.config import SourceParams
from pipeline.schema import Skip

SHARD_COLUMNS = ("id", "audio", "caption", "phrases", "duration_s")  # duration_s: where a row's segments must end


class SourceError(ValueError):
    """A training source that cannot be read; the message says what to fix."""


def pa_errors() -> type[Exception]:
    import pyarrow as pa

    return pa.ArrowException


def _first_line(error: Exception) -> str:
    text = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    return text[:200]


@dataclass(frozen=True)
class Piece:
    """Rows ``[start, stop)`` of one row group of one file (``row_group`` is -1 for a CSV)."""

    source: int
    file: str
    row_group: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


def stable_hash(text: str) -> int:
    """A 32-bit hash of an id that does not change between runs or machines."""
    return zlib.crc32(text.encode("utf-8"))


def _fs(path: str):
    import fsspec

    return fsspec.core.url_to_fs(path)


def list_parquet(path: str, split: str) -> list[str]:
    """The split's Parquet files in a folder (``index.json`` first, then a glob) or a single file.

    Every file is checked before anything opens it: an ``index.json`` entry must name a path
    inside the folder (:func:`~pipeline.shards.layout.entry_problem`), and a local file must be a
    regular one (a FIFO would block the reader, ``/dev/zero`` never end). Raises ``SourceError``
    naming the entry and the folder otherwise.
    """
    import json

    from pipeline.shards.layout import entry_problem

    fs, root = _fs(path)
    if root.endswith(".parquet"):
        if not fs.exists(root):
            raise SourceError(f"train: {path} not found")
        _refuse_special(fs, root, f"train: {path}")
        return [root]
    folder = root.rstrip("/")
    index = f"{folder}/index.json"
    if fs.exists(index):
        _refuse_special(fs, index, f"train: {index}")
        try:
            with fs.open(index, "r") as f:
                files = [e["path"] for e in json.load(f)["files"] if e["split"] == split]
        except (ValueError, KeyError, TypeError) as e:  # not JSON, or entries without path / split
            raise SourceError(f"train: {index} is malformed ({type(e).__name__}: {e}); re-create the folder with "
                              "`sedsynth shards` or download it again") from None
        for p in files:
            unsafe = entry_problem(p)
            if unsafe:
                raise SourceError(f"train: {index} entry {p!r} {unsafe}; every entry must name a file under {path}: "
                                  "re-create the folder with `sedsynth shards` or download it again")
        files = [f"{folder}/{p}" for p in files]
        for p in files:
            _refuse_special(fs, p, f"train: {index} entry {p}")
        if files:  # none: a split the index does not list falls through to the error below
            return files
    found = sorted(fs.glob(f"{folder}/**/{split}-*.parquet")) or sorted(fs.glob(f"{folder}/{split}-*.parquet"))
    if not found:
        key = ("train.data.sources[].path" if split == "train" else
               "train.data.valid (its path and split; null trains without a held-out split)")
        raise SourceError(f"train: no {split}-*.parquet files under {path}; build them with `sedsynth shards` "
                          f"or point {key} at a folder in the Hugging Face layout")
    for p in found:
        _refuse_special(fs, p, f"train: {p} under {path}")
    return found


def _refuse_special(fs, path: str, what: str) -> None:
    """Raise ``SourceError`` when the local file ``path`` exists but is not a regular file
    (a remote store holds only regular objects: nothing to check there)."""
    from fsspec.implementations.local import LocalFileSystem

    from pipeline.shards.layout import special_file_problem

    problem = special_file_problem(path) if isinstance(fs, LocalFileSystem) else None
    if problem:
        raise SourceError(f"{what} {problem}; replace it with the Parquet file `sedsynth shards` wrote, or remove it")


READ_BATCH_ROWS = 16  # rows per Arrow batch when streaming a row group
READ_BUFFER_BYTES = 2**20  # the reader's buffer: a row group's column chunks are read a page at a time, not whole


class _Cursor:
    """One pass through one row group of one file, in batches; it only goes forward."""

    def __init__(self, fs, file: str, row_group: int, columns):
        import pyarrow.parquet as pq

        self.key, self.at, self.pid = (file, row_group), 0, os.getpid()
        self._file = fs.open(file, "rb")
        try:
            pf = pq.ParquetFile(self._file, pre_buffer=False, buffer_size=READ_BUFFER_BYTES)
            self._batches = pf.iter_batches(batch_size=READ_BATCH_ROWS, row_groups=[row_group], columns=columns(pf.schema_arrow.names))
        except BaseException:
            self._file.close()
            raise
        self._held = None  # the last batch read, for a piece that starts inside it

    def can_reach(self, key: tuple[str, int], start: int) -> bool:
        held = self._held.num_rows if self._held is not None else 0
        return key == self.key and start >= self.at - held and os.getpid() == self.pid  # a forked worker opens its own

    def take(self, start: int, stop: int):
        """The record batches (sliced) that hold rows ``[start, stop)``, one at a time; rows before
        ``start`` are read and dropped."""
        while True:
            if self._held is None:
                self._held = next(self._batches, None)
                if self._held is None:
                    return  # the row group ended (a piece past its end reads nothing)
                self.at += self._held.num_rows
            first = self.at - self._held.num_rows  # the held batch's first row
            lo, hi = max(start - first, 0), min(stop - first, self._held.num_rows)
            if hi > lo:
                yield self._held.slice(lo, hi - lo)
            if self.at >= stop:
                return
            self._held = None

    def close(self) -> None:
        self._batches, self._held = None, None
        self._file.close()


class ParquetSource:
    """Rows of Parquet files, read a piece at a time by streaming its row group (:meth:`read`)."""

    def __init__(self, index: int, params: SourceParams):
        self.index, self.params = index, params
        self.fs, root = _fs(params.path)
        self.root = root.rstrip("/")  # the folder (or the one file) the files are listed under
        self.files = list_parquet(params.path, params.split)
        self._cursor: _Cursor | None = None  # the open pass through the row group read last
        self._row_groups: list[tuple[str, int, int]] | None = None
        self._first_row: dict[tuple[str, int], int] = {}  # (file, row group) -> its first row's position in the file
        self.skips: list[Skip] = []
        self.row_groups()  # footers now, so a broken file is reported (and left out) before training starts

    def row_groups(self) -> list[tuple[str, int, int]]:
        """``(file, row_group, rows)`` from the files' footers, read once (no data read).

        A file whose footer cannot be read (empty, cut short, not Parquet, gone), that has no
        audio column, or with a column of another type than the readers take
        (:func:`~pipeline.shards.rows.column_problem`) is left out: it goes to ``skips`` and one
        line on stderr names it (and the column). No readable file is an error.
        """
        import pyarrow.parquet as pq

        from pipeline.shards.rows import column_problem

        if self._row_groups is None:
            groups = []
            for file in self.files:
                try:
                    with self.fs.open(file, "rb") as f:
                        pf = pq.ParquetFile(f)
                        meta, schema = pf.metadata, pf.schema_arrow
                except (FileNotFoundError, IsADirectoryError) as e:
                    self._skip(file, "missing-file", f"listed but not there ({e.strerror or e})")
                    continue
                except (OSError, ValueError, pa_errors()) as e:  # pyarrow: ArrowInvalid (a ValueError), ArrowIOError (an OSError)
                    self._skip(file, "unreadable", f"not a readable Parquet file ({_first_line(e)})")
                    continue
                wanted = self.columns(schema.names)
                wrong = [p for c in wanted if (p := column_problem(schema, c, self.params.audio_column))]
                if "audio" not in wanted and self.params.audio_column not in wanted:
                    wrong.insert(0, f"no column 'audio' (nor {self.params.audio_column!r}, train.data.sources[].audio_column)")
                if wrong:
                    self._skip(file, "unreadable", wrong[0])
                    continue
                first = 0
                for g in range(meta.num_row_groups):
                    groups.append((file, g, meta.row_group(g).num_rows))
                    self._first_row[(file, g)] = first
                    first += meta.row_group(g).num_rows
            if not groups:
                named = "; ".join(f"{s.path}: {s.detail}" for s in self.skips[:3])
                raise SourceError(f"train: no readable {self.params.split} Parquet file under {self.params.path} ({named}); "
                                  "re-create the shards with `sedsynth shards` or point train.data.sources[].path elsewhere")
            self._row_groups = groups
        return self._row_groups

    def _skip(self, file: str, reason: str, detail: str) -> None:
        self.skips.append(Skip(file, file, reason, detail))
        print(f"train: skipping {file}: {detail}; re-create it (sedsynth shards, or download it again) or remove it "
              "and its index.json entry", file=sys.stderr)

    def columns(self, names: list[str]) -> list[str]:
        wanted = [c for c in SHARD_COLUMNS if c in names]
        wanted += [c for c in self.params.caption_columns if c in names and c not in wanted]
        if self.params.audio_column in names and self.params.audio_column not in wanted:
            wanted.append(self.params.audio_column)
        return wanted

    def read(self, piece: Piece) -> list[dict]:
        """The rows of ``piece``, each with ``_from``: ``(file, row position in it)`` for reports.

        The row group is streamed in batches of ``READ_BATCH_ROWS`` from its start to the piece's
        last row, and only the piece's rows are kept, so a reader holds one piece and about one
        data page, not the row group (190 MB of audio in a default shard's); a piece that goes on
        where the last one stopped continues the same pass (:class:`_Cursor`).

        ``audio`` is the cell's ``{"bytes"}`` only (``None`` for a null cell): a shard's audio
        comes from its bytes, never from the path a cell may name (a FIFO there would hang
        the reader, a test file be trained on). Rows are not checked here: the stream skips
        and reports a bad one (:meth:`~trainer.data.stream.ItemBuilder.check`).
        """
        key = (piece.file, piece.row_group)
        try:
            if self._cursor is None or not self._cursor.can_reach(key, piece.start):
                self.release()
                self._cursor = _Cursor(self.fs, piece.file, piece.row_group, self.columns)
            rows = [r for batch in self._cursor.take(piece.start, piece.stop) for r in batch.to_pylist()]  # Arrow's buffers: a batch at a time
        except (OSError, ValueError, pa_errors()) as e:  # its footer read at the start: the file changed or its data is corrupt
            self.release()
            raise SourceError(f"train: cannot read row group {piece.row_group} of {piece.file} ({_first_line(e)}); re-create it "
                              "(sedsynth shards, or download it again) or remove it and its index.json entry, then rerun "
                              "(training resumes from latest.pt)") from None
        first = self._first_row[key]  # the row group's first row in the file
        several = self.params.caption_columns != ("caption",)  # a caption corpus's columns: one is drawn per row and epoch
        for i, r in enumerate(rows, piece.start):
            r.setdefault("id", f"{piece.file}#{piece.row_group}:{i}")
            cell = r["audio"] if "audio" in r else r.pop(self.params.audio_column, None)
            r["audio"] = {"bytes": cell.get("bytes")} if isinstance(cell, dict) else None
            r["_from"] = (piece.file, first + i)
            if several:
                r["captions"] = [r[c] for c in self.params.caption_columns if isinstance(r.get(c), str) and r[c].strip()]
        return rows

    def release(self) -> None:
        """Close the open row group pass (a stream's reader calls it once its pieces are read)."""
        if self._cursor is not None:
            self._cursor.close()
            self._cursor = None

    def texts(self) -> list[str]:
        """Every caption (of ``caption`` and the caption columns) and phrase of the readable files,
        read without the audio column."""
        import pyarrow.parquet as pq

        out: list[str] = []
        for file in dict.fromkeys(f for f, _, _ in self.row_groups()):
            with self.fs.open(file, "rb") as f:
                pf = pq.ParquetFile(f)
                names = pf.schema_arrow.names
                wanted = [c for c in dict.fromkeys(("caption", *self.params.caption_columns, "phrases")) if c in names]
                table = pf.read(columns=wanted).to_pydict()
            for column, values in table.items():
                if column == "phrases":  # a null list, phrase or text gives nothing (the stream skips such rows)
                    out += [ph["phrase"] for row in values for ph in row or [] if ph and isinstance(ph.get("phrase"), str)
                            and ph["phrase"]]
                else:
                    out += [v for v in values if isinstance(v, str) and v]
        return out


class CaptionCsvSource:
    """Rows of a captions CSV; files missing from ``audio_dir`` are reported, not read."""

    def __init__(self, index: int, params: SourceParams):
        from pathlib import Path

        self.index, self.params = index, params
        if params.audio_dir is None:
            raise SourceError(f"train: caption source {params.path} needs audio_dir (the folder its audio files live in)")
        path, audio_dir = Path(params.path), Path(params.audio_dir)
        if not path.exists():
            raise SourceError(f"train: caption CSV {path} not found")
        if not audio_dir.is_dir():
            raise SourceError(f"train: audio_dir {audio_dir} is not a folder")
        self.rows: list[dict] = []
        self.skips: list[Skip] = []
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = [c for c in params.caption_columns if c not in (reader.fieldnames or [])]
            if missing:
                raise SourceError(f"train: {path} has no column(s) {missing}; its columns are {reader.fieldnames}. "
                                  "Set caption_columns (and path_format) to match")
            for line, row in enumerate(reader, start=2):
                if params.split_column and row.get(params.split_column) != params.split:
                    continue
                try:
                    name = params.path_format.format(**row)
                except (KeyError, IndexError, ValueError) as e:
                    self.skips.append(Skip(f"line {line}", str(path), "malformed-row", f"path_format {params.path_format!r}: {e}"))
                    continue
                captions = [row[c] for c in params.caption_columns if (row.get(c) or "").strip()]
                if not captions:
                    self.skips.append(Skip(f"line {line}", str(path), "malformed-row", "no caption in the caption columns"))
                    continue
                audio = audio_dir / name
                if not audio.is_file():
                    self.skips.append(Skip(name, str(audio), "missing-file", f"named by {path} line {line}"))
                    continue
                self.rows.append({"id": name, "audio": {"file": str(audio)}, "captions": captions})
        if not self.rows:
            reasons = ", ".join(f"{s.item_id}: {s.reason} ({s.detail})" for s in self.skips[:3])
            raise SourceError(f"train: no usable rows in {path}; {len(self.skips)} skipped, e.g. {reasons}")
        self.files = [str(path)]

    def row_groups(self) -> list[tuple[str, int, int]]:
        return [(str(self.params.path), -1, len(self.rows))]

    def texts(self) -> list[str]:
        """Every caption of the usable rows."""
        return [c for r in self.rows for c in r["captions"]]

    def read(self, piece: Piece) -> list[dict]:
        return [dict(r) for r in self.rows[piece.start:piece.stop]]


def location_free(source) -> list[tuple[str, int, int]]:
    """``source.row_groups()`` with each Parquet file named relative to its source's folder (its
    bare name when the source is the file itself): the same for a checkout in any folder, so
    what is derived from it (a checkpoint's data fingerprint) has the same bytes everywhere."""
    groups = source.row_groups()
    if not isinstance(source, ParquetSource):
        return groups
    root = source.root

    def name(file: str) -> str:
        if file == root:
            return file.rsplit("/", 1)[-1]
        return file[len(root) + 1:] if file.startswith(root + "/") else file

    return [(name(file), group, rows) for file, group, rows in groups]


def open_source(index: int, params: SourceParams):
    """A shards or captions source; a mixing source needs the run's params: :class:`trainer.data.mixing.MixingSource`."""
    if params.kind == "mixing":
        raise SourceError("train: a mixing source is opened with the run's params (trainer.data.mixing.MixingSource, "
                          "as make_stream does)")
    if params.kind == "captions" and params.path.endswith((".csv", ".tsv")):
        return CaptionCsvSource(index, params)
    return ParquetSource(index, params)


def pieces_of(source, piece_rows: int) -> list[Piece]:
    """Cut every row group into pieces of at most ``piece_rows`` rows."""
    out = []
    for file, group, rows in source.row_groups():
        for start in range(0, rows, piece_rows):
            out.append(Piece(source.index, file, group, start, min(rows, start + piece_rows)))
    return out


@dataclass
class Deal:
    """One epoch's assignment: the pieces of each global worker and the rows each may use."""

    pieces: list[list[Piece]] = field(default_factory=list)
    quota: int = 0


def plan_epoch(pieces: list[Piece], num_workers: int, seed: int, epoch: int) -> Deal:
    """Shuffle the pieces for this epoch and deal them to ``num_workers`` global workers.

    Each piece goes to the worker with the fewest rows so far, so row counts differ by less
    than one piece; ``quota`` (the smallest count) is what every worker yields, which keeps
    DDP ranks in step. Depends only on (pieces, num_workers, seed, epoch).
    """
    order = np.random.default_rng([seed, epoch, 0x5EED]).permutation(len(pieces))
    deal = Deal([[] for _ in range(num_workers)])
    load = np.zeros(num_workers, dtype=np.int64)
    for i in order:
        w = int(np.argmin(load))
        deal.pieces[w].append(pieces[i])
        load[w] += pieces[i].rows
    deal.quota = int(load.min()) if num_workers else 0
    return deal


def piece_rows_for(total_rows: int, num_workers: int, piece_rows: int) -> int:
    """Pieces small enough that each worker gets several (so the deal stays balanced)."""
    return max(1, min(piece_rows, -(-total_rows // (8 * max(1, num_workers)))))
