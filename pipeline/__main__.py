"""``python -m pipeline STAGE ...`` is the same as ``sedsynth STAGE ...``."""

from pipeline.cli import main

raise SystemExit(main())
