"""Files written beside the mix stage's tables: DCASE metadata, per-mixture annotations,
licences and a timeline picture.

Input: the staging folder and the concatenated ``mixtures`` / ``occurrences`` / ``segments``
tables. Output (all atomic):

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
from pathlib import Path
from typing import Iterable, TypeVar

import numpy as np
import pyarrow as pa

from pipeline.config.mix_spec import MixSpec
from pipeline.config.params import MixParams
from pipeline.licenses import license_name, most_restrictive
from pipeline.mix.jams_export import write_jams
from pipeline.mix.layout import ATTRIBUTION, LICENSES, METADATA, MIXTURES, OCCURRENCES, SEGMENTS, TIMELINES
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


def write_dcase_metadata(stage: Path, recipes: list[MixtureRecipe], segments_of: dict[str, list[LabelSegment]]) -> None:
    for split in SPLITS:
        events, durations = [], []
        for m in (r for r in recipes if r.split == split):
            name = Path(m.audio_path).name
            durations.append([name, _seconds(m.duration_s)])
            mine = sorted(segments_of.get(m.mixture_id, []), key=lambda s: (s.onset_s, s.label))
            events.extend([name, _seconds(s.onset_s), _seconds(s.offset_s), s.label] for s in mine)
            if not mine:  # DCASE's way of listing a clip without events: read as no events, not as a missing clip
                events.append([name, "", "", ""])
        write_atomic(stage / METADATA / split / "events.tsv", _tsv(events, ["filename", "onset", "offset", "event_label"]))
        write_atomic(stage / METADATA / split / "durations.tsv", _tsv(durations, ["filename", "duration"]))


def write_txt(stage: Path, recipes: list[MixtureRecipe], occurrences_of: dict[str, list[EventOccurrence]]) -> None:
    for m in recipes:
        rows = [[repr(o.onset_s), repr(o.offset_s), o.label]
                for o in sorted(occurrences_of.get(m.mixture_id, []), key=lambda o: o.occurrence_index)]
        write_atomic((stage / m.audio_path).with_suffix(".txt"), _tsv(rows, None))


def license_summary(recipes: list[MixtureRecipe], occurrences: list[EventOccurrence], events: list[EventClip],
                    backgrounds: list[BackgroundSegment]) -> tuple[dict, bytes]:
    """(licenses.json content, attribution.csv bytes) for the sources the mixtures use."""
    ev = {e.clip_id: e for e in events}
    bg = {b.segment_id: b for b in backgrounds}
    used_events = Counter(o.clip_id for o in occurrences)
    used_bgs = Counter(m.background_id for m in recipes)
    rows = []
    for cid in sorted(used_events):
        e = ev[cid]
        rows.append(["event", cid, e.source_dataset, e.source_id, e.title, e.uploader, e.license, e.license_url, used_events[cid]])
    for sid in sorted(used_bgs):
        b = bg[sid]
        url = b.license if "://" in b.license else ""
        rows.append(["background", sid, "ambience", b.source_id, b.source_path, b.author, license_name(b.license), url, used_bgs[sid]])
    header = ["role", "id", "dataset", "source_id", "title", "author", "license", "license_url", "occurrences"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    per_mixture = [m.license for m in recipes]
    by_split = {}
    for split in SPLITS:
        lic = [m.license for m in recipes if m.split == split]
        by_split[split] = {"license": most_restrictive(lic) if lic else None, "mixtures_by_license": dict(sorted(Counter(lic).items()))}
    summary = {
        "dataset_license": most_restrictive(per_mixture) if per_mixture else None,
        "rule": "a mixture carries the most restrictive licence of its sources; the dataset that of its mixtures",
        "mixtures_by_license": dict(sorted(Counter(per_mixture).items())),
        "sources_by_license": dict(sorted(Counter(r[6] for r in rows).items())),
        "splits": by_split,
        "attribution": ATTRIBUTION,
    }
    return summary, buf.getvalue().encode("utf-8")


def plot_timelines(stage: Path, recipes: list[MixtureRecipe], occurrences_of: dict[str, list[EventOccurrence]],
                   segments_of: dict[str, list[LabelSegment]], count: int, path: Path) -> None:
    """Spectrogram over lanes per label: placed occurrences (light) and relabeled segments (dark)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import soundfile as sf

    from pipeline.figures import save_png

    if not recipes or count <= 0:
        return
    picks = [recipes[int(i)] for i in np.unique(np.linspace(0, len(recipes) - 1, min(count, len(recipes))).round())]
    fig, axes = plt.subplots(2 * len(picks), 1, figsize=(10, 3.2 * len(picks)), gridspec_kw={"height_ratios": [2, 1.2] * len(picks)})
    for k, m in enumerate(picks):
        ax_s, ax_l = axes[2 * k], axes[2 * k + 1]
        x, sr = sf.read(stage / m.audio_path, dtype="float32")
        n_fft = 1 << int(np.ceil(np.log2(0.032 * sr)))
        hop = n_fft // 4
        frames = np.lib.stride_tricks.sliding_window_view(np.pad(x, (0, n_fft)), n_fft)[::hop] * np.hanning(n_fft)
        power = 10 * np.log10(np.abs(np.fft.rfft(frames, axis=1)) ** 2 + 1e-10)
        ax_s.imshow(power.T, origin="lower", aspect="auto", cmap="magma", vmin=power.max() - 80, vmax=power.max(),
                    extent=(0, frames.shape[0] * hop / sr, 0, sr / 2000))
        ax_s.set_xlim(0, m.duration_s)
        ax_s.set_ylabel("kHz")
        ax_s.set_title(f"{m.mixture_id}  ({m.num_occurrences} occurrences, background {m.background_id})", fontsize=9, loc="left")
        ax_s.set_xticks([])
        mine_o = occurrences_of.get(m.mixture_id, [])
        mine_s = segments_of.get(m.mixture_id, [])
        labels = sorted({o.label for o in mine_o})
        lane = {label: i for i, label in enumerate(labels)}
        for o in mine_o:
            ax_l.barh(lane[o.label], o.offset_s - o.onset_s, left=o.onset_s, height=0.8, color="#c9d7ea", edgecolor="#7f9cc4")
        for seg in mine_s:
            ax_l.barh(lane[seg.label], seg.offset_s - seg.onset_s, left=seg.onset_s, height=0.4, color="#1f4e99")
        ax_l.set_yticks(range(len(labels)), labels, fontsize=8)
        ax_l.set_xlim(0, m.duration_s)
        ax_l.set_ylim(-0.6, max(len(labels), 1) - 0.4)
        ax_l.invert_yaxis()
        ax_l.set_xlabel("time (s)  light: placed occurrence, dark: relabeled (audible) segment", fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=90)


def write_all(stage: Path, tables: dict[str, pa.Table], p: MixParams, spec: MixSpec, sources: Sources, events_dir: Path,
              backgrounds_dir: Path, events: list[EventClip], backgrounds: list[BackgroundSegment]) -> dict:
    """Every export of a finished run from its three tables (keyed by file name); returns the summary's counts."""
    recipes = from_table(tables[MIXTURES], MixtureRecipe)
    occurrences = from_table(tables[OCCURRENCES], EventOccurrence)
    segments = from_table(tables[SEGMENTS], LabelSegment)
    occurrences_of, segments_of = by_mixture(occurrences), by_mixture(segments)
    write_dcase_metadata(stage, recipes, segments_of)
    if p.export.txt:
        write_txt(stage, recipes, occurrences_of)
    if p.export.jams:
        write_jams(stage, recipes, occurrences_of, spec, sources, events_dir, backgrounds_dir, events, backgrounds)
    licenses, attribution = license_summary(recipes, occurrences, events, backgrounds)
    write_atomic(stage / LICENSES, (json.dumps(licenses, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    write_atomic(stage / ATTRIBUTION, attribution)
    plot_timelines(stage, recipes, occurrences_of, segments_of, p.export.timelines, stage / TIMELINES)
    return {
        "mixtures": len(recipes),
        "mixtures_by_split": {s: sum(m.split == s for m in recipes) for s in SPLITS},
        "occurrences": len(occurrences),
        "occurrences_by_role": dict(sorted(Counter(o.role for o in occurrences).items())),
        "segments": len(segments),
        "labels": len({seg.label for seg in segments}),
        "level_mode": spec.level_mode,
        "snr_error_db": _snr_error(occurrences),
        "max_polyphony": max((m.max_polyphony for m in recipes), default=0),
        "licenses": licenses,
    }


def _snr_error(occurrences: list[EventOccurrence]) -> dict:
    """Realised minus drawn SNR over whole and repeated occurrences: median and largest magnitude in dB."""
    whole = np.array([o.realised_snr_db - o.snr_db for o in occurrences if o.role != "piece"], dtype=np.float64)
    return {
        "median": float(np.median(whole)) if whole.size else 0.0,
        "max_abs": float(np.max(np.abs(whole))) if whole.size else 0.0,
        "note": "realised minus drawn SNR over whole and repeated occurrences (pieces share their event's draw)",
    }
