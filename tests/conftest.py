"""Fixtures: small hand-built corpora in the real FSD50K and ambience layouts, with known truth."""

from __future__ import annotations

import csv
import functools
import hashlib
import json
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the project root

import sedsynth  # noqa: F401,E402 - before numpy: the tests run on the kernels the command pins (pipeline.determinism)

import numpy as np
import pytest
import soundfile as sf

from pipeline.config.params import read_yaml_mapping
from trainer.config import Params, load_params

# (fname, labels, mids): leaf first, then ancestors, as FSD50K writes them.
BARK = ("Bark,Dog,Domestic_animals_and_pets,Animal", "/m/05tny_,/m/0bt9lr,/m/068hy,/m/0jbk")
MEOW = ("Meow,Cat,Domestic_animals_and_pets,Animal", "/m/07qrkrw,/m/01yrx,/m/068hy,/m/0jbk")
KNOCK = ("Knock,Door", "/m/07r4wb8,/m/02dgv")
BARK_AND_MEOW = (
    "Bark,Dog,Meow,Cat,Domestic_animals_and_pets,Animal",
    "/m/05tny_,/m/0bt9lr,/m/07qrkrw,/m/01yrx,/m/068hy,/m/0jbk",
)


def tone_burst(
    sr: int,
    total_s: float,
    on_s: float,
    off_s: float,
    level_dbfs: float = -12.0,
    freq_hz: float = 440.0,
    floor_dbfs: float = -90.0,
    seed: int = 0,
) -> np.ndarray:
    """A sine between ``on_s`` and ``off_s`` over a faint noise floor."""
    rng = np.random.default_rng(seed)
    n = int(round(total_s * sr))
    t = np.arange(n) / sr
    x = rng.standard_normal(n) * 10 ** (floor_dbfs / 20)
    a, b = int(round(on_s * sr)), int(round(off_s * sr))
    x[a:b] += np.sqrt(2) * 10 ** (level_dbfs / 20) * np.sin(2 * np.pi * freq_hz * t[a:b])
    return x.astype(np.float32)


def write_fsd50k(
    root: Path,
    dev_rows: list[tuple],
    eval_rows: list[tuple],
    audio: dict[str, tuple[np.ndarray, int, str]],
    licences: dict[str, str] | None = None,
) -> Path:
    """Write the FSD50K layout: ground-truth CSVs, metadata JSON and the given audio files.

    ``audio`` maps fname -> (samples (n,) or (n, ch), rate, soundfile subtype); a value of
    ``bytes`` is written verbatim (for corrupt files).
    """
    gt = root / "FSD50K.ground_truth"
    gt.mkdir(parents=True)
    for part, rows, header in (
        ("dev", dev_rows, ["fname", "labels", "mids", "split"]),
        ("eval", eval_rows, ["fname", "labels", "mids"]),
    ):
        with (gt / f"{part}.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            for r in rows:
                w.writerow(r)
        (root / f"FSD50K.{part}_audio").mkdir()
    meta = root / "FSD50K.metadata"
    meta.mkdir()
    for part, rows in (("dev", dev_rows), ("eval", eval_rows)):
        info = {
            str(r[0]): {
                "title": f"clip {r[0]}",
                "description": "",
                "tags": [],
                "license": (licences or {}).get(str(r[0]), "http://creativecommons.org/licenses/by/3.0/"),
                "uploader": f"user{r[0]}",
            }
            for r in rows
        }
        (meta / f"{part}_clips_info_FSD50K.json").write_text(json.dumps(info))
    eval_names = {str(r[0]) for r in eval_rows}
    for fname, value in audio.items():
        folder = "FSD50K.eval_audio" if fname in eval_names else "FSD50K.dev_audio"
        path = root / folder / f"{fname}.wav"
        if isinstance(value, bytes):
            path.write_bytes(value)
        else:
            x, sr, subtype = value
            sf.write(path, x, sr, subtype=subtype)
    return root


@functools.cache
def debug_params() -> Params:
    """params.yaml with configs/debug.yaml over it, as ``sedsynth pipeline --overrides configs/debug.yaml`` reads
    them: the fixtures take their tiny sizes from here (never its folders, which are under debug/)."""
    return load_params(ROOT / "params.yaml", read_yaml_mapping(ROOT / "configs" / "debug.yaml", "overrides file"))


def debug_values(section, *names: str) -> dict:
    """``{name: value}`` of ``names`` in ``section`` of :func:`debug_params` (``debug_params().mix``), for ``replace``."""
    return {name: getattr(section, name) for name in names}


@pytest.fixture
def params() -> Params:
    """Default parameters, run in-process (one worker, as the debug run) and with few example plots."""
    p = Params()
    return replace(p, compute=debug_params().compute, clip=replace(p.clip, plot_examples=2))


def tree_digest(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder``, keyed by relative path."""
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="session")
def mixed(tmp_path_factory):
    """A small mix stage output made by the real stages from the embedded corpus, sized as the debug run's.

    Returns ``(params, mix_dir, events_dir, backgrounds_dir)``; params point ``mix.out_dir``
    at the folder and run everything in-process.
    """
    from pipeline.stages import ambience, clip
    from pipeline.corpus import write_ambience_library, write_fsd50k_corpus
    from pipeline.stages.mix import run as mix

    tmp = tmp_path_factory.mktemp("mixed")
    tiny, p = debug_params(), Params()
    mix_sizes = debug_values(tiny.mix, "mixtures", "partition_size", "event_split", "holdout", "export")
    p = replace(
        p,
        compute=tiny.compute,
        clip=replace(p.clip, **debug_values(tiny.clip, "plot_examples")),
        mix=replace(p.mix, **mix_sizes, out_dir=str(tmp / "mix")),
    )
    write_fsd50k_corpus(tmp / "fsd50k", n_clips=tiny.corpus.fsd50k_clips, seed=tiny.corpus.seed)
    write_ambience_library(tmp / "ambience", n_recordings=tiny.corpus.ambience_recordings, seed=tiny.corpus.seed)
    clip.run(p, tmp / "fsd50k", tmp / "events")
    ambience.run(p, tmp / "ambience", tmp / "backgrounds")
    mix(p, tmp / "events", tmp / "backgrounds", tmp / "mix")
    return p, tmp / "mix", tmp / "events", tmp / "backgrounds"


@pytest.fixture(scope="session")
def shard_folder(mixed, tmp_path_factory):
    """Shards written by the real captions, clusters and shards stages from ``mixed``.

    Shards and row groups are small, so every split spans several of each. Returns
    ``(params, folder)`` where ``folder`` holds ``data/``, ``index.json`` and ``clusters/``.
    """
    from pipeline.stages.shards import run as shards
    from pipeline.stages import captions, clusters

    params, mix_dir, _, _ = mixed
    tmp = tmp_path_factory.mktemp("shard_folder")
    captions.run(params, mix_dir, tmp / "captions")
    # the inventory's phrases too: phrases naming several clusters, and the negatives' inventory share, get exercised
    clusters.run(
        replace(params, clusters=replace(params.clusters, include_inventory_phrases=True)), tmp / "captions", tmp / "clusters"
    )
    p = replace(params, shards=replace(params.shards, shard_size_mb=1.0, row_group_size_mb=0.4))
    shards(p, mix_dir, tmp / "captions", tmp / "clusters", tmp / "dataset")
    return p, tmp / "dataset"


def tiny_train_params(params: Params, folder: Path, out_dir: Path, **train_changes) -> Params:
    """``params`` with the debug run's CPU-sized ``train`` settings (a few steps, tiny model) reading ``folder``."""
    from trainer.config import SourceParams

    t, tiny = params.train, debug_params().train
    data = replace(
        t.data,
        **debug_values(tiny.data, "batch_size", "num_workers", "shuffle_buffer", "piece_rows"),
        sources=(SourceParams(path=str(folder), split="train"),),
        valid=SourceParams(path=str(folder), split="valid"),
    )
    model = replace(t.model, **debug_values(tiny.model, "encoder", "embed_dim", "adapter_heads", "adapter_ffn", "freeze_text"))
    optim = replace(t.optim, **debug_values(tiny.optim, "lr", "warmup_steps", "epochs", "max_steps"))
    train = replace(t, data=data, model=model, optim=optim, log_every_steps=tiny.log_every_steps, out_dir=str(out_dir))
    return replace(params, train=replace(train, **train_changes))


@pytest.fixture
def one_torch_thread():
    """Tiny models run fastest on one thread, and do not stall when other work holds the cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# The slow tier, by node-id prefix: ``pytest -m "not slow"`` runs the rest (docs/contributing.md). Tests
# marked ``compile`` (torch.compile on the CPU) are slow too. tests/test_docs.py checks every prefix names a test.
SLOW = (
    "tests/test_dvc_pipeline.py::test_dvc_repro_runs_every_stage_to_valid_shards",  # a whole dvc repro
    "tests/test_reproducible_lock.py::test_fresh_copy_reproduces_committed_lock_for_data_stages",  # the data stages again
    "tests/trainer/stages/test_train_ddp.py::test_two_ranks_",  # torchrun, two ranks
    "tests/trainer/test_features.py::test_fbank_compiles_as_one_graph",  # torch.compile's tracer
    "tests/pipeline/stages/test_mix.py::test_scaper_",  # the Scaper 1.6.5 peer, in its own environment
    "tests/pipeline/stages/test_mix_library.py::test_scaper_",
)


def slow_tier_tests() -> frozenset[str]:
    """The node ids (without parameters) tests/slow_tier.txt lists: the tests measured at 1 s or more."""
    lines = (Path(__file__).parent / "slow_tier.txt").read_text(encoding="utf-8").splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def pytest_collection_modifyitems(config, items):
    """Mark the slow tier ``slow``: the node ids :data:`SLOW` names, those tests/slow_tier.txt lists, and every
    ``compile`` test."""
    measured = slow_tier_tests()
    for item in items:
        function = item.nodeid.split("[", 1)[0]
        if item.nodeid.startswith(SLOW) or function in measured or item.get_closest_marker("compile") is not None:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True, scope="session")
def mixing_banks_in_the_session_folder(tmp_path_factory):
    """Mixing sources keep their decoded sources in this session's temp folder, not the machine's cache."""
    from trainer.data import mixing

    folder = tmp_path_factory.mktemp("mixing-banks")
    kept = mixing.banks_folder
    mixing.banks_folder = lambda: folder
    yield
    mixing.banks_folder = kept
