"""Numbers from input, read one way: documents (rig.core.documents), server answers, command output.

Two bounds, each where it belongs:
- A document's number (token): its text is at most MAX_CHARS long before anything converts it (Python's int()
  refuses text past 4300 digits, float() of a 401-digit integer overflows) and its value is finite. Nothing
  more: a field rig never reads (a torch trace's nanosecond epoch, a prompt file's 64-bit ids) is not rig's to
  judge.
- A field rig reads (read, answer, problem; the schema's fields): within ±LIMIT, or the bound its meaning gives
  (its low and high). Within these bounds sums and averages of what rig measures stay finite.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from rig.core import RigError

LIMIT = 10**18      # beyond any count, size, byte total, time or rate rig meets; within a signed 64-bit integer
MAX_CHARS = 64      # the longest float repr is 24 characters; room for a human's zeros, none for an attack
# the most requests a server runs at once (SGLang's max_running_requests, a batch, a histogram's running requests):
# far beyond any GPU's batch, and still a number a bound check can hold
MAX_RUNNING_REQUESTS = 1 << 20


def problem(value: Any, low: float = -LIMIT, high: float = LIMIT, whole: bool = False,
            limit: float = LIMIT) -> str | None:
    """What makes VALUE no number rig takes (from LOW to HIGH, an int when WHOLE, within ±LIMIT), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"expected a {'whole ' if whole else ''}number, got {_short(value)}"
    if whole and not isinstance(value, int):
        return f"expected a whole number, got {_short(value)}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} is not a finite number; give one"
    if not -limit <= value <= limit:  # int against int or float: exact, never an OverflowError
        return f"{_short(value)} is beyond ±{limit:.3g}, larger than anything rig counts or measures here; give a " \
               "smaller one"
    if not low <= value <= high:
        return f"{value!r} is out of range: give {low} to {high}"
    return None


def read(value: Any, what: str, low: float = -LIMIT, high: float = LIMIT, whole: bool = False) -> int | float:
    """VALUE when problem() finds none; else a RigError naming WHAT."""
    if found := problem(value, low, high, whole):
        raise RigError(f"{what}: {found}")
    return value


def answer(value: Any, low: float = -LIMIT, high: float = LIMIT, whole: bool = False) -> int | float | None:
    """VALUE from a server's or a program's answer when it is a number read() takes, else None (not given)."""
    return None if problem(value, low, high, whole) else value


def token(text: str, what: str, convert: Callable[[str], Any] | None = None) -> int | float:
    """A number as a document writes it (JSON, YAML): bounded in length before CONVERT runs and finite, its size
    left to whoever reads the field."""
    return parse(text, what, convert, low=-math.inf, high=math.inf, limit=math.inf)


def _plain(text: str) -> int | float:
    stripped = text.strip()
    return int(stripped) if stripped.lstrip("+-").isdigit() else float(stripped)


def parse(text: str, what: str, convert: Callable[[str], Any] | None = None, low: float = -LIMIT,
          high: float = LIMIT, whole: bool = False, limit: float = LIMIT) -> int | float:
    """TEXT as a number: its length bounded before CONVERT (int, or float where TEXT is not a whole number)
    runs, then read()."""
    if len(text) > MAX_CHARS:
        raise RigError(f"{what}: a number written with {len(text)} characters ({_short(text)}); rig reads none "
                       f"longer than {MAX_CHARS}: write a smaller number (or quote it, if it is text)")
    try:
        value = (convert or _plain)(text)
    except (ValueError, OverflowError) as exc:
        raise RigError(f"{what}: {_short(text)} is not a number ({exc})") from exc
    if found := problem(value, low, high, whole, limit):
        raise RigError(f"{what}: {_short(text.strip())}: {found}")
    return value


def _short(value: Any) -> str:
    if isinstance(value, int) and value.bit_length() > 128:  # str() of one past 4300 digits raises
        return f"an integer of {len(format(value, 'x'))} hex digits"
    text = repr(value)
    return text if len(text) <= 40 else text[:30] + "..."


def mean(values: list) -> float | None:
    """The mean of measured values, or None: finite values can still average past the largest float (two of
    1.7e308), and such a mean says nothing."""
    import statistics

    try:
        found = statistics.fmean(values) if values else None
    except OverflowError:  # fsum's intermediate overflow
        return None
    return found if found is not None and math.isfinite(found) else None
