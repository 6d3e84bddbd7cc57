"""Scaper-style distribution tuples: parse and check them up front, then sample them.

A tuple is a YAML list whose first item names the distribution, exactly as in Scaper 1.6:

    [const, 10.0]                       always 10.0
    [choose, [1, 2, 3]]                 one of the values, uniformly
    [choose_weighted, [1, 2], [0.8, 0.2]]
    [uniform, 12.0, 20.0]               continuous uniform on [lo, hi)
    [normal, 5.0, 2.0]                  mean, standard deviation
    [truncnorm, 5.0, 2.0, 0.0, 10.0]    normal truncated to [lo, hi]

Placement tuples (onsets, background offsets) may use the word ``fit`` as a bound: it stands
for the largest value that keeps the item inside the mixture, and every placement sample is
clamped to ``[0, fit]`` as Scaper does.

Input: the raw YAML value and the key it came from. Output: a frozen :class:`Distribution`
whose ``sample(rng, fit=...)`` draws one value from a ``numpy.random.Generator``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeline.config.loading import ParamsError

KINDS = ("const", "choose", "choose_weighted", "uniform", "normal", "truncnorm")
FIT = "fit"


class SpecError(ParamsError):
    """A mixing spec problem; the message names the key and says what would be accepted.

    The params check reports it as a ``ParamsError`` naming ``mix.spec`` and the preset.
    """


def _number(value: object, key: str, allow_fit: bool) -> int | float | str:
    if allow_fit and value == FIT:
        return FIT
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        extra = " or 'fit'" if allow_fit else ""
        raise SpecError(f"mix spec: '{key}' needs a finite number{extra}, got {value!r}")
    return value if isinstance(value, int) else float(value)


@dataclass(frozen=True)
class Distribution:
    """One parsed tuple. ``args`` hold numbers, or ``'fit'`` where a placement allows it."""

    kind: str
    args: tuple

    def to_list(self) -> list:
        """Back to the YAML form (``choose_weighted`` drops its cached cumulative weights)."""
        args = self.args[:2] if self.kind == "choose_weighted" else self.args
        return [self.kind, *[list(a) if isinstance(a, tuple) else a for a in args]]

    @property
    def values(self) -> tuple:
        """Every value a const/choose tuple can produce (empty for continuous ones)."""
        if self.kind == "const":
            return (self.args[0],)
        if self.kind in ("choose", "choose_weighted"):
            return self.args[0]
        return ()

    def bounds(self, fit: float = math.inf) -> tuple[float, float]:
        """Smallest and largest value this tuple can produce (normal: unbounded)."""
        if self.kind in ("const", "choose", "choose_weighted"):
            vals = [_resolve(v, fit) for v in self.values]
            return min(vals), max(vals)
        if self.kind == "uniform":
            return _resolve(self.args[0], fit), _resolve(self.args[1], fit)
        if self.kind == "truncnorm":
            return _resolve(self.args[2], fit), _resolve(self.args[3], fit)
        return -math.inf, math.inf

    def sample(self, rng: np.random.Generator, fit: float = math.inf):
        kind, a = self.kind, self.args
        if kind == "const":
            return _resolve(a[0], fit)
        if kind == "choose":
            return _resolve(a[0][int(rng.integers(len(a[0])))], fit)
        if kind == "choose_weighted":
            return _resolve(a[0][int(np.searchsorted(a[2], rng.random(), side="right"))], fit)
        if kind == "uniform":
            lo, hi = _resolve(a[0], fit), _resolve(a[1], fit)
            return lo + (hi - lo) * rng.random()
        mu, sd = _resolve(a[0], fit), _resolve(a[1], fit)
        if kind == "normal":
            return mu + sd * float(rng.standard_normal())
        # truncnorm by inverse CDF: one uniform draw, no rejection loop, same for any bounds
        lo, hi = _resolve(a[2], fit), _resolve(a[3], fit)
        if sd == 0:
            return min(max(mu, lo), hi)
        from scipy.special import ndtr, ndtri  # when first needed: scipy takes a while to import in every worker

        p_lo, p_hi = ndtr((lo - mu) / sd), ndtr((hi - mu) / sd)
        u = p_lo + (p_hi - p_lo) * rng.random()
        return float(min(max(mu + sd * ndtri(u), lo), hi))


def _resolve(value, fit: float):
    return fit if value == FIT else value


def parse(raw: object, key: str, *, allow_fit: bool = False) -> Distribution:
    """A YAML value -> :class:`Distribution`; a bare number means ``[const, number]``."""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool) or raw == FIT and allow_fit:
        return Distribution("const", (_number(raw, key, allow_fit),))
    if not isinstance(raw, (list, tuple)) or not raw or raw[0] not in KINDS:
        raise SpecError(
            f"mix spec: '{key}' must be a distribution tuple such as [uniform, 12, 20] or [choose, [1, 2, 3]] "
            f"(kinds: {', '.join(KINDS)}), got {raw!r}"
        )
    kind, rest = raw[0], list(raw[1:])
    want = {"const": 1, "choose": 1, "choose_weighted": 2, "uniform": 2, "normal": 2, "truncnorm": 4}[kind]
    if len(rest) != want:
        raise SpecError(f"mix spec: '{key}': [{kind}, ...] takes {want} argument(s) after the kind, got {len(rest)}: {raw!r}")
    if kind == "const":
        return Distribution(kind, (_number(rest[0], key, allow_fit),))
    if kind in ("choose", "choose_weighted"):
        if not isinstance(rest[0], (list, tuple)) or not rest[0]:
            raise SpecError(f"mix spec: '{key}': [{kind}, [values...]] needs a non-empty list of values, got {rest[0]!r}")
        values = tuple(_number(v, key, allow_fit) for v in rest[0])
        if kind == "choose":
            return Distribution(kind, (values,))
        weights = rest[1]
        if not isinstance(weights, (list, tuple)) or len(weights) != len(values):
            raise SpecError(f"mix spec: '{key}': choose_weighted needs one weight per value ({len(values)}), got {weights!r}")
        w = np.array([_number(x, key, False) for x in weights], dtype=np.float64)
        if (w < 0).any() or w.sum() <= 0:
            raise SpecError(f"mix spec: '{key}': choose_weighted weights must be non-negative and not all zero, got {weights!r}")
        cumulative = tuple(float(c) for c in np.cumsum(w / w.sum())[:-1])
        return Distribution(kind, (values, tuple(float(x) for x in w), cumulative))
    nums = tuple(_number(v, key, allow_fit) for v in rest)
    if kind == "uniform" and not (FIT in nums or nums[0] <= nums[1]):
        raise SpecError(f"mix spec: '{key}': [uniform, lo, hi] needs lo <= hi, got {raw!r}")
    if kind in ("normal", "truncnorm") and (nums[1] == FIT or nums[1] < 0):
        raise SpecError(f"mix spec: '{key}': the standard deviation must be a number >= 0, got {raw!r}")
    if kind == "truncnorm" and not (FIT in nums[2:] or nums[2] <= nums[3]):
        raise SpecError(f"mix spec: '{key}': [truncnorm, mu, sd, lo, hi] needs lo <= hi, got {raw!r}")
    return Distribution(kind, nums)
