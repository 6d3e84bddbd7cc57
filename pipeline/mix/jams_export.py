"""Scaper-compatible JAMS files, one per mixture (``mix.export.jams``; needs ``pip install .[jams]``).

Input: the mix stage's recipes and occurrences (records) and the source bank. Output:
``audio/<split>/<id>.jams`` with one annotation in the ``scaper`` namespace, laid out as
Scaper 1.6 writes it, so ``scaper.generate_from_jams(path, out.wav)`` re-renders the mixture
from the stored clips and segments (absolute ``source_file`` paths) and reports the same events.

Level translation: Scaper sets the background to ``ref_db - LUFS(background)`` and each event
to ``ref_db + snr - LUFS(event)``. Writing ``ref_db = LUFS(background window) + background
gain`` and ``snr = LUFS(event span) + event gain - ref_db`` makes Scaper apply this
project's gains whatever the level mode; the mixture gain (normalisation) has no Scaper
equivalent (Scaper's ``fix_clipping`` / ``peak_normalization`` scale to full scale instead
of ``normalize.peak_dbfs``) and is kept in ``sandbox.sedsynth``. Scaper uses one fade length per soundscape;
the first occurrence's is written.

Times: Scaper turns seconds into samples with ``int(sr * t)``, which truncates, and the
nearest float to ``n / sr`` may lie a hair below it (``0.0636875 * 16000`` is
``1018.9999999999999``). Every time and length is therefore written as the float nearest the
recipe's sample index that Scaper maps back onto it (:func:`scaper_seconds`), and a span's
end as well (Scaper reads a source from ``int(source_time * sr)`` to
``int((source_time + event_duration) * sr)``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from pipeline.config.mix_spec import MixSpec
from pipeline.mix.instantiate import level_db
from pipeline.mix.render import Sources, samples
from pipeline.outputs import write_atomic
from pipeline.schema import BackgroundSegment, EventClip, EventOccurrence, MixtureRecipe


def _step_up_until(t: float, ok: Callable[[float], bool], step: Callable[[float], float]) -> float:
    """``t``, or the next values ``step`` gives above it, until ``ok`` holds (a few steps: the error is an ulp)."""
    for _ in range(64):
        if ok(t):
            return t
        t = step(t)
    raise ValueError(f"no float near {t!r} s meets Scaper's sample arithmetic")


def _next_float(t: float) -> float:
    return float(np.nextafter(t, np.inf))


def scaper_seconds(n: int, sample_rate_hz: int) -> float:
    """Seconds for sample index ``n`` that Scaper's ``int(sr * t)`` turns back into ``n``."""
    return _step_up_until(n / sample_rate_hz, lambda t: int(sample_rate_hz * t) == n, _next_float)


def scaper_span(start: int, length: int, sample_rate_hz: int) -> tuple[float, float]:
    """``(source_time, event_duration)`` for samples ``[start, start + length)`` as Scaper cuts them:
    ``int(sr * source_time) == start``, ``int(sr * event_duration) == length`` and
    ``int((source_time + event_duration) * sr) == start + length``."""
    sr = sample_rate_hz
    t = scaper_seconds(start, sr)

    def ok(d: float) -> bool:
        return int(sr * d) == length and int((t + d) * sr) == start + length

    def step(d: float) -> float:  # the sum's float spacing can be far coarser than d's own
        return max(_next_float(d), _next_float(t + d) - t)

    return t, _step_up_until(length / sr, ok, step)


def write_jams(
    stage: Path,
    recipes: list[MixtureRecipe],
    occurrences_of: dict[str, list[EventOccurrence]],
    *,
    spec: MixSpec,
    sources: Sources,
    events_dir: Path,
    backgrounds_dir: Path,
    events: list[EventClip],
    backgrounds: list[BackgroundSegment],
) -> None:
    """One ``<id>.jams`` beside each mixture's FLAC; ``occurrences_of`` maps mixture ids to their occurrences."""
    try:
        import jams
    except ImportError as e:
        raise ImportError("mix.export.jams needs the jams package: pip install -e '.[jams]'") from e

    sr = sources.sample_rate_hz
    ev = {e.clip_id: e for e in events}
    bg = {b.segment_id: b for b in backgrounds}
    cache: dict[tuple, float] = {}

    def lufs(kind: str, item: str, start: int, length: int) -> float:
        key = (kind, item, start, length)
        if key not in cache:
            q = sources.event(item) if kind == "event" else sources.background(item)
            cache[key] = level_db(q[start : start + length], "lufs", sr)
        return cache[key]

    for m in recipes:
        occ = sorted(occurrences_of.get(m.mixture_id, []), key=lambda o: o.occurrence_index)
        duration = scaper_seconds(m.num_samples, sr)
        b = bg[m.background_id]
        bg_start = samples(m.background_offset_s, sr)
        ref_db = lufs("bg", b.segment_id, bg_start, m.num_samples) + m.background_gain_db
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
            "fade_in_len": scaper_seconds(samples(occ[0].fade_in_s, sr), sr) if occ else 0.0,
            "fade_out_len": scaper_seconds(samples(occ[0].fade_out_s, sr), sr) if occ else 0.0,
            "reverb": None,
            # Scaper can only scale a whole soundscape to full scale: ask for that where this
            # project scaled it (to normalize.peak_dbfs, so Scaper's output is louder by a constant).
            "fix_clipping": bool(m.mixture_gain_db < 0 and spec.normalize.peak == "if-clipping"),
            "peak_normalization": spec.normalize.peak == "always",
            "quick_pitch_time": False,
            "n_events": len(occ),
        }
        ann.sandbox.sedsynth = {
            "mixture_id": m.mixture_id,
            "preset": spec.preset,
            "level_mode": m.level_mode,
            "mixture_gain_db": m.mixture_gain_db,
            "license": m.license,
        }
        bg_time, bg_duration = scaper_span(bg_start, m.num_samples, sr)
        ann.append(
            time=0.0,
            duration=bg_duration,
            confidence=1.0,
            value={
                "label": b.category,
                "source_file": str((backgrounds_dir / b.audio_path).resolve()),
                "source_time": bg_time,
                "event_time": 0.0,
                "event_duration": bg_duration,
                "snr": 0.0,
                "role": "background",
                "pitch_shift": None,
                "time_stretch": None,
            },
        )
        for o in occ:
            e = ev[o.clip_id]
            start = samples(o.source_in_s, sr)
            onset = samples(o.onset_s, sr)
            length = samples(o.offset_s, sr) - onset
            snr = lufs("event", e.clip_id, start, length) + o.gain_db - ref_db
            source_time, event_duration = scaper_span(start, length, sr)
            event_time = scaper_seconds(onset, sr)
            ann.append(
                time=event_time,
                duration=event_duration,
                confidence=1.0,
                value={
                    "label": o.label,
                    "source_file": str((events_dir / e.audio_path).resolve()),
                    "source_time": source_time,
                    "event_time": event_time,
                    "event_duration": event_duration,
                    "snr": float(snr),
                    "role": "foreground",
                    "pitch_shift": None,
                    "time_stretch": None,
                },
            )
        jam.annotations.append(ann)
        path = (stage / m.audio_path).with_suffix(".jams")
        jam.validate()
        write_atomic(path, jam.dumps(indent=2).encode("utf-8"))
