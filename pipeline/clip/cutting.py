"""Event clips from an FSD50K-layout corpus: which source clips qualify, and cutting one.

Input: the corpus root and :class:`~pipeline.config.params.ClipParams`. :func:`plan_clips`
reads the corpus and keeps the clips with a single label (one :class:`ClipTask` each, the
others as :class:`~pipeline.schema.Skip`). :func:`clip_one` decodes one source clip, finds its
first continuous high-energy segment (:func:`~pipeline.segmentation.find_segment`), checks it
(silence, length, clipping), and writes it as ``audio/<clip_id>.flac`` (mono, 16-bit, at the
pipeline rate). Output per clip: an :class:`~pipeline.schema.EventClip` describing exactly the
stored audio, or a Skip saying why not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.audio import (
    AudioError,
    clipped_fraction,
    downmix,
    int16_to_float,
    quantize_int16,
    read_audio,
    remove_dc,
    resample,
    write_flac,
)
from pipeline.config.params import ClipParams
from pipeline.fsd50k import FSD50KClip, read_fsd50k, single_label
from pipeline.licenses import license_name
from pipeline.loudness import a_weighted_envelope, integrated_lufs, peak_dbfs, rms_dbfs
from pipeline.ontology import default_ontology
from pipeline.schema import EventClip, Skip
from pipeline.segmentation import find_segment

AUDIO_DIR = "audio"  # clips' folder inside the output folder; EventClip.audio_path is relative to that


@dataclass(frozen=True)
class ClipTask:
    """One single-label source clip to cut, with its label resolved."""

    clip: FSD50KClip
    label: str
    mid: str
    audioset_name: str


def plan_clips(fsd50k_dir: Path, p: ClipParams) -> tuple[list[ClipTask], list[Skip]]:
    """Read the corpus and keep the single-label clips of ``p.splits``: the tasks, and the rows left out."""
    clips, skips = read_fsd50k(fsd50k_dir, p.splits)
    ontology = default_ontology()
    tasks: list[ClipTask] = []
    for clip in clips:
        chosen = single_label(clip, ontology, p.single_label_rule)
        if isinstance(chosen, Skip):
            skips.append(chosen)
            continue
        label, mid = chosen
        known = ontology.by_mid.get(mid)
        tasks.append(ClipTask(clip, label, mid, known.name if known else label.replace("_", " ")))
    return tasks, skips


def clip_one(task: ClipTask, p: ClipParams, sample_rate_hz: int, audio_dir: Path) -> EventClip | Skip:
    """Decode one source clip, find its first event segment, write it; or say why not."""
    c = task.clip
    try:
        return _clip_one(task, p, sample_rate_hz, audio_dir)
    except AudioError as e:
        return Skip(c.clip_id, c.rel_path, e.reason, e.detail)
    except Exception as e:  # one bad file must not stop a 50k-clip run; the report keeps it
        (audio_dir / f"{c.clip_id}.flac").unlink(missing_ok=True)  # no audio without a manifest row
        return Skip(c.clip_id, c.rel_path, "unexpected-error", f"{type(e).__name__}: {e}")


def _clip_one(task: ClipTask, p: ClipParams, sample_rate_hz: int, audio_dir: Path) -> EventClip | Skip:
    c = task.clip
    decoded = read_audio(c.audio_path)
    sr = decoded.sample_rate_hz
    x = remove_dc(downmix(decoded.samples))
    seg = find_segment(x, sr, p.segmentation)
    if float(seg.frame_energy_db.max()) < p.silence_dbfs:
        return Skip(
            c.clip_id, c.rel_path, "silent", f"loudest frame {seg.frame_energy_db.max():.1f} dBFS < {p.silence_dbfs} dBFS"
        )
    if not seg.found:
        return Skip(c.clip_id, c.rel_path, "no-segment", "no window reaches the threshold")
    duration_s = (seg.end - seg.start) / sr
    if duration_s < p.min_duration_s:
        return Skip(c.clip_id, c.rel_path, "too-short", f"first segment {duration_s:.3f} s < {p.min_duration_s} s")
    if duration_s > p.max_duration_s:
        return Skip(c.clip_id, c.rel_path, "too-long", f"first segment {duration_s:.3f} s > {p.max_duration_s} s")
    clipped = clipped_fraction(decoded.samples[seg.start : seg.end], p.clip_level)
    if clipped > p.max_clipped_fraction:
        return Skip(c.clip_id, c.rel_path, "clipped", f"{clipped:.2%} of samples at |x| >= {p.clip_level}")

    q = quantize_int16(resample(x[seg.start : seg.end], sr, sample_rate_hz))
    y = int16_to_float(q)  # statistics describe exactly what is stored
    envelope = a_weighted_envelope(y, sample_rate_hz, p.envelope_frame_s, p.envelope_hop_s)
    write_flac(audio_dir / f"{c.clip_id}.flac", q, sample_rate_hz)
    return EventClip(
        clip_id=c.clip_id,
        audio_path=f"{AUDIO_DIR}/{c.clip_id}.flac",
        source_dataset="fsd50k",
        source_id=c.fname,
        source_split=c.split,
        source_path=c.rel_path,
        label=task.label,
        mid=task.mid,
        audioset_name=task.audioset_name,
        onset_in_source_s=seg.start / sr,
        offset_in_source_s=seg.end / sr,
        duration_s=q.shape[0] / sample_rate_hz,
        num_samples=int(q.shape[0]),
        sample_rate_hz=sample_rate_hz,
        source_sample_rate_hz=sr,
        source_channels=decoded.channels,
        rms_dbfs=rms_dbfs(y),
        peak_dbfs=peak_dbfs(y),
        loudness_lufs=integrated_lufs(y, sample_rate_hz),
        envelope_frame_s=envelope.frame_s,
        envelope_hop_s=envelope.hop_s,
        envelope_db=envelope.energy_db,
        license_url=c.license_url,
        license=license_name(c.license_url),
        uploader=c.uploader,
        title=c.title,
    )
