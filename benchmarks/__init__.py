"""Benchmarks that print figures beside a peer measured in the same run (``sedsynth bench``, one subcommand each)."""
