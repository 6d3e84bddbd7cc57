"""``python -m trainer`` (and ``torchrun -m trainer``): the ``sedsynth train`` command."""

import sys

from pipeline.cli import main

raise SystemExit(main(["train", *sys.argv[1:]]))
