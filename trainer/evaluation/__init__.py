"""Evaluation: the ``evaluate`` stage, the ``detect`` command, benchmark readers and ablations."""
