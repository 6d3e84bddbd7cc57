"""Training data: Parquet shards and caption corpora streamed into model-ready batches.

``sources`` lists rows and reads them in pieces, ``plan`` deals the pieces to ranks and
workers, ``labels`` turns recipe segments into frame labels at the encoder's frame times,
``negatives`` draws cluster-based negative phrases, and ``stream`` ties them into an
``IterableDataset`` with a shuffle buffer and weighted source mixing.
"""
