"""The dataset card: ``README.md`` with the YAML ``datasets`` reads, statistics and pictures.

Input: a shard folder being built (shards and ``index.json`` written), the params and the mix
stage's folder (licences, timelines picture). Output: ``README.md`` whose front matter holds
``configs`` (split -> ``data/<split>-*``), ``dataset_info`` (features, splits, sizes) and the
licence; its body holds how to load the data, the fields, statistics (events per mixture,
phrases, clusters, durations, SNRs), the licence summary and attribution; and
``images/statistics.png`` and ``images/timelines.png``.

:func:`write_imported` writes the card of an imported real corpus (``sedsynth import``) from the
folder alone (its own ``licenses.json``, ``attribution.csv`` and ``summary.json`` figures): the
same front matter, loading, statistics and files sections, with the corpus's own
introduction, fields, licence and citation, and no timelines picture.
"""

from __future__ import annotations

import csv
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import yaml

from pipeline.figures import pyplot, save_png
from pipeline.outputs import write_atomic
from pipeline.shards.layout import CARD, DATA, features

HF_LICENSES = {"CC0": "cc0-1.0", "CC-BY": "cc-by-4.0", "CC-BY-NC": "cc-by-nc-4.0", "CC-Sampling+": "other"}
ATTRIBUTION_LINES_SHOWN = 20
STATISTICS_BATCH_ROWS = 1024


def statistics(folder: Path, index: dict) -> dict:
    """Per-split figures from the shards' metadata columns (the audio is not read)."""
    out = {}
    for split in index["splits"]:
        seconds = 0
        figures = {
            "mixtures": 0,
            "labels_per_mixture": [],
            "phrases": Counter(),
            "clusters": Counter(),
            "segment_s": [],
            "snr_db": [],
        }
        # a batch of rows at a time, in order: the split's rows as Python objects at once grew with the dataset
        for f in index["files"]:
            if f["split"] != split:
                continue
            batches = pq.ParquetFile(folder / f["path"]).iter_batches(
                batch_size=STATISTICS_BATCH_ROWS, columns=["duration_s", "phrases"]
            )
            for r in (r for batch in batches for r in batch.to_pylist()):
                figures["mixtures"] += 1
                seconds += r["duration_s"]
                figures["labels_per_mixture"].append(len(r["phrases"]))
                for ph in r["phrases"]:
                    figures["phrases"][ph["phrase"]] += 1
                    figures["clusters"][ph["cluster_id"]] += 1
                    figures["segment_s"].extend(s["end_s"] - s["start_s"] for s in ph["segments"])
                    figures["snr_db"].extend(ph["snr_db"])
        out[split] = {
            "mixtures": figures["mixtures"],
            "hours": seconds / 3600.0,
            **{k: v for k, v in figures.items() if k != "mixtures"},
        }
    return out


def _bins(values) -> int:
    """30 bins, or 1 where the values (nearly) coincide: numpy cannot cut a float-rounding-wide range into 30."""
    return 30 if len(values) == 0 or float(np.max(values)) - float(np.min(values)) > 1e-6 else 1


def plot(stats: dict, cluster_names: dict[int, str], path: Path, unit: str = "mixture") -> None:
    """``images/statistics.png``: phrases per ``unit`` (row), segment durations and SNRs per split, and the top clusters."""
    fig, axes = pyplot().subplots(2, 2, figsize=(11, 7))
    ax = axes[0, 0]
    top = max((max(s["labels_per_mixture"], default=0) for s in stats.values()), default=0)
    for split, s in stats.items():
        ax.hist(s["labels_per_mixture"], bins=np.arange(-0.5, top + 1.5), alpha=0.6, label=split)
    ax.set(title=f"labelled phrases per {unit}", xlabel="phrases", ylabel=f"{unit}s")
    ax.legend()
    ax = axes[0, 1]
    for split, s in stats.items():
        ax.hist(s["segment_s"], bins=_bins(s["segment_s"]), alpha=0.6, label=split)
    ax.set(title="audible segment durations", xlabel="seconds", ylabel="segments")
    ax = axes[1, 0]
    for split, s in stats.items():
        ax.hist(s["snr_db"], bins=_bins(s["snr_db"]), alpha=0.6, label=split)
    ax.set(title="event SNR against the background", xlabel="dB", ylabel="events")
    ax = axes[1, 1]
    clusters = sum((s["clusters"] for s in stats.values()), Counter()).most_common(15)
    ax.barh([cluster_names.get(c, str(c))[:28] for c, _ in reversed(clusters)], [n for _, n in reversed(clusters)])
    ax.set(title="most frequent clusters (all splits)", xlabel="label phrases")
    fig.tight_layout()
    save_png(fig, path, dpi=80)


def front_matter(
    params,
    index: dict,
    licenses: dict,
    title: str | None = None,
    tags: tuple[str, ...] = ("sound-event-detection", "text-to-audio-grounding", "synthetic", "audio"),
) -> dict:
    """The card's YAML: title (default ``shards.card_title``), licence, tags, ``configs`` and ``dataset_info``."""
    info = {
        "features": features(index["sample_rate_hz"])._to_yaml_list(),
        "splits": [{"name": s, "num_bytes": v["num_bytes"], "num_examples": v["num_rows"]} for s, v in index["splits"].items()],
        "download_size": sum(f["num_bytes"] for f in index["files"]),
        "dataset_size": sum(f["num_bytes"] for f in index["files"]),
    }
    n = sum(v["num_rows"] for v in index["splits"].values())
    size = next(
        c
        for limit, c in ((1e3, "n<1K"), (1e4, "1K<n<10K"), (1e5, "10K<n<100K"), (1e6, "100K<n<1M"), (float("inf"), "n>1M"))
        if n < limit
    )
    return {
        "pretty_name": title or params.shards.card_title,
        "license": HF_LICENSES.get(licenses.get("dataset_license", ""), "other"),
        "task_categories": ["audio-classification", "audio-text-to-text"],
        "tags": list(tags),
        "size_categories": [size],
        "configs": [{"config_name": "default", "data_files": [{"split": s, "path": f"{DATA}/{s}-*"} for s in index["splits"]]}],
        "dataset_info": info,
    }


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


FIELDS_SECTION = """## Fields

| field | type | meaning |
|---|---|---|
| `id` | string | mixture id (`<split>_<index>`) |
| `audio` | Audio | FLAC bytes and file name |
| `audio_sha256` | string | sha256 (hex) of the FLAC bytes, taken when the row was written |
| `sample_rate_hz`, `duration_s` | int, float | |
| `caption` | string | a template filled with the phrases in temporal order |
| `phrases` | list | one per audible label: `phrase`, `label` (FSD50K name), `mid` (AudioSet), `cluster_id`, `segments` (`start_s`, `end_s`), `source_clip_ids` and `snr_db` (one per sampled event of the label) |
| `background_id` | string | background segment |
| `split` | string | |
| `license`, `licenses`, `attribution` | | most restrictive licence, all source licences, credit lines |
| `seed` | int | the generation seed |"""

SOURCES_SECTION = """## Sources and citation

Mixing follows FineLAP (Scaper-style soundscapes, 1-5 events at 12-20 dB SNR over ambience) with
FLAM's boundary smoothing. Event sources: FSD50K (Fonseca et al., 2022). Label hierarchy:
AudioSet ontology (Gemmeke et al., 2017); cluster inventory from AudioSet-Strong (Hershey et
al., 2021)."""


def _introduction(params, sample_rate_hz: int) -> str:
    return f"""# {params.shards.card_title}

Synthetic sound-event-detection soundscapes with frame-exact event boundaries and captions, for
training and evaluating open-vocabulary (language-queried) sound event detectors and audio-text
models. Each row is one {sample_rate_hz / 1000:g} kHz mixture of single-event clips (FSD50K-style
sources) over a background ambience, with the recipe's labels relabeled from the rendered
signals: a label's segments are where it is audible, not where its clip was placed.
Mixing preset `{params.mix.preset}`, seed {params.seed}."""


def _load_section(splits: list[str]) -> str:
    return f"""## Load

```python
from datasets import Audio, load_dataset
import io, soundfile as sf

ds = load_dataset("path/or/repo-id")                     # splits: {", ".join(splits)}
ds = ds.cast_column("audio", Audio(decode=False))       # keep the FLAC bytes
row = ds["{splits[0]}"][0]
samples, rate = sf.read(io.BytesIO(row["audio"]["bytes"]))
for p in row["phrases"]:
    print(p["phrase"], [(s["start_s"], s["end_s"]) for s in p["segments"]])
```

`clusters/phrases.parquet` is the phrase database (phrase, label, MID, cluster id, similarity,
method, count) and `clusters/clusters.parquet` the cluster inventory with the ancestor,
descendant and near-synonym relations a negative sampler should avoid."""


def _statistics_row(split: str, s: dict) -> list:
    """One split's row of the statistics table; ``-`` where the split has nothing to average."""
    lpm = np.asarray(s["labels_per_mixture"], float)
    seg = np.asarray(s["segment_s"], float)
    snr = np.asarray(s["snr_db"], float)
    return [
        split,
        s["mixtures"],
        f"{s['hours']:.2f}",
        f"{lpm.mean():.2f}" if lpm.size else "-",
        len(s["phrases"]),
        len(s["clusters"]),
        f"{np.median(seg):.2f}" if seg.size else "-",
        f"{snr.min():.1f} to {snr.max():.1f}" if snr.size else "-",
    ]


def _statistics_section(
    splits: list[str],
    stats: dict,
    cluster_names: dict[int, str],
    unit: str = "mixture",
    pictures: tuple[str, ...] = ("statistics", "timelines"),
) -> str:
    header = ["split", f"{unit}s", "hours", f"labels per {unit}", "distinct phrases", "clusters", "median segment s", "SNR dB"]
    clusters = sum((s["clusters"] for s in stats.values()), Counter()).most_common(10)
    phrases = sum((s["phrases"] for s in stats.values()), Counter()).most_common(10)
    images = "\n\n".join(f"![{name}](images/{name}.png)" for name in pictures)
    return f"""## Statistics

{_table(header, [_statistics_row(split, stats[split]) for split in splits])}

Most frequent clusters: {", ".join(f"{cluster_names.get(c, c)} ({n})" for c, n in clusters)}.

Most frequent phrases: {", ".join(f"{p} ({n})" for p, n in phrases)}.

{images}"""


def _licence_section(licenses: dict, attribution: list[list[str]]) -> str:
    by_license = licenses.get("mixtures_by_license", {})
    shown = attribution[:ATTRIBUTION_LINES_SHOWN]
    return f"""## Licence

Each mixture carries the most restrictive licence of its sources; the dataset as a whole is
**{licenses.get("dataset_license", "unknown")}**. Mixtures by licence: {", ".join(f"{k} {v}" for k, v in sorted(by_license.items()))}.
Every source is credited in `attribution.csv` ({len(attribution)} sources); the first {len(shown)}:

{_table(["role", "id", "title", "author", "licence"], [[a[0], a[1], a[4], a[5], a[6]] for a in shown])}"""


def _files_section(files: list[dict]) -> str:
    rows = [[f["path"], f["split"], f["num_rows"], f["num_bytes"], f["sha256"][:16] + "..."] for f in files]
    return f"""## Files

{_table(["file", "split", "rows", "bytes", "sha256"], rows)}

`index.json` lists every shard with its full sha256; `sedsynth validate <folder>` checks a copy
(every row's audio against its `audio_sha256`; `--decode` also decodes every cell in full and
checks its length)."""


def body(params, index: dict, stats: dict, licenses: dict, attribution: list[list[str]], cluster_names: dict[int, str]) -> str:
    """The card's Markdown below the front matter, one section after another.

    Sections: what the data is, how to load it, its fields, statistics, licence, files and sources.
    """
    splits = list(index["splits"])
    sections = [
        _introduction(params, index["sample_rate_hz"]),
        _load_section(splits),
        FIELDS_SECTION,
        _statistics_section(splits, stats, cluster_names),
        _licence_section(licenses, attribution),
        _files_section(index["files"]),
        SOURCES_SECTION,
    ]
    return "\n" + "\n\n".join(sections) + "\n"


def card_text(
    params, index: dict, stats: dict, licenses: dict, attribution: list[list[str]], cluster_names: dict[int, str]
) -> str:
    """``README.md``: the YAML front matter, then :func:`body`."""
    meta = yaml.safe_dump(front_matter(params, index, licenses), sort_keys=False, allow_unicode=True)
    return f"---\n{meta}---\n{body(params, index, stats, licenses, attribution, cluster_names)}"


def _statistics_picture(
    folder: Path, licence_dir: Path, index: dict, unit: str
) -> tuple[dict, list[list[str]], dict[int, str], dict]:
    """Draw ``images/statistics.png`` of the dataset folder being built; returns what its card needs:
    (licences, attribution rows, cluster names, statistics), the first two from ``licence_dir``."""
    licenses = json.loads((licence_dir / "licenses.json").read_text(encoding="utf-8"))
    with open(licence_dir / "attribution.csv", newline="", encoding="utf-8") as f:
        attribution = list(csv.reader(f))[1:]
    clusters = pq.read_table(folder / "clusters" / "clusters.parquet", columns=["cluster_id", "name"]).to_pylist()
    names = {c["cluster_id"]: c["name"] for c in clusters}
    stats = statistics(folder, index)
    (folder / "images").mkdir(exist_ok=True)
    plot(stats, names, folder / "images" / "statistics.png", unit=unit)
    return licenses, attribution, names, stats


def write(folder: Path, params, mix_dir: Path, index: dict) -> None:
    """Write ``README.md`` and ``images/`` into the dataset folder being built."""
    licenses, attribution, names, stats = _statistics_picture(folder, mix_dir, index, "mixture")
    if (mix_dir / "timelines.png").exists():
        shutil.copyfile(mix_dir / "timelines.png", folder / "images" / "timelines.png")
    write_atomic(folder / CARD, card_text(params, index, stats, licenses, attribution, names).encode("utf-8"))


# --------------------------------------------------------------------------- imported corpora

IMPORTED_FIELDS_SECTION = """## Fields

| field | type | meaning |
|---|---|---|
| `id` | string | the corpus's own clip id |
| `audio` | Audio | FLAC bytes (mono, resampled to the dataset rate) and file name |
| `audio_sha256` | string | sha256 (hex) of the FLAC bytes, taken when the row was written |
| `sample_rate_hz`, `duration_s` | int, float | |
| `caption` | string | the clip's own caption, else a template filled with its phrases in temporal order |
| `phrases` | list | one per labelled phrase: `phrase`, `label` (the corpus's label), `mid` (AudioSet, empty if none), `cluster_id`, `segments` (`start_s`, `end_s`, the annotated regions merged); `source_clip_ids` and `snr_db` are empty |
| `background_id` | string | empty (a real recording) |
| `split` | string | |
| `license`, `licenses`, `attribution` | | the clip's licence as the corpus states it (`unknown` if it does not), credit line |
| `seed` | int | the seed that drew the caption templates |"""

IMPORTED_SOURCES = {
    "audioset-strong": 'AudioSet-Strong: Hershey et al., "The benefit of temporally-strong labels in audio event classification", '
    "ICASSP 2021; labels CC BY 4.0 (Google), audio from YouTube (licence unknown). AudioSet ontology: "
    "Gemmeke et al., 2017.",
    "tacos": 'TACOS: Primus et al., "TACOS: Temporally-aligned audio captions for language-queried sound event detection", 2025; '
    "audio from Freesound (the clips' own licences).",
    "desed": 'DESED: Turpault et al., "Sound event detection in domestic environments with weakly labeled data and soundscape '
    'synthesis", DCASE 2019 workshop; real recordings from AudioSet (YouTube).',
    "dcase-tsv": "A DCASE-format strong-label corpus (filename, onset, offset, event_label).",
    "urban-sed": 'URBAN-SED: Salamon et al., "Scaper: A library for soundscape synthesis and augmentation", WASPAA 2017; '
    "sources from UrbanSound8K (Freesound).",
}


def _imported_introduction(title: str, kind: str, summary: dict, sample_rate_hz: int) -> str:
    missing = summary.get("missing_audio", 0)
    return f"""# {title}

Real recordings of the `{kind}` corpus with its strong (time-stamped) labels, in the same
Parquet layout as the synthetic mixtures, so one loader reads both. Each row is one clip,
mono at {sample_rate_hz / 1000:g} kHz, with its annotated regions as labelled phrases and their
segments. {summary["outputs"]} of {summary["inputs"]} listed clips are here; {missing} had no audio
({100 * summary.get("missing_audio_share", 0.0):.1f}%) and the others left out are listed with
their reasons in `skipped.csv`."""


def _imported_licence_section(licenses: dict, attribution: list[list[str]]) -> str:
    by_license = licenses.get("clips_by_license", {})
    shown = attribution[:ATTRIBUTION_LINES_SHOWN]
    return f"""## Licence

Each clip carries its source's licence as the corpus states it (`unknown` where it states
none); the dataset as a whole is **{licenses.get("dataset_license", "unknown")}**. Clips by licence:
{", ".join(f"{k} {v}" for k, v in sorted(by_license.items()))}. Every clip is credited in
`attribution.csv` ({len(attribution)} clips); the first {len(shown)}:

{_table(["id", "credit", "licence"], [[a[1], a[4], a[6]] for a in shown])}"""


def imported_card_text(
    params,
    index: dict,
    stats: dict,
    licenses: dict,
    attribution: list[list[str]],
    cluster_names: dict[int, str],
    kind: str,
    summary: dict,
) -> str:
    """``README.md`` of an imported corpus: front matter, then its sections."""
    title = params.imports.card_title.format(kind=kind)
    tags = ("sound-event-detection", "text-to-audio-grounding", "audio", kind)
    meta = yaml.safe_dump(front_matter(params, index, licenses, title, tags), sort_keys=False, allow_unicode=True)
    splits = list(index["splits"])
    sections = [
        _imported_introduction(title, kind, summary, index["sample_rate_hz"]),
        _load_section(splits),
        IMPORTED_FIELDS_SECTION,
        _statistics_section(splits, stats, cluster_names, unit="clip", pictures=("statistics",)),
        _imported_licence_section(licenses, attribution),
        _files_section(index["files"]),
        "## Sources and citation\n\n" + IMPORTED_SOURCES.get(kind, f"The `{kind}` corpus."),
    ]
    return f"---\n{meta}---\n" + "\n" + "\n\n".join(sections) + "\n"


def write_imported(folder: Path, params, index: dict, kind: str, summary: dict) -> None:
    """Write ``README.md`` and ``images/statistics.png`` of an imported corpus's folder being built.

    The folder already holds its shards, ``clusters/``, ``licenses.json`` and ``attribution.csv``.
    """
    licenses, attribution, names, stats = _statistics_picture(folder, folder, index, "clip")
    write_atomic(
        folder / CARD, imported_card_text(params, index, stats, licenses, attribution, names, kind, summary).encode("utf-8")
    )
