"""Training of open-vocabulary frame- and clip-level audio-text models on the pipeline's shards."""
