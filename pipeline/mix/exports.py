"""Files written beside the mix stage's tables: DCASE metadata, per-mixture annotations,
licences and a timeline picture.

Two steps, so that the work grows in the workers and not in the main process. Per partition
(in the worker that rendered it, from its records, :func:`write_partition_files`): the txt and
JAMS files of its mixtures and its rows of the DCASE files (two fragments in the staging
folder). Once per run (from the concatenated ``mixtures`` / ``occurrences`` / ``segments``
tables, read column-wise, :func:`write_all`): the DCASE files joined from the fragments, the
licences and the summary's counts. The picture (:func:`plot_timelines`) is drawn by the mix
stage as one more task beside its partitions. Output (all atomic):

- ``metadata/<split>/events.tsv``: ``filename onset offset event_label`` (DESED / DCASE
  task 4; relabeled, same-label segments merged; a mixture with no audible event has one row
  with empty onset, offset and label, so both files name every mixture, as
  ``sed_scores_eval`` requires), and ``durations.tsv``: ``filename duration``;
- ``audio/<split>/<id>.txt`` (``mix.export.txt``): Scaper's txt, ``onset offset label``
  tab-separated without a header, one row per placed occurrence (Scaper's meaning: where a
  clip was placed; the relabeled, audible segments are in ``events.tsv``);
- ``audio/<split>/<id>.jams`` (``mix.export.jams``): see :mod:`pipeline.mix.jams_export`;
- ``licenses.json``: the dataset licence (the most restrictive of its sources), mixtures
  and sources per licence; ``attribution.csv``: every source used, its author and licence;
- ``timelines.png``: spectrogram, placed occurrences and relabeled segments of a few mixtures.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow as pa

from pipeline.audio import int16_to_float
from pipeline.config.mix_spec import MixSpec
from pipeline.config.params import MixParams
from pipeline.licenses import license_name, most_restrictive
from pipeline.mix.augment import BROWNIAN, BROWNIAN_AUTHOR, BROWNIAN_LICENSE, BROWNIAN_SOURCE, is_brownian
from pipeline.mix.jams_export import write_jams
from pipeline.mix.layout import ATTRIBUTION, LICENSES, METADATA, MIXTURES, OCCURRENCES, SEGMENTS
from pipeline.mix.render import Sources
from pipeline.outputs import write_atomic
from pipeline.schema import SPLITS, BackgroundSegment, EventClip, EventOccurrence, LabelSegment, MixtureRecipe, from_table

Row = TypeVar("Row", EventOccurrence, LabelSegment)


def _tsv(rows: list[list], header: list[str] | None) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, delimiter="\t", lineterminator="\n")
    if header:
        w.writerow(header)
    w.writerows(rows)
    return buf.getvalue().encode("utf-8")


def _seconds(x: float) -> str:
    return f"{x:.3f}"


def by_mixture(rows: Iterable[Row]) -> dict[str, list[Row]]:
    """Occurrences or label segments grouped by ``mixture_id``, each group in the given order."""
    out: dict[str, list[Row]] = {}
    for row in rows:
        out.setdefault(row.mixture_id, []).append(row)
    return out


DCASE_FILES = {"events.tsv": ["filename", "onset", "offset", "event_label"], "durations.tsv": ["filename", "duration"]}
LANE_LABEL_CHARS = 48  # timelines.png cuts a longer label to this many characters (FSD50K's longest name has 37), so the lanes keep most of the width


def dcase_rows(recipes: list[MixtureRecipe], segments_of: dict[str, list[LabelSegment]]) -> dict[str, bytes]:
    """The rows (no header) that ``recipes`` add to ``events.tsv`` and ``durations.tsv``, keyed by file name."""
    events, durations = [], []
    for m in recipes:
        name = Path(m.audio_path).name
        durations.append([name, _seconds(m.duration_s)])
        mine = sorted(segments_of.get(m.mixture_id, []), key=lambda s: (s.onset_s, s.label))
        events.extend([name, _seconds(s.onset_s), _seconds(s.offset_s), s.label] for s in mine)
        if not mine:  # DCASE's way of listing a clip without events: read as no events, not as a missing clip
            events.append([name, "", "", ""])
    return {"events.tsv": _tsv(events, None), "durations.tsv": _tsv(durations, None)}


def write_dcase_metadata(stage: Path, recipes: list[MixtureRecipe], segments_of: dict[str, list[LabelSegment]]) -> None:
    """``metadata/<split>/{events,durations}.tsv`` of all ``recipes`` at once."""
    for split in SPLITS:
        rows = dcase_rows([r for r in recipes if r.split == split], segments_of)
        for name, header in DCASE_FILES.items():
            write_atomic(stage / METADATA / split / name, _tsv([], header) + rows[name])


def join_dcase_metadata(stage: Path, fragments: dict[str, list[Path]]) -> None:
    """``metadata/<split>/{events,durations}.tsv``: the header, then each fragment's rows in the given order.

    ``fragments`` maps a split to the fragment prefixes of its partitions (``<prefix>.events.tsv``
    and ``<prefix>.durations.tsv``, from :func:`write_partition_files`); the bytes equal
    :func:`write_dcase_metadata` over the partitions' recipes in that order.
    """
    for split in SPLITS:
        for name, header in DCASE_FILES.items():
            pieces = [Path(f"{prefix}.{name}").read_bytes() for prefix in fragments.get(split, [])]
            write_atomic(stage / METADATA / split / name, b"".join([_tsv([], header), *pieces]))


def write_txt(stage: Path, recipes: list[MixtureRecipe], occurrences_of: dict[str, list[EventOccurrence]]) -> None:
    """``audio/<split>/<id>.txt`` beside each mixture: its placed occurrences, Scaper's txt layout."""
    for m in recipes:
        rows = [
            [repr(o.onset_s), repr(o.offset_s), o.label]
            for o in sorted(occurrences_of.get(m.mixture_id, []), key=lambda o: o.occurrence_index)
        ]
        write_atomic((stage / m.audio_path).with_suffix(".txt"), _tsv(rows, None))


@dataclass(frozen=True)
class PartitionExports:
    """Which exports :func:`write_partition_files` writes beside a partition's DCASE rows, and what its
    JAMS files are made from."""

    write_txt: bool  # audio/<split>/<id>.txt, Scaper's txt layout
    write_jams: bool  # audio/<split>/<id>.jams
    spec: MixSpec
    sources: Sources
    events_dir: Path  # where the event clips are once the run is done
    backgrounds_dir: Path  # where the background segments are once the run is done
    events: list[EventClip]
    backgrounds: list[BackgroundSegment]


def write_partition_files(
    stage: Path,
    prefix: Path,
    recipes: list[MixtureRecipe],
    occurrences: list[EventOccurrence],
    segments: list[LabelSegment],
    exports: PartitionExports,
) -> None:
    """One partition's exports, from its records: ``<prefix>.events.tsv`` and ``<prefix>.durations.tsv``
    (its DCASE rows, joined by :func:`join_dcase_metadata`) and, if ``exports`` asks, the txt and JAMS
    files of its mixtures."""
    occurrences_of = by_mixture(occurrences)
    if exports.write_txt:
        write_txt(stage, recipes, occurrences_of)
    if exports.write_jams:
        write_jams(
            stage,
            recipes,
            occurrences_of,
            spec=exports.spec,
            sources=exports.sources,
            events_dir=exports.events_dir,
            backgrounds_dir=exports.backgrounds_dir,
            events=exports.events,
            backgrounds=exports.backgrounds,
        )
    for name, rows in dcase_rows(recipes, by_mixture(segments)).items():
        write_atomic(Path(f"{prefix}.{name}"), rows)


def _column(table: pa.Table, name: str) -> list:
    return table.column(name).to_pylist()


def license_summary(
    mixtures: pa.Table, occurrences: pa.Table, events: list[EventClip], backgrounds: list[BackgroundSegment]
) -> tuple[dict, bytes]:
    """(licenses.json content, attribution.csv bytes) for the sources the mixtures use.

    ``mixtures`` and ``occurrences``: the stage's tables (columns ``license``, ``split``,
    ``background_id`` and ``clip_id`` are read). Generated Brownian-noise backgrounds (one
    per mixture) share one row, ``brownian-*``, counting the mixtures that use one.
    """
    ev = {e.clip_id: e for e in events}
    bg = {b.segment_id: b for b in backgrounds}
    used_events = Counter(_column(occurrences, "clip_id"))
    used_bgs = Counter(BROWNIAN + "*" if is_brownian(sid) else sid for sid in _column(mixtures, "background_id"))
    rows = []
    for cid in sorted(used_events):
        e = ev[cid]
        rows.append(
            ["event", cid, e.source_dataset, e.source_id, e.title, e.uploader, e.license, e.license_url, used_events[cid]]
        )
    for sid in sorted(used_bgs):
        if is_brownian(sid):
            rows.append(
                ["background", sid, "generated", BROWNIAN_SOURCE, "", BROWNIAN_AUTHOR, BROWNIAN_LICENSE, "", used_bgs[sid]]
            )
            continue
        b = bg[sid]
        url = b.license if "://" in b.license else ""
        rows.append(
            ["background", sid, "ambience", b.source_id, b.source_path, b.author, license_name(b.license), url, used_bgs[sid]]
        )
    header = ["role", "id", "dataset", "source_id", "title", "author", "license", "license_url", "occurrences"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    per_mixture = _column(mixtures, "license")
    splits = _column(mixtures, "split")
    by_split = {}
    for split in SPLITS:
        lic = [license for license, s in zip(per_mixture, splits) if s == split]
        by_split[split] = {
            "license": most_restrictive(lic) if lic else None,
            "mixtures_by_license": dict(sorted(Counter(lic).items())),
        }
    summary = {
        "dataset_license": most_restrictive(per_mixture) if per_mixture else None,
        "rule": "a mixture carries the most restrictive licence of its sources; the dataset that of its mixtures",
        "mixtures_by_license": dict(sorted(Counter(per_mixture).items())),
        "sources_by_license": dict(sorted(Counter(r[6] for r in rows).items())),
        "splits": by_split,
        "attribution": ATTRIBUTION,
    }
    return summary, buf.getvalue().encode("utf-8")


def plot_timelines(
    stage: Path | None,
    picks: list[MixtureRecipe],
    occurrences_of: dict[str, list[EventOccurrence]],
    segments_of: dict[str, list[LabelSegment]],
    path: Path,
    audio_of: dict[str, np.ndarray] | None = None,
) -> None:
    """Spectrogram over lanes per label: placed occurrences (light) and relabeled segments (dark), one pair of panels per mixture in ``picks``.

    Each mixture's int16 samples come from ``audio_of`` (mixture id -> samples), else from its
    FLAC file under ``stage``.
    """
    if not picks:  # before the imports: matplotlib alone takes most of a second to import
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import soundfile as sf

    from pipeline.figures import save_png

    # Margins in inches, set once (tight_layout would draw the whole figure an extra time to measure
    # them); the left one fits the longest lane label at 8 pt. Labels are cut (lane_label): a label
    # folder's name may be 255 bytes, and a margin wider than the figure is an error in matplotlib.
    width_in, height_in = 10.0, 3.2 * len(picks)
    longest = max((len(lane_label(o.label)) for m in picks for o in occurrences_of.get(m.mixture_id, [])), default=4)
    fig = plt.figure(figsize=(width_in, height_in))
    rows = fig.add_gridspec(
        len(picks),
        1,
        left=(0.25 + 0.062 * longest) / width_in,
        right=1 - 0.15 / width_in,
        top=1 - 0.3 / height_in,
        bottom=0.45 / height_in,
        hspace=0.32,
    )
    for k, m in enumerate(picks):
        panels = rows[k].subgridspec(2, 1, height_ratios=[2, 1.2], hspace=0.06)
        ax_s, ax_l = fig.add_subplot(panels[0]), fig.add_subplot(panels[1])
        if audio_of is not None:
            x, sr = int16_to_float(audio_of[m.mixture_id]), m.sample_rate_hz  # the FLAC's samples, as sf.read gives them
        else:
            x, sr = sf.read(stage / m.audio_path, dtype="float32")
        n_fft = 1 << int(np.ceil(np.log2(0.032 * sr)))
        hop = n_fft // 4
        frames = np.lib.stride_tricks.sliding_window_view(np.pad(x, (0, n_fft)), n_fft)[::hop] * np.hanning(n_fft)
        power = 10 * np.log10(np.abs(np.fft.rfft(frames, axis=1)) ** 2 + 1e-10)
        ax_s.imshow(
            power.T,
            origin="lower",
            aspect="auto",
            cmap="magma",
            vmin=power.max() - 80,
            vmax=power.max(),
            extent=(0, frames.shape[0] * hop / sr, 0, sr / 2000),
        )
        ax_s.set_xlim(0, m.duration_s)
        ax_s.set_ylabel("kHz")
        ax_s.set_title(f"{m.mixture_id}  ({m.num_occurrences} occurrences, background {m.background_id})", fontsize=9, loc="left")
        ax_s.set_xticks([])
        mine_o = occurrences_of.get(m.mixture_id, [])
        mine_s = segments_of.get(m.mixture_id, [])
        labels = sorted({o.label for o in mine_o})
        for i, label in enumerate(labels):  # one collection per lane and kind, not one artist per bar
            placed = [(o.onset_s, o.offset_s - o.onset_s) for o in mine_o if o.label == label]
            audible = [(seg.onset_s, seg.offset_s - seg.onset_s) for seg in mine_s if seg.label == label]
            ax_l.broken_barh(placed, (i - 0.4, 0.8), facecolors="#c9d7ea", edgecolors="#7f9cc4")
            if audible:
                ax_l.broken_barh(audible, (i - 0.2, 0.4), facecolors="#1f4e99", edgecolors="none")
        ax_l.set_yticks(range(len(labels)), [lane_label(label) for label in labels], fontsize=8)
        ax_l.set_xlim(0, m.duration_s)
        ax_l.set_ylim(-0.6, max(len(labels), 1) - 0.4)
        ax_l.invert_yaxis()
        ax_l.set_xlabel("time (s)  light: placed occurrence, dark: relabeled (audible) segment", fontsize=8)
    save_png(fig, path, dpi=90)


def lane_label(label: str) -> str:
    """``label`` as a lane of timelines.png names it: itself, or its first characters and an ellipsis
    when it is longer than :data:`LANE_LABEL_CHARS` (the tables and DCASE files keep it whole)."""
    return label if len(label) <= LANE_LABEL_CHARS else label[: LANE_LABEL_CHARS - 1] + "\u2026"


def timeline_rows(num_rows: int, count: int) -> np.ndarray:
    """Rows of the run's mixtures table (splits in order, each by index) that the picture shows: ``count`` spread evenly."""
    if num_rows == 0 or count <= 0:
        return np.zeros(0, np.int64)
    return np.unique(np.linspace(0, num_rows - 1, min(count, num_rows)).round()).astype(np.int64)


def timeline_mixtures(mixtures_by_split: dict[str, int], count: int) -> list[tuple[str, int]]:
    """``(split, index)`` of the mixtures :func:`timeline_picks` picks from a run of these counts, known before it is made."""
    order = [(split, index) for split in SPLITS for index in range(mixtures_by_split.get(split, 0))]
    return [order[r] for r in timeline_rows(len(order), count).tolist()]


def timeline_picks(tables: dict[str, pa.Table], count: int) -> tuple[list[MixtureRecipe], dict, dict]:
    """(recipes, occurrences_of, segments_of) of ``count`` mixtures spread evenly over the run, as records."""
    mixtures = tables[MIXTURES]
    rows = timeline_rows(mixtures.num_rows, count)
    if rows.shape[0] == 0:
        return [], {}, {}
    recipes = from_table(mixtures.take(pa.array(rows)), MixtureRecipe)
    ids = {m.mixture_id for m in recipes}

    def mine(name: str, record_type: type) -> dict:
        table = tables[name]
        kept = [i for i, mixture in enumerate(_column(table, "mixture_id")) if mixture in ids]
        return by_mixture(from_table(table.take(pa.array(kept, pa.int64())), record_type))

    return recipes, mine(OCCURRENCES, EventOccurrence), mine(SEGMENTS, LabelSegment)


def write_all(
    stage: Path,
    tables: dict[str, pa.Table],
    fragments: dict[str, list[Path]],
    p: MixParams,
    spec: MixSpec,
    events: list[EventClip],
    backgrounds: list[BackgroundSegment],
) -> dict:
    """The run's exports from its three tables (keyed by file name) and its partitions' DCASE
    fragments (split -> prefixes, in order); returns the summary's counts. The tables are read
    column-wise, never as records. The timelines picture is not among them: the mix stage draws
    it in a worker while the partitions render (:func:`plot_timelines`)."""
    mixtures, occurrences, segments = tables[MIXTURES], tables[OCCURRENCES], tables[SEGMENTS]
    join_dcase_metadata(stage, fragments)
    licenses, attribution = license_summary(mixtures, occurrences, events, backgrounds)
    write_atomic(stage / LICENSES, (json.dumps(licenses, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    write_atomic(stage / ATTRIBUTION, attribution)
    splits = Counter(_column(mixtures, "split"))
    return {
        "mixtures": mixtures.num_rows,
        "mixtures_by_split": {s: splits.get(s, 0) for s in SPLITS},
        "occurrences": occurrences.num_rows,
        "occurrences_by_role": dict(sorted(Counter(_column(occurrences, "role")).items())),
        "segments": segments.num_rows,
        "labels": len(set(_column(segments, "label"))),
        "level_mode": spec.level_mode,
        "snr_error_db": _snr_error(occurrences),
        "max_polyphony": max(_column(mixtures, "max_polyphony"), default=0),
        "licenses": licenses,
    }


def _float64(table: pa.Table, name: str) -> np.ndarray:
    return np.array(_column(table, name), dtype=np.float64)  # not to_numpy(): its first call imports pandas (0.4 s)


def _snr_error(occurrences: pa.Table) -> dict:
    """Realised minus drawn SNR over whole and repeated occurrences: median and largest magnitude in dB."""
    whole_rows = np.array([role != "piece" for role in _column(occurrences, "role")], dtype=bool)
    whole = (_float64(occurrences, "realised_snr_db") - _float64(occurrences, "snr_db"))[whole_rows]
    return {
        "median": float(np.median(whole)) if whole.size else 0.0,
        "max_abs": float(np.max(np.abs(whole))) if whole.size else 0.0,
        "note": "realised minus drawn SNR over whole and repeated occurrences (pieces share their event's draw)",
    }
