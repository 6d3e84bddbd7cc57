"""Figures: matplotlib without a display, and PNGs whose bytes depend only on the data and the library versions.

Input: a matplotlib figure made with :func:`pyplot`, a path and a resolution. Output: the PNG
at ``path``, written atomically, and the figure closed. matplotlib stamps a ``Software`` text
chunk with its own version into every PNG; it is left out, so a picture only changes when
what it shows does.
"""

from __future__ import annotations

import io
from pathlib import Path

from pipeline.outputs import write_atomic

# Text chunks matplotlib would add; PNG carries no date unless asked for one.
REPRODUCIBLE_PNG_METADATA = {"Software": None}


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend: figures render to files, with no display needed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: Path, dpi: int) -> None:
    """Render ``fig`` to ``path`` (PNG, parent folders created), then close it."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata=REPRODUCIBLE_PNG_METADATA)
    plt.close(fig)
    write_atomic(Path(path), buf.getvalue())
