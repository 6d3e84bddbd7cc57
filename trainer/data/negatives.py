"""Cluster-based negative phrases (FineLAP Algorithm 1) that never contradict a positive.

Input: the phrase clusters a shard folder carries (``clusters/clusters.parquet``: cluster ids with
their ancestor, descendant and near-synonym ids; ``clusters/phrases.parquet``: every phrase of
the database and its cluster). Output, per clip: ``N - K`` negative phrases whose clusters are
neither a positive cluster nor an ontology relative or near-synonym of one ("Dog" is never a
negative for "Bark"). ``mode: cluster`` draws a cluster uniformly, then one of its phrases (the
authors' code); ``mode: phrase`` draws uniformly from the phrase pool (the paper's text).

The database is the training corpus's phrases (FineLAP 3.2: "we gather all phrases from the
training corpus"; rows with ``source == "dataset"``). A database built with
``clusters.include_inventory_phrases`` also holds inventory phrases of classes the data may never
sound; ``inventory_share`` caps the share of a clip's negatives drawn from those (the rest come
from the corpus's own phrases, the real competitors).

A local cluster table must be a regular file: a FIFO at ``clusters/clusters.parquet`` would block
``train`` for ever and a device never ends, so either is refused before it is opened, in one line
naming the file (:class:`~pipeline.files.NotRegularFileError`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np

from pipeline.files import open_regular


class NegativeError(ValueError):
    """The cluster tables are missing or cannot supply negatives."""


@dataclass(frozen=True)
class ClusterTables:
    """The two cluster tables, as plain lists of dicts (rows)."""

    clusters: list[dict]
    phrases: list[dict]

    @classmethod
    def read(cls, folder: str) -> ClusterTables:
        """Read ``<folder>/clusters.parquet`` and ``<folder>/phrases.parquet`` (local path or fsspec URL).

        A local file that is not a regular file raises :class:`~pipeline.files.NotRegularFileError`
        before anything is read from it.
        """
        import fsspec
        import pyarrow.parquet as pq

        fs, root = fsspec.core.url_to_fs(str(folder))
        tables = []
        for name in ("clusters.parquet", "phrases.parquet"):
            path = f"{root.rstrip('/')}/{name}"
            if not fs.exists(path):
                raise NegativeError(f"negatives: {folder}/{name} not found; run `sedsynth clusters` and `sedsynth shards`, "
                                    "or set train.data.clusters to a folder holding clusters.parquet and phrases.parquet")
            with open_cluster_table(fs, path) as f:
                tables.append(pq.read_table(f).to_pylist())
        return cls(*tables)


def open_cluster_table(fs, path: str) -> BinaryIO:
    """``path`` on the fsspec filesystem ``fs``, open for binary reading. A local file is opened
    without blocking and checked on its descriptor (:func:`~pipeline.files.open_regular`), so a FIFO
    or device there raises :class:`~pipeline.files.NotRegularFileError` naming it instead of
    blocking; a remote store holds only regular objects."""
    from fsspec.implementations.local import LocalFileSystem

    return open_regular(path, "negatives: cluster table") if isinstance(fs, LocalFileSystem) else fs.open(path, "rb")


class NegativeSampler:
    """Draws negative phrases for a clip from the clusters its positives leave open."""

    def __init__(self, tables: ClusterTables, mode: Literal["cluster", "phrase"] = "cluster", inventory_share: float = 1.0):
        self.mode, self.inventory_share = mode, inventory_share
        self.related: dict[int, frozenset[int]] = {}
        for c in tables.clusters:
            cid = int(c["cluster_id"])
            self.related[cid] = frozenset([cid, *c["ancestor_ids"], *c["descendant_ids"], *c["near_synonym_ids"]])
        # A phrase may name several clusters ("howl": the dog's and the wind's); it is a negative only
        # when none of them is excluded, and it is drawn at most once.
        self.clusters_of: dict[str, frozenset[int]] = {}
        for p in tables.phrases:
            self.clusters_of[p["phrase"]] = self.clusters_of.get(p["phrase"], frozenset()) | {int(p["cluster_id"])}
        # the corpus's own phrases, then the inventory's (a database without a source column is all corpus)
        corpus = [p for p in tables.phrases if p.get("source", "dataset") == "dataset"]
        taken = {p["phrase"] for p in corpus}
        inventory = [p for p in tables.phrases if p["phrase"] not in taken]
        self.pools = [_Pool(rows) for rows in (corpus, inventory) if rows]
        if len({cid for pool in self.pools for cid in pool.cluster_ids.tolist()}) < 2:
            raise NegativeError("negatives: the phrase database needs phrases in at least two clusters")

    def excluded(self, positive_clusters: list[int]) -> frozenset[int]:
        """Positive clusters with their ancestors, descendants and near-synonyms."""
        out: set[int] = set()
        for cid in positive_clusters:
            out |= self.related.get(int(cid), frozenset([int(cid)]))
        return frozenset(out)

    def sample(self, positive_clusters: list[int], count: int, rng: np.random.Generator) -> list[tuple[str, int]]:
        """``count`` distinct negative phrases with their clusters (fewer only if the pools run out): at
        most ``inventory_share`` of them inventory phrases, the rest the corpus's."""
        if count <= 0:
            return []
        banned = self.excluded(positive_clusters)
        if len(self.pools) == 1:
            return self.pools[0].sample(banned, count, self.mode, self.clusters_of, rng)
        corpus, inventory = self.pools
        extra = inventory.sample(banned, int(round(self.inventory_share * count)), self.mode, self.clusters_of, rng)
        return corpus.sample(banned, count - len(extra), self.mode, self.clusters_of, rng) + extra


class _Pool:
    """Phrases of one source by cluster, and how negatives are drawn from them."""

    def __init__(self, rows: list[dict]):
        by_cluster: dict[int, list[str]] = {}
        for p in rows:
            by_cluster.setdefault(int(p["cluster_id"]), []).append(p["phrase"])
        self.cluster_ids = np.array(sorted(by_cluster), dtype=np.int64)
        self.phrases_of = {cid: sorted(set(v)) for cid, v in by_cluster.items()}
        self.phrase_pool = [(ph, cid) for cid in self.cluster_ids.tolist() for ph in self.phrases_of[cid]]

    def sample(self, banned: frozenset[int], count: int, mode: str, clusters_of: dict[str, frozenset[int]],
               rng: np.random.Generator) -> list[tuple[str, int]]:
        if count <= 0:
            return []
        if mode == "phrase":
            order = rng.permutation(len(self.phrase_pool))
            picked, taken = [], set()
            for ph, cid in (self.phrase_pool[i] for i in order):
                if ph not in taken and not clusters_of[ph] & banned:
                    taken.add(ph)
                    picked.append((ph, cid))
            return picked[:count]
        out: list[tuple[str, int]] = []
        seen: set[str] = set()
        # Clusters in a random order, cycling when every open cluster has given a phrase.
        open_clusters = [c for c in self.cluster_ids[rng.permutation(len(self.cluster_ids))].tolist() if c not in banned]
        while len(out) < count and open_clusters:
            remaining = []
            for cid in open_clusters:
                choices = [p for p in self.phrases_of[cid] if p not in seen and not clusters_of[p] & banned]
                if not choices:
                    continue
                phrase = choices[int(rng.integers(len(choices)))]
                seen.add(phrase)
                out.append((phrase, cid))
                remaining.append(cid)
                if len(out) == count:
                    break
            open_clusters = remaining
        return out


def default_clusters_folder(shards_path: str) -> str:
    return str(Path(shards_path) / "clusters") if "://" not in shards_path else shards_path.rstrip("/") + "/clusters"
