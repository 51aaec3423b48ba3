"""A venv as the archive sees it: its entries walked without following a link, each one's mode as packed, and a
venv compared with a manifest entry by entry."""
from __future__ import annotations

import os
import stat
from pathlib import Path

from rig.core import RigError
from rig.core.fs import open_plain
from rig.python.venv_archive.manifest import digest_of, link_problem, path_problem


def walk(venv: Path) -> list[tuple[str, str, os.stat_result]]:
    """(kind, path, lstat) of every entry under VENV, never following a link: directories and files in path order
    (a directory before what it holds), then every link, in path order."""
    found: list[tuple[str, str, os.stat_result]] = []
    links: list[tuple[str, str, os.stat_result]] = []

    def visit(inner: str) -> None:
        try:
            listed = os.scandir(venv / inner if inner else venv)
        except OSError as exc:
            raise RigError(f"cannot list {venv / inner}: {exc.strerror or exc}; rig packs all of a venv") from None
        with listed:
            for entry in listed:
                path = f"{inner}/{entry.name}" if inner else entry.name
                if path_problem(path):  # what read_manifest refuses is never packed: the archive would not unpack
                    raise RigError(f"{venv}/{path!r}: a name that is not UTF-8, holds a control character or is "
                                   "too long; rename it")
                seen = entry.stat(follow_symlinks=False)
                if stat.S_ISLNK(seen.st_mode):
                    if link_problem(os.readlink(entry.path)):
                        raise RigError(f"{venv}/{path} is a link to {os.readlink(entry.path)!r}: link text that is "
                                       "not UTF-8, holds a control character or is too long; replace the link")
                    links.append(("link", path, seen))
                elif stat.S_ISDIR(seen.st_mode):
                    found.append(("dir", path, seen))
                    visit(path)
                elif stat.S_ISREG(seen.st_mode):
                    found.append(("file", path, seen))  # a hard link too: its bytes, as a file of its own
                else:
                    raise RigError(f"{venv}/{path} is a FIFO, a socket or a device: a venv holds directories, files "
                                   "and links only; remove it and pack again")

    visit("")
    return sorted(found, key=lambda e: e[1]) + sorted(links, key=lambda e: e[1])


def packed_mode(st_mode: int, kind: str) -> int:
    """The mode an entry is packed with: only whether a file is executable is kept (no owner's quirks, no set-id)."""
    return {"dir": 0o755, "link": 0o777}.get(kind) or (0o755 if st_mode & 0o111 else 0o644)



def verify_against(venv: str | Path, manifest: dict) -> dict:
    """VENV compared with MANIFEST, entry by entry (kind, mode, size, sha256, link text), and what VENV holds
    beyond it, but for __pycache__: Python writes there as it imports."""
    venv = Path(venv)
    if venv.is_symlink() or not venv.is_dir():
        raise RigError(f"{venv} is not a venv directory")
    found = {path: (kind, seen) for kind, path, seen in walk(venv)}
    differs = []
    for kind, path, mode, size, data in manifest["entries"]:
        have = found.pop(path, None)
        if have is None:
            differs.append(f"{path}: missing")
        elif have[0] != kind:
            differs.append(f"{path}: a {have[0]}, the archive has a {kind}")
        elif packed_mode(have[1].st_mode, kind) != mode:
            differs.append(f"{path}: mode {oct(packed_mode(have[1].st_mode, kind))}, the archive has {oct(mode)}")
        elif kind == "link" and os.readlink(venv / path) != data:
            differs.append(f"{path}: links to {os.readlink(venv / path)!r}, the archive to {data!r}")
        elif kind == "file":
            with os.fdopen(open_plain(venv / path, os.O_RDONLY, "the venv's file", follow=False), "rb") as handle:
                if digest_of(handle) != (data, size):
                    differs.append(f"{path}: its bytes differ from the archive's")
    differs += [f"{path}: not in the archive" for path in sorted(found) if "__pycache__" not in path.split("/")]
    return {"ok": not differs, "differs": differs, "entries": len(manifest["entries"])}
