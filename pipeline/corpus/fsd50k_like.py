"""A synthetic corpus in FSD50K's on-disk layout, for running the pipeline without the real data.

Input: an output folder, a clip count and a seed. Output (:func:`write_fsd50k_corpus`)::

    out_dir/FSD50K.dev_audio/<fname>.wav           44.1 kHz, 16-bit PCM, mono
    out_dir/FSD50K.eval_audio/<fname>.wav
    out_dir/FSD50K.ground_truth/vocabulary.csv     no header: index,label,mid
    out_dir/FSD50K.ground_truth/dev.csv            fname,labels,mids,split (train or val)
    out_dir/FSD50K.ground_truth/eval.csv           fname,labels,mids
    out_dir/FSD50K.metadata/{dev,eval}_clips_info_FSD50K.json
        {"<fname>": {"title", "description", "tags", "license", "uploader"}}

Each clip holds one class of :data:`FSD50K_LEAF_CLASSES` (about 15% hold two), synthesised
by :mod:`pipeline.corpus.sound_models`. As in FSD50K, ``labels``/``mids`` list each leaf
followed by its AudioSet ancestors (nearest first) in FSD50K spelling; the ancestors
exclude abstract ontology classes ("Human sounds", "Onomatopoeia", ...) but keep concrete
roots such as "Animal" and "Music", and the vocabulary is the leaves
plus those ancestors. A clip is 0.3-30 s (median about 5 s) of near-silence around one to
three bursts of the event; the first burst is 0.3-9 s, so a "first continuous segment of
1-7.5 s" rule keeps most clips but not all.

Clip ``i`` depends only on ``(seed, i)``: same arguments, byte-identical files; the work and
memory per clip are constant, so the count scales to FSD50K's 51k clips. Every file is
written under a temporary name and renamed into place.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import soundfile as sf

from pipeline.compute import map_ordered
from pipeline.config.params import ComputeParams
from pipeline.corpus import sound_models
from pipeline.ontology import Ontology, default_ontology, fsd50k_label_name
from pipeline.outputs import write_atomic

FSD50K_LEAF_CLASSES: tuple[str, ...] = sound_models.CLASS_NAMES

SAMPLE_RATE_HZ = 44100
GROUND_TRUTH = "FSD50K.ground_truth"
METADATA = "FSD50K.metadata"
AUDIO_DIRS = {"dev": "FSD50K.dev_audio", "eval": "FSD50K.eval_audio"}
LICENSES = (
    "http://creativecommons.org/publicdomain/zero/1.0/",
    "http://creativecommons.org/licenses/by/3.0/",
    "http://creativecommons.org/licenses/by-nc/3.0/",
    "http://creativecommons.org/licenses/sampling+/1.0/",
)
_LICENSE_WEIGHTS = (0.45, 0.35, 0.15, 0.05)

MIN_CLIP_S, MAX_CLIP_S = 0.3, 30.0
_MEDIAN_CLIP_S, _CLIP_SIGMA = 5.3, 1.05  # truncation to 0.3-30 s pulls the median to ~5 s
MAX_FIRST_BURST_S = 9.0
_MEDIAN_FIRST_BURST_S, _FIRST_BURST_SIGMA = 3.5, 0.8
MIN_BURST_S = 0.3
MIN_PAUSE_S, MAX_PAUSE_S = 0.3, 2.0
PEAK_DBFS = (-30.0, -3.0)
FLOOR_DBFS = (-85.0, -70.0)
_ZERO_EDGES_FRACTION = 0.12  # clips whose leading and trailing silence is exact digital zero
_VAL_FRACTION = 0.15

# fname = 10000 + (a * i + b) mod P with P prime is a bijection on 0..P-1: unique 5-6 digit
# ids, computed per clip without remembering the ones already used.
_FNAME_BASE = 10_000
_FNAME_MODULUS = 989_999


@dataclass(frozen=True)
class _Segment:
    start_s: float
    dur_s: float
    cls: int
    gain: float


@dataclass(frozen=True)
class _ClipPlan:
    index: int
    fname: int
    split: str  # train, val or eval
    classes: tuple[int, ...]  # leaf classes, primary first
    n_samples: int
    segments: tuple[_Segment, ...]
    lead_s: float  # start of the first burst
    tail_s: float  # end of the last burst
    peak_dbfs: float
    floor_dbfs: float
    zero_edges: bool


# --------------------------------------------------------------------------- labels


def _ancestor_chain(onto: Ontology, name: str) -> list[str]:
    """MIDs of the leaf ``name`` and its ancestors that are not abstract, nearest first.

    Abstract ontology classes ("Onomatopoeia", "Human sounds", ...) are grouping nodes that
    FSD50K's vocabulary leaves out; concrete roots such as "Animal" and "Music" stay, as in
    FSD50K (``Bark,Dog,Domestic_animals_and_pets,Animal``).
    """
    mid = onto.by_name[name].mid
    return [mid] + [a for a in onto.ancestors(mid) if not onto.by_mid[a].abstract]


def vocabulary(onto: Ontology | None = None) -> list[tuple[str, str]]:
    """(FSD50K label, MID) of every leaf class and its non-abstract ancestors, sorted by label."""
    onto = onto or default_ontology()
    mids = {m for name in FSD50K_LEAF_CLASSES for m in _ancestor_chain(onto, name)}
    return sorted((fsd50k_label_name(onto.by_mid[m].name), m) for m in mids)


def _labels_and_mids(onto: Ontology, classes: tuple[int, ...]) -> tuple[list[str], list[str]]:
    mids: list[str] = []
    for c in classes:
        for m in _ancestor_chain(onto, FSD50K_LEAF_CLASSES[c]):
            if m not in mids:
                mids.append(m)
    return [fsd50k_label_name(onto.by_mid[m].name) for m in mids], mids


# --------------------------------------------------------------------------- planning


def _units(n: int) -> list[int]:
    return [u for u in range(1, n) if math.gcd(u, n) == 1] or [1]


def _fname(i: int, seed: int) -> int:
    a = 1 + (seed * 7919 + 104_729) % (_FNAME_MODULUS - 1)
    b = (seed * 15_485_863 + 32_452_843) % _FNAME_MODULUS
    return _FNAME_BASE + (a * i + b) % _FNAME_MODULUS


def _primary_class(i: int, n_classes: int) -> tuple[int, int]:
    """(class, round): clips go round-robin over the classes, each round in its own order."""
    rnd, pos = divmod(i, n_classes)
    units = _units(n_classes)
    return (pos * units[rnd % len(units)] + 11 * rnd) % n_classes, rnd


def _is_eval(cls: int, rnd: int) -> bool:
    # One class in five per round, a different fifth each round: exactly 20% of the clips,
    # and every class has an eval clip within its first five rounds (150 clips).
    return (rnd + cls) % 5 == 0


def _is_multilabel(i: int, seed: int) -> bool:
    # 3 of every 20 consecutive clips: 15% at any size, spread evenly.
    return (3 * i + seed) % 20 < 3


def _lognormal(rng: np.random.Generator, median: float, sigma: float, lo: float, hi: float) -> float:
    while True:
        v = float(np.exp(rng.normal(math.log(median), sigma)))
        if lo <= v <= hi:
            return v


def _plan_clip(i: int, seed: int, rng: np.random.Generator) -> _ClipPlan:
    """Split, classes, length, burst layout and levels of clip ``i`` (draws from ``rng`` first)."""
    n_classes = len(FSD50K_LEAF_CLASSES)
    primary, rnd = _primary_class(i, n_classes)
    if _is_eval(primary, rnd):
        split = "eval"
    else:
        split = "val" if rng.random() < _VAL_FRACTION else "train"
    classes: tuple[int, ...] = (primary,)
    if _is_multilabel(i, seed):
        classes = (primary, (primary + 1 + int(rng.integers(n_classes - 1))) % n_classes)

    n = int(round(_lognormal(rng, _MEDIAN_CLIP_S, _CLIP_SIGMA, MIN_CLIP_S, MAX_CLIP_S) * SAMPLE_RATE_HZ))
    dur = n / SAMPLE_RATE_HZ
    lead = min(dur * rng.uniform(0.02, 0.12), rng.uniform(0.2, 1.5))
    trail = min(dur * rng.uniform(0.02, 0.12), rng.uniform(0.2, 2.0))
    active = dur - lead - trail
    first = min(_lognormal(rng, _MEDIAN_FIRST_BURST_S, _FIRST_BURST_SIGMA, MIN_BURST_S, MAX_FIRST_BURST_S), active)
    k = int(rng.choice([1, 2, 3], p=[0.6, 0.3, 0.1] if dur < 4.0 else [0.25, 0.4, 0.35]))
    bursts = [(lead, first)]
    t, left = lead + first, active - first
    for j in range(1, k):
        if left < MIN_PAUSE_S + MIN_BURST_S:
            break
        pause = min(rng.uniform(MIN_PAUSE_S, MAX_PAUSE_S), left - MIN_BURST_S)
        t, left = t + pause, left - pause
        if j == k - 1 or left < 2 * MIN_BURST_S + MIN_PAUSE_S:
            length = left  # the last burst runs to the planned trailing silence
        else:
            length = rng.uniform(MIN_BURST_S, left - MIN_BURST_S - MIN_PAUSE_S)
        bursts.append((t, length))
        t, left = t + length, left - length

    gains = [float(10.0 ** (rng.uniform(-3.0, 3.0) / 20.0)) for _ in bursts]
    segments = [_Segment(s, d, primary, g) for (s, d), g in zip(bursts, gains)]
    if len(classes) == 2:
        other = classes[1]
        if len(bursts) >= 2 and rng.random() < 0.5:
            # In sequence: the bursts alternate between the two classes.
            segments = [_Segment(s.start_s, s.dur_s, classes[j % 2], s.gain) for j, s in enumerate(segments)]
        elif bursts[0][1] >= 2 * MIN_BURST_S and rng.random() < 0.3:
            # In sequence inside the first burst: one sound takes over from the other.
            s0 = segments[0]
            cut = rng.uniform(0.3, 0.7) * s0.dur_s
            segments[0] = _Segment(s0.start_s, cut, primary, s0.gain)
            segments.insert(1, _Segment(s0.start_s + cut, s0.dur_s - cut, other, s0.gain))
        else:
            # Overlapping: the second sound over part of a burst, a little quieter.
            bs, bd = bursts[int(rng.integers(len(bursts)))]
            od = max(min(bd, MIN_BURST_S), rng.uniform(0.4, 1.0) * bd)
            o_start = bs + rng.uniform(0.0, bd - od)
            segments.append(_Segment(o_start, od, other, float(10.0 ** (rng.uniform(-6.0, 0.0) / 20.0))))

    return _ClipPlan(
        index=i,
        fname=_fname(i, seed),
        split=split,
        classes=classes,
        n_samples=n,
        segments=tuple(segments),
        lead_s=lead,
        tail_s=t,
        peak_dbfs=float(rng.uniform(*PEAK_DBFS)),
        floor_dbfs=float(rng.uniform(*FLOOR_DBFS)),
        zero_edges=bool(rng.random() < _ZERO_EDGES_FRACTION),
    )


# --------------------------------------------------------------------------- audio


def _render(plan: _ClipPlan, rng: np.random.Generator) -> np.ndarray:
    """int16 samples of the clip: noise floor plus the planned segments at the planned peak."""
    n = plan.n_samples
    event = np.zeros(n, dtype=np.float32)
    for seg in plan.segments:
        a = int(round(seg.start_s * SAMPLE_RATE_HZ))
        x = sound_models.synthesize(FSD50K_LEAF_CLASSES[seg.cls], rng, seg.dur_s, SAMPLE_RATE_HZ)
        m = min(len(x), n - a)
        event[a : a + m] += seg.gain * x[:m]
    peak = float(np.max(np.abs(event)))
    if peak > 0.0:
        event *= np.float32(10.0 ** (plan.peak_dbfs / 20.0) / peak)
    floor = rng.standard_normal(n, dtype=np.float32)
    floor[1:] += 0.7 * floor[:-1]  # a slightly dark floor, like a real preamp's hiss
    floor *= np.float32(10.0 ** (plan.floor_dbfs / 20.0) / math.sqrt(1.0 + 0.49))
    if plan.zero_edges:
        # Some uploads were trimmed or faded in an editor: exact digital silence at the ends.
        floor[: int(plan.lead_s * SAMPLE_RATE_HZ)] = 0.0
        floor[int(math.ceil(plan.tail_s * SAMPLE_RATE_HZ)) :] = 0.0
    # Peak is at most -3 dBFS and the floor below -70 dBFS: rounding cannot clip.
    return np.round((event + floor) * 32767.0).astype(np.int16)


# --------------------------------------------------------------------------- metadata

# Per class: phrases for titles and descriptions, and tags.
_TEXT: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "Bark": (("dog barking", "small dog barks", "barking dog"), ("dog", "bark", "pet", "animal")),
    "Meow": (("cat meowing", "kitten meow", "hungry cat"), ("cat", "meow", "pet", "animal")),
    "Chirp, tweet": (("bird chirping", "sparrow tweets", "small bird calls"), ("bird", "chirp", "tweet", "nature")),
    "Church bell": (("church bell ringing", "bell tower", "sunday bells"), ("church", "bell", "toll", "city")),
    "Bicycle bell": (("bicycle bell ring", "bike bell", "ring ring bicycle"), ("bicycle", "bell", "bike", "ring")),
    "Vehicle horn, car horn, honking": (("car horn honking", "horn beep", "traffic honk"), ("car", "horn", "honk", "traffic")),
    "Siren": (("police siren", "ambulance siren passing", "emergency siren"), ("siren", "emergency", "alarm", "city")),
    "Knock": (("knocking on door", "door knock", "knock knock"), ("knock", "door", "wood", "house")),
    "Clapping": (("hand clapping", "slow claps", "single person clapping"), ("clap", "hands", "applause", "human")),
    "Finger snapping": (("finger snaps", "snapping fingers", "finger snap loop"), ("snap", "finger", "hand", "click")),
    "Cough": (("man coughing", "dry cough", "coughing fit"), ("cough", "human", "sick", "throat")),
    "Whistling": (("whistling a tune", "man whistles melody", "whistled song"), ("whistle", "melody", "human", "tune")),
    "Ringtone": (("phone ringtone", "mobile ringing", "old cellphone ring"), ("phone", "ringtone", "ring", "electronic")),
    "Chink, clink": (("glasses clinking", "cheers glass clink", "glass tap"), ("glass", "clink", "cheers", "kitchen")),
    "Drill": (("electric drill", "power drill running", "cordless drill"), ("drill", "tool", "motor", "diy")),
    "Hammer": (("hammering nails", "hammer on metal", "workshop hammer"), ("hammer", "tool", "nail", "workshop")),
    "Cricket": (("crickets at night", "field cricket", "cricket chirping"), ("cricket", "insect", "night", "summer")),
    "Thunder": (("thunder rumble", "distant thunderstorm", "thunder clap"), ("thunder", "storm", "weather", "rumble")),
    "Water tap, faucet": (("running tap water", "kitchen faucet", "bathroom sink tap"), ("water", "tap", "faucet", "sink")),
    "Gunshot, gunfire": (("gun shots", "pistol firing", "rifle shots outdoors"), ("gun", "gunshot", "shot", "weapon")),
    "Snare drum": (("snare drum beat", "snare hits", "marching snare"), ("snare", "drum", "percussion", "beat")),
    "Bass drum": (("kick drum", "bass drum hits", "kick loop"), ("kick", "bass-drum", "drum", "percussion")),
    "Acoustic guitar": (
        ("acoustic guitar picking", "guitar notes", "fingerstyle guitar"),
        ("guitar", "acoustic", "strings", "music"),
    ),
    "Tick-tock": (("clock ticking", "old wall clock", "tick tock clock"), ("clock", "tick", "tock", "time")),
    "Typing": (("typing on keyboard", "keyboard typing", "office typing"), ("typing", "keyboard", "computer", "office")),
    "Frog": (("frog croaking", "frogs at the pond", "tree frog call"), ("frog", "croak", "pond", "amphibian")),
    "Purr": (("cat purring", "purring kitten", "happy cat purr"), ("cat", "purr", "pet", "animal")),
    "Harmonica": (("harmonica chords", "blues harmonica", "mouth organ"), ("harmonica", "music", "blues", "instrument")),
    "Glockenspiel": (
        ("glockenspiel melody", "glockenspiel notes", "toy glockenspiel"),
        ("glockenspiel", "bells", "music", "mallet"),
    ),
    "Buzz": (("fly buzzing", "bee buzzing around", "insect buzz"), ("buzz", "insect", "fly", "bee")),
}
_PLACES = (
    "in a small room", "outdoors", "in the garden", "in a home studio",
    "near a busy street", "in the kitchen", "at night", "in a hallway",
)  # fmt: skip
_DEVICES = (
    "a handheld recorder",
    "a phone",
    "a shotgun microphone",
    "a pair of condenser mics",
    "a dynamic mic",
    "a portable recorder",
)
_EXTRA_TAGS = ("field-recording", "sfx", "sound", "recording", "mono", "foley", "effect", "raw")
_SYLLABLES = ("ka", "lo", "mi", "ra", "to", "ne", "su", "vi", "de", "po", "ja", "el", "fo", "gu", "ri", "an")
_HANDLE_SUFFIXES = ("", "audio", "sound", "rec", "fx", "_", "music")


def _uploader(k: int, split: str) -> str:
    """A made-up username; dev and eval draw from disjoint pools, as FSD50K splits by uploader."""
    k = 2 * k + (1 if split == "eval" else 0)
    syl = len(_SYLLABLES)
    name = _SYLLABLES[k % syl] + _SYLLABLES[(k // syl) % syl] + _SYLLABLES[(k // syl**2) % syl]
    # The syllables encode k mod 16**3 and the number the rest (k // 16**3, k % 97 < 100),
    # so different k give different names.
    return f"{name}{_HANDLE_SUFFIXES[k % len(_HANDLE_SUFFIXES)]}{(k // syl**3) * 100 + k % 97}"


def _metadata(plan: _ClipPlan, rng: np.random.Generator, n_uploaders: int) -> dict:
    texts = [_TEXT[FSD50K_LEAF_CLASSES[c]] for c in plan.classes]
    phrases = [t[0][int(rng.integers(len(t[0])))] for t in texts]
    subject = " and ".join(phrases)
    title = f"{subject} {int(rng.integers(1, 40)):02d}.wav" if rng.random() < 0.5 else subject.title()
    description = (
        f"{subject[0].upper()}{subject[1:]}, recorded {_PLACES[int(rng.integers(len(_PLACES)))]} "
        f"with {_DEVICES[int(rng.integers(len(_DEVICES)))]}."
    )
    tags = list(dict.fromkeys([tag for t in texts for tag in t[1]]))
    tags += [str(t) for t in rng.choice(_EXTRA_TAGS, size=int(rng.integers(0, 3)), replace=False)]
    return {
        "title": title,
        "description": description,
        "tags": tags,
        "license": LICENSES[int(rng.choice(len(LICENSES), p=_LICENSE_WEIGHTS))],
        "uploader": _uploader(int(rng.integers(n_uploaders)), plan.split),
    }


# --------------------------------------------------------------------------- writing


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_audio_atomically(path: Path, data: np.ndarray, sample_rate_hz: int, subtype: str, fmt: str) -> None:
    """Write integer samples (int16 for PCM_16, int32 for PCM_24) under a temporary name, then rename."""
    tmp = _tmp_name(path)
    try:
        sf.write(tmp, data, sample_rate_hz, subtype=subtype, format=fmt)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def csv_text(rows: list[list[str]]) -> str:
    """Rows as CSV; fields with commas are quoted, as in FSD50K's ground truth."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerows(rows)
    return buf.getvalue()


def _write_clip(i: int, seed: int, out_dir: Path, n_uploaders: int) -> tuple[str, list[str], dict]:
    """Render and write clip ``i``; return its split part, CSV row and metadata entry."""
    onto = default_ontology()
    rng = np.random.default_rng([seed, i])
    plan = _plan_clip(i, seed, rng)
    audio = _render(plan, rng)
    part = "eval" if plan.split == "eval" else "dev"
    write_audio_atomically(out_dir / AUDIO_DIRS[part] / f"{plan.fname}.wav", audio, SAMPLE_RATE_HZ, "PCM_16", "WAV")
    labels, mids = _labels_and_mids(onto, plan.classes)
    row = [str(plan.fname), ",".join(labels), ",".join(mids)]
    return part, (row + [plan.split] if part == "dev" else row), _metadata(plan, rng, n_uploaders)


def write_fsd50k_corpus(out_dir: Path, n_clips: int = 240, seed: int = 0, compute: ComputeParams | None = None) -> None:
    """Write ``n_clips`` synthetic clips with FSD50K's folders, ground truth and metadata.

    Clips are rendered through :func:`pipeline.compute.map_ordered` (in this process unless
    ``compute`` asks for workers); each depends on ``(seed, index)`` alone, so the bytes do
    not depend on the number of workers.
    """
    if n_clips < 1:
        raise ValueError(f"n_clips must be at least 1, not {n_clips}")
    if n_clips > _FNAME_MODULUS:
        raise ValueError(f"n_clips must be at most {_FNAME_MODULUS}")
    out_dir = Path(out_dir)
    onto = default_ontology()
    for sub in (*AUDIO_DIRS.values(), GROUND_TRUTH, METADATA):
        (out_dir / sub).mkdir(parents=True, exist_ok=True)
    # Uploaders: a pool growing with the corpus, so each uploads a handful of clips.
    n_uploaders = max(8, n_clips // 6)
    rows: dict[str, list[list[str]]] = {"dev": [], "eval": []}
    meta: dict[str, dict[str, dict]] = {"dev": {}, "eval": {}}
    work = partial(_write_clip, seed=seed, out_dir=out_dir, n_uploaders=n_uploaders)
    for part, row, info in map_ordered(
        work, range(n_clips), compute or ComputeParams(workers=1, chunk_size=64), desc="fsd50k corpus"
    ):
        rows[part].append(row)
        meta[part][row[0]] = info

    # Ground truth last: an interrupted run leaves no tables pointing at missing audio.
    gt = out_dir / GROUND_TRUTH
    write_atomic(
        gt / "vocabulary.csv", csv_text([[str(k), lab, mid] for k, (lab, mid) in enumerate(vocabulary(onto))]).encode("utf-8")
    )
    write_atomic(gt / "dev.csv", csv_text([["fname", "labels", "mids", "split"], *rows["dev"]]).encode("utf-8"))
    write_atomic(gt / "eval.csv", csv_text([["fname", "labels", "mids"], *rows["eval"]]).encode("utf-8"))
    for part in ("dev", "eval"):
        text = json.dumps(meta[part], sort_keys=True, ensure_ascii=False)
        write_atomic(out_dir / METADATA / f"{part}_clips_info_FSD50K.json", text.encode("utf-8"))
