"""Text that input reaches, written into what rig generates: the terminal, rig's own lines, systemd units.

Input (a log line, a host's prove.json, what a venv's sglang says its version is) may hold control
characters (a terminal's OSC sequences set its title or write its clipboard), a newline (a new table row, a
new unit directive), `|` (a new table cell) or systemd's `%` and `$` (specifiers and variables). Each
destination has one function, here or, for markdown tables, in rig.core.markdown (whose cells are inline()
text); every writer of that destination goes through it.
"""
from __future__ import annotations

import re

from rig.core import RigError


def _visible(text: str, keep: str = "") -> str:
    """TEXT with every non-printable character but those in KEEP written as its Python escape (\\x1b, \\n)."""
    return "".join(ch if ch.isprintable() or ch in keep else ch.encode("unicode_escape", "backslashreplace").decode()
                   for ch in text)


def terminal(text: str) -> str:
    """TEXT as a terminal should show it: its lines kept, every control character (ESC, CR, BEL) visible."""
    return _visible(text, keep="\n")


def inline(text: str) -> str:
    """TEXT within one of rig's lines: every control character, a newline too, visible."""
    return _visible(text)


def rig_line(text: str) -> str:
    """`rig: TEXT`, a line rig writes to a person (progress, an error): control characters visible, and lines
    after the first indented, so that a path or name holding a newline can start no line of its own (no forged
    `rig: error:`)."""
    return "rig: " + terminal(text).replace("\n", "\n  ")


# ------------------------------------------------------------------ systemd units

def _one_line(text: str, what: str) -> str:
    if any(not ch.isprintable() for ch in text):  # a newline would start a directive of its own
        raise RigError(f"{what} {_visible(text)!r} holds a newline or another control character, which would "
                       f"split the systemd unit; fix {what}")
    return text


def unit_text(text: str, what: str) -> str:
    """TEXT as a unit's setting or comment: one line, `%` (a specifier) written `%%`."""
    return _one_line(text, what).replace("%", "%%")


def unit_path(path: str, what: str) -> str:
    """PATH as a unit takes a file: absolute and without spaces (systemd takes it as it is)."""
    if not path.startswith("/") or any(ch.isspace() for ch in path):
        raise RigError(f"{what} {_visible(path)!r}: give an absolute path without spaces (systemd takes it as it is)")
    return unit_text(path, what)


UNIT_BARE = re.compile(r"[-A-Za-z0-9_@+=:,./]+")


def unit_exec(argv: list[str], what: str, verbatim: frozenset[str] | set[str] = frozenset()) -> str:
    """ARGV as one Exec line by systemd's rules: the program an absolute path (or a plain name systemd looks
    up), `%` written `%%` and `$` written `$$` except in the VERBATIM words systemd must expand (${NAME},
    $MAINPID), words with anything but plain characters double-quoted with \\ and \" escaped."""
    program = argv[0] if argv else ""
    if not (program.startswith("/") or re.fullmatch(r"[A-Za-z0-9._+-]+", program)):
        raise RigError(f"{what}: the program {_visible(program)!r} is a relative path, which systemd refuses to "
                       "run; give its venv (or the program) as an absolute path")
    words = []
    for arg in argv:
        if _one_line(arg, what) in verbatim or UNIT_BARE.fullmatch(arg):  # no %, $, quote, backslash, space
            words.append(arg)
            continue
        escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
        words.append(f'"{escaped}"')
    return " ".join(words)
