"""What the mix stage promises about bad or awkward input: every mixture in the DCASE
metadata, JAMS times that Scaper's sample arithmetic maps back onto the recipe, no silent
upsampling, a licence filter that names itself, and refusals that state counts and reasons."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.config.mix_spec import resolve_spec
from pipeline.config.params import MixtureCounts, ParamsError
from pipeline.mix.sources import MixError, check_sample_rates
from pipeline.schema import EventClip, MixtureRecipe, from_table
from pipeline.stages.mix import report_dir, run
from tests.conftest import ROOT
from trainer.config import Params, load_params


def rejected_report_path(out: Path) -> Path:
    """Where a refused mix run leaves its skip report: its report folder, not beside the output."""
    return report_dir(out) / "skipped.csv"


def small(params: Params, train: int = 8, valid: int = 4, test: int = 4, **mix) -> Params:
    m = replace(
        params.mix,
        mixtures=MixtureCounts(train=train, valid=valid, test=test),
        partition_size=8,
        export=replace(params.mix.export, timelines=0),
    )
    return replace(params, mix=replace(m, **mix))


# --- item 3: every mixture is in events.tsv, and sed_scores_eval reads both files ---------------


def test_mixtures_without_events_are_in_the_dcase_metadata(mixed, tmp_path: Path) -> None:
    from sed_scores_eval import intersection_based, io
    from sed_scores_eval.base_modules.scores import create_score_dataframe

    from trainer.evaluation.readers import read_desed

    params, _, events_dir, backgrounds_dir = mixed
    out = tmp_path / "mix"
    run(small(params, spec={"events_per_mixture": ["choose", [0, 1]]}, test=12), events_dir, backgrounds_dir, out)
    for split in ("train", "valid", "test"):
        folder = out / "metadata" / split
        truth = io.read_ground_truth_events(folder / "events.tsv")
        durations = io.read_audio_durations(folder / "durations.tsv")
        assert set(truth) == set(durations), split
        ids = {Path(p).stem for p in (out / "audio" / split).glob("*.flac")}
        assert set(truth) == ids, split
    assert any(not events for events in truth.values()), "the spec draws mixtures without events"
    assert any(events for events in truth.values())

    # PSDS over the ids of durations.tsv (what raised "ground_truth audio ids do not match")
    classes = sorted({label for events in truth.values() for _, _, label in events})
    rng = np.random.default_rng(0)
    timestamps = np.arange(0.0, 10.0 + 1e-9, 0.5)
    scores = {i: create_score_dataframe(rng.random((len(timestamps) - 1, len(classes))), timestamps, classes) for i in durations}
    psds, *_ = intersection_based.psds(
        scores,
        str(out / "metadata" / "test" / "events.tsv"),
        durations,
        dtc_threshold=0.7,
        gtc_threshold=0.7,
        alpha_ct=0.0,
        alpha_st=1.0,
        max_efpr=100.0,
    )
    assert 0.0 <= psds <= 1.0

    # the project's own DESED-format reader takes the empty rows as "no events"
    sed = read_desed(
        audio_dir=out / "audio" / "test",
        events_tsv=out / "metadata" / "test" / "events.tsv",
        durations_tsv=out / "metadata" / "test" / "durations.tsv",
    )
    assert set(sed.ground_truth) == set(durations) and any(not events for events in sed.ground_truth.values())


# --- item 4: JAMS times survive Scaper's int(sr * t) --------------------------------------------


def test_scaper_seconds_round_trip_every_sample_index() -> None:
    from pipeline.mix.jams_export import scaper_seconds, scaper_span

    for sr in (16000, 22050, 44100, 48000):
        n = np.arange(0, 12 * sr, 7)
        naive = np.array([int(sr * (k / sr)) for k in n[:5000]])
        assert (naive != n[:5000]).any(), "n / sr alone is truncated below n for some n (what this guards against)"
        assert all(int(sr * scaper_seconds(int(k), sr)) == k for k in n[::13])
    for start, length, sr in ((1019, 16000, 16000), (159_000, 11, 16000), (0, 1, 44100), (44099, 440999, 44100)):
        t, d = scaper_span(start, length, sr)
        assert (int(sr * t), int(sr * d), int((t + d) * sr)) == (start, length, start + length)


def test_every_jams_value_maps_to_the_recipes_sample(mixed, tmp_path: Path) -> None:
    """For each exported JAMS: int(sr * t) of every time and length is the recipe's sample index,
    and Scaper's source end int((source_time + event_duration) * sr) is the span's end."""
    jams = pytest.importorskip("jams")
    params, _, events_dir, backgrounds_dir = mixed
    out = tmp_path / "mix"
    p = small(params, train=24, valid=6, test=6)
    run(replace(p, mix=replace(p.mix, export=replace(p.mix.export, jams=True))), events_dir, backgrounds_dir, out)
    mixtures = from_table(pq.read_table(out / "mixtures.parquet"), MixtureRecipe)
    occurrences = pq.read_table(out / "occurrences.parquet").to_pylist()
    checked = 0
    for m in mixtures:
        sr = m.sample_rate_hz

        def at(t: float) -> int:
            return int(round(t * sr))

        ann = jams.load(str((out / m.audio_path).with_suffix(".jams"))).annotations[0]
        assert int(sr * ann.sandbox.scaper["duration"]) == m.num_samples
        data = list(ann.data)
        bg = [x for x in data if x.value["role"] == "background"]
        fg = [x for x in data if x.value["role"] == "foreground"]
        mine = sorted(
            (o for o in occurrences if o["mixture_id"] == m.mixture_id), key=lambda o: (o["onset_s"], o["occurrence_index"])
        )
        assert len(bg) == 1 and len(fg) == len(mine)
        expected = [(at(m.background_offset_s), 0, m.num_samples)]
        expected += [(at(o["source_in_s"]), at(o["onset_s"]), at(o["offset_s"]) - at(o["onset_s"])) for o in mine]
        for x, (start, onset, length) in zip(bg + fg, expected):
            v = x.value
            got = (
                int(v["source_time"] * sr),
                int(sr * v["event_time"]),
                int(sr * v["event_duration"]),
                int((v["source_time"] + v["event_duration"]) * sr),
            )
            assert got == (start, onset, length, start + length), (m.mixture_id, v["label"])
            assert (x.time, x.duration) == (v["event_time"], v["event_duration"])
            checked += 1
        if mine:
            assert (
                int(ann.sandbox.scaper["fade_in_len"] * sr) == at(mine[0]["fade_in_s"])
                or ann.sandbox.scaper["fade_in_len"] == 0.0
            )
    assert checked > len(mixtures) * 2


# --- item 11: no silent upsampling ----------------------------------------------------------------


def test_a_rate_above_the_sources_rate_stops_before_mixing(mixed, tmp_path: Path) -> None:
    params, _, events_dir, backgrounds_dir = mixed
    out = tmp_path / "mix"
    with pytest.raises(MixError) as caught:
        run(small(replace(params, sample_rate_hz=48000), preset="flam"), events_dir, backgrounds_dir, out)
    text = str(caught.value)
    assert "sample_rate_hz is 48000 Hz" in text and f"{events_dir} holds 16000 Hz clips" in text
    assert "sedsynth clip --set sample_rate_hz=48000" in text and "sample_rate_hz: 16000 in params.yaml" in text
    assert not out.exists()


def test_sources_at_or_above_the_mixture_rate_are_accepted(tmp_path: Path) -> None:
    """Downsampling loses nothing the mixtures can hold: 48 kHz sources make 16 kHz mixtures."""
    at = [SimpleNamespace(sample_rate_hz=48000)]
    check_sample_rates(resolve_spec("finelap", sample_rate_hz=16000), at, at, tmp_path / "events", tmp_path / "backgrounds")
    check_sample_rates(resolve_spec("flam", sample_rate_hz=48000), at, at, tmp_path / "events", tmp_path / "backgrounds")
    low = [SimpleNamespace(sample_rate_hz=16000)]
    with pytest.raises(MixError, match="backgrounds holds 16000 Hz background segments"):
        check_sample_rates(resolve_spec("flam", sample_rate_hz=48000), at, low, tmp_path / "events", tmp_path / "backgrounds")


def test_the_top_level_rate_is_the_mix_specs_and_the_spec_has_no_rate_knob() -> None:
    """One rate drives the data stages: presets take sample_rate_hz, and mix.spec.sample_rate_hz points there."""
    p = load_params(ROOT / "params.yaml", {"sample_rate_hz": 22050, "mix": {"preset": "finelap-code"}})
    assert resolve_spec(p.mix.preset, p.mix.spec, sample_rate_hz=p.sample_rate_hz).sample_rate_hz == 22050
    with pytest.raises(ParamsError, match=r"'sample_rate_hz' is not a knob.*set that one instead") as caught:
        load_params(ROOT / "params.yaml", {"mix": {"spec": {"sample_rate_hz": ["const", 48000]}}})
    assert "top-level sample_rate_hz of params.yaml" in str(caught.value)


# --- item 21: the licence filter names itself, counts what it dropped, reports each source ------


def test_params_reject_a_misspelt_licence() -> None:
    with pytest.raises(
        ParamsError, match=r"'mix\.allowed_licenses' holds 'cc-by', not a licence name; did you mean CC-BY\?"
    ) as caught:
        load_params(ROOT / "params.yaml", {"mix": {"allowed_licenses": ["CC0", "cc-by"]}})
    assert "CC0, CC-BY, CC-Sampling+, CC-BY-NC, unknown" in str(caught.value)
    with pytest.raises(ParamsError, match="is empty"):
        load_params(ROOT / "params.yaml", {"mix": {"allowed_licenses": []}})
    assert load_params(ROOT / "params.yaml", {"mix": {"allowed_licenses": ["CC0", "unknown"]}}).mix.allowed_licenses == (
        "CC0",
        "unknown",
    )


def _without_licences(backgrounds_dir: Path, folder: Path) -> Path:
    """The backgrounds as a library read without a metadata CSV gives them: no licence."""
    folder.mkdir()
    table = pq.read_table(backgrounds_dir / "manifest.parquet")
    table = table.set_column(table.schema.get_field_index("license"), "license", [[""] * table.num_rows])
    pq.write_table(table, folder / "manifest.parquet")
    (folder / "audio").symlink_to(backgrounds_dir / "audio")
    return folder


def test_backgrounds_without_licence_stop_the_stage_with_counts_and_a_report(mixed, tmp_path: Path) -> None:
    params, _, events_dir, backgrounds_dir = mixed
    unlicensed = _without_licences(backgrounds_dir, tmp_path / "backgrounds")
    n = pq.read_metadata(unlicensed / "manifest.parquet").num_rows
    out = tmp_path / "mix"
    with pytest.raises(MixError) as caught:
        run(small(params), events_dir, unlicensed, out)
    text = str(caught.value)
    assert "no background segments are left" in text
    assert (
        f"mix.allowed_licenses [CC0, CC-BY, CC-Sampling+, CC-BY-NC] dropped 0 event clips and {n} background segments (unknown {n})"
        in text
    )
    assert "add unknown to mix.allowed_licenses" in text and f"license-not-allowed {n}" in text
    report = rejected_report_path(out)
    assert str(report) in text and not out.exists()
    rows = list(csv.DictReader(report.open(newline="")))
    assert len(rows) == n and list(rows[0]) == ["item_id", "path", "reason", "detail"]
    assert all(
        r["reason"] == "license-not-allowed"
        and r["detail"].startswith("licence unknown (stated: none in the library's metadata)")
        for r in rows
    )

    # allowing unknown makes the mixtures, and the stale report goes
    summary = run(
        small(params, allowed_licenses=("CC0", "CC-BY", "CC-Sampling+", "CC-BY-NC", "unknown")), events_dir, unlicensed, out
    )
    assert summary["mixtures"] == 16 and not report.exists()
    assert json.loads((out / "licenses.json").read_text())["dataset_license"] == "unknown"


def test_partial_licence_drop_is_counted_per_kind_and_licence(mixed, tmp_path: Path, capsys) -> None:
    params, _, events_dir, backgrounds_dir = mixed
    out = tmp_path / "mix"
    summary = run(small(params, allowed_licenses=("CC0", "CC-BY", "CC-Sampling+")), events_dir, backgrounds_dir, out)
    clips = from_table(pq.read_table(events_dir / "manifest.parquet"), EventClip)
    nc = sum(c.license == "CC-BY-NC" for c in clips)
    dropped = summary["license_filter"]["dropped"]
    assert dropped["events"] == {"CC-BY-NC": nc} and nc > 0
    skipped = (out / "skipped.csv").read_text().splitlines()[1:]
    assert len(skipped) == nc + sum(dropped["backgrounds"].values()) == summary["skipped_by_reason"]["license-not-allowed"]
    assert f"dropped {nc} event clips (CC-BY-NC {nc})" in capsys.readouterr().err


# --- item 22: refusals state counts; zero mixtures is an error -------------------------------------


def test_too_few_clips_in_a_split_states_available_and_needed(mixed, tmp_path: Path) -> None:
    params, _, events_dir, backgrounds_dir = mixed
    clips = from_table(pq.read_table(events_dir / "manifest.parquet"), EventClip)
    have = sum(c.source_split == "eval" for c in clips)
    assert have > 0
    p = small(params, train=0, valid=0, test=2, event_split="fsd50k", spec={"events_per_mixture": ["const", have + 2]})
    with pytest.raises(MixError) as caught:
        run(p, events_dir, backgrounds_dir, tmp_path / "mix")
    text = str(caught.value)
    assert f"split 'test' has {have} event clips (the clips of FSD50K's 'eval' split" in text
    assert f"a mixture draws up to {have + 2} distinct clips" in text
    assert "survived" not in text


def test_zero_mixtures_is_refused(mixed, tmp_path: Path) -> None:
    params, _, events_dir, backgrounds_dir = mixed
    with pytest.raises(MixError, match="asks for 0 mixtures in every split"):
        run(small(params, train=0, valid=0, test=0), events_dir, backgrounds_dir, tmp_path / "mix")
    assert not (tmp_path / "mix").exists() and rejected_report_path(tmp_path / "mix").exists()


def test_cli_exits_non_zero_with_the_skip_reasons(mixed, tmp_path: Path) -> None:
    _, _, events_dir, backgrounds_dir = mixed
    out = tmp_path / "mix"
    sets = [
        "compute.workers=1",
        f"clip.out_dir={events_dir}",
        f"ambience.out_dir={backgrounds_dir}",
        f"mix.out_dir={out}",
        "mix.allowed_licenses=[CC-Sampling+]",
        "mix.export.timelines=0",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "sedsynth", "mix", *[a for s in sets for a in ("--set", s)]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        "sources skipped by reason: license-not-allowed" in done.stderr
        and "mix.allowed_licenses [CC-Sampling+] dropped" in done.stderr
    )
    assert not out.exists() and rejected_report_path(out).exists()


# --- an output folder that is an input --------------------------------------------------------


def test_mixing_into_the_event_clips_folder_is_refused_and_leaves_it_whole(mixed, tmp_path: Path) -> None:
    import shutil

    from pipeline.outputs import OutDirError
    from tests.conftest import tree_digest

    params, _, events_dir, backgrounds_dir = mixed
    events, backgrounds = tmp_path / "events", tmp_path / "backgrounds"
    shutil.copytree(events_dir, events)
    shutil.copytree(backgrounds_dir, backgrounds)
    before = tree_digest(events)
    with pytest.raises(OutDirError, match=rf"^mix.out_dir is {events}, which is also mix.events \({events}\); "):
        run(small(params), events, backgrounds, events)
    assert tree_digest(events) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backgrounds", "events"], "nothing written beside it"
