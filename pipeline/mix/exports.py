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
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.audio import write_atomic
from pipeline.licenses import license_name, most_restrictive
from pipeline.mix.instantiate import SPLITS
from pipeline.mix.render import Sources
from pipeline.mix.spec import MixSpec
from pipeline.params import MixParams
from pipeline.schema import BackgroundSegment, EventClip


def _tsv(rows: list[list], header: list[str] | None) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, delimiter="\t", lineterminator="\n")
    if header:
        w.writerow(header)
    w.writerows(rows)
    return buf.getvalue().encode("utf-8")


def _seconds(x: float) -> str:
    return f"{x:.3f}"


def by_mixture(table: pa.Table) -> dict[str, list[dict]]:
    """Rows of an occurrences or segments table grouped by ``mixture_id``."""
    out: dict[str, list[dict]] = {}
    for row in table.to_pylist():
        out.setdefault(row["mixture_id"], []).append(row)
    return out


def write_dcase_metadata(stage: Path, mixtures: pa.Table, segments: pa.Table) -> None:
    segments_of = by_mixture(segments)
    for split in SPLITS:
        events, durations = [], []
        for m in mixtures.filter(pa.compute.equal(mixtures["split"], split)).to_pylist():
            name = Path(m["audio_path"]).name
            durations.append([name, _seconds(m["duration_s"])])
            mine = sorted(segments_of.get(m["mixture_id"], []), key=lambda s: (s["onset_s"], s["label"]))
            events.extend([name, _seconds(s["onset_s"]), _seconds(s["offset_s"]), s["label"]] for s in mine)
            if not mine:  # DCASE's way of listing a clip without events: read as no events, not as a missing clip
                events.append([name, "", "", ""])
        write_atomic(stage / "metadata" / split / "events.tsv", _tsv(events, ["filename", "onset", "offset", "event_label"]))
        write_atomic(stage / "metadata" / split / "durations.tsv", _tsv(durations, ["filename", "duration"]))


def write_txt(stage: Path, mixtures: pa.Table, occurrences: pa.Table) -> None:
    occurrences_of = by_mixture(occurrences)
    for m in mixtures.to_pylist():
        rows = [[repr(o["onset_s"]), repr(o["offset_s"]), o["label"]]
                for o in sorted(occurrences_of.get(m["mixture_id"], []), key=lambda o: o["occurrence_index"])]
        write_atomic((stage / m["audio_path"]).with_suffix(".txt"), _tsv(rows, None))


def license_summary(mixtures: pa.Table, occurrences: pa.Table, events: list[EventClip], backgrounds: list[BackgroundSegment]) -> tuple[dict, bytes]:
    """(licenses.json content, attribution.csv bytes) for the sources the mixtures use."""
    ev = {e.clip_id: e for e in events}
    bg = {b.segment_id: b for b in backgrounds}
    used_events = Counter(occurrences["clip_id"].to_pylist())
    used_bgs = Counter(mixtures["background_id"].to_pylist())
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
    per_mixture = mixtures["license"].to_pylist()
    by_split = {}
    for split in SPLITS:
        lic = [l for l, s in zip(per_mixture, mixtures["split"].to_pylist()) if s == split]
        by_split[split] = {"license": most_restrictive(lic) if lic else None, "mixtures_by_license": dict(sorted(Counter(lic).items()))}
    summary = {
        "dataset_license": most_restrictive(per_mixture) if per_mixture else None,
        "rule": "a mixture carries the most restrictive licence of its sources; the dataset that of its mixtures",
        "mixtures_by_license": dict(sorted(Counter(per_mixture).items())),
        "sources_by_license": dict(sorted(Counter(r[6] for r in rows).items())),
        "splits": by_split,
        "attribution": "attribution.csv",
    }
    return summary, buf.getvalue().encode("utf-8")


def plot_timelines(stage: Path, mixtures: pa.Table, occurrences: pa.Table, segments: pa.Table, count: int, path: Path) -> None:
    """Spectrogram over lanes per label: placed occurrences (light) and relabeled segments (dark)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import soundfile as sf

    rows = mixtures.to_pylist()
    if not rows or count <= 0:
        return
    picks = [rows[int(i)] for i in np.unique(np.linspace(0, len(rows) - 1, min(count, len(rows))).round())]
    occurrences_of, segments_of = by_mixture(occurrences), by_mixture(segments)
    fig, axes = plt.subplots(2 * len(picks), 1, figsize=(10, 3.2 * len(picks)), gridspec_kw={"height_ratios": [2, 1.2] * len(picks)})
    for k, m in enumerate(picks):
        ax_s, ax_l = axes[2 * k], axes[2 * k + 1]
        x, sr = sf.read(stage / m["audio_path"], dtype="float32")
        n_fft = 1 << int(np.ceil(np.log2(0.032 * sr)))
        hop = n_fft // 4
        frames = np.lib.stride_tricks.sliding_window_view(np.pad(x, (0, n_fft)), n_fft)[::hop] * np.hanning(n_fft)
        power = 10 * np.log10(np.abs(np.fft.rfft(frames, axis=1)) ** 2 + 1e-10)
        ax_s.imshow(power.T, origin="lower", aspect="auto", cmap="magma", vmin=power.max() - 80, vmax=power.max(),
                    extent=(0, frames.shape[0] * hop / sr, 0, sr / 2000))
        ax_s.set_xlim(0, m["duration_s"])
        ax_s.set_ylabel("kHz")
        ax_s.set_title(f"{m['mixture_id']}  ({m['num_occurrences']} occurrences, background {m['background_id']})", fontsize=9, loc="left")
        ax_s.set_xticks([])
        mine_o = occurrences_of.get(m["mixture_id"], [])
        mine_s = segments_of.get(m["mixture_id"], [])
        labels = sorted({o["label"] for o in mine_o})
        lane = {label: i for i, label in enumerate(labels)}
        for o in mine_o:
            ax_l.barh(lane[o["label"]], o["offset_s"] - o["onset_s"], left=o["onset_s"], height=0.8, color="#c9d7ea", edgecolor="#7f9cc4")
        for s in mine_s:
            ax_l.barh(lane[s["label"]], s["offset_s"] - s["onset_s"], left=s["onset_s"], height=0.4, color="#1f4e99")
        ax_l.set_yticks(range(len(labels)), labels, fontsize=8)
        ax_l.set_xlim(0, m["duration_s"])
        ax_l.set_ylim(-0.6, max(len(labels), 1) - 0.4)
        ax_l.invert_yaxis()
        ax_l.set_xlabel("time (s)  light: placed occurrence, dark: relabeled (audible) segment", fontsize=8)
    fig.tight_layout()
    from pipeline.figures import save_png

    save_png(fig, path, dpi=90)


def write_all(stage: Path, tables: dict, p: MixParams, spec: MixSpec, sources: Sources, events_dir: Path, backgrounds_dir: Path,
              events: list[EventClip], backgrounds: list[BackgroundSegment]) -> dict:
    """Every export; returns the summary's counts."""
    import json

    mixtures, occurrences, segments = tables["mixtures.parquet"], tables["occurrences.parquet"], tables["segments.parquet"]
    write_dcase_metadata(stage, mixtures, segments)
    if p.export.txt:
        write_txt(stage, mixtures, occurrences)
    if p.export.jams:
        from pipeline.mix.jams_export import write_jams

        write_jams(stage, mixtures, occurrences, spec, sources, events_dir, backgrounds_dir, events, backgrounds)
    licenses, attribution = license_summary(mixtures, occurrences, events, backgrounds)
    write_atomic(stage / "licenses.json", (json.dumps(licenses, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    write_atomic(stage / "attribution.csv", attribution)
    plot_timelines(stage, mixtures, occurrences, segments, p.export.timelines, stage / "timelines.png")

    errors = np.array(occurrences["realised_snr_db"].to_numpy(zero_copy_only=False) - occurrences["snr_db"].to_numpy(zero_copy_only=False))
    roles = np.array(occurrences["role"].to_pylist(), dtype=object)
    whole = errors[roles != "piece"] if errors.size else errors
    return {
        "mixtures": mixtures.num_rows,
        "mixtures_by_split": {s: int(np.sum(np.array(mixtures["split"].to_pylist(), dtype=object) == s)) for s in SPLITS},
        "occurrences": occurrences.num_rows,
        "occurrences_by_role": dict(sorted(Counter(occurrences["role"].to_pylist()).items())),
        "segments": segments.num_rows,
        "labels": len(set(segments["label"].to_pylist())),
        "level_mode": spec.level_mode,
        "snr_error_db": {
            "median": float(np.median(whole)) if whole.size else 0.0,
            "max_abs": float(np.max(np.abs(whole))) if whole.size else 0.0,
            "note": "realised minus drawn SNR over whole and repeated occurrences (pieces share their event's draw)",
        },
        "max_polyphony": int(max(mixtures["max_polyphony"].to_pylist(), default=0)),
        "licenses": licenses,
    }
