"""Hugging Face Parquet shards of the mixtures: writing, the dataset card, validation and publishing."""
