"""The stages of the pipeline in ``dvc.yaml``'s order, and the settings naming the folders each command writes.

Input: nothing. Output: :data:`PIPELINE` (what ``sedsynth pipeline`` runs, one after another; a
test compares it with ``dvc.yaml``) and :data:`OUTPUT_SETTINGS` (command -> the params keys of its
output folders: what to change when that disk is full or read-only). Both the command and the
benchmarks read them from here, so neither imports the other for them.
"""

OUTPUT_SETTINGS = {
    "corpus": ("corpus.fsd50k_dir", "corpus.ambience_dir"),
    "clip": ("clip.out_dir",),
    "ambience": ("ambience.out_dir",),
    "mix": ("mix.out_dir",),
    "captions": ("captions.out_dir",),
    "clusters": ("clusters.out_dir",),
    "shards": ("shards.out_dir",),
    "import": ("imports.out_dir",),
    "pretrain": ("pretrain.out_dir",),
    "train": ("train.out_dir",),
    "evaluate": ("evaluate.out_dir",),
    "ablate": ("ablations.out_dir",),
}
PIPELINE = ("corpus", "clip", "ambience", "mix", "captions", "clusters", "shards", "pretrain", "train", "evaluate")
