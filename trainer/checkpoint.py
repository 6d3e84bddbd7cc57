"""Atomic training checkpoints with everything a resume needs, and the one way to read a torch file.

A checkpoint is one ``torch.save`` file: the trainable model weights (a frozen text encoder is
left out; it is rebuilt from its name), the optimizer, the scheduler, the step, the epoch and
the batches done in it, torch's RNG state, and the resolved ``train`` config. It is written to
a temporary name, flushed to disk and renamed, so a crash never leaves a half-written ``latest.pt``
(:func:`write_torch_file`). A temporary is removed when its write fails or is interrupted; one left
by a killed writer (kill -9, a lost node) is removed by the next run, which calls
:func:`remove_stale_temporaries` on its checkpoint folder before it writes. A write that fails or is
stopped raises what stopped it, as any other file write would: an ``OSError`` (a full disk is
``ENOSPC``), or the ``KeyboardInterrupt`` of Ctrl-C or of SIGTERM through ``sedsynth``'s handler,
never the ``RuntimeError`` torch's zip writer makes of an error raised while it writes. Everything
in it is a plain container (dict, list, tuple, str, number, None) or a tensor, so it reads back
under ``weights_only=True``. After training, :func:`store_entry` adds plain-data entries (the
``calibration``: the detection threshold chosen on the held-out split) to a written checkpoint,
again atomically; :func:`read_entry` reads one back without loading the weights. A checkpoint
written before an entry existed reads as not having it.

Every ``.pt`` this project opens (its own checkpoints, an EAT encoder checkpoint) goes through
:func:`read_torch_file`: a weights-only unpickle, so a file whose pickle names a function or
class (``os.system``, ``builtins.open``...) is refused instead of run; a foreign format may
allow a fixed list of plain config types. Whatever goes wrong comes out as one
:class:`CheckpointError` line naming the file and what was expected.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import signal
import threading
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pipeline import outputs

TRAINER_CHECKPOINT = "a checkpoint written by `sedsynth train` (checkpoints/latest.pt or best.pt)"
# Keys every trainer checkpoint has (optimizer, scheduler, cuda_rng and metrics may be None/empty).
REQUIRED_KEYS = ("model", "step", "epoch", "batches_in_epoch", "torch_rng", "config")


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used; the message names the file and what was expected."""


def _why(error: Exception, path: Path) -> str:
    """One short line for a failed ``torch.load``: the refused global when there is one (never
    torch's advice to load the file unsafely)."""
    text = str(error)
    refused = re.search(r"GLOBAL (\S+) was not an allowed global", text) or re.search(r"unsupported GLOBAL (\S+)", text)
    if refused:
        return f"its pickle calls {refused.group(1)}, which a weights-only load refuses to run"
    if path.stat().st_size == 0:
        return "the file is empty"
    detail = re.search(r"WeightsUnpickler error:\s*(.+)", text)
    if detail:
        return f"its pickle is not plain data: {detail.group(1).strip()[:200]}"
    if "Weights only load failed" in text:
        return "its pickle is not plain data"
    if zipfile.is_zipfile(path):
        return "a zip archive that torch.save did not write"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {first[:200]}" if first else type(error).__name__


def read_torch_file(path: str | Path, what: str, expected: str, allow: Iterable[Any] = (), mmap: bool = False) -> Any:
    """The object stored in ``torch.save`` file ``path``, unpickled weights-only onto the CPU.

    ``what`` names the caller in messages (``train``, ``detector``, ``encoder``), ``expected``
    says what the file should be, and ``allow`` lists the extra classes a foreign format may
    hold (plain config objects); nothing else that a pickle can name is ever called. With
    ``mmap`` the tensors are mapped from the file, not read, until they are used.
    Raises FileNotFoundError when there is no file and :class:`CheckpointError` otherwise.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what}: no checkpoint at {path}; expected {expected}")
    try:
        with torch.serialization.safe_globals(list(allow)):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except OSError as e:
        raise CheckpointError(f"{what}: cannot read {path} ({e.strerror or e}); expected {expected}") from None
    except Exception as e:  # noqa: BLE001  arbitrary bytes fail in many ways; each means "not a checkpoint"
        raise CheckpointError(f"{what}: {path} is not a usable torch checkpoint ({_why(e, path)}); expected {expected}") from None


def read(path: str | Path, what: str = "checkpoint") -> dict:
    """A trainer checkpoint as a dict (model, optimizer, scheduler, step, epoch, config...), checked
    for the keys and types :func:`restore` needs; raises :class:`CheckpointError` naming the file."""
    state = read_torch_file(path, what, TRAINER_CHECKPOINT)

    def bad(problem: str) -> CheckpointError:
        return CheckpointError(f"{what}: {path} is not a sedsynth training checkpoint ({problem}); expected {TRAINER_CHECKPOINT}")

    if not isinstance(state, dict):
        raise bad(f"it holds a {type(state).__name__}, not a dict")
    missing = [k for k in REQUIRED_KEYS if k not in state]
    if missing:
        raise bad(f"no {', '.join(missing)}; it has {', '.join(map(str, list(state)[:8])) or 'no keys'}")
    model = state["model"]
    if not isinstance(model, Mapping) or not all(isinstance(v, torch.Tensor) for v in model.values()):
        raise bad("'model' is not a dict of tensors")
    if not isinstance(state["config"], Mapping) or not isinstance(state["config"].get("train"), Mapping):
        raise bad("'config' has no 'train' section")
    if not (isinstance(state["torch_rng"], torch.Tensor) and state["torch_rng"].dtype == torch.uint8):
        raise bad("'torch_rng' is not a byte tensor")
    for key in ("step", "epoch", "batches_in_epoch"):
        if not isinstance(state[key], int):
            raise bad(f"'{key}' is not an integer")
    for key in ("optimizer", "scheduler"):
        if state.get(key) is not None and not isinstance(state[key], Mapping):
            raise bad(f"'{key}' is not a state dict")
    problem = calibration_problem(state.get("calibration"))
    if problem:
        raise bad(problem)
    return state


def calibration_problem(entry: Any) -> str | None:
    """What is wrong with a checkpoint's ``calibration`` entry (absent is fine), or None."""
    if entry is None:
        return None
    if not isinstance(entry, Mapping):
        return "'calibration' is not a dict"
    t = entry.get("threshold")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not np.isfinite(t):
        return f"'calibration' has no finite threshold (got {t!r})"
    k = entry.get("median_filter_frames", 1)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1 or k % 2 == 0:
        return f"'calibration' has a median filter that is not an odd number of frames (got {k!r})"
    return None


def read_entry(path: str | Path, key: str, what: str = "checkpoint") -> Any:
    """Entry ``key`` of trainer checkpoint ``path`` (None when it has none), read weights-only without
    loading the weights; a malformed ``calibration`` raises :class:`CheckpointError`."""
    state = read_torch_file(path, what, TRAINER_CHECKPOINT, mmap=True)
    if not isinstance(state, dict):
        raise CheckpointError(
            f"{what}: {path} is not a sedsynth training checkpoint (it holds a {type(state).__name__}); "
            f"expected {TRAINER_CHECKPOINT}"
        )
    value = state.get(key)
    problem = calibration_problem(value) if key == "calibration" else None
    if problem:
        raise CheckpointError(f"{what}: {path} is not a sedsynth training checkpoint ({problem}); expected {TRAINER_CHECKPOINT}")
    return value


def store_entry(path: str | Path, key: str, value: Any) -> None:
    """Set entry ``key`` of the checkpoint at ``path`` to plain data ``value`` (:func:`plain`); the
    file is rewritten under a temporary name and renamed, so it is never half-written."""
    path = Path(path)
    state = read(path, "checkpoint")
    state[key] = plain(value)
    write_torch_file(path, state)


# temporaries are named ``.<name>.<pid>.<16 hex digits>.tmp`` like ``pipeline.outputs.write_atomic``'s,
# so its sweep of a folder also removes these
_WRITING: set[str] = set()  # names of the temporaries this process is writing now


def write_torch_file(path: Path, state: dict) -> None:
    """``torch.save`` ``state`` to ``path`` through a temporary name and a rename (parent folders made).

    The temporary is fsynced before the rename and the folder after it, so after a power loss
    ``path`` holds either the old file or the whole new one. The temporary is removed when the
    write fails or is interrupted (Ctrl-C, SIGTERM). A failed write raises its own ``OSError``
    (``ENOSPC`` on a full disk) and an interrupted one its ``KeyboardInterrupt``, once
    ``torch.save`` has returned (:func:`_signals_held`).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
    _WRITING.add(tmp.name)
    try:
        with open(tmp, "xb") as f:
            sink = _Sink(f)
            with _signals_held():
                try:
                    torch.save(state, sink)
                except RuntimeError:
                    # torch's zip writer reports an error of the file's write() as "[enforce fail at
                    # inline_container.cc] unexpected pos": raise the error itself (ENOSPC, EIO...)
                    if sink.error is not None:
                        raise sink.error from None
                    raise
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        _WRITING.discard(tmp.name)
    _fsync_folder(path.parent)


class _Sink:
    """The file ``torch.save`` writes to, keeping the exception a write raised (torch replaces it
    with a RuntimeError of its own). After one, every write raises it again without touching the
    file (torch still writes the end of the archive). Every other attribute is the file's (``name``, ``flush``)."""

    def __init__(self, f):
        self._f, self.error = f, None

    def write(self, data) -> int:
        if self.error is not None:
            raise self.error
        try:
            return self._f.write(data)
        except BaseException as e:
            self.error = e
            raise

    def __getattr__(self, name: str):
        return getattr(self._f, name)


HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def _signals_held() -> Iterator[None]:
    """Run the block with Ctrl-C and SIGTERM held back, then act on any that came, as their handlers do.

    Python runs a signal's handler between two steps of whatever Python code runs, and
    ``torch.save`` calls the file's ``write`` (Python) from its C++ zip writer, which turns the
    handler's KeyboardInterrupt into a RuntimeError: a stop asked for mid-save would end in a
    traceback and exit status 1. So while the block runs, a signal is only noted; when it ends, the
    handler that was set runs (``sedsynth``'s raises ``Terminated``), so the caller unwinds as from
    any other interrupted write. Handlers that are not Python functions (the default action, or
    ignoring) are left as they are; outside the main thread nothing is changed (only it runs handlers).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[tuple[int, object]] = []
    kept = {}
    for signum in HELD_SIGNALS:
        handler = signal.getsignal(signum)
        if callable(handler):
            kept[signum] = handler
            signal.signal(signum, lambda number, frame: came.append((number, frame)))
    try:
        yield
    finally:
        for signum, handler in kept.items():
            signal.signal(signum, handler)
        if came:
            number, frame = came[0]
            kept[number](number, frame)


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (a no-op where folders cannot be opened, as on Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems (network mounts) refuse to fsync a folder; the rename stands
        pass
    finally:
        os.close(fd)


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Remove the checkpoint temporaries in ``folder`` that no running writer owns: those of
    processes that are gone, and those carrying this process's id that it is not writing (a
    killed run whose id the restarted job was given again). Returns the removed paths."""
    return outputs.remove_stale_temporaries(folder, writing=_WRITING)


def plain(value: Any) -> Any:
    """``value`` as plain containers, numbers, strings and tensors (what a weights-only load reads):
    dataclasses become dicts, numpy arrays tensors, numpy scalars Python numbers, paths strings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def frozen_prefixes(model: nn.Module) -> tuple[str, ...]:
    """State-dict prefixes of frozen text encoders (rebuilt from their names, never saved)."""
    return tuple(f"{name}.model." if name else "model." for name, m in model.named_modules() if getattr(m, "frozen", False))


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state without a frozen text encoder's weights (they never change)."""
    skip = frozen_prefixes(model)
    return {k: v for k, v in model.state_dict().items() if not (skip and k.startswith(skip))}


def save(
    path: Path,
    model: nn.Module,
    *,
    optimizer=None,
    scheduler=None,
    step: int,
    epoch: int,
    batches_in_epoch: int,
    config: dict,
    metrics: dict | None = None,
) -> None:
    """Write a trainer checkpoint to ``path`` (atomically): ``model``'s trainable weights, the
    ``optimizer`` and ``scheduler`` states (None in a checkpoint that is not resumed, such as
    ``best.pt``), the position (``step``, ``epoch``, ``batches_in_epoch`` done in it), torch's RNG
    states, the run's ``config`` and ``metrics``; :func:`read` and :func:`restore` read it back."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "model": trainable_state(model),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": plain(scheduler.state_dict()) if scheduler is not None else None,
        "step": int(step),
        "epoch": int(epoch),
        "batches_in_epoch": int(batches_in_epoch),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "config": plain(config),
        "metrics": plain(metrics or {}),
    }
    write_torch_file(path, state)


def restore(
    state: dict, model: nn.Module, optimizer=None, scheduler=None, restore_rng: bool = True, path: str | Path = "checkpoint"
) -> dict:
    """Put a :func:`read` checkpoint into the given objects; returns ``state``."""
    missing, unexpected = model.load_state_dict(state["model"], strict=False)
    skip = frozen_prefixes(model)
    missing = [k for k in missing if not (skip and k.startswith(skip))]
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {path} does not fit this model (missing {missing[:5]}, unexpected {unexpected[:5]}); "
            "was it trained with other train.model settings?"
        )
    if optimizer is not None and state.get("optimizer"):
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state.get("scheduler"):
        scheduler.load_state_dict(state["scheduler"])
    if restore_rng:
        torch.set_rng_state(state["torch_rng"])
        if state.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
    return state
