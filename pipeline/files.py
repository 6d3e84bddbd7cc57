"""Opening a file a user named: regular files only, checked before reading.

Every file the project reads from a user's folder (a shard folder's ``clusters.parquet`` and
``README.md``, ``captions.llm.cache``, a params file) goes through :func:`open_regular` or is
checked first with :func:`special_file_problem`. A FIFO would block the reader forever and a
device (``/dev/zero``) never ends, so both are refused in one line instead of read.

Input: a path and the words that name it in a message. Output: an open binary file, or a
:class:`NotRegularFileError` whose message is one line naming the path and what it is.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO


class NotRegularFileError(OSError):
    """A path a reader was given is a FIFO, device, socket or folder, or a link leaving its folder."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device"


def special_file_problem(path: str | Path) -> str | None:
    """Why a local ``path`` that exists must not be opened (a FIFO blocks a reader, a device never
    ends); ``None`` for a regular file, or for a missing one (its reader reports that itself)."""
    try:
        mode = os.stat(path).st_mode  # follows symlinks: a link to /dev/zero is a device
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot be examined ({e.strerror or e})"
    return None if stat.S_ISREG(mode) else "is not a regular file (a folder, FIFO or device)"


def open_regular(path: str | Path, role: str = "file", follow_links: bool = True) -> BinaryIO:
    """Open ``path`` for binary reading if it is a regular file, else raise :class:`NotRegularFileError`.

    The file is opened without blocking (so a FIFO with no writer does not wait) and its type is
    checked on the open descriptor, so a file swapped for a FIFO after a check is still caught.
    ``follow_links=False`` refuses a symbolic link itself (``O_NOFOLLOW``). ``role`` names the
    file in the message (``"captions.llm.cache"``). A missing file raises ``FileNotFoundError``.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if not follow_links and e.errno == 40:  # ELOOP: the last part is a symbolic link
            raise NotRegularFileError(e.errno, f"{role} {path} is a symbolic link, which is not followed") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(f"{role} {path} is {_kind(mode)}, not a regular file; point it at a file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return open(fd, "rb")


def read_regular(path: str | Path, role: str = "file", max_bytes: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (see :func:`open_regular`); with ``max_bytes``, at most
    that many are read and a longer file raises ``ValueError`` naming the bound."""
    with open_regular(path, role) as f:
        data = f.read() if max_bytes is None else f.read(max_bytes + 1)
    if max_bytes is not None and len(data) > max_bytes:
        raise ValueError(f"{role} {path} is larger than {max_bytes} bytes; is it the right file?")
    return data
