"""Reading and checking configuration: YAML files, ``--set`` overrides, typed dataclasses and their errors.

Input: YAML text or files and dataclass types. Output: nested mappings (merged) and frozen
dataclasses built from them, or one :class:`ParamsError` line that names the key or the file and
says what would be accepted. Every section of ``params.yaml`` and the mixing spec use these.
A float setting also takes a number written with an exponent and no dot (``1e-4``), which YAML 1.2
(DVC's reader) reads as a number and PyYAML as a string.

Files are read only when they are regular files of at most :data:`MAX_PARAMS_BYTES`, and YAML
aliases (``*name``) are refused: an alias lets a few lines stand for billions of values (or for
themselves), which no params file needs. An error never shows a key that is not a plain name,
nor more than the start of a value, so pointing ``--overrides`` at a file that is not params
(``/etc/shadow``) does not print what it holds.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import stat
import types
import typing
from pathlib import Path
from typing import Literal

import yaml


class ParamsError(ValueError):
    """A params.yaml problem; the message names the key and the fix."""


MAX_PARAMS_BYTES = 1 << 20  # params.yaml is about 25 kB; the bound stops /dev/zero or a stray large file
SHOWN_VALUE_CHARS = 80  # a value in an error is cut here: enough to recognise it, never a file's contents
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}")  # a key an error may repeat
# A number with an exponent but no dot (1e-4, 5E+3): YAML 1.2 (DVC's reader) reads a float, YAML 1.1
# (PyYAML) a string; a float setting takes it as the number it is.
_EXPONENT_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+")


def _shown(value: object) -> str:
    """``repr(value)``, cut to :data:`SHOWN_VALUE_CHARS` characters."""
    text = repr(value)
    return text if len(text) <= SHOWN_VALUE_CHARS else text[: SHOWN_VALUE_CHARS - 3] + "..."


def _key_name(key: object) -> str | None:
    """``key`` as text when it is a plain name (letters, digits, ``_.+-``, at most 64), else None: it is not repeated."""
    text = str(key)
    return text if _NAME.fullmatch(text) else None


def _describe(hint: object) -> str:
    if typing.get_origin(hint) is Literal:
        return " or ".join(repr(a) for a in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        return f"a list of {_describe(typing.get_args(hint)[0])}"
    return getattr(hint, "__name__", str(hint))


def _reject_non_finite(value: object, key: str) -> None:
    """Free-form mappings (``mix.spec``, ``evaluate.benchmarks``) hold no NaN or infinity either."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ParamsError(f"params: '{key}' is {_shown(value)}; use a finite number")
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        _reject_non_finite(v, f"{key}.{k}" if isinstance(value, dict) else f"{key}[{k}]")


def _coerce(value: object, hint: object, key: str) -> object:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ParamsError(f"params: '{key}' must be a mapping of {hint.__name__} keys, got {_shown(value)}")
        return build(hint, value, key)
    if origin is Literal:
        if value not in typing.get_args(hint):
            raise ParamsError(f"params: '{key}' is {_shown(value)}; use {_describe(hint)}")
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
        raise ParamsError(f"params: '{key}' must be {' or '.join(_describe(o) for o in options)}, got {_shown(value)}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ParamsError(f"params: '{key}' must be a list, got {_shown(value)}")
        inner = typing.get_args(hint)[0]
        return tuple(_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value))
    if hint is dict:
        if not isinstance(value, dict):
            raise ParamsError(f"params: '{key}' must be a mapping, got {_shown(value)}")
        _reject_non_finite(value, key)
        return value
    if hint is float and isinstance(value, str) and _EXPONENT_FLOAT.fullmatch(value):
        value = float(value)
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):  # YAML's .nan and .inf parse as floats; no parameter means them
            raise ParamsError(f"params: '{key}' is {_shown(value)}; use a finite number")
        return float(value)
    if hint in (int, str, bool) and isinstance(value, hint) and not (hint is int and isinstance(value, bool)):
        return value
    raise ParamsError(f"params: '{key}' must be {_describe(hint)}, got {_shown(value)}")


def build(cls: type, raw: dict, prefix: str = "") -> object:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys with a suggestion."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in raw.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if key not in names:
            if _key_name(key) is None:  # text that is no key name may be a line of a file that is not params
                where = f"'{prefix}'" if prefix else "the top level"
                raise ParamsError(
                    f"params: {where} holds a key that is not a parameter name (not shown); known keys: {', '.join(names)}"
                )
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


class _AliasRefused(yaml.composer.ComposerError):
    """An alias in params text (:class:`_NoAliasLoader`)."""


class _NoAliasLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses aliases (``*name``).

    An alias repeats a node by reference: nine lines of nested aliases stand for 10^9 values
    that every walk over the params (checks, merges, the spec's digest) visits one by one, and
    an alias inside its own anchor is a structure that contains itself. Anchors alone are harmless.
    """

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _AliasRefused(
                None,
                None,
                f"an alias (*{event.anchor}); params take no YAML aliases: write the value out in full",
                event.start_mark,
            )
        return super().compose_node(parent, index)


def _parse_yaml(text: str, where: str, column_offset: int | None = None) -> object:
    """YAML text -> data; a syntax error becomes one ParamsError line naming ``where``, the position and the problem.

    ``column_offset`` marks one-line text (a ``--set`` value): the position is then a column
    of the whole ``--set`` text instead of a line and column. Aliases are refused (:class:`_NoAliasLoader`).
    """
    try:
        return yaml.load(text, Loader=_NoAliasLoader)
    except RecursionError:
        raise ParamsError(
            f"params: {where}: nested deeper than the YAML reader can follow; a params file nests a few levels"
        ) from None
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
        fix = "" if isinstance(e, _AliasRefused) else "; fix the YAML there"
        raise ParamsError(f"params: {where}{at}: {problem}{fix}") from None
    except yaml.YAMLError as e:  # e.g. characters YAML does not allow; no problem_mark
        raise ParamsError(f"params: {where}: {' '.join(str(e).split())}") from None


def _read_bounded(path: Path, role: str) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most :data:`MAX_PARAMS_BYTES`, else one ParamsError line.

    Opened without blocking, so a named pipe is refused instead of waited on; the type and size
    are checked on the open file, and at most one byte past the bound is read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise ParamsError(f"params: cannot read {role} {path} ({e.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(mode) else "a device, pipe or socket"
        raise ParamsError(f"params: {role} {path} is {kind}, not a file; pass a YAML file")
    with open(fd, "rb") as f:
        try:
            data = f.read(MAX_PARAMS_BYTES + 1)
        except OSError as e:
            raise ParamsError(f"params: cannot read {role} {path} ({e.strerror})") from None
    if len(data) > MAX_PARAMS_BYTES:
        raise ParamsError(
            f"params: {role} {path} is larger than {MAX_PARAMS_BYTES // 1024} KiB, which no params file is; is it the right file?"
        )
    return data


def read_yaml_mapping(path: Path | str, role: str = "params file") -> dict:
    """A YAML file that must hold a mapping at the top level (``params.yaml``, an ``--overrides`` file).

    Every problem (unreadable, not a regular file, over :data:`MAX_PARAMS_BYTES`, not UTF-8, a
    YAML syntax error or alias, not a mapping, a top-level key that is no section name) is one
    :class:`ParamsError` line that names the file and shows none of its text.
    """
    path = Path(path)
    data = _read_bounded(path, role)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ParamsError(f"params: {role} {path} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    raw = _parse_yaml(text, str(path))
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ParamsError(f"params: {role} {path} holds a {type(raw).__name__}; it must hold a mapping of keys at the top level")
    if not all(isinstance(key, str) and _key_name(key) for key in raw):
        raise ParamsError(
            f"params: {role} {path} has a top-level key that is not a section name (not shown); is it a params file?"
        )
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
