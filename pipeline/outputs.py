"""Stage outputs that are either complete or absent.

A stage builds its whole output folder under a hidden staging name beside the target and
swaps it in only when everything is written, so a crash or a kill leaves the previous good
output (or nothing) in place, never a half-written one. Single files go through a temporary
name and a rename.

Every stage folder holds ``manifest.parquet`` (one row per output record), ``skipped.csv``
(one row per input it could not use, with the reason) and ``summary.json`` (counts).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import secrets
import shutil
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.schema import Skip, to_table

# folders this process has cleared of temporaries left by killed writers (once each, so a
# stage writing 100,000 files into one folder lists it once, not once per file)
_SWEPT_FOLDERS: set[str] = set()


def write_atomic(path: Path, data: bytes) -> None:
    """Write bytes to ``path`` through a temporary file in the same folder and a rename.

    The file gets the mode every new file gets (0666 less the umask), like the FLACs beside it.
    The temporary, ``.<name>.<pid>.<random>.tmp``, is removed when the write fails or is
    interrupted; those left by a writer that was killed outright are removed by the next
    process that writes into the same folder (:func:`remove_stale_temporaries`).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = os.path.abspath(path.parent)
    if folder not in _SWEPT_FOLDERS:
        remove_stale_temporaries(path.parent)
        _SWEPT_FOLDERS.add(folder)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp"
    created = False
    try:
        # "x" opens with O_CREAT | O_EXCL and mode 0666, so the umask applies (mkstemp forces 0600)
        with open(tmp, "xb") as f:
            created = True
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if created:
            tmp.unlink(missing_ok=True)
        raise


_TEMPORARY = re.compile(r"^\..+\.(\d+)\.[0-9a-f]{16}\.tmp$")


def remove_stale_temporaries(folder: Path, recursive: bool = False) -> list[Path]:
    """Remove the :func:`write_atomic` temporaries in ``folder`` whose writing process is gone.

    ``recursive`` also searches its subfolders. Temporaries of running processes (another
    writer at work) are kept. Returns the removed paths.
    """
    import psutil

    found = Path(folder).rglob(".*.tmp") if recursive else Path(folder).glob(".*.tmp")
    removed = []
    for tmp in found:
        m = _TEMPORARY.match(tmp.name)
        if m and not psutil.pid_exists(int(m.group(1))):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


MANIFEST = "manifest.parquet"
SKIPPED = "skipped.csv"
SUMMARY = "summary.json"


@contextmanager
def staged_dir(target: Path) -> Iterator[Path]:
    """Yield an empty staging folder that replaces ``target`` when the block succeeds.

    If the block raises (or is interrupted) the staging folder is removed and ``target`` is
    left as it was; a folder left by a killed run is removed by the next run.
    """
    target = Path(target)
    staging = _staging_path(target)
    if staging.exists():
        shutil.rmtree(staging)  # left by a run that was killed outright
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _swap_in(staging, target)


FINGERPRINT = "fingerprint.txt"


@contextmanager
def resumable_dir(target: Path, fingerprint: str) -> Iterator[tuple[Path, bool]]:
    """Like :func:`staged_dir`, but a run that fails or is killed leaves its staging folder.

    Yields ``(staging, resumed)``. The next run with the same ``fingerprint`` (a digest of
    everything that decides the output) gets the same folder back, ``resumed=True``, and
    can skip the work it holds; a different fingerprint starts from an empty folder. The
    block must remove its bookkeeping files before it ends; the folder is then swapped in.
    A resumed folder is first cleared of the temporaries of writes the killed run had under
    way, so none of them ends up in the output.
    """
    target = Path(target)
    staging = _staging_path(target)
    marker = staging / FINGERPRINT
    resumed = marker.exists() and marker.read_text(encoding="utf-8") == fingerprint
    if staging.exists() and not resumed:
        shutil.rmtree(staging)
    if resumed:
        remove_stale_temporaries(staging, recursive=True)
    if not resumed:
        staging.mkdir()
        write_atomic(marker, fingerprint.encode("utf-8"))
    yield staging, resumed
    marker.unlink(missing_ok=True)
    _swap_in(staging, target)


def _staging_path(target: Path) -> Path:
    """The hidden staging folder beside ``target`` (whose parent is created).

    A run killed between the two renames of :func:`_swap_in` left the previous output under
    its ``.old`` name and no ``target``: that output is put back first.
    """
    old = _old_path(target)
    if old.exists() and not target.exists():
        old.rename(target)
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"{target} exists and is not a folder: choose another output path or remove it")
    target.parent.mkdir(parents=True, exist_ok=True)
    return target.parent / f".{target.name}.partial"


def _old_path(target: Path) -> Path:
    return target.parent / f".{target.name}.old"


def _swap_in(staging: Path, target: Path) -> None:
    old = _old_path(target)
    if old.exists():
        shutil.rmtree(old)
    if target.exists():
        target.rename(old)
    staging.rename(target)
    if old.exists():
        shutil.rmtree(old)


def write_manifest(path: Path, records: list, record_type: type) -> None:
    """Records -> a Parquet file (zstd), written atomically."""
    write_table(path, to_table(records, record_type))


def write_table(path: Path, table: pa.Table) -> None:
    """An Arrow table -> a Parquet file (zstd), written atomically."""
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    write_atomic(path, buf.getvalue())


def write_skips(path: Path, skips: list[Skip]) -> None:
    """The skip report: ``item_id,path,reason,detail``, sorted by item id."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["item_id", "path", "reason", "detail"])
    for s in sorted(skips, key=lambda s: (s.item_id, s.reason)):
        writer.writerow([s.item_id, s.path, s.reason, s.detail])
    write_atomic(path, buf.getvalue().encode("utf-8"))


class NoOutputError(ValueError):
    """A stage used none of its inputs; its skip report is in :func:`rejected_report_path`."""


def rejected_report_path(out_dir: Path) -> Path:
    """Where a run that made nothing leaves its skip report: beside the output, ``<out_dir>.skipped.csv``."""
    out_dir = Path(out_dir)
    return out_dir.parent / f"{out_dir.name}.{SKIPPED}"


def refuse_empty(out_dir: Path, summary: dict, skips: list[Skip], outputs: str, inputs: str, hint: str = "") -> None:
    """Write the skip report beside ``out_dir`` and raise :class:`NoOutputError` with the counts per reason.

    Called inside :func:`staged_dir`, so an empty result never replaces a previous good output.
    """
    report = rejected_report_path(out_dir)
    write_skips(report, skips)
    reasons = ", ".join(f"{reason} {n}" for reason, n in summary["skipped_by_reason"].items()) or "none"
    raise NoOutputError(
        f"no {outputs} from {summary['inputs']} {inputs} (skipped by reason: {reasons}); each skipped item and why is "
        f"listed in {report}; {out_dir} was left as it was{hint}"
    )


def summarize(num_inputs: int, num_outputs: int, skips: list[Skip], **extra: object) -> dict:
    by_reason = dict(sorted(Counter(s.reason for s in skips).items()))
    return {"inputs": num_inputs, "outputs": num_outputs, "skipped": len(skips), "skipped_by_reason": by_reason, **extra}


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_json(path: Path, data: dict) -> None:
    write_atomic(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def format_summary(stage: str, summary: dict, outputs: str = "outputs", inputs: str = "inputs") -> str:
    """One human-readable block for the end of a stage run, e.g. ``clip: 165 event clips from 240 rows``."""
    lines = [f"{stage}: {summary['outputs']} {outputs} from {summary['inputs']} {inputs}, {summary['skipped']} skipped"]
    for reason, n in summary["skipped_by_reason"].items():
        lines.append(f"  {reason:<18} {n}")
    return "\n".join(lines)
