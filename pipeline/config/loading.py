"""Reading and checking configuration: YAML files, ``--set`` overrides, typed dataclasses and their errors.

Input: YAML text or files and dataclass types. Output: nested mappings (merged) and frozen
dataclasses built from them, or one :class:`ParamsError` line that names the key or the file and
says what would be accepted. Every section of ``params.yaml`` and the mixing spec use these.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Literal

import yaml


class ParamsError(ValueError):
    """A params.yaml problem; the message names the key and the fix."""


def _describe(hint: object) -> str:
    if typing.get_origin(hint) is Literal:
        return " or ".join(repr(a) for a in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        return f"a list of {_describe(typing.get_args(hint)[0])}"
    return getattr(hint, "__name__", str(hint))


def _reject_non_finite(value: object, key: str) -> None:
    """Free-form mappings (``mix.spec``, ``evaluate.benchmarks``) hold no NaN or infinity either."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ParamsError(f"params: '{key}' is {value!r}; use a finite number")
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        _reject_non_finite(v, f"{key}.{k}" if isinstance(value, dict) else f"{key}[{k}]")


def _coerce(value: object, hint: object, key: str) -> object:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ParamsError(f"params: '{key}' must be a mapping of {hint.__name__} keys, got {value!r}")
        return build(hint, value, key)
    if origin is Literal:
        if value not in typing.get_args(hint):
            raise ParamsError(f"params: '{key}' is {value!r}; use {_describe(hint)}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _coerce(value, options[0], key)  # keeps the inner error, e.g. an unknown key's suggestion
        for option in options:
            try:
                return _coerce(value, option, key)
            except ParamsError:
                continue
        raise ParamsError(f"params: '{key}' must be {' or '.join(_describe(o) for o in options)}, got {value!r}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ParamsError(f"params: '{key}' must be a list, got {value!r}")
        inner = typing.get_args(hint)[0]
        return tuple(_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value))
    if hint is dict:
        if not isinstance(value, dict):
            raise ParamsError(f"params: '{key}' must be a mapping, got {value!r}")
        _reject_non_finite(value, key)
        return value
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):  # YAML's .nan and .inf parse as floats; no parameter means them
            raise ParamsError(f"params: '{key}' is {value!r}; use a finite number")
        return float(value)
    if hint in (int, str, bool) and isinstance(value, hint) and not (hint is int and isinstance(value, bool)):
        return value
    raise ParamsError(f"params: '{key}' must be {_describe(hint)}, got {value!r}")


def build(cls: type, raw: dict, prefix: str = "") -> object:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys with a suggestion."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in raw.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)  # YAML keys may be numbers or booleans
            hint = f"; did you mean '{close[0]}'?" if close else f"; known keys: {', '.join(names)}"
            raise ParamsError(f"params: unknown key '{dotted}'{hint}")
        kwargs[key] = _coerce(value, hints[key], dotted)
    return cls(**kwargs)


def need(ok: bool, key: str, what: str, *, error: type[ParamsError] = ParamsError, where: str = "params") -> None:
    """Raise ``error`` naming ``key`` with ``what`` (what is wrong and the fix) unless ``ok``.

    ``where`` starts the message: ``params`` for params.yaml keys, ``mix spec`` for the mixing spec's knobs.
    """
    if not ok:
        raise error(f"{where}: '{key}' {what}")


def _parse_yaml(text: str, where: str, column_offset: int | None = None) -> object:
    """YAML text -> data; a syntax error becomes one ParamsError line naming ``where``, the position and the problem.

    ``column_offset`` marks one-line text (a ``--set`` value): the position is then a column
    of the whole ``--set`` text instead of a line and column.
    """
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        def position(mark) -> str:
            if column_offset is not None:
                return f"column {column_offset + mark.column + 1}"
            return f"line {mark.line + 1}, column {mark.column + 1}"

        mark = e.problem_mark or e.context_mark
        problem = " ".join(f"{e.problem or e.context or 'not valid YAML'}".split())
        if e.problem and e.context and e.context_mark is not None and e.context_mark is not mark:
            # an unclosed bracket is found where the text ends: also say where it opened
            problem += f" ({' '.join(e.context.split())} that starts at {position(e.context_mark)})"
        at = f" {position(mark)}" if mark is not None else ""
        raise ParamsError(f"params: {where}{at}: {problem}; fix the YAML there") from None
    except yaml.YAMLError as e:  # e.g. characters YAML does not allow; no problem_mark
        raise ParamsError(f"params: {where}: {' '.join(str(e).split())}") from None


def read_yaml_mapping(path: Path | str, role: str = "params file") -> dict:
    """A YAML file that must hold a mapping at the top level (``params.yaml``, an ``--overrides`` file).

    Every problem (unreadable, not UTF-8, a YAML syntax error, not a mapping) is one
    :class:`ParamsError` line that names the file.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ParamsError(f"params: cannot read {role} {path} ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise ParamsError(f"params: {role} {path} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    raw = _parse_yaml(text, str(path))
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ParamsError(f"params: {role} {path} holds a {type(raw).__name__}; it must hold a mapping of keys at the top level")
    return raw


def merge(base: dict, top: dict) -> dict:
    """Nested dict merge: values of ``top`` win; mappings merge key by key."""
    out = dict(base)
    for k, v in top.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def parse_override(text: str) -> dict:
    """``"clip.segmentation.threshold_db=-30"`` -> ``{"clip": {"segmentation": {"threshold_db": -30}}}``."""
    if "=" not in text:
        raise ParamsError(f"params: override {text!r} must look like key.sub=value")
    key, value = text.split("=", 1)
    node: dict = {}
    root = node
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node[part] = {}
        node = node[part]
    node[parts[-1]] = _parse_yaml(value, f"--set {text!r}", column_offset=len(key) + 1)
    return root
