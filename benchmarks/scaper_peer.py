"""Scaper 1.6.5 making the same soundscapes as ``sedsynth bench mix``, for its peer figure.

Runs in Scaper's own environment (Scaper needs ``numpy<2`` and libsox), started by the
benchmark as ``PYTHON scaper_peer.py CONFIG.json``; it imports nothing from this project.
Input (JSON): event clips ``[label, path, duration_s]``, background paths, the number of
soundscapes, seed, rate, duration, SNR range, events per mixture, repetition rule, fade
length, output folder. Output: one JSON line ``{"mixtures": n, "seconds": t}`` timing only
the generation loop (Scaper writes a 32-bit WAV, a JAMS file and a txt per soundscape; it has
no FLAC output). The spec matches the ``finelap`` preset without pitch shift, time stretch
or reverb.
"""

import json
import os
import re
import sys
import time
import warnings

import numpy as np


def _folder(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label)


def main(config_path: str) -> None:
    import scaper

    cfg = json.load(open(config_path))
    out = cfg["out_dir"]
    fg, bg = os.path.join(out, "fg"), os.path.join(out, "bg")
    events = []
    for label, path, duration in cfg["events"]:
        folder = os.path.join(fg, _folder(label))
        os.makedirs(folder, exist_ok=True)
        link = os.path.join(folder, os.path.basename(path))
        if not os.path.exists(link):
            os.symlink(path, link)
        events.append((_folder(label), link, duration))
    os.makedirs(os.path.join(bg, "ambience"), exist_ok=True)
    backgrounds = []
    for path in cfg["backgrounds"]:
        link = os.path.join(bg, "ambience", os.path.basename(path))
        if not os.path.exists(link):
            os.symlink(path, link)
        backgrounds.append(link)
    os.makedirs(os.path.join(out, "soundscapes"), exist_ok=True)

    warnings.filterwarnings("ignore")
    duration, sr = cfg["duration_s"], cfg["sample_rate_hz"]
    sc = scaper.Scaper(duration, fg, bg, random_state=cfg["seed"])
    sc.sr = sr
    sc.ref_db = -30
    sc.fade_in_len = sc.fade_out_len = cfg["fade_s"]
    rng = np.random.default_rng(cfg["seed"])
    lo, hi = cfg["snr_db"]
    t0 = time.perf_counter()
    for i in range(cfg["mixtures"]):
        sc.reset_bg_event_spec()
        sc.reset_fg_event_spec()
        sc.add_background(
            label=("const", "ambience"),
            source_file=("const", backgrounds[rng.integers(len(backgrounds))]),
            source_time=("const", 0),
        )
        k = int(rng.choice(cfg["events_per_mixture"]))
        for j in rng.choice(len(events), size=min(k, len(events)), replace=False):
            label, path, dur = events[int(j)]
            reps = int(rng.choice(cfg["repeat_counts"])) if dur < cfg["repeat_below_s"] else 1
            for _ in range(reps):
                sc.add_event(
                    label=("const", label),
                    source_file=("const", path),
                    source_time=("const", 0),
                    event_time=("uniform", 0, max(duration - dur, 0)),
                    event_duration=("const", dur),
                    snr=("uniform", lo, hi),
                    pitch_shift=None,
                    time_stretch=None,
                )
        base = os.path.join(out, "soundscapes", f"{i:07d}")
        sc.generate(
            base + ".wav",
            base + ".jams",
            txt_path=base + ".txt",
            reverb=None,
            allow_repeated_label=True,
            allow_repeated_source=True,
            disable_instantiation_warnings=True,
            disable_sox_warnings=True,
        )
    print(json.dumps({"mixtures": cfg["mixtures"], "seconds": time.perf_counter() - t0}))


if __name__ == "__main__":
    main(sys.argv[1])
