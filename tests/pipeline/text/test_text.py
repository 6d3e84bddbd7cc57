"""Label phrases, the cluster inventory, captions (offline) and cluster assignment."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.ontology import default_ontology
from pipeline.schema import (
    Caption,
    Cluster,
    LabelPhrase,
    LabelSegment,
    PhraseAssignment,
    from_table,
)
from pipeline.stages import captions, clusters
from pipeline.text import inventory
from pipeline.text.inventory import DATA_DIR
from pipeline.text.llm import MalformedCompletion
from pipeline.text.phrases import (
    join_phrases,
    label_phrases,
    name_phrases,
)
from pipeline.text.templates import DEFAULT_TEMPLATES, CaptionError, fill, validate_templates
from tests.conftest import tree_digest

ONTO = default_ontology()


def mid(name: str) -> str:
    return ONTO.by_name[name].mid


# --------------------------------------------------------------------------- phrases


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Chirp, tweet", ["chirp", "tweet"]),
        ("Dishes, pots, and pans", ["dishes, pots and pans"]),
        ("Coin (dropping)", ["coin dropping", "coin"]),
        ("Keyboard (musical)", ["musical keyboard", "keyboard"]),
        ("Telephone dialing, DTMF", ["telephone dialing", "DTMF"]),
        ("Bee, wasp, etc.", ["bee", "wasp"]),
        ("Roaring cats (lions, tigers)", ["roaring cats"]),
    ],
)
def test_name_phrases(name: str, expected: list[str]) -> None:
    assert name_phrases(name) == expected


def test_label_phrases_add_animal_parent() -> None:
    assert label_phrases(ONTO, mid("Bark"))[:2] == ["bark", "dog bark"]
    assert "cat meow" in label_phrases(ONTO, mid("Meow"))
    assert label_phrases(ONTO, mid("Hammer")) == ["hammer"]
    assert label_phrases(ONTO, mid("Vehicle horn, car horn, honking")) == ["vehicle horn", "car horn", "honking"]


def test_every_shipped_phrase_names_its_sound() -> None:
    """No description fragment ("a tool or device") becomes a phrase: every word of every shipped
    label phrase and inventory alternative comes from the class's display name or its parents'."""
    shipped = json.loads((DATA_DIR / "label_phrases.json").read_text())["phrases"]
    inventory = json.loads((DATA_DIR / "clusters.json").read_text())["clusters"]
    checked = 0
    for m, phrases in [*shipped.items(), *((c["mid"], c["alternatives"]) for c in inventory)]:
        if m not in ONTO.by_mid:
            continue
        names = [ONTO.by_mid[m].name, *(ONTO.by_mid[p].name for p in ONTO.parent_mids.get(m, ()))]
        words = set(re.findall(r"[\w'-]+", " ".join(names).lower()))
        for phrase in phrases:
            assert set(re.findall(r"[\w'-]+", phrase.lower())) <= words, (m, phrase)
            checked += 1
    assert checked > 1000


def test_join_and_fill() -> None:
    assert join_phrases([]) == "" and join_phrases(["rain"]) == "rain"
    assert join_phrases(["a", "b"]) == "a and b"
    assert join_phrases(["a", "b", "c"]) == "a, b and c"
    assert fill("{} can be heard.", ["dog bark", "rain"]) == "Dog bark and rain can be heard."


def test_validate_templates_keeps_one_slot_lines_once() -> None:
    raw = [
        "1. This audio has {}.",
        "- this audio has {}.",
        '"Hear {} now."',
        "no slot",
        "two {} slots {}",
        "bad {x} {}",
        "# c {}",
    ]
    assert validate_templates(raw) == ["This audio has {}.", "Hear {} now."]
    with pytest.raises(MalformedCompletion):
        validate_templates(["no slot here"], minimum=1)


def test_shipped_templates_are_valid() -> None:
    lines = [ln for ln in DEFAULT_TEMPLATES.read_text().splitlines() if ln and not ln.startswith("#")]
    assert validate_templates(lines) == lines and len(lines) >= 20


# --------------------------------------------------------------------------- inventory


def test_shipped_inventory_is_what_the_builder_makes() -> None:
    built_clusters, built_phrases = inventory.build()
    assert inventory.CLUSTERS_PATH.read_bytes() == inventory.dump(built_clusters), "run: python -m pipeline.text.inventory"
    assert inventory.LABEL_PHRASES_PATH.read_bytes() == inventory.dump(built_phrases), "run: python -m pipeline.text.inventory"


def test_inventory_covers_its_sources() -> None:
    data = clusters.load_inventory()
    assert 450 <= len(data) <= 550
    mids = {c["mid"] for c in data}
    strong = inventory.read_strong_classes()
    assert {m for m, _ in strong} <= mids
    assert {m for _, m in inventory.fsd50k_vocabulary(ONTO)} <= mids
    assert mid("Violin, fiddle") in mids and mid("Didgeridoo") in mids  # instruments AudioSet-Strong lacks
    assert sum(len(c["alternatives"]) for c in data) > 600
    assert all(c["alternatives"] and len(set(c["alternatives"])) == len(c["alternatives"]) for c in data)
    by_mid = {c["mid"]: c for c in data}
    bark = by_mid[mid("Bark")]
    assert by_mid[mid("Dog")]["id"] in bark["parent_ids"]


def test_vocabulary_csv_replaces_the_builtin_list(tmp_path: Path) -> None:
    vocab = tmp_path / "vocabulary.csv"
    vocab.write_text("0,Bark,/m/05tny_\n1,Chatter,/m/07rkbfh\n")
    assert inventory.read_vocabulary_csv(vocab) == [("Bark", "/m/05tny_"), ("Chatter", "/m/07rkbfh")]
    out = tmp_path / "data"
    out.mkdir()
    assert inventory.main(["--fsd50k-vocabulary", str(vocab), "--out-dir", str(out)]) == 0
    names = {c["name"] for c in json.loads((out / "clusters.json").read_text())["clusters"]}
    assert "Chatter" in names and "Domestic sounds, home sounds" not in names


# --------------------------------------------------------------------------- captions


def test_phrases_are_the_relabeled_segments(captioned) -> None:
    _params, mix_dir, out, _ = captioned
    phrases = from_table(pq.read_table(out / "phrases.parquet"), LabelPhrase)
    segments = from_table(pq.read_table(mix_dir / "segments.parquet"), LabelSegment)
    occurrences = pq.read_table(mix_dir / "occurrences.parquet").to_pylist()
    want = {}
    for s in segments:
        want.setdefault((s.mixture_id, s.label), []).append((s.onset_s, s.offset_s))
    got = {(p.mixture_id, p.label): [(t.start_s, t.end_s) for t in p.segments] for p in phrases}
    assert got == {k: sorted(v) for k, v in want.items()}
    for p in phrases:
        events = {
            (o["event_index"], o["clip_id"], o["snr_db"])
            for o in occurrences
            if o["mixture_id"] == p.mixture_id and o["label"] == p.label
        }
        assert sorted(p.source_clip_ids) == sorted(c for _, c, _ in events)
        assert sorted(p.snr_db) == sorted(s for _, _, s in events)
        assert p.phrase in label_phrases(ONTO, p.mid)


def test_captions_name_every_phrase_in_temporal_order(captioned) -> None:
    _, mix_dir, out, summary = captioned
    caps = {c.mixture_id: c for c in from_table(pq.read_table(out / "captions.parquet"), Caption)}
    phrases = from_table(pq.read_table(out / "phrases.parquet"), LabelPhrase)
    assert len(caps) == pq.read_metadata(mix_dir / "mixtures.parquet").num_rows == summary["mixtures"]
    templates = (out / "templates.txt").read_text().splitlines()
    for mixture_id, cap in caps.items():
        mine = [p for p in phrases if p.mixture_id == mixture_id]
        starts = [p.segments[0].start_s for p in mine]
        assert starts == sorted(starts)
        assert cap.source == "template" and cap.template in templates
        assert cap.caption == fill(cap.template, list(dict.fromkeys(p.phrase for p in mine)))


def test_captions_are_deterministic(captioned, tmp_path: Path) -> None:
    params, mix_dir, out, _ = captioned
    captions.run(params, mix_dir, tmp_path / "again")
    assert tree_digest(tmp_path / "again") == tree_digest(out)
    captions.run(replace(params, seed=params.seed + 1), mix_dir, tmp_path / "other")
    assert tree_digest(tmp_path / "other")["captions.parquet"] != tree_digest(out)["captions.parquet"]


def test_captions_do_not_depend_on_the_stored_row_order_or_the_chunk(captioned, tmp_path: Path, monkeypatch) -> None:
    """Rows shuffled in all three manifests, plus an occurrence and a segment of no recipe, read a few
    mixtures at a time: the same files as the stored order read at once."""
    params, mix_dir, out, _ = captioned
    shuffled = tmp_path / "mix"
    shuffled.mkdir()
    rng = np.random.default_rng(0)
    for name in ("mixtures.parquet", "occurrences.parquet", "segments.parquet"):
        table = pq.read_table(mix_dir / name)
        if name != "mixtures.parquet":  # a row whose mixture is not in the recipes is never read
            i = table.schema.get_field_index("mixture_id")
            table = pa.concat_tables([table, table.slice(0, 1).set_column(i, table.schema.field(i), pa.array(["orphan"]))])
        pq.write_table(table.take(rng.permutation(table.num_rows)), shuffled / name)
    monkeypatch.setattr(captions, "MIXTURES_PER_CHUNK", 3)
    captions.run(params, shuffled, tmp_path / "again")
    assert tree_digest(tmp_path / "again") == tree_digest(out)


def test_template_file_and_missing_inputs(mixed, tmp_path: Path) -> None:
    params, mix_dir, _, _ = mixed
    good = tmp_path / "t.txt"
    good.write_text("Only {} here.\n")
    p = replace(params, captions=replace(params.captions, templates=str(good)))
    captions.run(p, mix_dir, tmp_path / "c")
    assert all(c["caption"].startswith("Only ") for c in pq.read_table(tmp_path / "c" / "captions.parquet").to_pylist())
    bad = tmp_path / "bad.txt"
    bad.write_text("no slot\n")
    with pytest.raises(CaptionError, match="exactly one"):
        captions.run(replace(params, captions=replace(params.captions, templates=str(bad))), mix_dir, tmp_path / "d")
    with pytest.raises(CaptionError, match="sedsynth mix"):
        captions.run(params, tmp_path / "nowhere", tmp_path / "e")
    assert not (tmp_path / "d").exists() and not (tmp_path / "e").exists()


# --------------------------------------------------------------------------- clusters


@pytest.fixture(scope="module")
def clustered(captioned, tmp_path_factory):
    """The clusters stage with the inventory's phrases in the database too (the option that covers every table)."""
    params, _mix_dir, cap_dir, _ = captioned
    params = replace(params, clusters=replace(params.clusters, include_inventory_phrases=True))
    out = tmp_path_factory.mktemp("clusters") / "clusters"
    summary = clusters.run(params, cap_dir, out)
    return params, cap_dir, out, summary


def test_the_default_phrase_database_is_the_corpus_phrases(captioned, tmp_path) -> None:
    """FineLAP 3.2: the database is the training corpus's phrases (each label's phrases), and only those."""
    params, _mix_dir, cap_dir, _ = captioned
    assert params.clusters.include_inventory_phrases is False
    clusters.run(params, cap_dir, tmp_path / "clusters")
    rows = from_table(pq.read_table(tmp_path / "clusters" / "phrases.parquet"), PhraseAssignment)
    used = from_table(pq.read_table(cap_dir / "phrases.parquet"), LabelPhrase)
    assert {r.source for r in rows} == {"dataset"} and {r.label for r in rows} == {u.label for u in used}
    assert {u.phrase for u in used} <= {r.phrase for r in rows}


def test_every_dataset_label_goes_to_its_own_mid(clustered) -> None:
    _, cap_dir, out, summary = clustered
    rows = from_table(pq.read_table(out / "phrases.parquet"), PhraseAssignment)
    inv = {c.cluster_id: c for c in from_table(pq.read_table(out / "clusters.parquet"), Cluster)}
    used = from_table(pq.read_table(cap_dir / "phrases.parquet"), LabelPhrase)
    by_key = {(r.phrase, r.label, r.mid): r for r in rows}
    for u in used:
        r = by_key[(u.phrase, u.label, u.mid)]
        assert r.method == "mid" and inv[r.cluster_id].mid == u.mid and r.count >= 1
    assert sum(r.count for r in rows) == len(used)
    assert summary["clusters"] == len(inv) and all(-1.0 <= r.similarity <= 1.0 for r in rows)
    assert {r.source for r in rows} == {"dataset", "inventory"}


def test_relations_are_consistent(clustered) -> None:
    _, _, out, _ = clustered
    inv = {c.cluster_id: c for c in from_table(pq.read_table(out / "clusters.parquet"), Cluster)}
    by_mid = {c.mid: c for c in inv.values()}
    bark, dog, animal = by_mid[mid("Bark")], by_mid[mid("Dog")], by_mid[mid("Animal")]
    assert dog.cluster_id in bark.ancestor_ids and animal.cluster_id in bark.ancestor_ids
    assert bark.cluster_id in animal.descendant_ids
    for c in inv.values():
        assert set(c.parent_ids) <= set(c.ancestor_ids) and c.cluster_id not in c.ancestor_ids
        assert all(c.cluster_id in inv[a].descendant_ids for a in c.ancestor_ids)
        assert all(c.cluster_id in inv[s].near_synonym_ids for s in c.near_synonym_ids)


def test_labels_outside_the_inventory_go_to_the_nearest_centroid(clustered, tmp_path: Path) -> None:
    """Withhold some FSD50K classes from the inventory: SentenceBERT must place their phrases
    in a cluster the AudioSet hierarchy relates to them (an independent grouping)."""
    params, _, _, _ = clustered
    data = json.loads(inventory.CLUSTERS_PATH.read_text())
    withheld = {mid(n) for n in ("Meow", "Church bell", "Acoustic guitar", "Snare drum", "Gunshot, gunfire", "Raindrop")}
    kept = [c for c in data["clusters"] if c["mid"] not in withheld]
    remap = {c["id"]: i for i, c in enumerate(kept)}
    for c in kept:
        c["id"] = remap[c["id"]]
        c["parent_ids"] = [remap[p] for p in c["parent_ids"] if p in remap]
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps({**data, "clusters": kept}))
    index = clusters.ClusterIndex(clusters.load_inventory(str(path)), params.clusters.model)
    phrases = [label_phrases(ONTO, m)[0] for m in sorted(withheld)]
    got = index.assign(phrases, sorted(withheld))
    related = 0
    for m, (cid, _sim, method, _, _) in zip(sorted(withheld), got):
        assert method == "sbert"
        target = kept[cid]["mid"]
        family = set(ONTO.ancestors(m)) | {m} | set(ONTO.by_mid[m].child_mids)
        siblings = {c for p in ONTO.parent_mids.get(m, ()) for c in ONTO.by_mid[p].child_mids}
        related += target in family | siblings
    assert related >= 5, [(ONTO.by_mid[m].name, kept[c]["name"]) for m, (c, *_rest) in zip(sorted(withheld), got)]


def test_bad_inventory_and_missing_captions(clustered, tmp_path: Path) -> None:
    params, _cap_dir, _, _ = clustered
    bad = tmp_path / "inv.json"
    bad.write_text(
        json.dumps({"version": 1, "clusters": [{"id": 3, "mid": "", "name": "x", "alternatives": ["x"], "parent_ids": []}]})
    )
    with pytest.raises(clusters.ClusterError, match="malformed"):
        clusters.load_inventory(str(bad))
    with pytest.raises(clusters.ClusterError, match="sedsynth captions"):
        clusters.run(params, tmp_path / "nowhere", tmp_path / "out")
