"""Stage ``ambience``: cut ambience recordings into clean 10 s background segments.

Input: ``sources.ambience_dir`` (an ambience library, see :mod:`pipeline.ambience.recordings`)
and ``params.ambience``. Each selected recording is read one segment at a time (so hour-long
files need no more memory than a segment), downmixed, resampled to ``sample_rate_hz`` and
cut into non-overlapping ``segment_s`` pieces; the remainder shorter than a segment is
dropped. A segment is rejected when it holds digital silence (a zero run longer than
``max_digital_silence_s``), clipping, too little energy, or a salient event: its loudest
``salience_frame_s`` frame stands more than ``max_peak_to_median_db`` above the median frame.

Output folder ``ambience.out_dir``: ``audio/<segment_id>.flac``, ``manifest.parquet``
(:class:`~pipeline.schema.BackgroundSegment`: source, offset, LUFS, RMS, peak-to-median
and the A-weighted envelope), ``skipped.csv`` (recordings and segments left out, with the
reason) and ``summary.json``. A run that keeps no segment at all raises
:class:`~pipeline.outputs.NoOutputError` (CLI exit status 2) naming the reasons, leaves the
previous output folder as it was and writes its skip report to ``<out_dir>.skipped.csv``.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import numpy as np

from pipeline.ambience.recordings import AmbienceRecording, read_ambience_library
from pipeline.audio import (
    AudioError,
    clipped_fraction,
    downmix,
    int16_to_float,
    longest_zero_run_s,
    open_audio,
    quantize_int16,
    read_block,
    remove_dc,
    resample,
    write_flac,
)
from pipeline.compute import map_ordered
from pipeline.config.params import AmbienceParams, Params, folders_besides
from pipeline.loudness import a_weighted_envelope, integrated_lufs, peak_dbfs, peak_to_median_db, rms_dbfs
from pipeline.outputs import (
    MANIFEST,
    SKIPPED,
    SUMMARY,
    check_out_dir,
    format_summary,
    refuse_empty,
    rejected_report_path,
    staged_dir,
    summarize,
    write_json,
    write_manifest,
    write_skips,
)
from pipeline.schema import BackgroundSegment, Skip

AUDIO_DIR = "audio"


def segment_one(
    rec: AmbienceRecording, p: AmbienceParams, sample_rate_hz: int, audio_dir: Path
) -> list[BackgroundSegment | Skip]:
    """All segments of one recording, each kept (a record) or rejected (a Skip)."""
    try:
        return _segment_one(rec, p, sample_rate_hz, audio_dir)
    except AudioError as e:
        return [Skip(rec.recording_id, rec.rel_path, e.reason, e.detail)]
    except Exception as e:  # keep going; the report names the recording and the error
        for stale in audio_dir.glob(f"{rec.recording_id}-*.flac"):
            stale.unlink()  # no audio without a manifest row
        return [Skip(rec.recording_id, rec.rel_path, "unexpected-error", f"{type(e).__name__}: {e}")]


def _segment_one(
    rec: AmbienceRecording, p: AmbienceParams, sample_rate_hz: int, audio_dir: Path
) -> list[BackgroundSegment | Skip]:
    out: list[BackgroundSegment | Skip] = []
    with open_audio(rec.path) as f:
        sr, channels, total = int(f.samplerate), int(f.channels), int(f.frames)
        if total == 0:
            raise AudioError("empty", "the file has no samples")
        if total / sr < p.min_recording_s:
            raise AudioError("too-short", f"{total / sr:.2f} s < {p.min_recording_s} s")
        span = int(round(p.segment_s * sr))
        target_len = int(round(p.segment_s * sample_rate_hz))
        if total < span:  # with min_recording_s below segment_s, it would yield nothing and leave no trace
            raise AudioError("too-short", f"{total / sr:.2f} s < one segment of {p.segment_s} s")
        for k in range(total // span):
            seg_id = f"{rec.recording_id}-{k:04d}"
            try:
                block = read_block(f, k * span, span)
            except AudioError as e:
                out.append(Skip(seg_id, rec.rel_path, e.reason, f"segment at {k * p.segment_s:.1f} s: {e.detail}"))
                if e.reason == "non-finite":
                    continue  # bad samples here say nothing about the next segment
                break  # a decoder error: nothing after it can be trusted
            if block.shape[0] < span:
                out.append(
                    Skip(
                        seg_id,
                        rec.rel_path,
                        "unreadable",
                        f"file ends at sample {k * span + block.shape[0]}, header says {total}",
                    )
                )
                break
            out.append(
                _one_segment(
                    rec,
                    seg_id,
                    k,
                    block,
                    sr,
                    channels=channels,
                    target_len=target_len,
                    p=p,
                    sample_rate_hz=sample_rate_hz,
                    audio_dir=audio_dir,
                )
            )
    return out


def _one_segment(
    rec: AmbienceRecording,
    seg_id: str,
    k: int,
    block: np.ndarray,
    sr: int,
    *,
    channels: int,
    target_len: int,
    p: AmbienceParams,
    sample_rate_hz: int,
    audio_dir: Path,
) -> BackgroundSegment | Skip:
    def skip(reason: str, detail: str) -> Skip:
        return Skip(seg_id, rec.rel_path, reason, f"segment at {k * p.segment_s:.1f} s: {detail}")  # type: ignore[arg-type]

    clipped = clipped_fraction(block, p.clip_level)
    if clipped > p.max_clipped_fraction:
        return skip("clipped", f"{clipped:.3%} of samples at |x| >= {p.clip_level}")
    x = downmix(block)
    zero_run = longest_zero_run_s(x, sr)
    if zero_run > p.max_digital_silence_s:
        return skip("digital-silence", f"{zero_run:.2f} s of exact zeros")
    y = resample(remove_dc(x), sr, sample_rate_hz)
    q = quantize_int16(np.pad(y, (0, max(0, target_len - y.shape[0])))[:target_len])
    y = int16_to_float(q)
    level = rms_dbfs(y)
    if level < p.silence_dbfs:
        return skip("silent", f"RMS {level:.1f} dBFS < {p.silence_dbfs} dBFS")
    salience = peak_to_median_db(y, sample_rate_hz, p.salience_frame_s)
    if salience > p.max_peak_to_median_db:
        return skip("salient-event", f"peak frame {salience:.1f} dB above the median > {p.max_peak_to_median_db} dB")
    envelope = a_weighted_envelope(y, sample_rate_hz, p.envelope_frame_s, p.envelope_hop_s)
    write_flac(audio_dir / f"{seg_id}.flac", q, sample_rate_hz)
    return BackgroundSegment(
        segment_id=seg_id,
        audio_path=f"{AUDIO_DIR}/{seg_id}.flac",
        source_id=rec.recording_id,
        source_path=rec.rel_path,
        category=rec.category,
        offset_in_source_s=k * p.segment_s,
        duration_s=target_len / sample_rate_hz,
        num_samples=target_len,
        sample_rate_hz=sample_rate_hz,
        source_sample_rate_hz=sr,
        source_channels=channels,
        rms_dbfs=level,
        peak_dbfs=peak_dbfs(y),
        loudness_lufs=integrated_lufs(y, sample_rate_hz),
        peak_to_median_db=salience,
        envelope_frame_s=envelope.frame_s,
        envelope_hop_s=envelope.hop_s,
        envelope_db=envelope.energy_db,
        license=rec.license,
        author=rec.author,
    )


def run(params: Params, ambience_dir: Path | None = None, out_dir: Path | None = None) -> dict:
    """Run the stage; returns the summary written to ``summary.json``."""
    ambience_dir = Path(ambience_dir or params.sources.ambience_dir)
    out_dir = Path(out_dir or params.ambience.out_dir)
    check_out_dir(
        out_dir, "ambience.out_dir", {**folders_besides(params, "ambience.out_dir"), "sources.ambience_dir": ambience_dir}
    )
    recordings, skips, selection = read_ambience_library(ambience_dir, params.ambience)
    num_inputs = len(recordings) + len(skips)
    with staged_dir(out_dir) as stage:
        work = partial(segment_one, p=params.ambience, sample_rate_hz=params.sample_rate_hz, audio_dir=stage / AUDIO_DIR)
        results = [r for per_recording in map_ordered(work, recordings, params.compute, desc="ambience") for r in per_recording]
        records = [r for r in results if isinstance(r, BackgroundSegment)]
        skips += [r for r in results if isinstance(r, Skip)]
        (stage / AUDIO_DIR).mkdir(exist_ok=True)
        write_manifest(stage / MANIFEST, records, BackgroundSegment)
        write_skips(stage / SKIPPED, skips)
        summary = summarize(
            num_inputs=num_inputs,
            num_outputs=len(records),
            skips=skips,
            selection=selection,
            recordings_used=len({r.source_id for r in records}),
            background_seconds=round(sum(r.duration_s for r in records), 3),
        )
        if not records:
            hint = (
                "; ambience.keywords: all selects every recording" if "filtered-category" in summary["skipped_by_reason"] else ""
            )
            refuse_empty(out_dir, summary, skips, "background segments", "recordings and rows", hint)
        write_json(stage / SUMMARY, summary)
    rejected_report_path(out_dir).unlink(missing_ok=True)  # a report of an earlier empty run no longer applies
    print(format_summary("ambience", summary, "segments", "recordings and rows"), file=sys.stderr)
    return summary
