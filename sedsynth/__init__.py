"""The ``sedsynth`` command above the two packages: ``pipeline`` (the data stages) and ``trainer``.

Importing it pins numpy's run-time kernels to its baseline (before numpy is imported), so every
stage writes the same bytes on every x86-64 CPU: see :mod:`pipeline.determinism`.
"""

from pipeline.determinism import pin_numpy_kernels

pin_numpy_kernels()

# The settings naming the folders each command writes: what to change when that disk is full or read-only.
OUTPUT_SETTINGS = {
    "corpus": ("corpus.fsd50k_dir", "corpus.ambience_dir"), "clip": ("clip.out_dir",), "ambience": ("ambience.out_dir",),
    "mix": ("mix.out_dir",), "captions": ("captions.out_dir",), "clusters": ("clusters.out_dir",), "shards": ("shards.out_dir",),
    "import": ("imports.out_dir",), "pretrain": ("pretrain.out_dir",), "train": ("train.out_dir",),
    "evaluate": ("evaluate.out_dir",), "ablate": ("ablations.out_dir",),
}
# The stages of dvc.yaml in its order (a test compares): what `sedsynth pipeline` runs, one after another.
PIPELINE = ("corpus", "clip", "ambience", "mix", "captions", "clusters", "shards", "pretrain", "train", "evaluate")
