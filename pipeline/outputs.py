"""Stage outputs that are either complete or absent.

A stage builds its whole output folder under a hidden staging name beside the target and
swaps it in only when everything is written, so a crash or a kill leaves the previous good
output (or nothing) in place, never a half-written one. Single files go through a temporary
name and a rename.

Every stage folder holds ``manifest.parquet`` (one row per output record), ``skipped.csv``
(one row per input it could not use, with the reason) and ``summary.json`` (counts).

Because a stage replaces its output folder whole, :func:`check_out_dir` refuses, before anything
is written, an output folder that is the filesystem root, the home folder or the current folder
(or holds one of them), or that is, lies inside or holds one of the stage's inputs. A run holds
an exclusive lock, ``.<name>.lock`` beside the output, for as long as it writes
(:func:`output_lock`): a second run into the same folder is refused instead of taking the
first one's staging folder for its own.
"""

from __future__ import annotations

import csv
import errno
import fcntl
import hashlib
import io
import json
import os
import re
import secrets
import shutil
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

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


# write_atomic's ``.<name>.<pid>.<16 hex>.tmp`` and the trainer's checkpoint ``.<name>.tmp-<pid>``
_TEMPORARY = re.compile(r"^\..+\.(?:(\d+)\.[0-9a-f]{16}\.tmp|tmp-(\d+))$")


def remove_stale_temporaries(folder: Path, recursive: bool = False, writing: set[str] | None = None) -> list[Path]:
    """Remove the temporaries in ``folder`` whose writing process is gone.

    Temporaries are :func:`write_atomic`'s (``.<name>.<pid>.<random>.tmp``) and the trainer's
    checkpoint writer's (``.<name>.tmp-<pid>``, e.g. ``.latest.pt.tmp-1234``). ``recursive``
    also searches its subfolders. Temporaries of running processes (another writer at work)
    are kept. ``writing``: where the caller knows every temporary this process is writing, the
    names of those; then this process's other temporaries are stale too (a killed run whose
    id a restarted job was given again). Returns the removed paths.
    """
    import psutil

    found = Path(folder).rglob(".*.tmp*") if recursive else Path(folder).glob(".*.tmp*")
    removed = []
    for tmp in found:
        m = _TEMPORARY.match(tmp.name)
        if not m or not tmp.is_file():
            continue
        pid = int(m.group(1) or m.group(2))
        mine = pid == os.getpid()
        if (mine and writing is not None and tmp.name not in writing) or (not mine and not psutil.pid_exists(pid)):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


MANIFEST = "manifest.parquet"
SKIPPED = "skipped.csv"
SUMMARY = "summary.json"


class OutDirError(ValueError):
    """An output folder a stage must not replace; the message names the setting and what to do."""


class OutputBusyError(FileExistsError):
    """Another running process is writing the same output folder."""


def check_out_dir(
    out_dir: Path | str, setting: str = "the output folder", inputs: Mapping[str, Path | str | None] | None = None
) -> None:
    """Raise :class:`OutDirError` unless ``out_dir`` is a folder a stage may replace whole.

    ``setting`` names the folder in the message (``mix.out_dir``); ``inputs`` maps a name
    (``clip.out_dir``, ``the corpus root``) to a folder the stage reads or must leave alone
    (None entries are ignored). Refused: the filesystem root, the home folder and the current
    folder, and any folder that holds one of them, because the swap removes what was there; a
    folder equal to, inside or holding one of ``inputs``, because the stage would destroy its
    own input (or another stage's output); and a path whose last part is ``..``. Paths are
    compared after resolving symlinks, relative ones against the current folder.
    """
    given = Path(out_dir)

    def refuse(why: str) -> None:
        raise OutDirError(
            f"{setting} is {given}, which {why}; the stage replaces its output folder whole, so point "
            f"{setting} at a folder of its own (such as data/<stage>)"
        )

    target = given.resolve()
    if target == Path(target.anchor):
        refuse("is the filesystem root")
    places = [("the current folder (where the command runs, the project root)", Path.cwd().resolve())]
    try:
        places.append(("your home folder", Path.home().resolve()))
    except RuntimeError:  # no HOME and no password entry: nothing to protect there
        pass
    for what, place in places:
        if target == place:
            refuse(f"is {what}")
        if place.is_relative_to(target):
            refuse(f"holds {what}")
    for name, folder in (inputs or {}).items():
        if folder is None:
            continue
        other = Path(folder).resolve()
        if target == other:
            refuse(f"is also {name} ({folder})")
        if target.is_relative_to(other):
            refuse(f"lies inside {name} ({folder})")
        if other.is_relative_to(target):
            refuse(f"holds {name} ({folder})")
    if given.name == "..":  # the staging folder beside it would be named '...partial' and the swap would fail
        refuse("ends in '..'")


# lock files this process holds (absolute paths): a stage that holds its output's lock may enter
# staged_dir or resumable_dir for the same folder (flock would refuse a second open of the file)
_HELD_LOCKS: set[str] = set()


def lock_path(target: Path) -> Path:
    """The lock file of an output folder: ``.<name>.lock`` beside it."""
    target = Path(target)
    return target.parent / f".{target.name}.lock"


@contextmanager
def output_lock(target: Path | str) -> Iterator[None]:
    """Hold the exclusive lock on the output folder ``target`` for the block, or raise :class:`OutputBusyError`.

    The lock is ``flock`` on ``.<name>.lock`` beside ``target``, which holds the pid of the run
    that has it. The kernel releases it when that process dies, however it dies, so a killed run
    never blocks the next one. Re-entrant within a process. The folder is checked first
    (:func:`check_out_dir`, without inputs), so no lock file lands beside ``/``.
    """
    target = Path(target)
    check_out_dir(target)
    path = lock_path(target)
    key = os.path.abspath(path)
    if key in _HELD_LOCKS:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise OutputBusyError(
                f"{target} is being written by another run (pid {holder}); wait for it to finish, or stop it, then run this again"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        # the run that held the lock removes its file before letting go: lock the file that is there now
        try:
            current = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        _HELD_LOCKS.add(key)
        yield
    finally:
        _HELD_LOCKS.discard(key)
        path.unlink(missing_ok=True)  # while still locked, so the next run never locks a removed file
        os.close(fd)


@contextmanager
def staged_dir(target: Path) -> Iterator[Path]:
    """Yield an empty staging folder that replaces ``target`` when the block succeeds.

    If the block raises (or is interrupted) the staging folder is removed and ``target`` is
    left as it was; a folder left by a killed run is removed by the next run. The block runs
    under :func:`output_lock`: a second run into ``target`` is refused while this one writes.
    """
    target = Path(target)
    with output_lock(target):
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
    """Like :func:`staged_dir`, but a run that fails or is killed leaves its staging folder
    (except one stopped by a full disk, ENOSPC or EDQUOT: that folder is removed).

    Yields ``(staging, resumed)``. The next run with the same ``fingerprint`` (a digest of
    everything that decides the output) gets the same folder back, ``resumed=True``, and
    can skip the work it holds; a different fingerprint starts from an empty folder. The
    block must remove its bookkeeping files before it ends; the folder is then swapped in.
    A resumed folder is first cleared of the temporaries of writes the killed run had under
    way, so none of them ends up in the output. Held under :func:`output_lock`, so the
    staging folder found is never one that another live run is writing.
    """
    target = Path(target)
    with output_lock(target):
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
        try:
            yield staging, resumed
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):  # kept for a resume, it would keep the disk full
                shutil.rmtree(staging, ignore_errors=True)
            raise
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
