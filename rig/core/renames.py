"""Old spellings rig still reads (a command, an option, a stack key), each until the release that removes it: one
record and one warning for all of them, so that whoever still writes one learns what to write now and by when.

A rename is declared once where the old spelling is read (rig.cli.common, rig.stack.spec); tests/unit/test_renames.py
fails once rig's version reaches a rename's removal, so that it is removed then rather than kept by habit.
"""
from __future__ import annotations

from dataclasses import dataclass

from rig.core import progress

DECLARED: list[Renamed] = []  # every rename rig reads, for the test that holds each to its removal
_SAID: set[str] = set()


@dataclass(frozen=True)
class Renamed:
    old: str  # as users wrote it: `rig lock --check`, tune.start_timeout
    new: str  # what to write instead
    removed_in: str  # the rig release that no longer reads OLD
    noun: str = "spelling"  # what OLD is: a spelling (of an option or command line), a name, a key

    def __post_init__(self) -> None:
        DECLARED.append(self)

    def __str__(self) -> str:
        return f"{self.old} is now {self.new}; the old {self.noun} is removed in rig {self.removed_in}"

    def warn(self, where: str = "") -> None:
        """Say on stderr (--json output stays parseable) that OLD was read, once a run: a stack read three times
        is warned about once. WHERE: the file it was read from, where there is one."""
        line = f"warning: {where + ': ' if where else ''}{self}"
        if line not in _SAID:
            _SAID.add(line)
            progress(line)
