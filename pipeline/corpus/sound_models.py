"""Class sound models for the synthetic FSD50K-like corpus.

Input: an AudioSet display name from :data:`CLASS_NAMES`, a ``numpy.random.Generator``,
a duration in seconds and a sample rate.
Output (:func:`synthesize`): a mono float32 array of ``round(duration_s * sample_rate_hz)``
samples, peak-normalised to 1.0, holding one continuous stretch of that class's sound.

Every class has a fixed recipe (centre frequencies, repetition rates, envelopes) from one
of six families (:data:`CLASS_FAMILIES`): tonal, harmonic, noisy, impulsive, swept and
modulated. A call only perturbs the recipe by a few percent, so clips of one class share a
recognisable spectro-temporal signature while no two clips are identical. Only numpy and
``scipy.signal`` are used; the output depends on nothing but the arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache

import numpy as np
from scipy import signal

Model = Callable[[np.random.Generator, int, int], np.ndarray]

TWO_PI = 2.0 * np.pi
_TABLE_SIZE = 4096  # power of two: phase indices wrap with a bit mask


# --------------------------------------------------------------------------- helpers


def _jit(rng: np.random.Generator, value: float, rel: float = 0.04) -> float:
    """``value`` scaled by a log-normal factor: keeps frequencies and rates positive."""
    return value * float(np.exp(rng.normal(0.0, rel)))


@lru_cache(maxsize=512)  # most bands are fixed per class; designing them dominated the run time
def _sos(sr: int, lo: float | None, hi: float | None, order: int = 2) -> np.ndarray:
    nyq = 0.5 * sr
    if hi is not None and hi >= 0.9 * nyq:
        hi = None
    if lo is not None and hi is not None and lo >= 0.8 * hi:
        # Only reachable at low sample rates; keep a usable band instead of failing.
        lo = 0.5 * hi
    if lo is not None and hi is not None:
        sos = signal.butter(order, [lo, hi], btype="bandpass", fs=sr, output="sos")
    elif lo is not None:
        sos = signal.butter(order, lo, btype="highpass", fs=sr, output="sos")
    elif hi is not None:
        sos = signal.butter(order, hi, btype="lowpass", fs=sr, output="sos")
    else:
        raise ValueError("a band needs lo or hi")
    return sos.astype(np.float32)


def _filt(x: np.ndarray, sr: int, lo: float | None, hi: float | None, order: int = 2) -> np.ndarray:
    # float32 filtering is several times faster than float64 and precise enough for
    # 16-bit output.
    return signal.sosfilt(_sos(sr, lo, hi, order), x.astype(np.float32, copy=False), axis=0)


def _noise(
    rng: np.random.Generator, n: int, sr: int, lo: float | None = None, hi: float | None = None, order: int = 2
) -> np.ndarray:
    x = rng.standard_normal(n, dtype=np.float32)
    if lo is None and hi is None:
        return x
    return _filt(x, sr, lo, hi, order)


def _time(n: int, sr: int) -> np.ndarray:
    return np.arange(n, dtype=np.float64) / sr


def _osc(freq_hz: np.ndarray | float, n: int, sr: int, amps: Sequence[float], phase0: float = 0.0) -> np.ndarray:
    """Harmonic oscillator (harmonic k has amplitude ``amps[k-1]``), wavetable based.

    A lookup table makes the cost independent of the number of harmonics; harmonics that
    would pass 0.45 * sr at the highest instantaneous frequency are dropped (no aliasing).
    """
    f = np.broadcast_to(np.asarray(freq_hz, dtype=np.float64), (n,))
    if n == 0:
        return np.zeros(0, dtype=np.float32)
    k_max = max(1, int(0.45 * sr // max(float(f.max()), 1.0)))
    ph = np.arange(_TABLE_SIZE) * (TWO_PI / _TABLE_SIZE)
    table = np.zeros(_TABLE_SIZE)
    for k, a in enumerate(amps[:k_max], start=1):
        if a:
            table += a * np.sin(k * ph)
    cycles = phase0 / TWO_PI + np.cumsum(f) / sr
    idx = ((cycles - np.floor(cycles)) * _TABLE_SIZE).astype(np.int64) & (_TABLE_SIZE - 1)
    return table.astype(np.float32)[idx]


def _ring(
    sr: int,
    dur_s: float,
    freqs: Sequence[float],
    amps: Sequence[float],
    decays_s: Sequence[float],
    attack_s: float = 0.001,
) -> np.ndarray:
    """A struck object: exponentially decaying partials."""
    m = max(1, int(dur_s * sr))
    t64 = _time(m, sr)
    t = t64.astype(np.float32)
    g = np.zeros(m, dtype=np.float32)
    for f, a, d in zip(freqs, amps, decays_s):
        if f < 0.45 * sr:
            # Phase wrapped in float64, sin and exp in float32: about half the cost of
            # float64 throughout, without float32's phase error at large arguments.
            ph = ((t64 * f) % 1.0).astype(np.float32) * np.float32(TWO_PI)
            g += np.float32(a) * np.exp(t * np.float32(-1.0 / d)) * np.sin(ph)
    if attack_s > 0:
        g *= 1.0 - np.exp(t * np.float32(-1.0 / attack_s))
    return g


def _decay_noise(
    rng: np.random.Generator, sr: int, dur_s: float, lo: float | None, hi: float | None, decay_s: float
) -> np.ndarray:
    m = max(1, int(dur_s * sr))
    t = _time(m, sr)
    env = (1.0 - np.exp(-t / 0.0005)) * np.exp(-t / decay_s)
    return (_noise(rng, m, sr, lo, hi) * env).astype(np.float32)


def _overlay(out: np.ndarray, grain: np.ndarray, start: int, gain: float = 1.0) -> None:
    if start >= len(out) or start < 0:
        return
    m = min(len(grain), len(out) - start)
    out[start : start + m] += gain * grain[:m]


def _onsets(rng: np.random.Generator, n: int, sr: int, period_s: float, jitter: float = 0.1) -> list[int]:
    """Event starts every ``period_s`` (log-normal jitter); the first falls early enough that
    even a 0.3 s stretch holds one event."""
    dur = n / sr
    t = rng.uniform(0.0, min(0.15 * period_s, 0.25 * dur))
    starts = []
    while t < dur:
        starts.append(int(t * sr))
        t += period_s * float(np.exp(rng.normal(0.0, jitter)))
    return starts


def _slow(rng: np.random.Generator, n: int, sr: int, rate_hz: float) -> np.ndarray:
    """Smooth random fluctuation in [-1, 1] with about ``rate_hz`` bandwidth.

    Drawn at a control rate and interpolated, which is much cheaper than filtering noise
    at audio rate for modulators of a few hertz.
    """
    ctrl_hz = 4.0 * rate_hz
    m = int(n / sr * ctrl_hz) + 3
    pts = np.tanh(rng.standard_normal(m))
    x = np.arange(n, dtype=np.float64) * (ctrl_hz / sr)
    return np.interp(x, np.arange(m, dtype=np.float64), pts).astype(np.float32)


def _smooth(x: np.ndarray, sr: int, tau_s: float) -> np.ndarray:
    """One-pole smoothing (glides between held values)."""
    a = 1.0 - np.exp(-1.0 / (tau_s * sr))
    zi = signal.lfilter_zi([a], [1.0, a - 1.0]) * x[0]
    return signal.lfilter([a], [1.0, a - 1.0], x, zi=zi)[0]


def _grain_len(n: int, sr: int, want_s: float) -> float:
    # Grains longer than the stretch would only be truncated: skip computing them.
    return min(want_s, n / sr + 0.01)


# --------------------------------------------------------------------------- models


def _bark(rng, n, sr):
    f0 = _jit(rng, 480.0, 0.08)
    out = np.zeros(n, dtype=np.float32)
    for start in _onsets(rng, n, sr, _jit(rng, 0.45, 0.1), jitter=0.25):
        dur = _jit(rng, 0.17, 0.15)
        m = int(dur * sr)
        t = _time(m, sr)
        f = f0 * _jit(rng, 1.0, 0.05) * (1.2 - 0.4 * t / dur)  # pitch falls within a bark
        voiced = _osc(f, m, sr, [1.0, 0.8, 0.6, 0.45, 0.3, 0.2, 0.12, 0.08])
        rough = 0.35 * _noise(rng, m, sr, 700.0, 3000.0)
        env = (1.0 - np.exp(-t / 0.006)) * np.exp(-t / (0.35 * dur))
        _overlay(out, (voiced + rough) * env, start, _jit(rng, 1.0, 0.2))
    return out


def _meow(rng, n, sr):
    f0 = _jit(rng, 600.0, 0.07)
    amps = [float(np.exp(-((((k * f0) - 1500.0) / 1000.0) ** 2)) + 0.2 / k) for k in range(1, 12)]
    out = np.zeros(n, dtype=np.float32)
    for start in _onsets(rng, n, sr, _jit(rng, 1.0, 0.1), jitter=0.1):
        dur = _jit(rng, 0.85, 0.1)
        m = int(dur * sr)
        u = _time(m, sr) / dur
        f = f0 * (0.85 + 0.6 * np.sin(np.pi * u) ** 1.5 - 0.15 * u)  # "mee-ow": rise, fall
        _overlay(out, _osc(f, m, sr, amps) * np.sin(np.pi * u) ** 0.7, start, _jit(rng, 1.0, 0.15))
    return out


def _chirp_tweet(rng, n, sr):
    lo = _jit(rng, 3300.0, 0.04)
    hi = lo * _jit(rng, 1.6, 0.04)
    gap = _jit(rng, 0.11, 0.08)
    grains = []
    for _ in range(3):
        dur = _jit(rng, 0.05, 0.1)
        m = int(dur * sr)
        u = _time(m, sr) / dur
        f = (lo + (hi - lo) * u**0.7) * _jit(rng, 1.0, 0.03)  # fast upward sweep
        grains.append(_osc(f, m, sr, [1.0, 0.15]) * np.sin(np.pi * u) ** 2)
    out = np.zeros(n, dtype=np.float32)
    t = rng.uniform(0.0, min(0.05, 0.2 * n / sr))
    while t * sr < n:
        for _ in range(int(rng.integers(4, 9))):  # a phrase of chirps
            if t * sr >= n:
                break
            _overlay(out, grains[int(rng.integers(3))], int(t * sr), _jit(rng, 1.0, 0.15))
            t += gap * _jit(rng, 1.0, 0.08)
        t += _jit(rng, 0.3, 0.2)
    return out


def _church_bell(rng, n, sr):
    base = _jit(rng, 330.0, 0.04)
    ratios = (0.5, 1.0, 1.19, 1.5, 2.0, 2.52, 3.0)  # hum, prime, minor third, ...: bell partials
    glen = _grain_len(n, sr, 4.0)
    grain = _ring(
        sr,
        glen,
        [base * r for r in ratios],
        (0.7, 1.0, 0.6, 0.5, 0.45, 0.3, 0.2),
        (3.5, 2.5, 2.0, 1.6, 1.2, 0.8, 0.6),
        attack_s=0.002,
    )
    grain[: int(0.08 * sr)] += 0.3 * _decay_noise(rng, sr, 0.08, 1000.0, 4000.0, 0.01)[: len(grain)]
    out = np.zeros(n, dtype=np.float32)
    for start in _onsets(rng, n, sr, _jit(rng, 2.0, 0.05), jitter=0.03):
        _overlay(out, grain, start, _jit(rng, 1.0, 0.1))
    return out


def _bicycle_bell(rng, n, sr):
    f1 = _jit(rng, 3350.0, 0.03)
    # Two nearly equal partials beat at ~13 Hz: the characteristic "trrring".
    grain = _ring(sr, _grain_len(n, sr, 0.6), (f1, f1 * 1.004, f1 * 1.27, f1 * 2.06), (1.0, 0.8, 0.6, 0.3), (0.4, 0.4, 0.25, 0.1))
    out = np.zeros(n, dtype=np.float32)
    for start in _onsets(rng, n, sr, _jit(rng, 0.75, 0.05), jitter=0.08):
        _overlay(out, grain, start)
        _overlay(out, grain, start + int(0.075 * sr), 0.8)
    return out


def _vehicle_horn(rng, n, sr):
    t = _time(n, sr)
    f1 = _jit(rng, 415.0, 0.04)
    square = [1.0, 0.25, 0.33, 0.15, 0.2, 0.1, 0.14, 0.07, 0.11]
    wobble = 1.0 + 0.003 * np.sin(TWO_PI * 5.0 * t)
    x = _osc(f1 * wobble, n, sr, square) + 0.8 * _osc(f1 * 1.26 * wobble, n, sr, square)  # major third
    return _filt(x, sr, 250.0, 3500.0, order=1)


def _siren(rng, n, sr):
    t = _time(n, sr)
    fc = _jit(rng, 1000.0, 0.04)
    dev = _jit(rng, 380.0, 0.05)
    rate = _jit(rng, 0.22, 0.05)  # slow "wail" cycle
    f = fc + dev * np.sin(TWO_PI * rate * t + rng.uniform(0.0, TWO_PI))
    return _osc(f, n, sr, [1.0, 0.35, 0.15])


def _knock(rng, n, sr):
    fb = _jit(rng, 190.0, 0.06)
    glen = 0.15
    grain = _ring(sr, glen, (fb, fb * 2.3, fb * 6.0), (1.0, 0.6, 0.25), (0.035, 0.02, 0.008))
    grain += 0.6 * _decay_noise(rng, sr, glen, None, 2500.0, 0.004)[: len(grain)]
    out = np.zeros(n, dtype=np.float32)
    t = rng.uniform(0.0, min(0.1, 0.2 * n / sr))
    while t * sr < n:
        for _ in range(int(rng.integers(2, 5))):  # knocks come in small groups
            _overlay(out, grain, int(t * sr), _jit(rng, 1.0, 0.15))
            t += _jit(rng, 0.17, 0.1)
        t += _jit(rng, 0.8, 0.2)
    return out


def _clapping(rng, n, sr):
    out = np.zeros(n, dtype=np.float32)
    for start in _onsets(rng, n, sr, _jit(rng, 0.23, 0.05), jitter=0.08):
        _overlay(out, _decay_noise(rng, sr, 0.08, 900.0, 3200.0, 0.012), start, _jit(rng, 1.0, 0.15))
    return out


def _finger_snapping(rng, n, sr):
    fr = _jit(rng, 2600.0, 0.05)
    ring = _ring(sr, 0.05, (fr,), (0.4,), (0.01,))
    out = np.zeros(n, dtype=np.float32)
    for start in _onsets(rng, n, sr, _jit(rng, 0.7, 0.05), jitter=0.15):
        _overlay(out, _decay_noise(rng, sr, 0.05, 2200.0, 6500.0, 0.004) + ring, start, _jit(rng, 1.0, 0.1))
    return out


def _cough(rng, n, sr):
    f0 = _jit(rng, 260.0, 0.08)
    out = np.zeros(n, dtype=np.float32)
    for start in _onsets(rng, n, sr, _jit(rng, 0.9, 0.1), jitter=0.3):
        dur = _jit(rng, 0.35, 0.1)
        m = int(dur * sr)
        t = _time(m, sr)
        env = (1.0 - np.exp(-t / 0.005)) * np.exp(-t / 0.08)
        burst = _noise(rng, m, sr, 250.0, 2800.0) * env
        tail = 0.3 * _noise(rng, m, sr, 400.0, 1500.0) * np.exp(-t / 0.15)
        voiced = 0.4 * _osc(f0, m, sr, [1.0, 0.5, 0.3]) * env
        _overlay(out, burst + tail + voiced, start, _jit(rng, 1.0, 0.2))
    return out


def _whistling(rng, n, sr):
    base = _jit(rng, 1500.0, 0.06)
    scale = (0, 2, 4, 7, 9, 12)  # pentatonic melody
    f = np.empty(n)
    pos = 0
    while pos < n:
        m = int(_jit(rng, 0.35, 0.25) * sr)
        f[pos : pos + m] = base * 2.0 ** (scale[int(rng.integers(len(scale)))] / 12.0)
        pos += m
    t = _time(n, sr)
    f = _smooth(f, sr, 0.015) * (1.0 + 0.012 * np.sin(TWO_PI * _jit(rng, 5.5, 0.05) * t))  # vibrato
    return _osc(f, n, sr, [1.0, 0.06]) + 0.04 * _noise(rng, n, sr, 1000.0, 4000.0)


def _ringtone(rng, n, sr):
    t = _time(n, sr)
    f1 = _jit(rng, 1320.0, 0.03)
    trill = _jit(rng, 16.0, 0.05)
    f = np.where(np.floor(t * trill) % 2 == 0, f1, f1 * 1.25)
    on, off = 1.0, 0.35
    gate = (((t + rng.uniform(0.0, 0.2)) % (on + off)) < on).astype(np.float64)
    gate = 0.25 + 0.75 * _smooth(gate, sr, 0.003)  # pauses keep the echo of the room
    return _osc(f, n, sr, [1.0, 0.0, 1 / 3, 0.0, 1 / 5]) * gate  # odd harmonics: electronic square tone


def _chink_clink(rng, n, sr):
    f1 = _jit(rng, 2900.0, 0.04)
    grain = _ring(
        sr, _grain_len(n, sr, 0.45), (f1, f1 * 1.6, f1 * 2.17, f1 * 2.83), (1.0, 0.7, 0.5, 0.3), (0.25, 0.18, 0.12, 0.08)
    )
    out = np.zeros(n, dtype=np.float32)
    for start in _onsets(rng, n, sr, _jit(rng, 0.55, 0.05), jitter=0.4):
        _overlay(out, grain, start, _jit(rng, 1.0, 0.2))
        if rng.random() < 0.3:  # glasses touching twice
            _overlay(out, grain, start + int(0.06 * sr), _jit(rng, 0.6, 0.2))
    return out


def _drill(rng, n, sr):
    t = _time(n, sr)
    f0 = _jit(rng, 150.0, 0.05)
    f = f0 * (1.0 - 0.3 * np.exp(-t / 0.15)) * (1.0 + 0.004 * np.sin(TWO_PI * 7.0 * t))  # spin-up
    # Emphasised harmonics 10-16 are the gear whine around 2 kHz.
    amps = [0.5 / k + (0.6 if 10 <= k <= 16 else 0.0) for k in range(1, 20)]
    return _osc(f, n, sr, amps) + 0.35 * _noise(rng, n, sr, 3000.0, 8000.0)


def _hammer(rng, n, sr):
    fr = _jit(rng, 880.0, 0.05)
    glen = 0.3
    grain = _ring(sr, glen, (140.0, fr, fr * 1.61, fr * 3.0), (0.8, 1.0, 0.7, 0.35), (0.05, 0.06, 0.04, 0.02))
    out = np.zeros(n, dtype=np.float32)
    for start in _onsets(rng, n, sr, _jit(rng, 0.6, 0.05), jitter=0.12):
        click = _decay_noise(rng, sr, glen, 1000.0, None, 0.003)
        _overlay(out, grain + click[: len(grain)], start, _jit(rng, 1.0, 0.1))
    return out


def _cricket(rng, n, sr):
    fc = _jit(rng, 4600.0, 0.03)
    pulse_gap = 1.0 / _jit(rng, 32.0, 0.04)
    pulse = np.hanning(int(0.014 * sr)).astype(np.float32)
    env = np.zeros(n, dtype=np.float32)
    for start in _onsets(rng, n, sr, _jit(rng, 0.38, 0.05), jitter=0.05):
        for j in range(int(rng.integers(3, 5))):  # a chirp of 3-4 wing strokes
            _overlay(env, pulse, start + int(j * pulse_gap * sr))
    t = _time(n, sr)
    return env * (np.sin(TWO_PI * fc * t) + 0.1 * np.sin(TWO_PI * 2 * fc * t))


def _thunder(rng, n, sr):
    rumble = _noise(rng, n, sr, None, 160.0) + 0.35 * _noise(rng, n, sr, 160.0, 700.0)
    ctrl_hz = 200.0
    m = int(n / sr * ctrl_hz) + 2
    tc = np.arange(m) / ctrl_hz
    env_c = np.zeros(m)
    for _ in range(1 + int(n / sr // 3)):  # several rolls of different size
        t0 = rng.uniform(0.0, 0.6 * n / sr)
        tau = np.maximum(tc - t0, 0.0)
        env_c += rng.uniform(0.4, 1.0) * (1.0 - np.exp(-tau / 0.1)) * np.exp(-tau / _jit(rng, 1.5, 0.3)) * (tc >= t0)
    env_c += 0.5 * np.exp(-tc / 2.0)
    env = np.interp(np.arange(n) * (ctrl_hz / sr), np.arange(m), env_c) * (1.0 + 0.3 * _slow(rng, n, sr, 3.0))
    crack = _decay_noise(rng, sr, min(0.4, n / sr), 1000.0, None, 0.06)
    x = rumble * env
    x[: len(crack)] += 0.8 * crack
    return x


def _water_tap(rng, n, sr):
    hiss = _noise(rng, n, sr, 1200.0, 7000.0) + 0.4 * _noise(rng, n, sr, 300.0, 1200.0)
    return hiss * (1.0 + 0.5 * _slow(rng, n, sr, 40.0))  # fast flutter of the stream


def _gunshot(rng, n, sr):
    boom = _ring(sr, 0.9, (_jit(rng, 70.0, 0.08),), (1.2,), (0.15,))
    out = np.zeros(n, dtype=np.float32)
    for start in _onsets(rng, n, sr, _jit(rng, 1.3, 0.1), jitter=0.35):
        crack = _decay_noise(rng, sr, 0.9, None, 6000.0, 0.03)
        tail = 0.25 * _decay_noise(rng, sr, 0.9, None, 900.0, 0.25)  # reflections
        _overlay(out, crack + boom + tail, start, _jit(rng, 1.0, 0.15))
    return out


def _snare_drum(rng, n, sr):
    fh = _jit(rng, 185.0, 0.04)
    head = _ring(sr, 0.35, (fh, fh * 1.78), (1.0, 0.5), (0.05, 0.03))
    out = np.zeros(n, dtype=np.float32)
    for start in _onsets(rng, n, sr, 60.0 / _jit(rng, 140.0, 0.05), jitter=0.02):
        wires = 0.9 * _decay_noise(rng, sr, 0.35, 1800.0, 9000.0, 0.09)
        _overlay(out, head + wires, start, _jit(rng, 1.0, 0.1))
    return out


def _bass_drum(rng, n, sr):
    m = int(0.7 * sr)
    t = _time(m, sr)
    f_end = _jit(rng, 48.0, 0.05)
    f = f_end + 70.0 * np.exp(-t / 0.03)  # pitch drop of a struck membrane
    body = np.sin(TWO_PI * np.cumsum(f) / sr) * np.exp(-t / 0.22)
    out = np.zeros(n, dtype=np.float32)
    for start in _onsets(rng, n, sr, 60.0 / _jit(rng, 110.0, 0.05), jitter=0.02):
        click = 0.3 * _decay_noise(rng, sr, 0.7, None, 3000.0, 0.002)
        _overlay(out, (body + click).astype(np.float32), start, _jit(rng, 1.0, 0.1))
    return out


def _acoustic_guitar(rng, n, sr):
    pitches = (110.0, 147.0, 165.0, 196.0, 220.0, 247.0, 294.0, 330.0)
    glen = _grain_len(n, sr, 1.5)
    pluck_pos = _jit(rng, 0.2, 0.1)
    bank = []
    for _ in range(4):
        f0 = pitches[int(rng.integers(len(pitches)))] * _jit(rng, 1.0, 0.005)
        ks = np.arange(1, 9)
        freqs = ks * f0 * np.sqrt(1.0 + 1e-4 * ks**2)  # string stiffness: slightly sharp overtones
        amps = np.abs(np.sin(np.pi * ks * pluck_pos)) / ks
        bank.append(_ring(sr, glen, freqs, amps, 1.5 / ks**0.6, attack_s=0.002))
    out = np.zeros(n, dtype=np.float32)
    for start in _onsets(rng, n, sr, _jit(rng, 0.42, 0.05), jitter=0.15):
        _overlay(out, bank[int(rng.integers(len(bank)))], start, _jit(rng, 1.0, 0.15))
    return out


def _tick_tock(rng, n, sr):
    ft = _jit(rng, 3100.0, 0.04)
    tick = _ring(sr, 0.05, (ft, ft * 1.68), (1.0, 0.4), (0.006, 0.004))
    tock = _ring(sr, 0.05, (ft * 0.68, ft * 1.26), (1.0, 0.4), (0.008, 0.004))
    out = np.zeros(n, dtype=np.float32)
    for j, start in enumerate(_onsets(rng, n, sr, _jit(rng, 0.5, 0.02), jitter=0.002)):
        _overlay(out, tick if j % 2 == 0 else tock, start)
    return out


def _typing(rng, n, sr):
    fk = _jit(rng, 2300.0, 0.05)
    keys = []
    for _ in range(4):
        g = _decay_noise(rng, sr, 0.06, 1000.0, 5000.0, 0.005) + _ring(sr, 0.06, (fk * _jit(rng, 1.0, 0.05),), (0.4,), (0.012,))
        g[int(0.025 * sr) :] += 0.4 * g[: len(g) - int(0.025 * sr)]  # key bottoming out after the press
        keys.append(g)
    space = _ring(sr, 0.08, (900.0,), (0.6,), (0.02,)) + _decay_noise(rng, sr, 0.08, None, 2500.0, 0.006)
    out = np.zeros(n, dtype=np.float32)
    t = rng.uniform(0.0, min(0.05, 0.2 * n / sr))
    while t * sr < n:
        for _ in range(int(rng.integers(5, 13))):  # a word, then a short hesitation
            if t * sr >= n:
                break
            grain = space if rng.random() < 0.1 else keys[int(rng.integers(4))]
            _overlay(out, grain, int(t * sr), _jit(rng, 1.0, 0.2))
            t += 0.06 + rng.exponential(0.08)
        t += min(_jit(rng, 0.35, 0.3), 0.6)
    return out


def _frog(rng, n, sr):
    f1 = _jit(rng, 520.0, 0.05)
    pulse = _ring(sr, 0.012, (f1, f1 * 2.6), (1.0, 0.5), (0.004, 0.003))
    croaks = []
    for _ in range(2):
        dur = _jit(rng, 0.22, 0.1)
        m = int(dur * sr)
        c = np.zeros(m, dtype=np.float32)
        step = int(sr / _jit(rng, 70.0, 0.05))  # pulsed call: ~70 glottal pulses per second
        for s in range(0, m, step):
            _overlay(c, pulse, s)
        croaks.append(c * np.sin(np.pi * np.arange(m) / m).astype(np.float32))
    out = np.zeros(n, dtype=np.float32)
    for start in _onsets(rng, n, sr, _jit(rng, 0.8, 0.05), jitter=0.15):
        _overlay(out, croaks[0], start)
        _overlay(out, croaks[1], start + int(0.3 * sr), 0.8)  # "rib-bit"
    return out


def _purr(rng, n, sr):
    t = _time(n, sr)
    base = _noise(rng, n, sr, 40.0, 380.0)
    am = (0.5 + 0.5 * np.cos(TWO_PI * _jit(rng, 26.0, 0.05) * t)) ** 3
    breath = 0.55 + 0.45 * np.abs(np.sin(np.pi * t / _jit(rng, 2.2, 0.05) + rng.uniform(0.0, np.pi)))
    return base * (am * breath + 0.15)


def _harmonica(rng, n, sr):
    roots = (392.0, 440.0, 494.0, 523.0, 587.0, 659.0)
    reed = [1.0, 0.7, 0.5, 0.6, 0.35, 0.3, 0.2, 0.15]
    detune = _jit(rng, 1.0, 0.01)
    tremolo_hz = _jit(rng, 6.0, 0.05)
    out = np.zeros(n, dtype=np.float32)
    pos = 0
    while pos < n:
        m = min(int(_jit(rng, 0.7, 0.25) * sr), n - pos)
        root = roots[int(rng.integers(len(roots)))] * detune
        seg = _osc(root, m, sr, reed) + 0.7 * _osc(root * 1.26, m, sr, reed)  # two reeds: a third
        t = _time(m, sr)
        env = np.minimum(1.0, np.minimum(t / 0.03, (m / sr - t) / 0.03 + 0.2))
        seg *= env * (1.0 + 0.12 * np.sin(TWO_PI * tremolo_hz * t))
        out[pos : pos + m] = seg
        pos += m
    return out


def _glockenspiel(rng, n, sr):
    glen = _grain_len(n, sr, 1.0)
    steps = (0, 2, 4, 5, 7, 9, 11, 12, 14, 16)
    bank = []
    for _ in range(6):
        f = 1046.5 * 2.0 ** (steps[int(rng.integers(len(steps)))] / 12.0)
        bank.append(_ring(sr, glen, (f, f * 2.76, f * 5.4), (1.0, 0.25, 0.08), (0.7, 0.18, 0.06)))  # bar modes
    out = np.zeros(n, dtype=np.float32)
    for start in _onsets(rng, n, sr, _jit(rng, 0.3, 0.04), jitter=0.1):
        _overlay(out, bank[int(rng.integers(len(bank)))], start, _jit(rng, 1.0, 0.1))
    return out


def _buzz(rng, n, sr):
    t = _time(n, sr)
    f0 = _jit(rng, 230.0, 0.05)
    rate = _jit(rng, 0.35, 0.1)
    ph = rng.uniform(0.0, TWO_PI)
    # An insect flying past: Doppler pitch swing, loudest while approaching.
    f = f0 * (1.0 + 0.07 * np.sin(TWO_PI * rate * t + ph)) * (1.0 + 0.01 * _slow(rng, n, sr, 5.0))
    saw = _osc(f, n, sr, [1.0 / k for k in range(1, 25)])
    return saw * (0.55 + 0.45 * np.sin(TWO_PI * rate * t + ph + 0.5 * np.pi))


# Fixed order: the class index of a name is its position here, and the corpus layout
# depends on it. Each entry: family, model, band (Hz) of the class's room tail.
_MODELS: dict[str, tuple[str, Model, tuple[float, float]]] = {
    "Bark": ("harmonic", _bark, (500.0, 2500.0)),
    "Meow": ("harmonic", _meow, (500.0, 2500.0)),
    "Chirp, tweet": ("swept", _chirp_tweet, (3000.0, 6000.0)),
    "Church bell": ("tonal", _church_bell, (200.0, 1200.0)),
    "Bicycle bell": ("tonal", _bicycle_bell, (3000.0, 7000.0)),
    "Vehicle horn, car horn, honking": ("harmonic", _vehicle_horn, (300.0, 2000.0)),
    "Siren": ("swept", _siren, (600.0, 1500.0)),
    "Knock": ("impulsive", _knock, (100.0, 1000.0)),
    "Clapping": ("impulsive", _clapping, (800.0, 3500.0)),
    "Finger snapping": ("impulsive", _finger_snapping, (2000.0, 6500.0)),
    "Cough": ("noisy", _cough, (250.0, 2800.0)),
    "Whistling": ("tonal", _whistling, (1200.0, 3500.0)),
    "Ringtone": ("tonal", _ringtone, (1200.0, 2200.0)),
    "Chink, clink": ("tonal", _chink_clink, (2500.0, 8000.0)),
    "Drill": ("harmonic", _drill, (1500.0, 8000.0)),
    "Hammer": ("impulsive", _hammer, (700.0, 3000.0)),
    "Cricket": ("modulated", _cricket, (4000.0, 5500.0)),
    "Thunder": ("noisy", _thunder, (30.0, 300.0)),
    "Water tap, faucet": ("noisy", _water_tap, (1200.0, 7000.0)),
    "Gunshot, gunfire": ("impulsive", _gunshot, (60.0, 1500.0)),
    "Snare drum": ("impulsive", _snare_drum, (1500.0, 8000.0)),
    "Bass drum": ("impulsive", _bass_drum, (30.0, 200.0)),
    "Acoustic guitar": ("harmonic", _acoustic_guitar, (100.0, 1500.0)),
    "Tick-tock": ("impulsive", _tick_tock, (1800.0, 4000.0)),
    "Typing": ("impulsive", _typing, (1000.0, 5000.0)),
    "Frog": ("modulated", _frog, (400.0, 1600.0)),
    "Purr": ("modulated", _purr, (40.0, 380.0)),
    "Harmonica": ("harmonic", _harmonica, (350.0, 3000.0)),
    "Glockenspiel": ("tonal", _glockenspiel, (1000.0, 3500.0)),
    "Buzz": ("modulated", _buzz, (150.0, 3000.0)),
}

CLASS_NAMES: tuple[str, ...] = tuple(_MODELS)
CLASS_FAMILIES: dict[str, str] = {name: fam for name, (fam, _, _) in _MODELS.items()}

# A stretch must read as ONE continuous high-energy segment to an energy-window segmenter
# (FineLAP: windows of ~0.1 s, threshold 20 dB under the loudest window), or the event
# clipper would cut e.g. a knocking sequence after its first knock. Dips deeper than this
# are filled with room tail.
_MAX_DIP_DB = 13.0
_DIP_HOP_S = 0.01
_DIP_WINDOW_HOPS = 6  # narrower than the segmenter's window: its frames overlap, weighting the centre


def _fill_dips(x: np.ndarray, sr: int, rng: np.random.Generator, band: tuple[float, float]) -> np.ndarray:
    """Add class-band noise where the ~0.1 s mean square falls more than ``_MAX_DIP_DB`` under its maximum.

    The added noise plays the part of the room's reverberant tail between the events of
    impulsive and intermittent classes; continuous classes never trigger it.
    """
    n = len(x)
    hop = max(1, int(_DIP_HOP_S * sr))
    nf = -(-n // hop)
    sq = np.zeros(nf * hop, dtype=np.float64)
    sq[:n] = np.square(x, dtype=np.float64)
    e = sq.reshape(nf, hop).mean(axis=1)
    width = min(_DIP_WINDOW_HOPS, nf)
    c = np.concatenate(([0.0], np.cumsum(e)))
    lo_idx = np.clip(np.arange(nf) - width // 2, 0, nf - width)
    w = (c[lo_idx + width] - c[lo_idx]) / width
    target = w.max() * 10.0 ** (-_MAX_DIP_DB / 10.0)
    deficit = np.maximum(target - w, 0.0)
    if not deficit.any():
        return x
    # Dilate, then smooth: the tail swells and fades gradually yet still fills dips
    # narrower than the smoothing kernel at full depth.
    half = width // 2
    padded = np.pad(deficit, half)
    deficit = np.max([padded[k : k + nf] for k in range(2 * half + 1)], axis=0)
    kernel = np.hanning(2 * half + 3)[1:-1]
    deficit = np.convolve(deficit, kernel / kernel.sum(), mode="same")
    env = np.interp(np.arange(n) / hop, np.arange(nf) + 0.5, np.sqrt(deficit))
    tail = _noise(rng, n, sr, band[0], band[1])
    tail /= max(float(np.sqrt(np.mean(np.square(tail, dtype=np.float64)))), 1e-12)
    return x + (tail * env).astype(np.float32)


def synthesize(audioset_name: str, rng: np.random.Generator, duration_s: float, sample_rate_hz: int = 44100) -> np.ndarray:
    """One stretch of ``audioset_name``'s sound: float32, ``round(duration_s * sr)`` samples, peak 1.0.

    Dips of more than ~13 dB between events are filled with room tail in the class's band
    (see ``_fill_dips``), so the stretch is one continuous event to an energy segmenter. The
    stretch starts and ends with 5 ms ramps so that cutting it out of a longer sound leaves
    no clicks. Raises ``ValueError`` for a name without a model.
    """
    try:
        _, model, band = _MODELS[audioset_name]
    except KeyError:
        raise ValueError(f"no sound model for {audioset_name!r}; known: {', '.join(CLASS_NAMES)}") from None
    n = max(1, int(round(duration_s * sample_rate_hz)))
    x = np.asarray(model(rng, n, int(sample_rate_hz)), dtype=np.float32)[:n]
    x = _fill_dips(x, int(sample_rate_hz), rng, band)
    ramp = min(int(0.005 * sample_rate_hz), n // 4)
    if ramp > 1:
        r = (0.5 - 0.5 * np.cos(np.linspace(0.0, np.pi, ramp))).astype(np.float32)
        x[:ramp] *= r
        x[-ramp:] *= r[::-1]
    peak = float(np.max(np.abs(x)))
    if peak > 0.0:
        x /= peak
    return x
