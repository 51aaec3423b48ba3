"""What a value on rig's command line may be, checked when the line is read, before any work: paths here and on
the target host, result directories and files, URLs, numbers and choices. A refusal names the option and the value,
and says what to give instead.
"""
from __future__ import annotations

import difflib
import math
import posixpath
import re
from urllib.parse import urlsplit

import click

from rig.core import RigError, numbers, outdir


class PathArg(click.Path):
    """A path on the command line: one with a NUL byte (no system call takes it) is refused in rig's words, and a
    file where a directory stands (or the other way round) as click.Path says."""

    def convert(self, value, param, ctx):
        if "\0" in str(value):
            raise RigError(f"{_named(param)} {str(value)!r}: a path cannot hold a NUL byte")
        return super().convert(value, param, ctx)


FILE = PathArg(dir_okay=False)
DIR = PathArg(file_okay=False)


class Directory(click.Path):
    """A directory named on the command line, never empty: `--venv ""` would mean the stack's venv, `--out ""`
    the current directory."""

    def __init__(self) -> None:
        super().__init__(file_okay=False)

    def convert(self, value, param, ctx):
        if not str(value):
            raise RigError(f"{_named(param)} '': an empty path", hint="give a directory, or leave the option out")
        return value


class OutDir(Directory):
    """A result directory (--out): the one output rule (rig.core.outdir.results_dir) applied when the command line
    is read, before any work; OUTPUTS are the files the command writes into it."""

    def __init__(self, outputs: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.outputs = outputs

    def convert(self, value, param, ctx):
        return str(outdir.results_dir(value, self.outputs, _named(param)))  # what was checked is what is written


class OutFile(click.Path):
    """The one file a command writes (--output, --junit): the output rule (rig.core.outdir.output_file) applied
    when the command line is read."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False)

    def convert(self, value, param, ctx):
        return str(outdir.output_file(value, _named(param)))  # what was checked is what is written


def _named(param: click.Parameter | None) -> str:
    return param.opts[0] if param is not None and param.opts else "the value"


class Choice(click.Choice):
    """click's Choice, with the close matches said when a value is misspelt (`--skip dcotor`: doctor)."""

    def convert(self, value, param, ctx):
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            near = difflib.get_close_matches(str(value), [str(c) for c in self.choices], n=3, cutoff=0.6)
            choices = ", ".join(map(str, self.choices))
            hint = f"did you mean {' or '.join(near)}? " if near else ""
            self.fail(f"{value!r} is not a choice: {hint}choose from {choices}", param, ctx)


class Url(click.ParamType):
    """A URL checked when the command line is read: scheme, host and port, so nothing fails later."""
    name = "url"

    def __init__(self, schemes: tuple[str, ...] = ("http", "https")):
        self.schemes = schemes

    def convert(self, value, param, ctx):
        if not value:
            return value
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises on a port out of range
        except ValueError as exc:
            self.fail(f"{value!r} is not a URL: {exc}", param, ctx)
        if parts.scheme not in self.schemes or (parts.scheme != "file" and not parts.hostname) or \
                any(c.isspace() or not c.isprintable() for c in value):
            example = ", e.g. http://127.0.0.1:30000" if "http" in self.schemes else ""
            self.fail(f"{value!r} is not a {'/'.join(self.schemes)} URL{example}", param, ctx)
        return value


_NUMERALS = {int: re.compile(r"[+-]?[0-9]+"),
             float: re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[+-]?(nan|inf)", re.IGNORECASE)}


class Number(click.ParamType):
    """Every number option's reader: ASCII digits only (Python's int and float take any script's digits, `1_0`
    and spaces: `--max-tokens ١٢` would be 12), at most numbers.MAX_CHARS of them; then LOW to HIGH where the
    option says so, else its consumer's range holds (the stack schema's for the plan's options; nan and inf
    reach it as such). MANY: comma-separated, e.g. 1,4,16, shown in --help as LETTER[,LETTER...]. A refusal is a
    RigError, so that a value gets the same words whichever command reads it."""

    def __init__(self, kind: type = int, low: float | None = None, high: float | None = None, many: bool = False,
                 letter: str = "N"):
        self.kind, self.low, self.high, self.many, self.letter = kind, low, high, many, letter
        self.name = ("integer" if kind is int else "float") + (" range" if (low, high) != (None, None) else "")
        self.noun = "whole number" if kind is int else "number"

    def _ranged(self, value: int | float, option: str) -> int | float:
        low, high = (-math.inf if self.low is None else self.low), (math.inf if self.high is None else self.high)
        if (self.low, self.high) != (None, None) and not low <= value <= high:  # nan is in no range
            span = f"from {low} to {high}" if self.low is not None and self.high is not None else \
                f"at least {low}" if self.low is not None else f"at most {high}"
            raise RigError(f"{option} {value} is out of range", hint=f"give a {self.noun} {span}")
        return value

    def get_metavar(self, param, ctx):
        return f"{self.letter}[,{self.letter}...]" if self.many else super().get_metavar(param, ctx)

    def convert(self, value, param, ctx):
        option = _named(param)
        if isinstance(value, (int, float)) and not isinstance(value, bool):  # a default, a number already
            return self._ranged(value, option)
        text = str(value)
        items = text.split(",") if self.many else [text]
        if not all(len(item) <= numbers.MAX_CHARS and _NUMERALS[self.kind].fullmatch(item) for item in items):
            what = f"comma-separated {self.noun}s in ASCII digits" if self.many else f"a {self.noun} in ASCII digits"
            example = ("1,4,16" if self.kind is int else "2,8") if self.many else "12"
            raise RigError(f"{option} {text!r} is not {what}", hint=f"give {what}, e.g. {example}")
        values = [self._ranged(self.kind(item), option) for item in items]
        return values if self.many else values[0]


class Seconds(Number):
    """A wait: finite, above 0 and at most a week (nan or inf would wait forever)."""

    def __init__(self) -> None:
        super().__init__(float, 0, 7 * 86400)
        self.name = "seconds"

    def _ranged(self, value, option):
        if not 0 < value <= 7 * 86400:
            raise RigError(f"{option} {value} is out of range", hint="give seconds above 0 and at most a week (604800)")
        return value




class HostPath(click.ParamType):
    """A path on another host (a builder, the server's host), never looked at here: only its form is checked, so a
    relative or unclean one fails on this line rather than there. Absolute, clean (no `.` or `..` part, no doubled
    or trailing slash) and printable: it is written into a command line or a unit file for that host. PROGRAM: a
    program, which may also be a bare name the host finds on its PATH (python3.12)."""
    name = "path"

    def __init__(self, program: bool = False) -> None:
        self.program = program

    def get_metavar(self, param, ctx):
        return "PATH"

    def convert(self, value, param, ctx):
        text = str(value)
        clean = text.startswith("/") and not text.startswith("//") and posixpath.normpath(text) == text
        bare = self.program and re.fullmatch(r"[A-Za-z0-9._+-]+", text) is not None and text not in (".", "..")
        if not ((clean or bare) and text.isprintable()):
            said = "an absolute, clean path or a bare name" if self.program else "an absolute, clean path"
            raise RigError(f"{_named(param)} {text!r} is not {said} on the target host",
                           hint="give the path as that host sees it, e.g. /opt/rig/build (nothing here is looked at)")
        return text


class PathOrUrl(PathArg):
    """A path here, or a URL of one of SCHEMES (what pip's --find-links and a venv archive's manifest take): a value
    with `SCHEME://` is read as a URL (Url's checks), any other as a path (PathArg's)."""

    def __init__(self, schemes: tuple[str, ...] = ("http", "https"), file_okay: bool = True, dir_okay: bool = True):
        super().__init__(file_okay=file_okay, dir_okay=dir_okay)
        self.url = Url(schemes)

    def convert(self, value, param, ctx):
        if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", str(value)):
            return self.url.convert(value, param, ctx)
        return super().convert(value, param, ctx)
