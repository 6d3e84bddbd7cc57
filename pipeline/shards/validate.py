"""Check a shard folder against the shard schema and its index.

Input: a dataset folder (as written by the shards stage, or downloaded from the hub).
Output: a summary dict, or :class:`ValidationError` listing every problem found, each naming
the file and what to do. Checks: ``index.json`` parses; every indexed path lies inside the
folder and is a regular file (checked before it is opened: a FIFO or device would block or
never end); every indexed shard exists with the indexed sha256 and row count, and no
unindexed shard lies in ``data/``; each shard is Parquet with exactly the shard schema
(fields, nullability, order) and ``huggingface`` metadata from which ``datasets`` types every
column as the card does (``audio`` as ``Audio`` at the indexed rate); every row's audio cell
has bytes matching its ``audio_sha256``, and its phrases pass
:func:`~pipeline.shards.rows.phrase_problems` (no nulls, segments inside their mixture, cluster
ids inside the inventory: the rule the trainer and the evaluator skip rows by); the card has
``configs`` for every split. With ``decode=True`` every audio cell is also decoded in full (a
damaged FLAC frame fails its CRC) and its length checked against the recipe's ``duration_s`` x
``sample_rate_hz``. A problem in a row names the shard file, the row's position in it and the
mixture id; every bad row is reported, not just the first.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import soundfile as sf
import yaml

from pipeline.outputs import file_sha256
from pipeline.shards.layout import CARD, DATA, INDEX, INDEX_VERSION, entry_problem, features, shard_schema, special_file_problem
from pipeline.shards.rows import phrase_problems


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
        return [f"{name}: columns differ from the shard schema (missing {missing}, unexpected {extra}); "
                "it was not written by `sedsynth shards` (or by another version): re-run `sedsynth shards`"]
    problems = [f"{name}: column {k!r} is {got[k].type}{'' if got[k].nullable else ' not null'}, datasets writes {want[k].type}; "
                "re-run `sedsynth shards`" for k in want if not got[k].equals(want[k])]
    if schema.names != expected.names:
        problems.append(f"{name}: columns are in the order {schema.names}, the shard schema's is {expected.names}; re-run `sedsynth shards`")
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
        problems.append(f"{name}: datasets would read columns {untyped} otherwise than the card says (its 'huggingface' "
                        "schema metadata disagrees); re-run `sedsynth shards`")
    return problems


def _cell_problems(r: dict, decode: bool) -> list[str]:
    """Faults of one row's audio cell, as messages without the file and row prefix."""
    data = (r["audio"] or {}).get("bytes")
    if data is None:  # readers take the audio from the bytes only: a path alone is never opened
        return ["malformed row: the audio cell has no bytes; re-run `sedsynth shards`"]
    problems = []
    if hashlib.sha256(data).hexdigest() != r["audio_sha256"]:
        problems.append("audio bytes do not match audio_sha256 (the cell changed after it was written); "
                        "copy the shard again or re-run `sedsynth shards`")
    if decode:
        # a full decode: libFLAC checks every frame's CRC, which a header read does not
        try:
            samples, rate = sf.read(io.BytesIO(data), dtype="int16", always_2d=True)
        except (RuntimeError, TypeError, ValueError) as e:
            return problems + [f"audio does not decode ({e}); re-run `sedsynth mix` and `sedsynth shards`"]
        expected = round(r["duration_s"] * r["sample_rate_hz"])
        if rate != r["sample_rate_hz"] or samples.shape[0] != expected:
            problems.append(f"audio is {samples.shape[0]} frames at {rate} Hz, the recipe says {expected} frames "
                            f"({r['duration_s']} s at {r['sample_rate_hz']} Hz); re-run `sedsynth mix` and `sedsynth shards`")
    return problems


def _row_problems(name: str, first_row: int, rows: list[dict], num_clusters: int | None, decode: bool) -> list[str]:
    """Problems of consecutive rows of one shard, ``first_row`` being the first's position in the file."""
    problems = []
    cluster_ids = range(num_clusters) if num_clusters is not None else None
    for k, r in enumerate(rows, first_row):
        where = f"{name}: row {k} (mixture {r.get('id')})"
        try:
            # every field of a ShardRow has a value (phrases, duration_s and audio: named by the checks below)
            found = [f"malformed row: {field} is null; re-run `sedsynth shards`" for field, value in r.items()
                     if value is None and field not in ("phrases", "duration_s", "audio")]
            # the rule the trainer and the evaluator skip rows by
            found += [f"{p}; re-run `sedsynth shards`" for p in phrase_problems(r["phrases"], r["duration_s"], cluster_ids)]
            found += _cell_problems(r, decode)
        except (TypeError, KeyError) as e:  # a null where a value belongs: report the row, check the rest
            found = [f"malformed row ({type(e).__name__}: {e}); re-run `sedsynth shards`"]
        problems += [f"{where}: {p}" for p in found]
    return problems


def validate(folder: Path | str, decode: bool = False) -> dict:
    """Check ``folder``; returns ``{"files", "rows", "splits"}`` or raises :class:`ValidationError`."""
    folder = Path(folder)
    if not (folder / INDEX).exists():
        raise ValidationError(folder, [f"no {INDEX}: not a folder written by `sedsynth shards` (or the download is incomplete)"])
    special = special_file_problem(folder / INDEX)
    if special:
        raise ValidationError(folder, [f"{INDEX} {special}; replace it with the index `sedsynth shards` wrote"])
    try:
        index = json.loads((folder / INDEX).read_text(encoding="utf-8"))
        files, rate = index["files"], index["sample_rate_hz"]
        if not all(isinstance(f, dict) and isinstance(f.get("path"), str) and isinstance(f.get("split"), str)
                   and {"sha256", "num_rows"} <= f.keys() for f in files):
            raise ValueError("an entry of 'files' lacks path, split, sha256 or num_rows")
    except (ValueError, KeyError, TypeError) as e:
        raise ValidationError(folder, [f"{INDEX} is malformed ({type(e).__name__}: {e}); re-run `sedsynth shards`"]) from None
    if index.get("version") != INDEX_VERSION:
        raise ValidationError(folder, [f"{INDEX} has version {index.get('version')!r}; this version reads {INDEX_VERSION}: "
                                       "re-run `sedsynth shards` with this version"])
    problems: list[str] = []
    indexed = {f["path"] for f in files}
    on_disk = {p.relative_to(folder).as_posix() for p in (folder / DATA).glob("*.parquet")}
    problems += [f"{p}: not listed in {INDEX} (a foreign or stale shard); remove it or re-run `sedsynth shards`" for p in sorted(on_disk - indexed)]
    num_clusters = None
    clusters = folder / "clusters" / "clusters.parquet"
    if clusters.exists():
        special = special_file_problem(clusters)
        if special:
            problems.append(f"clusters/clusters.parquet {special}; re-run `sedsynth shards`")
        else:
            num_clusters = pq.ParquetFile(clusters).metadata.num_rows
    for f in files:
        # an entry is untrusted: '../x' or '/dev/zero' must not be hashed or opened (a FIFO blocks, a device never ends)
        unsafe = entry_problem(f["path"])
        if unsafe is None:
            unsafe = special_file_problem(folder / f["path"])
        if unsafe:
            problems.append(f"{INDEX} entry {f['path']!r} {unsafe}; every entry must be a file under {folder}: "
                            "re-run `sedsynth shards` or download the folder again")
            continue
        path = folder / f["path"]
        if not path.exists():
            problems.append(f"{f['path']}: listed in {INDEX} but missing; download or copy it again")
            continue
        if file_sha256(path) != f["sha256"]:
            problems.append(f"{f['path']}: sha256 differs from {INDEX} (the file was changed or truncated); copy it again or re-run `sedsynth shards`")
        try:
            pf = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as e:
            problems.append(f"{f['path']}: not a readable Parquet file ({type(e).__name__}: {e})")
            continue
        if pf.metadata.num_rows != f["num_rows"]:
            problems.append(f"{f['path']}: {pf.metadata.num_rows} rows, {INDEX} says {f['num_rows']}")
        schema_problems = _schema_problems(f["path"], pf.schema_arrow, rate)
        problems += schema_problems
        if schema_problems:
            continue
        first_row = 0
        for g in range(pf.num_row_groups):
            rows = pf.read_row_group(g).to_pylist()
            problems += _row_problems(f["path"], first_row, rows, num_clusters, decode)
            first_row += len(rows)
            if any(r["split"] != f["split"] for r in rows):
                problems.append(f"{f['path']}: rows of another split than {f['split']!r}")
    problems += _card_problems(folder, {f["split"] for f in files})
    if problems:
        raise ValidationError(folder, problems)
    return {"files": len(files), "rows": sum(f["num_rows"] for f in files), "splits": sorted({f["split"] for f in files})}


def _card_problems(folder: Path, splits: set[str]) -> list[str]:
    card = folder / CARD
    if not card.exists():
        return [f"no {CARD}: the dataset card (re-run `sedsynth shards`)"]
    text = card.read_text(encoding="utf-8")
    try:
        meta = yaml.safe_load(text.split("---", 2)[1]) if text.startswith("---") else None
        configured = {d["split"] for c in meta["configs"] for d in c["data_files"]}
    except (yaml.YAMLError, KeyError, TypeError, IndexError):
        return [f"{CARD}: no YAML front matter with 'configs'; datasets would guess the splits"]
    missing = sorted(splits - configured)
    return [f"{CARD}: 'configs' lacks splits {missing}"] if missing else []
