"""Typed fields for every input document rig reads: stack files, patch files, locks' and
state files' JSON, bench results.

A small spec rather than a schema library, so that the engine bundle shipped to
targets stays dependency-free and every error names the file, the key path and
what is allowed. Text is one line unless a field says otherwise: a newline or a
NUL in a name, a path or a flag would split the unit, the environment module or
a command line it ends up in.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from rig.core import RigError, numbers


@dataclass(frozen=True)
class Field:
    kind: type | tuple = str
    required: bool = False
    default: Any = None
    choices: tuple = ()
    item: "Field | None" = None           # for lists
    fields: dict = field(default_factory=dict)  # for mappings with known keys
    values: "Field | None" = None          # for mappings with free keys (names -> hashes)
    open: bool = False                     # a mapping may hold keys beyond `fields` (kept as they are)
    multiline: bool = False                # text may span lines (patch hunks)
    nonempty: bool = False                 # given, it holds something: null or "" is refused, never the default's
    #                                        meaning ("every environment", "this directory")
    check: Callable[[Any], str | None] | None = None  # returns an error or None


def validate(value: Any, spec: Field, source: str, where: str = "") -> Any:
    """VALUE checked against SPEC with defaults filled in, or a RigError naming SOURCE and the key path."""
    def fail(msg: str) -> RigError:
        return RigError(f"{source}: {where or 'top level'}: {msg}")

    if value is None:
        if spec.required:
            raise fail("is required")
        value = spec.default
        if isinstance(value, (dict, list)):
            value = type(value)(value)
    if wrong := _kind_problem(value, spec):
        raise fail(wrong)
    if isinstance(value, list) and spec.item:  # the items first: a check of the whole list reads checked items
        value = [validate(v, spec.item, source, f"{where}[{i}]") for i, v in enumerate(value)]
    if spec.check and (msg := spec.check(value)):
        raise fail(msg)
    if isinstance(value, str) and ("\0" in value or (not spec.multiline and ("\n" in value or "\r" in value))):
        raise fail(f"{_short(value)} must be one line of text (no newline, carriage return or NUL)")
    if isinstance(value, dict) and (spec.values or spec.fields):
        return _mapping(value, spec, source, where, fail)
    return value


def _kind_problem(value: Any, spec: Field) -> str | None:
    """What is wrong with VALUE's kind, its number or its choice, or None."""
    kinds = spec.kind if isinstance(spec.kind, tuple) else (spec.kind,)
    if isinstance(value, bool) and bool not in kinds:
        return f"expected {'/'.join(k.__name__ for k in kinds)}, got a boolean"
    if not isinstance(value, spec.kind):
        names = spec.kind.__name__ if isinstance(spec.kind, type) else "/".join(k.__name__ for k in spec.kind)
        return f"expected {names}, got {type(value).__name__} {_short(value)}"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and (wrong := numbers.problem(value)):
        return wrong  # a field rig reads: the document's reader bounded only its text
    if spec.choices and value not in spec.choices:
        return f"{_short(value)} is not allowed; choose one of: {', '.join(map(str, spec.choices))}"
    return None


def _mapping(value: dict, spec: Field, source: str, where: str, fail: Callable[[str], RigError]) -> dict:
    """A mapping's keys and values checked: free keys against SPEC.values, or the known FIELDS (and no other key
    unless SPEC is open)."""
    if spec.values:
        return {validate(k, Field(), source, f"{where} key"): validate(v, spec.values, source, f"{where}.{k}")
                for k, v in value.items()}
    unknown = sorted(map(str, set(value) - set(spec.fields)))
    if unknown and not spec.open:
        raise fail(f"unknown key {unknown[0]!r}; allowed: {', '.join(spec.fields)}")
    if empty := [k for k, f in spec.fields.items() if f.nonempty and k in value and value[k] in (None, "")]:
        raise fail(f"{empty[0]!r} is empty: give it a value, or leave the key out")
    known = {k: validate(value.get(k), f, source, f"{where}.{k}" if where else k) for k, f in spec.fields.items()}
    return {**value, **known} if spec.open else known


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# ------------------------------------------------------------------ checks shared by the documents

def version(value: str) -> str | None:
    from packaging.version import InvalidVersion, Version

    try:
        Version(value)
    except InvalidVersion:
        return f"{_short(value)} is not a version (PEP 440)"
    return None


def distribution(value: str) -> str | None:
    return None if re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", value) else \
        f"{_short(value)} is not a package name"


def feature(value: str) -> str | None:
    """An opt-in feature's name (a patch's opt_in, a stack's patches.opt_in): lowercase words and hyphens."""
    return None if re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", value) and len(value) <= 40 else \
        f"{_short(value)} is not an opt-in feature name like free-off"


def sha256(value: str) -> str | None:
    return None if re.fullmatch(r"[0-9a-f]{64}", value) else f"{_short(value)} is not 64 hex digits (lowercase)"


def once(value: list) -> str | None:
    """A list whose every item is given once (a server, a level or a variant listed twice is a careless copy)."""
    from collections import Counter

    # by value: 2 and 2.0 are one request rate (the items are checked scalars by now)
    twice = sorted(repr(item) for item, seen in Counter(value).items() if seen > 1)
    return f"{', '.join(twice[:5])} given more than once: give each once" if twice else None


def between(low: float, high: float) -> Callable[[Any], str | None]:
    """A bounded number: nothing rig feeds to a server or a loop is unbounded (NaN is in no range)."""
    from rig.core import numbers

    return lambda value: numbers.problem(value, low, high)
