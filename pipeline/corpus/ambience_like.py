"""A synthetic ambience library: category folders of long background recordings plus a metadata CSV.

Input: an output folder, a recording count (at least :data:`MIN_RECORDINGS`) and a seed.
Output (:func:`write_ambience_library`)::

    out_dir/<Category>/<Name>_<index>.wav|.flac
    out_dir/metadata.csv    filename,category,subcategory,description,license,author

``filename`` is the path relative to ``out_dir``. Most recordings are stationary beds (rain,
wind, room tone, traffic hum, crowd babble, HVAC hum, surf, fire crackle, forest air) of
30-180 s, drawn toward the short end so the default size writes in seconds, at -45 to
-20 dBFS RMS and never clipping. The category is mostly "Ambiance", sometimes "Ambience"
(the other spelling); "Foley", "Impacts" and "Vehicles" rows hold foreground sounds that
an ambience filter must drop.

The first :data:`MIN_RECORDINGS` recordings are fixed so that any size covers the cases a
reader must handle: every sample rate of :data:`SAMPLE_RATES_HZ`, mono and stereo
(decorrelated channels), WAV PCM_16, WAV PCM_24 and FLAC, an Ambiance file shorter than
10 s, and an Ambiance file with a salient transient (a ~0.5 s burst ~20 dB above its bed).
Recording ``i`` depends only on ``(seed, i)``; files are written under a temporary name and
renamed into place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import signal

from pipeline.corpus.fsd50k_like import LICENSES, csv_text, write_audio_atomically
from pipeline.outputs import write_atomic

SAMPLE_RATES_HZ = (16000, 22050, 32000, 44100, 48000)
METADATA_COLUMNS = ("filename", "category", "subcategory", "description", "license", "author")
RMS_DBFS = (-45.0, -20.0)
_TRANSIENT_BED_RMS_DBFS = (-45.0, -38.0)  # room for a +20 dB burst below full scale
TRANSIENT_DB = 20.0
TRANSIENT_S = 0.5
_MAX_PEAK = 10.0 ** (-1.0 / 20.0)
_STEREO_BLEED = 0.25  # share of each channel in the other: correlation ~0.45
LONG_RANGE_S = (30.0, 180.0)
# The first recordings (the default size) stay near the short end, so generating the
# default library takes seconds; later ones use the whole range.
_EARLY_RECORDINGS, _EARLY_RANGE_S = 12, (30.0, 70.0)

_FORMATS = {  # name: (soundfile format, subtype, extension)
    "wav16": ("WAV", "PCM_16", "wav"),
    "wav24": ("WAV", "PCM_24", "wav"),
    "flac16": ("FLAC", "PCM_16", "flac"),
    "flac24": ("FLAC", "PCM_24", "flac"),
}


@dataclass(frozen=True)
class _Spec:
    category: str
    kind: str
    sample_rate_hz: int
    channels: int
    fmt: str
    dur_s: tuple[float, float]
    transient: bool = False


_REQUIRED = (
    _Spec("Ambiance", "rain", 44100, 2, "wav16", (30.0, 50.0)),
    _Spec("Ambiance", "room_tone", 48000, 1, "flac16", (4.0, 9.0)),  # short: a length filter must drop it
    _Spec("Ambiance", "traffic", 32000, 1, "wav24", (30.0, 50.0), transient=True),
    _Spec("Ambience", "wind", 22050, 2, "flac16", (30.0, 50.0)),
    _Spec("Foley", "footsteps", 44100, 1, "wav16", (8.0, 20.0)),
    _Spec("Ambiance", "crowd", 16000, 1, "wav16", (30.0, 50.0)),
    _Spec("Impacts", "impacts", 48000, 2, "wav24", (5.0, 15.0)),
    _Spec("Vehicles", "pass_by", 44100, 2, "flac24", (10.0, 25.0)),
)
MIN_RECORDINGS = len(_REQUIRED)

# Beds the fixed recordings lack come first, so the default size has every kind.
_BED_ORDER = ("hvac", "surf", "fire", "forest", "rain", "wind", "room_tone", "traffic", "crowd")
_FOREGROUND = {"Foley": "footsteps", "Impacts": "impacts", "Vehicles": "pass_by"}
_CATEGORY_WEIGHTS = {"Ambiance": 0.7, "Ambience": 0.15, "Foley": 0.05, "Impacts": 0.05, "Vehicles": 0.05}
_FORMAT_WEIGHTS = {"wav16": 0.4, "wav24": 0.3, "flac16": 0.2, "flac24": 0.1}

_TEXT: dict[str, tuple[str, tuple[str, ...], str]] = {  # kind: subcategory, name words, description
    "rain": ("Rain", ("Light_On_Roof", "Steady_Window", "Heavy_Street", "Drizzle_Garden"), "Steady rain, no thunder"),
    "wind": ("Wind", ("Gusty_Field", "Through_Trees", "Coastal_Gusts", "Light_Breeze"), "Wind with gusts, no birds"),
    "room_tone": (
        "Room Tone",
        ("Empty_Office", "Quiet_Bedroom", "Studio_Silence", "Hotel_Room"),
        "Room tone with faint mains hum",
    ),
    "traffic": ("Traffic", ("Distant_Highway", "City_Street", "Ring_Road_Hum", "Suburb_Cars"), "Traffic hum with passing cars"),
    "crowd": (
        "Crowd",
        ("Cafe_Walla", "Restaurant_Murmur", "Lobby_Babble", "Market_Walla"),
        "Indoor crowd babble, no intelligible speech",
    ),
    "hvac": ("HVAC", ("Air_Conditioner", "Ventilation_Duct", "Server_Room", "Office_Fan_Coil"), "HVAC hum with steady fan tone"),
    "surf": ("Surf", ("Gentle_Waves", "Beach_Waves", "Rocky_Shore", "Calm_Lake_Shore"), "Waves breaking on a shore"),
    "fire": ("Fire", ("Campfire_Crackle", "Fireplace_Close", "Wood_Stove", "Bonfire_Night"), "Crackling fire with low roar"),
    "forest": ("Forest", ("Morning_Air", "Leaves_Rustle", "Pine_Forest", "Quiet_Woods"), "Forest air with distant birds"),
    "footsteps": ("Footsteps", ("Gravel_Walk", "Wood_Floor", "Concrete_Steps"), "Footsteps, close perspective"),
    "impacts": ("Metal", ("Heavy_Hits", "Door_Slams", "Crate_Drops"), "Isolated heavy impacts"),
    "pass_by": ("Car", ("Pass_By_Fast", "Pass_By_Slow", "Drive_By"), "Single car passing by"),
}
_AUTHORS = (
    "Mara Lind",
    "J. Okafor",
    "fieldrec_tom",
    "Ines Carvalho",
    "soundwalker",
    "K. Tanaka",
    "ambient_ana",
    "Piotr Zawadzki",
)
_PLACES = (
    "recorded in Lisbon", "recorded in the Black Forest", "recorded near Osaka",
    "recorded in Lagos", "recorded in Gdansk", "location unknown",
)  # fmt: skip


# --------------------------------------------------------------------------- signal helpers


def _sos(sr: int, lo: float | None, hi: float | None, order: int = 2) -> np.ndarray:
    nyq = 0.5 * sr
    if hi is not None and hi >= 0.9 * nyq:
        hi = None
    if lo is not None and hi is not None:
        sos = signal.butter(order, [lo, hi], btype="bandpass", fs=sr, output="sos")
    elif lo is not None:
        sos = signal.butter(order, lo, btype="highpass", fs=sr, output="sos")
    else:
        sos = signal.butter(order, hi, btype="lowpass", fs=sr, output="sos")
    return sos.astype(np.float32)


def _noise(
    rng: np.random.Generator, n: int, ch: int, sr: int, lo: float | None = None, hi: float | None = None, order: int = 2
) -> np.ndarray:
    """(n, ch) Gaussian noise, band-limited; channels are independent."""
    x = rng.standard_normal((n, ch), dtype=np.float32)
    if lo is None and hi is None:
        return x
    return signal.sosfilt(_sos(sr, lo, hi, order), x, axis=0)


# Paul Kellet's economy pinking filter: -3 dB/octave within ~1 dB over the audio band.
_PINK_SOS = signal.tf2sos(
    [0.049922035, -0.095993537, 0.050612699, -0.004408786], [1.0, -2.494956002, 2.017265875, -0.522189400]
).astype(np.float32)


def _pink(rng: np.random.Generator, n: int, ch: int) -> np.ndarray:
    x = signal.sosfilt(_PINK_SOS, rng.standard_normal((n, ch), dtype=np.float32), axis=0)
    return x / max(float(np.std(x)), 1e-12)


def _control(rng: np.random.Generator, n: int, sr: int, rate_hz: float) -> np.ndarray:
    """(n, 1) smooth random curve in [-1, 1] with about ``rate_hz`` bandwidth, shared by all channels."""
    ctrl_hz = 4.0 * rate_hz
    m = int(n / sr * ctrl_hz) + 3
    pts = np.tanh(rng.standard_normal(m))
    return np.interp(np.arange(n) * (ctrl_hz / sr), np.arange(m), pts).astype(np.float32)[:, None]


def _curve(n: int, sr: int, fn, ctrl_hz: float = 50.0) -> np.ndarray:
    """(n, 1) envelope computed by ``fn(times)`` at a control rate and interpolated."""
    m = int(n / sr * ctrl_hz) + 2
    tc = np.arange(m) / ctrl_hz
    return np.interp(np.arange(n) * (ctrl_hz / sr), np.arange(m), fn(tc)).astype(np.float32)[:, None]


def _sparse(rng: np.random.Generator, n: int, ch: int, sr: int, rate_hz: float, heavy: bool = False) -> np.ndarray:
    """(n, ch) Poisson-timed impulses: drops, crackles."""
    out = np.zeros((n, ch), dtype=np.float32)
    for c in range(ch):
        k = int(rng.poisson(rate_hz * n / sr))
        pos = rng.integers(0, n, size=k)
        # Heavy-tailed for crackles, but capped: a bed must not turn into isolated bangs.
        amp = np.minimum(rng.pareto(3.0, size=k) + 0.2, 5.0) if heavy else rng.exponential(1.0, size=k)
        out[pos, c] = (amp * rng.choice([-1.0, 1.0], size=k)).astype(np.float32)
    return out


def _tones(n: int, sr: int, freqs: list[float], amps: list[float]) -> np.ndarray:
    t = np.arange(n) / sr
    return sum(a * np.sin(2 * np.pi * f * t) for f, a in zip(freqs, amps) if f < 0.45 * sr).astype(np.float32)[:, None]


# --------------------------------------------------------------------------- beds


def _rain(rng, n, sr, ch):
    hiss = signal.sosfilt(_sos(sr, 400.0, None), _pink(rng, n, ch), axis=0)
    drops = signal.sosfilt(_sos(sr, 2000.0, 8000.0), _sparse(rng, n, ch, sr, rng.uniform(150.0, 400.0)), axis=0)
    return hiss + 3.0 * drops


def _wind(rng, n, sr, ch):
    gust = (0.35 + 0.65 * (0.5 + 0.5 * _control(rng, n, sr, rng.uniform(0.08, 0.25)))) ** 2
    body = _noise(rng, n, ch, sr, None, rng.uniform(350.0, 700.0))
    whistle = 0.3 * _noise(rng, n, ch, sr, 330.0, 420.0, order=4) * _curve(n, sr, lambda t: 0.5 + 0.5 * np.sin(0.4 * t))
    return (body + whistle) * gust


def _room_tone(rng, n, sr, ch):
    mains = float(rng.choice([50.0, 60.0]))
    bed = signal.sosfilt(_sos(sr, None, 3000.0), _pink(rng, n, ch), axis=0)
    return bed + _tones(n, sr, [mains, 2 * mains, 3 * mains], [0.25, 0.12, 0.05])


def _traffic(rng, n, sr, ch):
    dur = n / sr
    cars = rng.uniform(0.0, dur, size=int(rng.poisson(0.15 * dur)) + 1)
    widths = rng.uniform(2.0, 4.0, size=len(cars))
    levels = rng.uniform(0.5, 1.5, size=len(cars))

    def swell(t):
        return 0.6 + np.sum(levels[:, None] * np.exp(-0.5 * ((t[None, :] - cars[:, None]) / widths[:, None]) ** 2), axis=0)

    hum = _noise(rng, n, ch, sr, None, 350.0) + 0.3 * _noise(rng, n, ch, sr, 400.0, 1500.0)
    return hum * _curve(n, sr, swell)


def _crowd(rng, n, sr, ch):
    out = np.zeros((n, ch), dtype=np.float32)
    for (lo, hi), w in zip(((300.0, 900.0), (900.0, 2000.0), (2000.0, 3500.0)), (1.0, 0.6, 0.25)):
        # Many talkers: the syllabic modulation mostly averages out, a little remains.
        out += w * _noise(rng, n, ch, sr, lo, hi) * (0.7 + 0.3 * _control(rng, n, sr, rng.uniform(3.0, 5.0)))
    return out


def _hvac(rng, n, sr, ch):
    blade = rng.uniform(90.0, 130.0)
    bed = signal.sosfilt(_sos(sr, None, 1500.0), _pink(rng, n, ch), axis=0)
    return bed + _tones(n, sr, [blade, 2 * blade, 3 * blade, 60.0], [0.3, 0.15, 0.07, 0.1])


def _surf(rng, n, sr, ch):
    period = rng.uniform(7.0, 11.0)
    phase0 = rng.uniform(0.0, 1.0)

    def waves(t):
        ph = (t / period + phase0) % 1.0
        return 0.25 + 0.75 * np.where(ph < 0.2, ph / 0.2, np.exp(-(ph - 0.2) / 0.25))

    return _noise(rng, n, ch, sr, 100.0, 3000.0) * _curve(n, sr, waves)


def _fire(rng, n, sr, ch):
    roar = 0.6 * _noise(rng, n, ch, sr, None, 300.0)
    crackle = signal.sosfilt(_sos(sr, 1000.0, 6000.0), _sparse(rng, n, ch, sr, rng.uniform(10.0, 25.0), heavy=True), axis=0)
    return roar + 3.0 * crackle


def _forest(rng, n, sr, ch):
    leaves = 0.4 * _noise(rng, n, ch, sr, 1500.0, 8000.0) * (0.7 + 0.3 * _control(rng, n, sr, 0.2))
    distant = 0.3 * _noise(rng, n, ch, sr, None, 200.0)
    birds = np.zeros((n, ch), dtype=np.float32)
    m = int(0.1 * sr)
    u = np.arange(m) / m
    for start in rng.integers(0, max(1, n - m), size=int(rng.poisson(0.3 * n / sr))):
        f = rng.uniform(2500.0, 4000.0) * (1.0 + 0.3 * u)
        chirp = (np.sin(2 * np.pi * np.cumsum(f) / sr) * np.sin(np.pi * u) ** 2).astype(np.float32)
        birds[start : start + m, int(rng.integers(ch))] += 0.25 * chirp  # far away: one side at a time
    return leaves + distant + birds


# --------------------------------------------------------------------------- foreground (filtered out)


def _events(rng, n, sr, ch, period_s, make):
    out = np.zeros((n, ch), dtype=np.float32)
    t = rng.uniform(0.0, period_s)
    while t < n / sr:
        g = make()
        a = int(t * sr)
        m = min(len(g), n - a)
        out[a : a + m] += g[:m, None] * rng.uniform(0.6, 1.0, size=ch).astype(np.float32)
        t += period_s * rng.uniform(0.8, 1.25)
    return out


def _decay_grain(rng, sr, dur_s, lo, hi, decay_s, freqs=(), decays=()):
    m = int(dur_s * sr)
    t = np.arange(m) / sr
    g = signal.sosfilt(_sos(sr, lo, hi), rng.standard_normal(m).astype(np.float32)) * np.exp(-t / decay_s)
    for f, d in zip(freqs, decays):
        g += np.exp(-t / d) * np.sin(2 * np.pi * f * t)
    return g.astype(np.float32)


def _footsteps(rng, n, sr, ch):
    floor = 0.02 * _noise(rng, n, ch, sr, None, 2000.0)
    return floor + _events(rng, n, sr, ch, rng.uniform(0.5, 0.65), lambda: _decay_grain(rng, sr, 0.2, 200.0, 3000.0, 0.05))


def _impacts(rng, n, sr, ch):
    floor = 0.01 * _noise(rng, n, ch, sr, None, 2000.0)

    def hit():
        return _decay_grain(rng, sr, 1.0, 100.0, 4000.0, 0.08, (80.0, 230.0, 600.0), (0.3, 0.2, 0.1))

    return floor + _events(rng, n, sr, ch, rng.uniform(1.5, 3.0), hit)


def _pass_by(rng, n, sr, ch):
    dur = n / sr
    t = np.arange(n) / sr
    tc = rng.uniform(0.35, 0.65) * dur
    f0 = rng.uniform(35.0, 50.0)
    f = f0 * (1.0 + 0.08 * np.tanh(-(t - tc) / 1.5))  # Doppler: pitch drops as the car passes
    phase = 2 * np.pi * np.cumsum(f) / sr
    engine = sum(np.sin(k * phase) / k for k in range(1, 13)).astype(np.float32)
    tyres = _noise(rng, n, ch, sr, None, 1500.0)
    env = _curve(n, sr, lambda tt: 0.1 + np.exp(-0.5 * ((tt - tc) / (dur / 6.0)) ** 2))
    x = (0.5 * engine[:, None] + tyres) * env
    if ch == 2:  # moves from left to right
        x *= 1.0 + np.linspace(-1.0, 1.0, n, dtype=np.float32)[:, None] * np.array([[-0.3, 0.3]], dtype=np.float32)
    return x


_MODELS = {
    "rain": _rain,
    "wind": _wind,
    "room_tone": _room_tone,
    "traffic": _traffic,
    "crowd": _crowd,
    "hvac": _hvac,
    "surf": _surf,
    "fire": _fire,
    "forest": _forest,
    "footsteps": _footsteps,
    "impacts": _impacts,
    "pass_by": _pass_by,
}


def _transient(rng: np.random.Generator, sr: int) -> np.ndarray:
    """A car horn blast: 0.5 s, mono, unit RMS over its length.

    Sustained rather than struck, so that every ~0.1 s frame of it stands ~20 dB over the
    bed, and its crest factor leaves headroom under full scale.
    """
    m = int(TRANSIENT_S * sr)
    t = np.arange(m) / sr
    f0 = rng.uniform(380.0, 520.0)
    g = sum(np.sin(2 * np.pi * k * f0 * t) / k for k in range(1, 9) if k * f0 < 0.45 * sr)
    g = g + 0.2 * signal.sosfilt(_sos(sr, 300.0, 4000.0), rng.standard_normal(m).astype(np.float32))
    g *= np.minimum(1.0, np.minimum(t / 0.015, (TRANSIENT_S - t) / 0.06))
    g = g.astype(np.float32)
    return g / max(float(np.sqrt(np.mean(np.square(g, dtype=np.float64)))), 1e-12)


# --------------------------------------------------------------------------- planning and writing


def _spec(i: int, rng: np.random.Generator) -> _Spec:
    if i < len(_REQUIRED):
        return _REQUIRED[i]
    category = str(rng.choice(list(_CATEGORY_WEIGHTS), p=list(_CATEGORY_WEIGHTS.values())))
    if category in _FOREGROUND:
        return _Spec(
            category,
            _FOREGROUND[category],
            int(rng.choice(SAMPLE_RATES_HZ)),
            int(rng.integers(1, 3)),
            str(rng.choice(list(_FORMAT_WEIGHTS), p=list(_FORMAT_WEIGHTS.values()))),
            (5.0, 30.0),
        )
    kind = _BED_ORDER[(i - len(_REQUIRED)) % len(_BED_ORDER)]
    short = rng.random() < 0.05
    return _Spec(
        category,
        kind,
        int(rng.choice(SAMPLE_RATES_HZ)),
        int(rng.integers(1, 3)),
        str(rng.choice(list(_FORMAT_WEIGHTS), p=list(_FORMAT_WEIGHTS.values()))),
        (3.0, 9.5) if short else (_EARLY_RANGE_S if i < _EARLY_RECORDINGS else LONG_RANGE_S),
        transient=bool(rng.random() < 0.2),
    )


def _duration(spec: _Spec, rng: np.random.Generator) -> float:
    lo, hi = spec.dur_s
    # Cubed uniform: the full range occurs, but most draws stay near its short end.
    return lo + (hi - lo) * float(rng.random()) ** 3


def _render(spec: _Spec, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, channels) float32 at the drawn level, peak under -1 dBFS."""
    sr, ch = spec.sample_rate_hz, spec.channels
    x = _MODELS[spec.kind](rng, n, sr, ch).astype(np.float32)
    if ch == 2:
        mix = np.array([[1.0, _STEREO_BLEED], [_STEREO_BLEED, 1.0]], dtype=np.float32) / np.float32(
            math.hypot(1.0, _STEREO_BLEED)
        )
        x = x[:, :1] * mix[0] + x[:, 1:] * mix[1]  # not BLAS, whose FMA use varies by CPU
    rms_db = rng.uniform(*(_TRANSIENT_BED_RMS_DBFS if spec.transient else RMS_DBFS))
    bed_rms = 10.0 ** (rms_db / 20.0)
    x *= np.float32(bed_rms / max(float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))), 1e-12))
    if spec.transient:
        burst = _transient(rng, sr) * np.float32(bed_rms * 10.0 ** (TRANSIENT_DB / 20.0))
        a = int(rng.uniform(0.25, 0.75) * (n - len(burst)))
        x[a : a + len(burst)] += burst[:, None] * np.array([1.0, 0.8][:ch], dtype=np.float32)
    peak = float(np.max(np.abs(x)))
    if peak > _MAX_PEAK:
        x *= np.float32(_MAX_PEAK / peak)
    return x


def _to_int(x: np.ndarray, subtype: str) -> np.ndarray:
    if subtype == "PCM_16":
        return np.round(x * 32767.0).astype(np.int16)
    # 24-bit: soundfile keeps the top 24 bits of int32 samples.
    return np.left_shift(np.round(x * 8388607.0).astype(np.int32), 8)


def write_ambience_library(out_dir: Path, n_recordings: int = 12, seed: int = 0) -> None:
    """Write ``n_recordings`` recordings (at least :data:`MIN_RECORDINGS`) and ``metadata.csv``."""
    if n_recordings < MIN_RECORDINGS:
        raise ValueError(f"n_recordings must be at least {MIN_RECORDINGS} (the fixed cases), not {n_recordings}")
    out_dir = Path(out_dir)
    rows = [list(METADATA_COLUMNS)]
    for i in range(n_recordings):
        rng = np.random.default_rng([seed, i])
        spec = _spec(i, rng)
        n = int(round(_duration(spec, rng) * spec.sample_rate_hz))
        fmt, subtype, ext = _FORMATS[spec.fmt]
        subcategory, words, description = _TEXT[spec.kind]
        rel = f"{spec.category}/{subcategory.replace(' ', '_')}_{words[int(rng.integers(len(words)))]}_{i:03d}.{ext}"
        x = _render(spec, n, rng)
        (out_dir / spec.category).mkdir(parents=True, exist_ok=True)
        write_audio_atomically(out_dir / rel, _to_int(x, subtype), spec.sample_rate_hz, subtype, fmt)
        channels = "stereo" if spec.channels == 2 else "mono"
        text = f"{description}; {channels}, {_PLACES[int(rng.integers(len(_PLACES)))]}."
        author = _AUTHORS[int(rng.integers(len(_AUTHORS)))]
        rows.append([rel, spec.category, subcategory, text, LICENSES[int(rng.integers(len(LICENSES)))], author])
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / "metadata.csv", csv_text(rows).encode("utf-8"))
