"""Ontology lookups and the single-label rule's leaf test."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.ontology import default_ontology, fsd50k_label_name

ONTOLOGY = default_ontology()
LEAVES = sorted(mid for mid, c in ONTOLOGY.by_mid.items() if not c.child_mids)


def test_fsd50k_names() -> None:
    assert fsd50k_label_name("Accelerating, revving, vroom") == "Accelerating_and_revving_and_vroom"
    assert fsd50k_label_name("Dishes, pots, and pans") == "Dishes_and_pots_and_pans"
    assert fsd50k_label_name("Zipper (clothing)") == "Zipper_(clothing)"
    assert ONTOLOGY.by_fsd50k_name["Chirp_and_tweet"].mid == "/m/07pggtn"


def test_ancestors_follow_every_parent() -> None:
    names = {ONTOLOGY.by_mid[m].name for m in ONTOLOGY.ancestors(ONTOLOGY.by_name["Bark"].mid)}
    assert names == {"Dog", "Domestic animals, pets", "Animal"}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(LEAVES), min_size=1, max_size=4, unique=True), st.randoms(use_true_random=False))
def test_leaves_of_a_label_list_with_ancestors_are_the_labels(leaves: list[str], rnd) -> None:
    mids = list(leaves)
    for leaf in leaves:
        mids += ONTOLOGY.ancestors(leaf)
    rnd.shuffle(mids)
    assert set(ONTOLOGY.leaf_mids(mids)) == set(leaves)


def test_unknown_mids_count_as_leaves() -> None:
    assert ONTOLOGY.leaf_mids(["/t/not-a-class", ONTOLOGY.by_name["Dog"].mid]) == ["/t/not-a-class", ONTOLOGY.by_name["Dog"].mid]
