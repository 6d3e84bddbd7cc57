"""Scaper-compatible JAMS files, one per mixture (``mix.export.jams``; needs ``pip install .[jams]``).

Input: the mix stage's recipe tables and the source bank. Output: ``audio/<split>/<id>.jams``
with one annotation in the ``scaper`` namespace, laid out as Scaper 1.6 writes it, so
``scaper.generate_from_jams(path, out.wav)`` re-renders the mixture from the stored clips and
segments (absolute ``source_file`` paths) and reports the same events.

Level translation: Scaper sets the background to ``ref_db - LUFS(background)`` and each event
to ``ref_db + snr - LUFS(event)``. Writing ``ref_db = LUFS(background window) + background
gain`` and ``snr = LUFS(event span) + event gain - ref_db`` makes Scaper apply this
project's gains whatever the level mode; the mixture gain (normalisation) has no Scaper
equivalent (Scaper's ``fix_clipping`` / ``peak_normalization`` scale to full scale instead
of ``normalize.peak_dbfs``) and is kept in ``sandbox.sedsynth``. Scaper uses one fade length per soundscape;
the first occurrence's is written.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from pipeline.audio import write_atomic
from pipeline.mix.exports import by_mixture
from pipeline.mix.instantiate import level_db
from pipeline.mix.render import Sources, samples
from pipeline.mix.spec import MixSpec
from pipeline.schema import BackgroundSegment, EventClip


def write_jams(stage: Path, mixtures: pa.Table, occurrences: pa.Table, spec: MixSpec, sources: Sources,
               events_dir: Path, backgrounds_dir: Path, events: list[EventClip], backgrounds: list[BackgroundSegment]) -> None:
    try:
        import jams
    except ImportError as e:
        raise ImportError("mix.export.jams needs the jams package: pip install -e '.[jams]'") from e

    sr = sources.sample_rate_hz
    ev = {e.clip_id: e for e in events}
    bg = {b.segment_id: b for b in backgrounds}
    occurrences_of = by_mixture(occurrences)
    cache: dict[tuple, float] = {}

    def lufs(kind: str, item: str, start: int, length: int) -> float:
        key = (kind, item, start, length)
        if key not in cache:
            q = sources.event(item) if kind == "event" else sources.background(item)
            cache[key] = level_db(q[start : start + length], "lufs", sr)
        return cache[key]

    for m in mixtures.to_pylist():
        occ = sorted(occurrences_of.get(m["mixture_id"], []), key=lambda o: o["occurrence_index"])
        duration = m["duration_s"]
        b = bg[m["background_id"]]
        ref_db = lufs("bg", b.segment_id, samples(m["background_offset_s"], sr), m["num_samples"]) + m["background_gain_db"]
        jam = jams.JAMS()
        jam.file_metadata.duration = duration
        ann = jams.Annotation(namespace="scaper", time=0, duration=duration)
        ann.sandbox.scaper = {
            "duration": duration,
            "original_duration": duration,
            "fg_path": str(events_dir / "audio"),
            "bg_path": str(backgrounds_dir / "audio"),
            "protected_labels": [],
            "sr": int(sr),
            "ref_db": float(ref_db),
            "n_channels": 1,
            "fade_in_len": float(occ[0]["fade_in_s"]) if occ else 0.0,
            "fade_out_len": float(occ[0]["fade_out_s"]) if occ else 0.0,
            "reverb": None,
            # Scaper can only scale a whole soundscape to full scale: ask for that where this
            # project scaled it (to normalize.peak_dbfs, so Scaper's output is louder by a constant).
            "fix_clipping": bool(m["mixture_gain_db"] < 0 and spec.normalize.peak == "if-clipping"),
            "peak_normalization": spec.normalize.peak == "always",
            "quick_pitch_time": False,
            "n_events": len(occ),
        }
        ann.sandbox.sedsynth = {
            "mixture_id": m["mixture_id"], "preset": spec.preset, "level_mode": m["level_mode"],
            "mixture_gain_db": m["mixture_gain_db"], "license": m["license"],
        }
        ann.append(time=0.0, duration=duration, confidence=1.0, value={
            "label": b.category, "source_file": str((backgrounds_dir / b.audio_path).resolve()),
            "source_time": m["background_offset_s"], "event_time": 0.0, "event_duration": duration,
            "snr": 0.0, "role": "background", "pitch_shift": None, "time_stretch": None,
        })
        for o in occ:
            e = ev[o["clip_id"]]
            start = samples(o["source_in_s"], sr)
            length = samples(o["offset_s"], sr) - samples(o["onset_s"], sr)
            snr = lufs("event", e.clip_id, start, length) + o["gain_db"] - ref_db
            ann.append(time=o["onset_s"], duration=o["offset_s"] - o["onset_s"], confidence=1.0, value={
                "label": o["label"], "source_file": str((events_dir / e.audio_path).resolve()),
                "source_time": o["source_in_s"], "event_time": o["onset_s"], "event_duration": o["offset_s"] - o["onset_s"],
                "snr": float(snr), "role": "foreground", "pitch_shift": None, "time_stretch": None,
            })
        jam.annotations.append(ann)
        path = (stage / m["audio_path"]).with_suffix(".jams")
        jam.validate()
        write_atomic(path, jam.dumps(indent=2).encode("utf-8"))
