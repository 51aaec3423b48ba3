"""What stands at a venv's path before rig replaces it: nothing yet, a venv directory, or the link `rig venv mount`
made into its image store (STORE/VENVNAME-HASH/NAME); anything else is refused. Mount, unpack and the environment
module all ask here; it imports neither pull nor mount, so none of them needs a lazy import to reach it."""
from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path
from typing import Literal, NamedTuple

from rig.core import RigError
from rig.core.fs import private_dir
from rig.python.venv import MARKER
from rig.python.venv_archive.manifest import absolute

STORE = Path("/var/lib/rig/venv-images")
STORE_WHAT = "the venv image store"
IMAGE_NAME = re.compile(r"venv-[0-9a-f]{16}-py[0-9]+\.[0-9]+-[A-Za-z0-9_.-]{1,32}")
RIG_LINK_FIX = "remove the link (or move it) and run again, or give another --venv"


def store_of(venv: Path, root: Path = STORE) -> Path:
    """The store directory of the venv at VENV: one per venv path, so two venvs of one lock never share a mount."""
    return root / f"{venv.name}-{hashlib.sha256(str(venv).encode()).hexdigest()[:12]}"


def rig_link(venv: str | Path, root: Path | None) -> Path | None:
    """The mount point VENV links to where VENV is a link rig made: to STORE/VENVNAME-HASH/NAME, the store of VENV's
    own path under ROOT (the same directory once links are resolved), else None. ROOT None takes any root: for a
    caller that only reads through the link or replaces it, and cannot know which --store mount was given. A store
    someone but root may change is refused (private_dir): what is mounted from it could be theirs."""
    venv = absolute(venv)
    if not os.path.islink(venv):
        return None
    target = Path(os.readlink(venv))
    store = store_of(venv, root or Path("/"))
    if not target.is_absolute() or os.path.normpath(target) != str(target) or not IMAGE_NAME.fullmatch(target.name) \
            or target.parent.name != store.name:
        return None
    if root is not None and os.path.realpath(target.parent) != os.path.realpath(store):
        return None
    private_dir(target.parent, STORE_WHAT)
    return target


class VenvPlace(NamedTuple):
    """What is at a venv's path: "absent", "dir" (a venv directory, or an empty one) or "link" (rig's, to TARGET)."""

    kind: Literal["absent", "dir", "link"]
    target: Path | None = None


def venv_place(venv: Path, root: Path | None) -> VenvPlace:
    """What is at VENV, which rig is about to replace (rig_link's ROOT says whose links are rig's); refused: a link
    rig did not make, a file, a FIFO, a device, a directory that holds files but is no venv, and (where VENV is not
    there yet) a parent it cannot be made in."""
    try:
        seen = os.lstat(venv)
    except (FileNotFoundError, NotADirectoryError):  # a file above it: said by _can_make
        _can_make(venv)
        return VenvPlace("absent")
    except OSError as exc:
        raise RigError(f"cannot look at the venv {venv}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(seen.st_mode):
        return VenvPlace("link", _rigs_link(venv, root))
    if not stat.S_ISDIR(seen.st_mode):
        raise RigError(f"{venv} is not a directory or a link (a file, a FIFO or a device); rig replaces only a venv",
                       hint=f"remove {venv} and run again, or give another --venv")
    if not any(os.path.lexists(venv / inner) for inner in (MARKER, "pyvenv.cfg")) and any(venv.iterdir()):
        raise RigError(f"{venv} holds files but is no venv (no {MARKER}, no pyvenv.cfg); rig replaces only a venv",
                       hint=f"move what is in {venv} elsewhere, or give another --venv")
    return VenvPlace("dir")


def _rigs_link(venv: Path, root: Path | None) -> Path:
    """The mount point VENV (a link) leads to, where rig made it; else refused: rig never replaces another's link."""
    target = rig_link(venv, root)
    if target is None:
        where = store_of(venv, root) if root is not None else f"STORE/{store_of(venv, Path('/')).name}"
        raise RigError(f"{venv} is a link to {os.readlink(venv)!r}, which rig did not make (rig links a venv only "
                       f"into {where}); it is left as it is", hint=RIG_LINK_FIX)
    return target


def _can_make(venv: Path) -> None:
    """VENV's nearest existing parent must be a directory (or a link to one) for VENV to be made in it."""
    above = next(path for path in venv.parents if os.path.lexists(path))
    if not above.is_dir():
        raise RigError(f"{above} is not a directory (a file, or a link to nothing), so {venv} cannot be made under "
                       "it", hint="remove it or give another --venv")
