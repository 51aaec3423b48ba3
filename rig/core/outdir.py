"""What a command leaves in --out (rig machine probe, rig bench, rig tune, rig prove): one rule for where it
may write, checked before any work, and one writer.

The JSON record first, so that nothing measured is lost when a later step fails; then the markdown report;
then the plots, drawn by the caller only once both are on disk, each written like every other file (never
through a link or into a FIFO). Where matplotlib does not import (a host's venv), the plots are left out and
said so: the record and the report hold everything they show."""
from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rig.core import RigError, progress
from rig.core.documents import dump_json
from rig.core.fs import atomic_write, output_dir


def _plain(given: str | Path, option: str, what: str) -> Path:
    """GIVEN as an absolute path, refused when empty (it would mean the current directory) or holding control
    characters (a directory reaches a server's command line), or when a link to nothing or a file is in the
    way of making it: whatever is refused is refused before any work, never once the work is done."""
    text = str(given)
    if not text or any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise RigError(f"{option} {text!r}: give {what}, not empty (that would be the current directory) and "
                       "without control characters")
    path = Path(text).absolute()
    if ".." in path.parts:  # as the kernel reads it, after the links before it: what is checked is what is written
        try:
            path = path.resolve()
        except (RuntimeError, OSError) as exc:  # a loop of links
            raise RigError(f"{option} {text}: cannot be resolved ({exc}); give {what}") from None
    for place in (path, *path.parents):
        if not os.path.lexists(place):
            continue
        if place.is_symlink() and not place.exists():
            raise RigError(f"{option} {path}: {place} is a link to {os.readlink(place)}, which does not exist; "
                           f"give {what} (or make the link's target)")
        if place != path and not place.is_dir():
            raise RigError(f"{option} {path}: {place} is not a directory; give {what} under a directory")
        break
    return path


def results_dir(given: str | Path, outputs: tuple[str, ...] = (), option: str = "--out",
                places: tuple[str, ...] = ()) -> Path:
    """OPTION's result directory as rig writes it, absolute: new or a directory, none of OUTPUTS (the files
    written into it) a directory, each of PLACES (where servers write) a directory of its own or absent, never a
    link. Every command's --out is checked by this, when its command line is read."""
    out = _plain(given, option, "a directory")
    output_dir(out, option)
    taken = [name for name in outputs if (out / name).is_dir() and not (out / name).is_symlink()]
    if taken:
        raise RigError(f"{option} {out} holds directories where rig writes {', '.join(taken)}; give another {option}")
    for name in places:  # where servers write: never through a link left there
        place = out / name
        if place.is_symlink() or (place.exists() and not place.is_dir()):
            raise RigError(f"{option} {out}: {name} is not a directory of its own (a link or a file); remove it or "
                           f"give another {option}")
    return out


def output_file(given: str | Path, option: str) -> Path:
    """OPTION's one output file (--output, --junit) as rig writes it, absolute: new or replaceable (never a
    directory), under a directory."""
    path = _plain(given, option, "a file path")
    if path.is_dir():
        raise RigError(f"{option} {path} is a directory; give a file path")
    # written by a rename over the path: a device, a FIFO or a link there would be replaced, not written to
    if os.path.lexists(path) and (path.is_symlink() or not path.is_file()):
        raise RigError(f"{option} {path} is {'a link' if path.is_symlink() else 'not a regular file'}; rig replaces "
                       "the file at the path whole, so give a new or a regular file's path")
    return path


def apart(given: str | Path, option: str, out: str | Path, outputs: tuple[str, ...]) -> None:
    """GIVEN (OPTION's file) is neither OUT nor any of OUTPUTS in it, by name or through a link: a file written
    beside a run's record never replaces it."""
    mine = Path(os.path.realpath(given))
    if mine == Path(os.path.realpath(out)):
        raise RigError(f"{option} {given} is the result directory {out}; give {option} a file path")
    for name in outputs:
        theirs = Path(os.path.realpath(Path(out) / name))
        if mine == theirs or (mine.exists() and theirs.exists() and mine.samefile(theirs)):
            raise RigError(f"{option} {given} is {Path(out) / name}, the run's own {name}; give {option} "
                           "another path")


def record(result: dict, name: str = "the record") -> str:
    """RESULT as the JSON record NAME; a non-finite number in it is refused (rig.core.documents.dump_json)."""
    return dump_json(result, name, indent=2, default=str) + "\n"


def write(out: str | Path, files: dict[str, str], draw: Callable[[], dict[str, Any]] | None = None) -> list[str]:
    """FILES (name -> text, in order) into OUT, then the figures DRAW returns (name -> a matplotlib Figure) as
    PNGs; the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = [str(atomic_write(out / name, text)) for name, text in files.items()]
    try:
        figures = draw() if draw else {}
    except ImportError as exc:
        progress(f"plots not drawn in {out}: {exc.name or 'matplotlib'} does not import here")
        return written
    for name, figure in figures.items():
        png = io.BytesIO()
        figure.savefig(png, format="png", dpi=110)
        written.append(str(atomic_write(out / name, png.getvalue())))
    return written
