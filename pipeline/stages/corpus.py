"""Stage ``corpus``: generate the embedded source corpora.

Input: ``params.corpus`` (sizes, seed, output folders). Output: an FSD50K-layout corpus at
``corpus.fsd50k_dir`` and an ambience library at ``corpus.ambience_dir``, each swapped in
whole when complete. The default size takes seconds; ``fsd50k_clips: 51197`` gives
FSD50K's scale for benchmarks.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pipeline.config.params import Params, folders_besides
from pipeline.corpus import write_ambience_library, write_fsd50k_corpus
from pipeline.outputs import check_out_dir, staged_dir


def run(params: Params, fsd50k_dir: Path | None = None, ambience_dir: Path | None = None) -> None:
    c = params.corpus
    fsd50k_dir, ambience_dir = Path(fsd50k_dir or c.fsd50k_dir), Path(ambience_dir or c.ambience_dir)
    check_out_dir(
        fsd50k_dir, "corpus.fsd50k_dir", {**folders_besides(params, "corpus.fsd50k_dir"), "corpus.ambience_dir": ambience_dir}
    )
    check_out_dir(
        ambience_dir, "corpus.ambience_dir", {**folders_besides(params, "corpus.ambience_dir"), "corpus.fsd50k_dir": fsd50k_dir}
    )
    t0 = time.perf_counter()
    with staged_dir(fsd50k_dir) as stage:
        write_fsd50k_corpus(stage, n_clips=c.fsd50k_clips, seed=c.seed, compute=params.compute)
    with staged_dir(ambience_dir) as stage:
        write_ambience_library(stage, n_recordings=c.ambience_recordings, seed=c.seed)
    print(
        f"corpus: {c.fsd50k_clips} FSD50K-layout clips and {c.ambience_recordings} ambience recordings "
        f"in {time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
    )
