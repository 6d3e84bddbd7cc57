"""The dataset card's text for a small fixture is exactly the text the card had when it was pinned.

The fixture covers every branch of the card: a split with statistics and one without (the
``-`` cells), a cluster id missing from the names, more credit lines than the card shows, and
a licence ``datasets`` does not name.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from pipeline.config.params import Params
from pipeline.shards.card import card_text

EXPECTED_CARD = Path(__file__).parent / "data" / "card_fixture.md"


def _fixture() -> tuple:
    """``(params, index, stats, licenses, attribution, cluster_names)`` for a two-split dataset."""
    files = [
        {"path": "data/train-00000-of-00001.parquet", "split": "train", "num_rows": 3, "num_bytes": 12345, "sha256": "ab" * 32},
        {"path": "data/test-00000-of-00001.parquet", "split": "test", "num_rows": 1, "num_bytes": 2345, "sha256": "cd" * 32},
    ]
    index = {
        "sample_rate_hz": 16000,
        "splits": {"train": {"num_rows": 3, "num_bytes": 12345}, "test": {"num_rows": 1, "num_bytes": 2345}},
        "files": files,
    }
    stats = {
        "train": {
            "mixtures": 3,
            "hours": 30.0 / 3600,
            "labels_per_mixture": [1, 2, 0],
            "phrases": Counter({"a dog barking": 2, "rain": 1}),
            "clusters": Counter({1: 2, 3: 1}),
            "segment_s": [1.25, 2.5, 0.75],
            "snr_db": [12.5, 19.75, 15.0],
        },
        "test": {
            "mixtures": 1,
            "hours": 10.0 / 3600,
            "labels_per_mixture": [],
            "phrases": Counter(),
            "clusters": Counter(),
            "segment_s": [],
            "snr_db": [],
        },
    }
    licenses = {"dataset_license": "CC-Sampling+", "mixtures_by_license": {"CC0": 2, "CC-BY": 1, "CC-Sampling+": 1}}
    attribution = [["event" if i % 2 else "background", f"id{i}", "", "", f"title {i}", f"author {i}", "CC0"] for i in range(25)]
    return Params(), index, stats, licenses, attribution, {1: "Dog", 2: "Rain"}


def test_card_text_of_the_fixture_is_unchanged() -> None:
    assert card_text(*_fixture()) == EXPECTED_CARD.read_text(encoding="utf-8")


def test_the_statistics_picture_draws_splits_whose_values_coincide(tmp_path: Path) -> None:
    """One clip repeated gives segment durations that differ by float rounding only: still a picture."""
    from pipeline.shards.card import plot

    same = [2.6000000000000005, 2.6, 2.6000000000000001]
    stats = {
        "valid": {"labels_per_mixture": [1, 1], "segment_s": same, "snr_db": [3.0, 3.0 + 1e-13], "clusters": Counter({1: 2})},
        "test": {"labels_per_mixture": [], "segment_s": [], "snr_db": [], "clusters": Counter()},
    }
    plot(stats, {1: "Siren"}, tmp_path / "statistics.png")
    assert (tmp_path / "statistics.png").stat().st_size > 0
