"""``python -m pipeline.corpus`` is the same as ``sedsynth corpus``."""

import sys

from pipeline.cli import main

raise SystemExit(main(["corpus", *sys.argv[1:]]))
