"""The mix stage end to end on the embedded corpus: outputs, splits, licences, determinism
across worker counts, re-rendering from the stored recipe, kill and resume, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from pipeline.config.params import ComputeParams, MixtureCounts, ParamsError
from pipeline.corpus import write_ambience_library, write_fsd50k_corpus
from pipeline.mix.bank import FileSources
from pipeline.mix.render import render
from pipeline.mix.sources import MixError
from pipeline.schema import BackgroundSegment, EventClip, EventOccurrence, MixtureRecipe, from_table
from pipeline.stages import ambience, clip
from pipeline.stages.mix import run
from tests.conftest import ROOT, tree_digest
from trainer.config import Params, load_params


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> tuple[Path, Path]:
    """Event clips and background segments made by the real stages from the embedded corpus."""
    tmp = tmp_path_factory.mktemp("mix-sources")
    p = replace(Params(), compute=ComputeParams(workers=1))
    p = replace(p, clip=replace(p.clip, plot_examples=0))
    write_fsd50k_corpus(tmp / "fsd50k", n_clips=160, seed=3)
    write_ambience_library(tmp / "ambience", n_recordings=10, seed=3)
    clip.run(p, tmp / "fsd50k", tmp / "events")
    ambience.run(p, tmp / "ambience", tmp / "backgrounds")
    return tmp / "events", tmp / "backgrounds"


def small(workers: int = 1, **mix) -> Params:
    p = Params()
    m = replace(
        p.mix,
        mixtures=MixtureCounts(train=24, valid=6, test=6),
        partition_size=8,
        export=replace(p.mix.export, timelines=2, txt=True),
    )
    return replace(p, compute=ComputeParams(workers=workers, chunk_size=1), mix=replace(m, **mix))


def tables(out: Path):
    mixtures = from_table(pq.read_table(out / "mixtures.parquet"), MixtureRecipe)
    occurrences = from_table(pq.read_table(out / "occurrences.parquet"), EventOccurrence)
    return mixtures, occurrences, pq.read_table(out / "segments.parquet").to_pylist()


def test_outputs_splits_and_licences(sources, tmp_path: Path) -> None:
    events_dir, backgrounds_dir = sources
    out = tmp_path / "mix"
    summary = run(small(), events_dir, backgrounds_dir, out)
    mixtures, occurrences, segments = tables(out)
    assert summary["mixtures"] == 36 == len(mixtures)
    for name in ("timelines.png", "licenses.json", "attribution.csv", "spec.json", "skipped.csv", "summary.json"):
        assert (out / name).exists(), name
    assert not (out / "parts").exists() and not (out / "bank").exists(), "bookkeeping is removed"
    for m in mixtures:
        audio, sr = sf.read(out / m.audio_path, dtype="int16")
        assert sr == 16000 and audio.shape == (m.num_samples,)
        assert (out / m.audio_path).with_suffix(".txt").exists()

    # disjoint splits: FSD50K's own split for events, whole recordings for backgrounds
    clips = {e.clip_id: e for e in from_table(pq.read_table(events_dir / "manifest.parquet"), EventClip)}
    bgs = {b.segment_id: b for b in from_table(pq.read_table(backgrounds_dir / "manifest.parquet"), BackgroundSegment)}
    split_of = {m.mixture_id: m.split for m in mixtures}
    used = {s: set() for s in ("train", "valid", "test")}
    recordings = {s: set() for s in ("train", "valid", "test")}
    for o in occurrences:
        used[split_of[o.mixture_id]].add(o.clip_id)
        expected = {"train": "train", "val": "valid", "eval": "test"}[clips[o.clip_id].source_split]
        assert split_of[o.mixture_id] == expected
    for m in mixtures:
        recordings[m.split].add(bgs[m.background_id].source_id)
    for a, b in (("train", "valid"), ("train", "test"), ("valid", "test")):
        assert not used[a] & used[b] and not recordings[a] & recordings[b]

    # DCASE metadata agrees with the derived segments
    rows = (out / "metadata" / "train" / "events.tsv").read_text().splitlines()
    assert rows[0] == "filename\tonset\toffset\tevent_label"
    n_train = sum(1 for s in segments if split_of[s["mixture_id"]] == "train")
    assert len(rows) - 1 == n_train
    durations = (out / "metadata" / "test" / "durations.tsv").read_text().splitlines()
    assert durations[1] == "test_0000000.flac\t10.000"

    licenses = json.loads((out / "licenses.json").read_text())
    assert licenses["dataset_license"] in ("CC-BY-NC", "CC-Sampling+", "CC-BY", "CC0")
    assert sum(licenses["mixtures_by_license"].values()) == 36
    assert all(m.license in m.licenses and m.attribution for m in mixtures)


def test_generated_noise_backgrounds_run_through_every_output(sources, tmp_path: Path) -> None:
    """URBAN-SED's preset: every background is Brownian noise, which no manifest holds; the
    licence summary, attribution and DCASE files still come out, the noise as one CC0 row."""
    events_dir, backgrounds_dir = sources
    out = tmp_path / "mix"
    p = small(preset="urban-sed")
    run(p, events_dir, backgrounds_dir, out)
    mixtures, _, _ = tables(out)
    assert mixtures and all(m.background_id.startswith("brownian-") for m in mixtures)
    rows = (out / "attribution.csv").read_text().splitlines()
    assert [r for r in rows if r.startswith("background,")] == [
        f"background,brownian-*,generated,Brownian noise,,generated,CC0,,{len(mixtures)}"
    ]
    assert (out / "metadata" / "train" / "events.tsv").exists()


def test_a_room_folder_is_checked_hashed_and_its_bad_files_reported(sources, tmp_path: Path) -> None:
    """mix.spec.reverb.rirs: a file that does not decode and a silent one are skipped with their
    reasons; the mixtures use only the usable room; the summary names it with its sha256."""
    import hashlib

    rooms = tmp_path / "rooms"
    rooms.mkdir()
    n = np.arange(4000)
    h = np.exp(-n / 800.0) * np.random.default_rng(0).choice([-1.0, 1.0], n.shape[0])
    sf.write(rooms / "hall.wav", h.astype(np.float32), 16000, subtype="FLOAT")
    sf.write(rooms / "dead.wav", np.zeros(4000, np.float32), 16000, subtype="FLOAT")
    (rooms / "broken.wav").write_bytes(b"RIFF not a wave file")
    out = tmp_path / "mix"
    summary = run(small(spec={"reverb": {"probability": 1.0, "rirs": str(rooms)}}), *sources, out)
    skipped = {row.split(",")[0]: row.split(",")[2] for row in (out / "skipped.csv").read_text().splitlines()[1:]}
    assert skipped[str(rooms / "dead.wav")] == "silent" and skipped[str(rooms / "broken.wav")] == "unreadable"
    hall = f"file:{rooms / 'hall.wav'}"
    assert summary["room_files"] == {hall: hashlib.sha256((rooms / "hall.wav").read_bytes()).hexdigest()}
    _, occurrences, _ = tables(out)
    assert occurrences and {o.rir_id for o in occurrences} == {hall}


def test_allowed_licenses_filter_sources(sources, tmp_path: Path) -> None:
    events_dir, backgrounds_dir = sources
    out = tmp_path / "mix"
    run(small(allowed_licenses=("CC0", "CC-BY")), events_dir, backgrounds_dir, out)
    mixtures, occurrences, _ = tables(out)
    assert {o.license for o in occurrences} <= {"CC0", "CC-BY"}
    assert all(set(m.licenses) <= {"CC0", "CC-BY"} for m in mixtures)
    skipped = (out / "skipped.csv").read_text()
    assert "license-not-allowed" in skipped and "CC-BY-NC" in skipped


def test_rerender_from_recipe_is_bit_identical(sources, tmp_path: Path) -> None:
    events_dir, backgrounds_dir = sources
    out = tmp_path / "mix"
    run(small(), events_dir, backgrounds_dir, out)
    mixtures, occurrences, _ = tables(out)
    clips = from_table(pq.read_table(events_dir / "manifest.parquet"), EventClip)
    bgs = from_table(pq.read_table(backgrounds_dir / "manifest.parquet"), BackgroundSegment)
    files = FileSources(
        events_dir, backgrounds_dir, 16000, {c.clip_id: c.audio_path for c in clips}, {b.segment_id: b.audio_path for b in bgs}
    )
    for m in mixtures[::5]:
        stored, _ = sf.read(out / m.audio_path, dtype="int16")
        again = render(m, [o for o in occurrences if o.mixture_id == m.mixture_id], files)
        assert np.array_equal(stored, again), m.mixture_id


def test_same_bytes_for_one_and_two_workers(sources, tmp_path: Path) -> None:
    events_dir, backgrounds_dir = sources
    run(small(workers=1), events_dir, backgrounds_dir, tmp_path / "one")
    run(small(workers=2), events_dir, backgrounds_dir, tmp_path / "two")
    assert tree_digest(tmp_path / "one") == tree_digest(tmp_path / "two")


def test_workers_keep_envelopes_as_one_buffer_and_bounded_caches_write_the_same_bytes(
    sources, tmp_path: Path, monkeypatch
) -> None:
    """A worker's records carry no envelope tuple; its stored envelopes are the manifest's values;
    caches emptied every 2 entries (instead of 4,096) change no byte of the run."""
    from pipeline.mix import instantiate, partitions
    from pipeline.mix.sources import read_envelopes, read_sources

    events_dir, backgrounds_dir = sources
    events, backgrounds = read_sources(events_dir, backgrounds_dir)
    stored = read_envelopes(events_dir, "clip_id"), read_envelopes(backgrounds_dir, "segment_id")
    for table, records, key in ((stored[0], events, "clip_id"), (stored[1], backgrounds, "segment_id")):
        for r in records:
            db = table.db(getattr(r, key))
            assert db.dtype == np.float32 and not db.flags.writeable and tuple(db.tolist()) == r.envelope_db
    light = read_sources(events_dir, backgrounds_dir, envelopes=False)
    assert [replace(r, envelope_db=()) for r in events] == light[0]
    assert all(b.envelope_db == () for b in light[1])

    run(small(), events_dir, backgrounds_dir, tmp_path / "unbounded")
    sizes = []
    remember = instantiate.remember

    def small_cache(cache, key, value):
        out = remember(cache, key, value)
        sizes.append(len(cache))
        return out

    monkeypatch.setattr(instantiate, "MAX_CACHED", 2)
    monkeypatch.setattr(instantiate, "remember", small_cache)
    partitions.load_context.cache_clear()
    run(small(), events_dir, backgrounds_dir, tmp_path / "bounded")
    assert sizes and max(sizes) <= 2
    assert tree_digest(tmp_path / "unbounded") == tree_digest(tmp_path / "bounded")


def _mapped_kib(path: Path) -> int:
    """Resident KiB of this process's mappings of ``path`` (from /proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            inside = line.endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(head[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads the mapping's resident pages from /proc")
def test_a_worker_gives_back_the_bank_pages_after_each_partition(sources, tmp_path: Path, monkeypatch) -> None:
    """A released bank keeps no resident page of its mapping and hands out the same samples;
    the stage releases once per partition, and that changes no byte of the run."""
    from pipeline.mix import partitions
    from pipeline.mix.bank import SourceBank, build_bank
    from pipeline.mix.sources import read_sources

    events_dir, backgrounds_dir = sources
    events, backgrounds = read_sources(events_dir, backgrounds_dir, envelopes=False)
    build_bank(
        tmp_path / "bank",
        16000,
        [(e.clip_id, events_dir / e.audio_path) for e in events],
        [(b.segment_id, backgrounds_dir / b.audio_path) for b in backgrounds],
    )
    bank = SourceBank(tmp_path / "bank")
    pcm = (tmp_path / "bank" / "events.pcm").resolve()
    before = [bank.event(e.clip_id).copy() for e in events]  # touches every page
    assert _mapped_kib(pcm) >= pcm.stat().st_size // 1024 - 4
    bank.release()
    assert _mapped_kib(pcm) == 0
    assert all(np.array_equal(bank.event(e.clip_id), q) for e, q in zip(events, before))

    run(small(), events_dir, backgrounds_dir, tmp_path / "released")
    released = []
    monkeypatch.setattr(SourceBank, "release", lambda self: released.append(1))
    partitions.load_context.cache_clear()
    p = small()
    run(p, events_dir, backgrounds_dir, tmp_path / "kept")  # every page stays mapped
    counts = p.mix.mixtures
    parts = sum(-(-n // p.mix.partition_size) for n in (counts.train, counts.valid, counts.test))
    assert len(released) == parts
    assert tree_digest(tmp_path / "kept") == tree_digest(tmp_path / "released")


def test_the_spec_is_resolved_once_per_run_and_travels_to_workers(sources, tmp_path: Path, monkeypatch) -> None:
    """The params check resolves the spec; the stage takes it from the cache; each partition carries it
    (pickled, as a worker receives it) into the worker's context, which resolves nothing."""
    import pickle

    from pipeline.config import mix_spec
    from pipeline.config.mix_spec import MixSpec
    from pipeline.mix import partitions

    builds = []
    build_spec = mix_spec.build_spec
    monkeypatch.setattr(mix_spec, "build_spec", lambda *a: builds.append(a) or build_spec(*a))
    seen = []
    render_partition = partitions.render_partition

    def as_a_worker(part):
        received = pickle.loads(pickle.dumps(part))
        ctx = partitions.load_context(received.run)
        seen.append((received.run.spec, ctx.spec))
        return render_partition(received)

    monkeypatch.setattr(partitions, "render_partition", as_a_worker)
    events_dir, backgrounds_dir = sources
    p = load_params(
        ROOT / "params.yaml",
        {
            "compute": {"workers": 1},
            "mix": {
                "spec": {"snr_db": ["uniform", 12.0, 19.25]},
                "mixtures": {"train": 4, "valid": 2, "test": 2},
                "partition_size": 2,
                "export": {"timelines": 0},
            },
        },
    )
    run(p, events_dir, backgrounds_dir, tmp_path / "mix")
    assert len(builds) == 1, "resolved more than once"
    assert len(seen) == 4
    spec = mix_spec.resolve_spec(p.mix.preset, p.mix.spec, sample_rate_hz=p.sample_rate_hz)
    for carried, in_context in seen:
        assert isinstance(carried, MixSpec) and carried == spec and in_context == carried
    assert len(builds) == 1


def test_killed_run_resumes_without_redoing_partitions(sources, tmp_path: Path) -> None:
    events_dir, backgrounds_dir = sources
    params_file = tmp_path / "params.yaml"
    params_file.write_text((ROOT / "params.yaml").read_text())
    sets = [
        "compute.workers=1",
        "mix.mixtures.train=80",
        "mix.mixtures.valid=6",
        "mix.mixtures.test=6",
        "mix.partition_size=4",
        "mix.export.timelines=1",
        f"clip.out_dir={events_dir}",
        f"ambience.out_dir={backgrounds_dir}",
    ]
    out = tmp_path / "killed"
    cmd = [
        sys.executable,
        "-m",
        "sedsynth",
        "mix",
        "--params",
        str(params_file),
        *[a for s in sets + [f"mix.out_dir={out}"] for a in ("--set", s)],
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    parts = tmp_path / ".killed.partial" / "parts"
    deadline = time.time() + 120
    while time.time() < deadline and len(list(parts.glob("*.done.json"))) < 3:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = len(list(parts.glob("*.done.json")))
    assert 3 <= done_before < 23, "killed part-way through"
    assert not out.exists(), "nothing half-finished in place"

    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    resumed = [line for line in again.stderr.splitlines() if "resuming" in line]
    assert resumed and int(resumed[0].split("resuming: ")[1].split()[0]) >= done_before

    reference = tmp_path / "reference"
    p = load_params(
        params_file,
        {
            "compute": {"workers": 1},
            "mix": {"mixtures": {"train": 80, "valid": 6, "test": 6}, "partition_size": 4, "export": {"timelines": 1}},
        },
    )
    run(p, events_dir, backgrounds_dir, reference)
    assert tree_digest(out) == tree_digest(reference)


@pytest.fixture(scope="module")
def jams_run(sources, tmp_path_factory) -> Path:
    """A small run with JAMS export (shared by the JAMS tests)."""
    pytest.importorskip("jams")
    out = tmp_path_factory.mktemp("mix-jams") / "mix"
    p = small()
    run(replace(p, mix=replace(p.mix, export=replace(p.mix.export, jams=True))), *sources, out)
    return out


def test_jams_export_validates(jams_run: Path) -> None:
    import jams

    out = jams_run
    mixtures, occurrences, _ = tables(out)
    m = mixtures[0]
    jam = jams.load(str((out / m.audio_path).with_suffix(".jams")))
    ann = jam.annotations[0]
    assert ann.namespace == "scaper"
    fg = [obs for obs in ann.data if obs.value["role"] == "foreground"]
    mine = sorted((o for o in occurrences if o.mixture_id == m.mixture_id), key=lambda o: (o.onset_s, o.occurrence_index))
    assert [(round(x.time, 9), x.value["label"]) for x in fg] == [(round(o.onset_s, 9), o.label) for o in mine]
    assert all(Path(x.value["source_file"]).exists() for x in ann.data)


SCAPER_PYTHON = ROOT / ".venv-scaper" / "bin" / "python"


@pytest.mark.skipif(not SCAPER_PYTHON.exists(), reason="needs Scaper 1.6.5 in .venv-scaper (docs/benchmarks.md, Mixing)")
def test_scaper_rerenders_exported_jams(jams_run: Path, tmp_path: Path) -> None:
    """Scaper re-renders every JAMS file of the run into the same events and, up to its
    full-scale normalisation (a constant gain), the same audio."""
    out = jams_run
    mixtures, _, _ = tables(out)
    script = (
        "import sys, warnings, scaper, jams, numpy as np, soundfile as sf\n"
        "warnings.filterwarnings('ignore')\n"
        "tmp = sys.argv[1]\n"
        "for flac in sys.argv[2:]:\n"
        "    path = flac[:-len('.flac')] + '.jams'\n"
        "    scaper.generate_from_jams(path, tmp + '/re.wav', jams_outfile=tmp + '/re.jams')\n"
        "    a, b = jams.load(path).annotations[0].data, jams.load(tmp + '/re.jams').annotations[0].data\n"
        "    assert [(x.time, x.duration, x.value['label']) for x in a] == [(x.time, x.duration, x.value['label']) for x in b], path\n"
        "    x, _ = sf.read(tmp + '/re.wav'); y, _ = sf.read(flac)\n"
        "    g = np.dot(x, y) / np.dot(x, x)\n"
        "    print(flac, 20 * np.log10(np.linalg.norm(g * x - y) / np.linalg.norm(y)))\n"
    )
    done = subprocess.run(
        [str(SCAPER_PYTHON), "-c", script, str(tmp_path), *[str(out / m.audio_path) for m in mixtures]],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    residuals = {Path(line.split()[0]).stem: float(line.split()[1]) for line in done.stdout.strip().splitlines()}
    assert len(residuals) == len(mixtures)
    worst = max(residuals, key=residuals.get)
    assert residuals[worst] < -60.0, f"residual after the constant gain: {residuals[worst]:.1f} dB for {worst}"


def test_bad_input_fails_clearly(sources, tmp_path: Path) -> None:
    events_dir, backgrounds_dir = sources
    with pytest.raises(FileNotFoundError, match="sedsynth clip"):
        run(small(), tmp_path / "nothing", backgrounds_dir, tmp_path / "out")
    with pytest.raises(MixError, match="no background"):
        run(
            replace(
                small(),
                mix=replace(
                    small().mix, allowed_licenses=("CC0",), holdout=replace(small().mix.holdout, train=0.0, valid=0.5, test=0.5)
                ),
            ),
            events_dir,
            backgrounds_dir,
            tmp_path / "out",
        )
    with pytest.raises(MixError, match="distinct clips"):
        run(small(spec={"events_per_mixture": ["const", 400]}), events_dir, backgrounds_dir, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(ParamsError, match="snr_db"):
        load_params(ROOT / "params.yaml", {"mix": {"spec": {"snr_db": ["uniform", 30, 6]}}})
    with pytest.raises(ParamsError, match="did you mean 'max_polyphony'"):
        load_params(ROOT / "params.yaml", {"mix": {"spec": {"max_polyphone": 3}}})


def test_partitions_write_their_exports_and_the_joined_metadata_equals_the_whole_runs(
    sources, tmp_path: Path, monkeypatch
) -> None:
    """Each partition leaves its DCASE rows and txt files behind before it is marked done; the
    main process only joins them, into the same bytes as writing the metadata from every record."""
    from pipeline.mix import exports, partitions
    from pipeline.schema import LabelSegment

    render_partition = partitions.render_partition
    checked = []

    def and_check(part):
        result = render_partition(part)
        folder = Path(part.run.stage_dir)
        assert (folder / "parts" / f"{part.key}.events.tsv").exists() and (
            folder / "parts" / f"{part.key}.durations.tsv"
        ).exists()
        assert all(
            (folder / f"audio/{part.split}/{part.split}_{i:07d}.txt").exists() for i in range(part.start, part.start + part.count)
        )
        checked.append(part.key)
        return result

    monkeypatch.setattr(partitions, "render_partition", and_check)
    out = tmp_path / "mix"
    run(small(), *sources, out)
    assert len(checked) == 5  # 3 train, 1 valid, 1 test
    mixtures, _, _ = tables(out)
    segments = from_table(pq.read_table(out / "segments.parquet"), LabelSegment)
    exports.write_dcase_metadata(tmp_path / "whole", mixtures, exports.by_mixture(segments))
    for split in ("train", "valid", "test"):
        for name in ("events.tsv", "durations.tsv"):
            assert (out / "metadata" / split / name).read_bytes() == (tmp_path / "whole" / "metadata" / split / name).read_bytes()


def test_the_timelines_picture_draws_one_collection_per_lane_and_kind(sources, tmp_path: Path, monkeypatch) -> None:
    from pipeline import figures
    from pipeline.mix import exports

    drawn = []
    monkeypatch.setattr(figures, "save_png", lambda fig, path, dpi: drawn.append(fig))
    out = tmp_path / "mix"
    run(small(), *sources, out)
    tables_ = {name: pq.read_table(out / name) for name in ("mixtures.parquet", "occurrences.parquet", "segments.parquet")}
    picks, occurrences_of, segments_of = exports.timeline_picks(tables_, 3)
    assert len(picks) == 3
    exports.plot_timelines(out, picks, occurrences_of, segments_of, tmp_path / "t.png")
    lanes_axes = drawn[-1].axes[1::2]
    for m, ax in zip(picks, lanes_axes):
        lanes = len({o.label for o in occurrences_of[m.mixture_id]})
        assert not ax.patches and lanes <= len(ax.collections) <= 2 * lanes


def test_the_picture_drawn_beside_the_partitions_equals_one_drawn_from_the_stored_run(sources, tmp_path: Path) -> None:
    """The stage draws timelines.png in its map from the pictured mixtures made again; drawn after
    the run from the stored tables and FLAC files it is the same PNG, and the picks are the ones
    known before the run."""
    from pipeline.mix import exports

    out = tmp_path / "mix"
    p = small(workers=2)
    run(p, *sources, out)
    tables_ = {name: pq.read_table(out / name) for name in ("mixtures.parquet", "occurrences.parquet", "segments.parquet")}
    picks, occurrences_of, segments_of = exports.timeline_picks(tables_, p.mix.export.timelines)
    assert [(m.split, m.index) for m in picks] == exports.timeline_mixtures(
        {"train": 24, "valid": 6, "test": 6}, p.mix.export.timelines
    )
    exports.plot_timelines(out, picks, occurrences_of, segments_of, tmp_path / "again.png")
    assert (tmp_path / "again.png").read_bytes() == (out / "timelines.png").read_bytes()


def test_the_main_process_reads_and_summarises_without_importing_pandas(sources, tmp_path: Path) -> None:
    """pq.read_table and Arrow's to_numpy import pandas (about 0.5 s): the manifests and the run's
    tables are read, and the summary made, without them."""
    events_dir, backgrounds_dir = sources
    out = tmp_path / "mix"
    run(small(), events_dir, backgrounds_dir, out)
    script = (
        "import sys\nfrom dataclasses import replace\nfrom pathlib import Path\n"
        "from tests.pipeline.stages.test_mix import small\nfrom pipeline.mix import exports\n"
        "from pipeline.mix.sources import read_parquet, read_sources\nfrom pipeline.config.mix_spec import resolve_spec\n"
        f"out, stage = Path({str(out)!r}), Path({str(tmp_path / 'again')!r})\n"
        f"events, backgrounds = read_sources(Path({str(events_dir)!r}), Path({str(backgrounds_dir)!r}))\n"
        "tables = {name: read_parquet(out / name) for name in ('mixtures.parquet', 'occurrences.parquet', 'segments.parquet')}\n"
        "p = small().mix\np = replace(p, export=replace(p.export, timelines=0))\n"
        "summary = exports.write_all(stage, tables, {}, p, resolve_spec(p.preset, p.spec, sample_rate_hz=16000), events, backgrounds)\n"
        "print(summary['mixtures'], 'pandas' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "36 False"
