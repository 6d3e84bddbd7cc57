"""The ``sedsynth`` command above the two packages: ``pipeline`` (the data stages) and ``trainer``."""
