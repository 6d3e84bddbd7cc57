"""``python -m sedsynth STAGE ...`` (and ``torchrun ... -m sedsynth train``) is the same as ``sedsynth STAGE ...``."""

from sedsynth.cli import main

raise SystemExit(main())
