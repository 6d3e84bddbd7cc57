"""Check a shard folder against the shard schema and its index.

Input: a dataset folder (as written by the shards stage, or downloaded from the hub).
Output: a summary dict, or :class:`ValidationError` listing every problem found, each naming
the file and what to do. Checks: ``index.json`` parses; every indexed path lies inside the
folder and is a regular file, not a symbolic link (checked before it is opened: a FIFO or
device would block or never end); every indexed shard exists with the indexed sha256 and row
count, and no unindexed shard lies in ``data/``; each shard is Parquet with exactly the shard schema
(fields, nullability, order) and ``huggingface`` metadata from which ``datasets`` types every
column as the card does (``audio`` as ``Audio`` at the indexed rate); every row's audio cell
has bytes matching its ``audio_sha256``, and its phrases pass
:func:`~pipeline.shards.rows.phrase_problems` (no nulls, segments inside their mixture, cluster
ids inside the inventory: the rule the trainer and the evaluator skip rows by); each cell's FLAC
header (read without decoding) states no more frames than the row's ``duration_s`` x
``sample_rate_hz`` at that rate (a 729 KB cell can hold 4 hours of silence, which a reader
would decode whole); the card has ``configs`` for every split. With ``decode=True`` every
audio cell is also decoded in full (a damaged FLAC frame fails its CRC) and its length checked
against the recipe's ``duration_s`` x ``sample_rate_hz``. A problem in a row names the shard
file, the row's position in it and the mixture id; every bad row is reported, not just the first.

Only regular files are read, and no symbolic link is followed: every file and folder under the
dataset folder (but hidden ones, which are never published) must be a regular file or a plain
folder, or it is a problem naming it, so a link such as ``images/x.png -> /etc/shadow`` makes
the folder invalid and nothing outside the folder is read. ``index.json``, ``README.md``,
``clusters/clusters.parquet`` and every shard are opened with
:func:`~pipeline.files.open_regular` (not following a link) and read from that descriptor. A
hub cache's snapshot (files linked to blobs) is therefore refused: download with
``hf download --local-dir`` or copy it with ``cp -rL`` first.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import soundfile as sf
import yaml

from pipeline.audio import ENDLESS_FRAMES, frame_limit
from pipeline.files import NotRegularFileError, open_regular
from pipeline.shards.layout import CARD, DATA, INDEX, INDEX_VERSION, entry_problem, features, shard_schema, special_file_problem
from pipeline.shards.rows import phrase_problems

LINKS_NOT_FOLLOWED = "validate and publish do not follow links"
CARD_MAX_BYTES = 16 * 2**20  # the card `sedsynth shards` writes is tens of kilobytes
CLUSTERS = "clusters/clusters.parquet"


class ValidationError(ValueError):
    """The folder is not a valid shard folder; ``problems`` lists why."""

    def __init__(self, folder: Path, problems: list[str]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{folder} is not a valid shard folder ({len(problems)} problems):\n{lines}")


def _schema_problems(name: str, schema: pa.Schema, rate: int) -> list[str]:
    """Problems of a shard's Arrow schema against :func:`shard_schema` and what ``datasets``
    infers from the file alone (it takes the ``huggingface`` metadata only where it matches)."""
    import datasets

    expected = shard_schema(rate)
    got = {f.name: f for f in schema}
    want = {f.name: f for f in expected}
    if set(got) != set(want):
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        return [
            f"{name}: columns differ from the shard schema (missing {missing}, unexpected {extra}); "
            "it was not written by `sedsynth shards` (or by another version): re-run `sedsynth shards`"
        ]
    problems = [
        f"{name}: column {k!r} is {got[k].type}{'' if got[k].nullable else ' not null'}, datasets writes {want[k].type}; "
        "re-run `sedsynth shards`"
        for k in want
        if not got[k].equals(want[k])
    ]
    if schema.names != expected.names:
        problems.append(
            f"{name}: columns are in the order {schema.names}, the shard schema's is {expected.names}; re-run `sedsynth shards`"
        )
    if problems:
        return problems
    inferred = datasets.Features.from_arrow_schema(schema)
    audio = inferred["audio"]
    if not isinstance(audio, datasets.Audio):
        problems.append(f"{name}: no 'huggingface' schema metadata typing 'audio' as Audio; datasets would load raw structs")
    elif audio.sampling_rate != rate:
        problems.append(f"{name}: Audio sampling_rate {audio.sampling_rate} differs from index.json's {rate}")
    feats = features(rate)
    untyped = [k for k in feats if k != "audio" and inferred[k] != feats[k]]
    if untyped:
        problems.append(
            f"{name}: datasets would read columns {untyped} otherwise than the card says (its 'huggingface' "
            "schema metadata disagrees); re-run `sedsynth shards`"
        )
    return problems


def _header_problems(info, r: dict) -> list[str]:
    """Faults the audio cell's header (``soundfile.info``, read without decoding) shows: a rate
    other than the row's, or more frames than ``duration_s`` x that rate (a header that gives no
    length counts as endless). A shorter cell is left to the full decode, which names it with
    its decoded length."""
    duration, rate = r["duration_s"], r["sample_rate_hz"]
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in (duration, rate)):
        return []  # a null or non-finite duration or rate is named by the row's other checks
    todo = "re-run `sedsynth mix` and `sedsynth shards`"
    problems = []
    if info.samplerate != rate:
        problems.append(f"audio header says {info.samplerate} Hz, the row says {rate} Hz; {todo}")
    if info.frames >= ENDLESS_FRAMES:
        problems.append(f"audio header gives no length, so a reader could not bound it (the row says {duration} s); {todo}")
    elif info.frames > frame_limit(duration, info.samplerate):
        problems.append(
            f"audio header says {info.frames} frames at {info.samplerate} Hz ({info.frames / info.samplerate:.1f} s), "
            f"longer than the row's duration_s {duration} s, and a reader would decode all of it; {todo}"
        )
    return problems


def _cell_problems(r: dict, decode: bool) -> list[str]:
    """Faults of one row's audio cell, as messages without the file and row prefix."""
    data = (r["audio"] or {}).get("bytes")
    if data is None:  # readers take the audio from the bytes only: a path alone is never opened
        return ["malformed row: the audio cell has no bytes; re-run `sedsynth shards`"]
    problems = []
    if hashlib.sha256(data).hexdigest() != r["audio_sha256"]:
        problems.append(
            "audio bytes do not match audio_sha256 (the cell changed after it was written); "
            "copy the shard again or re-run `sedsynth shards`"
        )
    try:
        info = sf.info(io.BytesIO(data))
    except (RuntimeError, TypeError, ValueError) as e:  # soundfile's LibsndfileError is a RuntimeError
        if not decode:  # with decode, the decode below names it
            return problems + [f"audio header does not parse ({_first_line(e)}); re-run `sedsynth mix` and `sedsynth shards`"]
    else:
        header = _header_problems(info, r)
        if header or not decode:  # a cell longer than its row is not decoded: 4 hours are 460 MB of samples
            return problems + header
    # a full decode: libFLAC checks every frame's CRC, which a header read does not
    try:
        samples, rate = sf.read(io.BytesIO(data), dtype="int16", always_2d=True)
    except (RuntimeError, TypeError, ValueError) as e:
        return problems + [f"audio does not decode ({e}); re-run `sedsynth mix` and `sedsynth shards`"]
    expected = round(r["duration_s"] * r["sample_rate_hz"])
    if rate != r["sample_rate_hz"] or samples.shape[0] != expected:
        problems.append(
            f"audio is {samples.shape[0]} frames at {rate} Hz, the recipe says {expected} frames "
            f"({r['duration_s']} s at {r['sample_rate_hz']} Hz); re-run `sedsynth mix` and `sedsynth shards`"
        )
    return problems


def _first_line(error: BaseException) -> str:
    return next((x.strip() for x in str(error).splitlines() if x.strip()), type(error).__name__)


def _row_problems(name: str, first_row: int, rows: list[dict], num_clusters: int | None, decode: bool) -> list[str]:
    """Problems of consecutive rows of one shard, ``first_row`` being the first's position in the file."""
    problems = []
    cluster_ids = range(num_clusters) if num_clusters is not None else None
    for k, r in enumerate(rows, first_row):
        where = f"{name}: row {k} (mixture {r.get('id')})"
        try:
            # every field of a ShardRow has a value (phrases, duration_s and audio: named by the checks below)
            found = [
                f"malformed row: {field} is null; re-run `sedsynth shards`"
                for field, value in r.items()
                if value is None and field not in ("phrases", "duration_s", "audio")
            ]
            # the rule the trainer and the evaluator skip rows by
            found += [f"{p}; re-run `sedsynth shards`" for p in phrase_problems(r["phrases"], r["duration_s"], cluster_ids)]
            found += _cell_problems(r, decode)
        except (TypeError, KeyError) as e:  # a null where a value belongs: report the row, check the rest
            found = [f"malformed row ({type(e).__name__}: {e}); re-run `sedsynth shards`"]
        problems += [f"{where}: {p}" for p in found]
    return problems


def folder_files(folder: Path) -> tuple[list[str], dict[str, str]]:
    """The entries under ``folder``, found without following any link, as paths relative to it.

    Returns the regular files (sorted) and every other entry that is not a plain folder (a
    symbolic link, to a file or a folder, a FIFO, socket or device), each with why it is not
    read. Hidden entries (a name starting with ``.``) and what lies under them are left out:
    neither checked nor published.
    """
    regular, odd, folders = [], {}, [folder]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for e in entries:
                if e.name.startswith("."):
                    continue
                rel = Path(e.path).relative_to(folder).as_posix()
                if e.is_symlink():
                    odd[rel] = f"is a symbolic link ({LINKS_NOT_FOLLOWED})"
                elif e.is_dir(follow_symlinks=False):
                    folders.append(Path(e.path))
                elif e.is_file(follow_symlinks=False):
                    regular.append(rel)
                else:
                    odd[rel] = "is not a regular file (a FIFO, socket or device)"
    return sorted(regular), dict(sorted(odd.items()))


def odd_file_problem(rel: str, why: str) -> str:
    """The problem line for an entry :func:`folder_files` found not to be a regular file."""
    todo = "put a copy of the file itself there, or remove it" if "link" in why else "remove it"
    return f"{rel} {why}; a shard folder holds regular files only: {todo}"


def _link_on_the_way(folder: Path, rel: str) -> str | None:
    """The first part of ``folder/rel`` below ``folder`` that is a symbolic link (``rel`` itself
    included), as a path relative to ``folder``; ``None`` when there is none."""
    here = folder
    for part in Path(rel).parts:
        here = here / part
        if here.is_symlink():
            return here.relative_to(folder).as_posix()
    return None


def _read_index(folder: Path) -> dict:
    """``index.json``, read only if it is a regular file and not a link; else :class:`ValidationError`."""
    path = folder / INDEX
    if not path.exists() and not path.is_symlink():
        raise ValidationError(folder, [f"no {INDEX}: not a folder written by `sedsynth shards` (or the download is incomplete)"])
    todo = "replace it with the index `sedsynth shards` wrote"
    special = special_file_problem(path)
    if special:
        raise ValidationError(folder, [f"{INDEX} {special}; {todo}"])
    if path.is_symlink():
        raise ValidationError(folder, [f"{INDEX} is a symbolic link ({LINKS_NOT_FOLLOWED}); {todo}"])
    try:
        with open_regular(path, INDEX, follow_links=False) as stream:  # swapped since the checks: refused here
            index = json.loads(stream.read().decode("utf-8"))
        files = index["files"]
        index["sample_rate_hz"]  # a KeyError names it
        if not all(
            isinstance(f, dict)
            and isinstance(f.get("path"), str)
            and isinstance(f.get("split"), str)
            and {"sha256", "num_rows"} <= f.keys()
            for f in files
        ):
            raise ValueError("an entry of 'files' lacks path, split, sha256 or num_rows")
    except NotRegularFileError as e:
        raise ValidationError(folder, [f"{e}; {todo}"]) from None
    except (ValueError, KeyError, TypeError) as e:
        raise ValidationError(folder, [f"{INDEX} is malformed ({type(e).__name__}: {e}); re-run `sedsynth shards`"]) from None
    if index.get("version") != INDEX_VERSION:
        raise ValidationError(
            folder,
            [
                f"{INDEX} has version {index.get('version')!r}; this version reads {INDEX_VERSION}: "
                "re-run `sedsynth shards` with this version"
            ],
        )
    return index


def _entry_problem(folder: Path, rel: str) -> str | None:
    """Why the ``index.json`` entry ``rel`` must not be opened (outside the folder, not a regular
    file, a link on its way); ``None`` when it may (also when it is missing)."""
    # an entry is untrusted: '../x' or '/dev/zero' must not be hashed or opened (a FIFO blocks, a device never ends)
    problem = entry_problem(rel) or special_file_problem(folder / rel)
    if problem:
        return problem
    link = _link_on_the_way(folder, rel)
    if link == rel:
        return f"is a symbolic link ({LINKS_NOT_FOLLOWED})"
    return None if link is None else f"lies under {link}, a symbolic link ({LINKS_NOT_FOLLOWED})"


def _shard_problems(folder: Path, f: dict, rate: int, num_clusters: int | None, decode: bool) -> list[str]:
    """Problems of the indexed shard ``f`` (a safe entry: :func:`_entry_problem` found none)."""
    name = f["path"]
    try:
        stream = open_regular(folder / name, name, follow_links=False)  # swapped since the checks: refused here
    except FileNotFoundError:
        return [f"{name}: listed in {INDEX} but missing; download or copy it again"]
    except NotRegularFileError as e:
        return [f"{INDEX} entry {name!r}: {e}; every entry must be a file under {folder}"]
    problems = []
    with stream:
        if hashlib.file_digest(stream, "sha256").hexdigest() != f["sha256"]:
            problems.append(
                f"{name}: sha256 differs from {INDEX} (the file was changed or truncated); copy it again or re-run `sedsynth shards`"
            )
        stream.seek(0)
        try:
            pf = pq.ParquetFile(stream)
        except (pa.ArrowException, OSError) as e:
            return problems + [f"{name}: not a readable Parquet file ({type(e).__name__}: {e})"]
        if pf.metadata.num_rows != f["num_rows"]:
            problems.append(f"{name}: {pf.metadata.num_rows} rows, {INDEX} says {f['num_rows']}")
        schema_problems = _schema_problems(name, pf.schema_arrow, rate)
        if schema_problems:
            return problems + schema_problems
        first_row = 0
        for g in range(pf.num_row_groups):
            rows = pf.read_row_group(g).to_pylist()
            problems += _row_problems(name, first_row, rows, num_clusters, decode)
            first_row += len(rows)
            if any(r["split"] != f["split"] for r in rows):
                problems.append(f"{name}: rows of another split than {f['split']!r}")
    return problems


def _num_clusters(folder: Path, regular: list[str], problems: list[str]) -> int | None:
    """Rows of ``clusters/clusters.parquet`` (the cluster ids' range), ``None`` without one; a
    fault is added to ``problems``."""
    if CLUSTERS not in regular:  # absent, or not a regular file: named by the folder's check
        return None
    try:
        with open_regular(folder / CLUSTERS, CLUSTERS, follow_links=False) as stream:
            return pq.ParquetFile(stream).metadata.num_rows
    except NotRegularFileError as e:
        problems.append(f"{e}; re-run `sedsynth shards`")
    except (pa.ArrowException, OSError) as e:
        problems.append(f"{CLUSTERS}: not a readable Parquet file ({type(e).__name__}: {e}); re-run `sedsynth shards`")
    return None


def validate(folder: Path | str, decode: bool = False) -> dict:
    """Check ``folder``; returns ``{"files", "rows", "splits"}`` or raises :class:`ValidationError`."""
    folder = Path(folder)
    index = _read_index(folder)
    files, rate = index["files"], index["sample_rate_hz"]
    problems: list[str] = []
    indexed = {f["path"] for f in files}
    regular, odd = folder_files(folder)
    on_disk = {p for p in [*regular, *odd] if Path(p).parent == Path(DATA) and p.endswith(".parquet")}
    problems += [
        f"{p}: not listed in {INDEX} (a foreign or stale shard); remove it or re-run `sedsynth shards`"
        for p in sorted(on_disk - indexed)
    ]
    problems += [odd_file_problem(p, why) for p, why in odd.items() if p not in indexed and p not in on_disk]
    num_clusters = _num_clusters(folder, regular, problems)
    for f in files:
        unsafe = _entry_problem(folder, f["path"])
        if unsafe:
            problems.append(
                f"{INDEX} entry {f['path']!r} {unsafe}; every entry must be a file under {folder}: "
                "re-run `sedsynth shards` or download the folder again"
            )
            continue
        problems += _shard_problems(folder, f, rate, num_clusters, decode)
    problems += _card_problems(folder, {f["split"] for f in files}, regular, odd)
    if problems:
        raise ValidationError(folder, problems)
    return {"files": len(files), "rows": sum(f["num_rows"] for f in files), "splits": sorted({f["split"] for f in files})}


def _card_problems(folder: Path, splits: set[str], regular: list[str], odd: dict[str, str]) -> list[str]:
    if CARD in odd:  # named by the folder's check
        return []
    if CARD not in regular:
        return [f"no {CARD}: the dataset card (re-run `sedsynth shards`)"]
    try:
        with open_regular(folder / CARD, CARD, follow_links=False) as stream:
            data = stream.read(CARD_MAX_BYTES + 1)
    except NotRegularFileError as e:
        return [f"{e}; re-run `sedsynth shards`"]
    if len(data) > CARD_MAX_BYTES:
        return [
            f"{CARD} is larger than {CARD_MAX_BYTES} bytes, which the card `sedsynth shards` writes never is; re-run `sedsynth shards`"
        ]
    try:
        text = data.decode("utf-8")
        meta = yaml.safe_load(text.split("---", 2)[1]) if text.startswith("---") else None
        configured = {d["split"] for c in meta["configs"] for d in c["data_files"]}
    except (UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError, IndexError):
        return [f"{CARD}: no YAML front matter with 'configs'; datasets would guess the splits"]
    missing = sorted(splits - configured)
    return [f"{CARD}: 'configs' lacks splits {missing}"] if missing else []
