"""The ``sedsynth`` command above the two packages: ``pipeline`` (the data stages) and ``trainer``.

Importing it pins numpy's run-time kernels to its baseline (before numpy is imported), so every
stage writes the same bytes on every x86-64 CPU: see :mod:`pipeline.determinism`.
"""

from pipeline.determinism import pin_numpy_kernels

pin_numpy_kernels()

from pipeline.config.stages import OUTPUT_SETTINGS, PIPELINE  # noqa: E402,F401  (the command's names for them)
