"""Check a shard folder against the shard schema and its index.

Input: a dataset folder (as written by the shards stage, or downloaded from the hub).
Output: a summary dict, or :class:`ValidationError` listing every problem found, each naming
the file and what to do. Checks: ``index.json`` parses; every indexed shard exists with the
indexed sha256 and row count, and no unindexed shard lies in ``data/``; each shard is
Parquet with exactly the shard schema and the ``huggingface`` metadata that types ``audio``
as ``Audio`` at the indexed rate; segments lie inside their mixture and cluster ids inside
the inventory; the card has ``configs`` for every split. With ``decode=True`` every audio
cell is decoded and its length checked against ``duration_s``.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import soundfile as sf
import yaml

from pipeline.outputs import file_sha256
from pipeline.schema import ShardRow, arrow_schema
from pipeline.shards.layout import CARD, DATA, INDEX, INDEX_VERSION


class ValidationError(ValueError):
    """The folder is not a valid shard folder; ``problems`` lists why."""

    def __init__(self, folder: Path, problems: list[str]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{folder} is not a valid shard folder ({len(problems)} problems):\n{lines}")


def _schema_problems(name: str, schema, rate: int) -> list[str]:
    expected = arrow_schema(ShardRow)
    got = {f.name: f.type for f in schema}
    want = {f.name: f.type for f in expected}
    problems = []
    if set(got) != set(want):
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        problems.append(f"{name}: columns differ from the shard schema (missing {missing}, unexpected {extra}); "
                        "it was not written by `sedsynth shards` (or by another version)")
    problems += [f"{name}: column {k!r} is {got[k]}, expected {want[k]}" for k in want if k in got and got[k] != want[k]]
    meta = (schema.metadata or {}).get(b"huggingface")
    try:
        audio = json.loads(meta)["info"]["features"]["audio"] if meta else None
    except (ValueError, KeyError, TypeError):
        audio = None
    if not audio or audio.get("_type") != "Audio":
        problems.append(f"{name}: no 'huggingface' schema metadata typing 'audio' as Audio; datasets would load raw structs")
    elif audio.get("sampling_rate") != rate:
        problems.append(f"{name}: Audio sampling_rate {audio.get('sampling_rate')} differs from index.json's {rate}")
    return problems


def _row_problems(name: str, rows: list[dict], num_clusters: int | None, decode: bool) -> list[str]:
    problems = []
    for r in rows:
        for ph in r["phrases"]:
            for s in ph["segments"]:
                if not 0.0 <= s["start_s"] < s["end_s"] <= r["duration_s"] + 1e-6:
                    problems.append(f"{name}: row {r['id']}: segment {s} of {ph['label']!r} is outside [0, {r['duration_s']}] s or empty")
            if num_clusters is not None and not 0 <= ph["cluster_id"] < num_clusters:
                problems.append(f"{name}: row {r['id']}: cluster id {ph['cluster_id']} is not in clusters/clusters.parquet")
        if decode:
            try:
                info = sf.info(io.BytesIO(r["audio"]["bytes"]))
            except (sf.LibsndfileError, RuntimeError, TypeError) as e:
                problems.append(f"{name}: row {r['id']}: audio does not decode ({e})")
                continue
            if info.samplerate != r["sample_rate_hz"] or abs(info.frames - round(r["duration_s"] * r["sample_rate_hz"])) > 1:
                problems.append(f"{name}: row {r['id']}: audio is {info.frames} samples at {info.samplerate} Hz, "
                                f"expected {r['duration_s']} s at {r['sample_rate_hz']} Hz")
    return problems


def validate(folder: Path | str, decode: bool = False) -> dict:
    """Check ``folder``; returns ``{"files", "rows", "splits"}`` or raises :class:`ValidationError`."""
    folder = Path(folder)
    if not (folder / INDEX).exists():
        raise ValidationError(folder, [f"no {INDEX}: not a folder written by `sedsynth shards` (or the download is incomplete)"])
    try:
        index = json.loads((folder / INDEX).read_text(encoding="utf-8"))
        files, rate = index["files"], index["sample_rate_hz"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValidationError(folder, [f"{INDEX} is malformed ({e}); re-run `sedsynth shards`"]) from None
    if index.get("version") != INDEX_VERSION:
        raise ValidationError(folder, [f"{INDEX} has version {index.get('version')!r}; this version reads {INDEX_VERSION}"])
    problems: list[str] = []
    indexed = {f["path"] for f in files}
    on_disk = {p.relative_to(folder).as_posix() for p in (folder / DATA).glob("*.parquet")}
    problems += [f"{p}: not listed in {INDEX} (a foreign or stale shard); remove it or re-run `sedsynth shards`" for p in sorted(on_disk - indexed)]
    num_clusters = None
    if (folder / "clusters" / "clusters.parquet").exists():
        num_clusters = pq.ParquetFile(folder / "clusters" / "clusters.parquet").metadata.num_rows
    for f in files:
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
        columns = None if decode else [c for c in pf.schema_arrow.names if c != "audio"]
        for g in range(pf.num_row_groups):
            rows = pf.read_row_group(g, columns=columns).to_pylist()
            problems += _row_problems(f["path"], rows, num_clusters, decode)
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
