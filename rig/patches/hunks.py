"""A patch's hunks on one file's text: whether they are in, would go in, or no longer find their code."""
from __future__ import annotations

import difflib

from rig.patches.patchset import Patch


def patched(text: str, patch: Patch) -> tuple[str, str]:
    """(status, new text or why): "applied" with TEXT unchanged, "needed" with the result, or "drifted" with the
    reason. An anchor must be found exactly once: one found twice is drift, never a guess at which is meant."""
    if all(text.count(new) >= 1 for _, new in patch.hunks):
        return "applied", text
    for find, _ in patch.hunks:
        count = text.count(find)
        if count != 1:
            where = "not found" if count == 0 else f"found {count} times"
            first = next((line.strip() for line in find.splitlines() if line.strip()), find)  # blank: as it is
            return "drifted", f"expected code {where} (anchor begins {first!r})"
    for find, new in patch.hunks:
        text = text.replace(find, new, 1)
    return "needed", text


def unified_diff(name: str, old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{name}", f"b/{name}"))
