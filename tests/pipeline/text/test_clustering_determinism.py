"""The clusters stage writes the same bytes whatever the CPU's matrix kernels.

Another CPU cannot be had in a test, but what it changes can: the summation order inside the
encoder's matrix products. A batch of other size pads the phrases to another length and so
runs other kernel shapes; in float32 that alone moves embeddings by about 2e-7, as another
CPU's kernels do. The stage must write identical bytes through both, and through embeddings
perturbed a thousand times above the float64 kernels' noise.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pipeline.stages import clusters
from pipeline.text import clustering
from tests.conftest import tree_digest

PHRASES = [
    "dog barking",
    "a dog barks twice",
    "glass breaking",
    "door slam",
    "water running from a tap",
    "church bells ringing in the distance",
    "bird",
    "speech",
]


def test_embeddings_are_float64_and_do_not_depend_on_the_batch() -> None:
    model = clusters.OFFLINE_MODEL
    whole = clustering.encode(model, PHRASES, batch_size=256)
    pieces = np.concatenate([clustering.encode(model, PHRASES[i : i + 3], batch_size=3) for i in range(0, len(PHRASES), 3)])
    assert whole.dtype == np.float64 and whole.shape[0] == len(PHRASES)
    np.testing.assert_allclose(np.linalg.norm(whole, axis=1), 1.0, atol=1e-12)
    # float32 kernels differ here by ~2e-7; float64 ones by ~3e-16
    assert np.abs(whole - pieces).max() < 1e-12


@pytest.fixture(scope="module")
def reference(captioned, tmp_path_factory):
    params, _mix_dir, cap_dir, _ = captioned
    out = tmp_path_factory.mktemp("clusters_ref") / "clusters"
    clusters.run(params, cap_dir, out)
    return params, cap_dir, tree_digest(out)


def test_other_kernel_shapes_write_the_same_bytes(reference, tmp_path) -> None:
    params, cap_dir, digest = reference
    small_batches = replace(params, clusters=replace(params.clusters, batch_size=5))
    clusters.run(small_batches, cap_dir, tmp_path / "clusters")
    assert tree_digest(tmp_path / "clusters") == digest


def test_embedding_noise_far_above_float64_kernels_moves_no_stored_byte(reference, tmp_path, monkeypatch) -> None:
    params, cap_dir, digest = reference
    exact = clustering.encode
    rng = np.random.default_rng(0)

    def noisy(model, texts, batch_size=256):
        emb = exact(model, texts, batch_size)
        emb = emb * (1.0 + 1e-13 * rng.standard_normal(emb.shape))  # float64 kernels differ by ~3e-16
        return emb / np.linalg.norm(emb, axis=1, keepdims=True)

    monkeypatch.setattr(clustering, "encode", noisy)
    clusters.run(params, cap_dir, tmp_path / "clusters")
    assert tree_digest(tmp_path / "clusters") == digest
