"""Special files for tests of readers that must refuse them without opening them."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path


def fifo(path: Path, for_s: float = 60.0) -> Path:
    """A FIFO at ``path``. A reader that opens it anyway is let go within half a second (it reads
    end-of-file), so a test of a reader that should refuse it fails instead of hanging."""
    os.mkfifo(path)

    def release() -> None:
        end = time.monotonic() + for_s
        while time.monotonic() < end:
            time.sleep(0.5)
            try:  # succeeds only while a reader is blocked in open(); closing gives it end-of-file
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass

    threading.Thread(target=release, daemon=True).start()
    return path
