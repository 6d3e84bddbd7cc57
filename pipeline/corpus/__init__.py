"""Embedded source corpora: synthetic stand-ins in the real on-disk formats.

Input: an output folder, a size and a seed. Output: an FSD50K-layout corpus
(:func:`write_fsd50k_corpus`, classes :data:`FSD50K_LEAF_CLASSES`) or an ambience library
with a metadata CSV (:func:`write_ambience_library`), byte-identical for the same arguments.
"""

from pipeline.corpus.ambience_like import write_ambience_library
from pipeline.corpus.fsd50k_like import FSD50K_LEAF_CLASSES, write_fsd50k_corpus

__all__ = ["FSD50K_LEAF_CLASSES", "write_ambience_library", "write_fsd50k_corpus"]
