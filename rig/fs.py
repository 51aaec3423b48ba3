"""Paths that come from input (archive members, lock filenames, patch targets) stay under their root."""
from __future__ import annotations

from pathlib import Path

from rig import RigError


def confined(root: str | Path, relative: str, what: str) -> Path:
    """ROOT/RELATIVE, resolved, or a RigError when it would land outside ROOT (`..`, an absolute path,
    a link out): nothing is written through a path that escapes its root."""
    base = Path(root).resolve()
    if not relative or "\0" in relative or Path(relative).is_absolute():
        raise RigError(f"{what}: {relative!r} is not a relative path under {base}; refusing it")
    target = (base / relative).resolve()
    if target != base and base not in target.parents:
        raise RigError(f"{what}: {relative!r} leads outside {base}; refusing it (path traversal)")
    return target


def output_dir(path: str | Path, option: str) -> None:
    """An output directory given on the command line may be new or a directory, never a file."""
    if Path(path).exists() and not Path(path).is_dir():
        raise RigError(f"{option} {path} is a file; give a directory")
