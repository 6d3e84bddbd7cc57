"""``sedsynth bench view`` at a tiny size: the table it prints, the figures it returns and the result file it saves.

Timings are not checked (they depend on the machine); their presence, types and the targets'
verdicts are. The checkpoint is the default model's path made absent, so the bench builds its
own at fresh weights; the model is the debug run's tiny one, so that takes seconds.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import debug_params

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_params(tmp_path_factory):
    from trainer.config import load_params

    params = load_params(ROOT / "params.yaml")
    tiny = debug_params().train.model
    model = replace(
        params.train.model,
        encoder=tiny.encoder,
        embed_dim=tiny.embed_dim,
        adapter_heads=tiny.adapter_heads,
        adapter_ffn=tiny.adapter_ffn,
        freeze_text=tiny.freeze_text,
    )
    missing = tmp_path_factory.mktemp("bench-view") / "none.pt"
    return replace(params, train=replace(params.train, model=model), evaluate=replace(params.evaluate, checkpoint=str(missing)))


def test_bench_view_prints_its_table_and_saves_its_figures(tiny_params, tmp_path: Path, capsys) -> None:
    from sedsynth.view.bench import TARGETS, main

    saved = tmp_path / "view.json"
    args = argparse.Namespace(what="view", rows=2000, repeat=1, save=str(saved))
    assert main(args, tiny_params) == 0
    printed = capsys.readouterr().out
    for what in (
        "first page of 2,000 rows, cold",
        "first page of 2,000 rows, warm",
        "mixture page",
        "detect, one query",
        "server RSS, 2,000 rows / 200 rows",
    ):
        assert re.search(rf"^{re.escape(what)}.*  (yes|no)$", printed, re.MULTILINE), f"no table line for {what!r}:\n{printed}"
    assert "the default model (train.model) at fresh weights" in printed

    result = json.loads(saved.read_text(encoding="utf-8"))
    assert {"benchmark", "command", "commit", "machine", "figures", "printed"} <= set(result)
    assert result["benchmark"] == "view" and result["command"] == "sedsynth bench view --rows 2000 --repeat 1"
    figures = result["figures"]
    assert figures["rows"] == 2000 and figures["rows_small"] == 200
    for name in (
        "first_page_cold_ms",
        "first_page_warm_ms",
        "filtered_page_ms",
        "mixture_page_ms",
        "mixture_page_cold_ms",
        "detect_ms",
        "detect_cold_ms",
        "detect_model_ms",
        "rss_mb",
        "rss_small_mb",
        "rss_ratio",
        "start_s",
        "build_s",
    ):
        assert isinstance(figures[name], (int, float)) and figures[name] > 0, name
    assert figures["met"] == {name: figures[name] <= target for name, target in TARGETS.items()}
    assert result["printed"] == printed.splitlines()


def test_bench_dataset_is_a_shard_folder_the_view_reads(tmp_path: Path) -> None:
    """The built folder is read as a real one: the shard schema, ``index.json``, and the timed rows' 10 s audio."""
    from pipeline.config.params import ShardParams
    from pipeline.shards.layout import shard_schema
    from sedsynth.view.bench import MIXTURE_BYTES, build_dataset, flac
    from sedsynth.view.catalog import open_catalog

    real = flac(10.0, 16000, 2)
    ids = build_dataset(tmp_path, 3000, 16000, ShardParams(shard_size_mb=200.0, row_group_size_mb=50.0), real)
    index = json.loads((tmp_path / "index.json").read_text())
    assert sum(f["num_rows"] for f in index["files"]) == 3000
    assert all(f["num_row_groups"] >= 1 for f in index["files"]) and len(index["files"]) > 3  # cut as 220 KB mixtures would be
    first = tmp_path / index["files"][0]["path"]
    assert pq.read_schema(first).remove_metadata() == shard_schema(16000).remove_metadata()
    assert pq.ParquetFile(first).metadata.row_group(0).num_rows == -(-50_000_000 // MIXTURE_BYTES)
    catalog = open_catalog(tmp_path)
    assert len(catalog) == 3000 and set(catalog.splits) == {"train", "valid", "test"}
    for mixture_id in ids:
        assert catalog.audio(mixture_id) == real and catalog.mixture(mixture_id)["phrases"]
    assert len(catalog.audio("mix-0000000")) < 2000
