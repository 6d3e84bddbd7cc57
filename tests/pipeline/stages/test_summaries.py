"""Every data stage prints its summary on stderr and leaves stdout empty, so stdout stays free for a caller's data."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pipeline.config.params import MixtureCounts
from pipeline.stages import captions, clusters, mix, shards


def test_the_mix_captions_clusters_and_shards_summaries_go_to_stderr(mixed, tmp_path: Path, capsys) -> None:
    params, _, events_dir, backgrounds_dir = mixed
    p = replace(
        params,
        mix=replace(
            params.mix,
            mixtures=MixtureCounts(train=4, valid=2, test=2),
            partition_size=4,
            export=replace(params.mix.export, timelines=0),
        ),
    )
    runs = [
        ("mix", lambda: mix.run(p, events_dir, backgrounds_dir, tmp_path / "mix")),
        ("captions", lambda: captions.run(p, tmp_path / "mix", tmp_path / "captions")),
        ("clusters", lambda: clusters.run(p, tmp_path / "captions", tmp_path / "clusters")),
        ("shards", lambda: shards.run(p, tmp_path / "mix", tmp_path / "captions", tmp_path / "clusters", tmp_path / "dataset")),
    ]
    for name, run in runs:
        capsys.readouterr()
        run()
        out, err = capsys.readouterr()
        assert out == "", f"{name} wrote to stdout: {out!r}"
        assert err.startswith(f"{name}: ") or f"\n{name}: " in err, f"{name}'s summary is not on stderr: {err!r}"
