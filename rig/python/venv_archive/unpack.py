"""An archive as a venv: every refusal that needs no archive first, then the archive hashed whole, then each
member checked against the manifest's next entry and written into a staging directory that takes the venv's
place only once all of it matched.

rig writes each member itself rather than through tarfile's extract() and its extraction filters: a file is
created new and never through a link (O_EXCL | O_NOFOLLOW) and hashed as it is written; the `data` filter would
refuse every venv (its bin/python is an absolute link) and resolve each path (half the unpack's time); and
Python 3.11 before 3.11.4, which rig supports, has no filters."""
from __future__ import annotations

import contextlib
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rig.core import RigError, progress
from rig.core.fs import open_plain, take_place
from rig.python.venv import read_marker
from rig.python.venv_archive.manifest import (
    ANY_PATCHES,
    FIXED_MTIME,
    absolute,
    digest_of,
    fits,
    lies_inside,
    zstd_binary,
)
from rig.python.venv_archive.members import hashed, marked, read_tar, unzstd, unzstd_ended
from rig.python.venv_archive.place import venv_place


def settle(manifest: dict, venv: Path, lock_hash: str | None, inputs: dict[str, str | Path] | None = None,
           patches: dict | str | None = ANY_PATCHES) -> dict | None:
    """Every refusal that needs no archive (fits(), with LOCK_HASH and PATCHES), INPUTS (what the run reads:
    {"manifest": path, ...}) inside the venv among them, then the answer where nothing is to be written (the venv
    already holds the lock); None where the archive is to be read. A link rig made to an image it mounted, in any
    store, is replaced (the image stays there, mounted, for a rollback)."""
    name = manifest["archive"]["name"]
    if why := fits(manifest, lock_hash, venv, patches):
        raise RigError(f"archive {name} does not fit {venv}: {why}")
    if venv.parent == venv:
        raise RigError(f"{venv} is the root directory, no venv's path; give the venv's own directory")
    _none_inside(venv, {**(inputs or {}), "working directory": os.getcwd()})
    marker = read_marker(venv) if venv_place(venv, None).kind == "dir" else None
    if marker and marker["lock_hash"] == manifest["lock_hash"]:
        return {"changed": False, "venv": str(venv), "msg": f"{venv} already has lock {manifest['lock_hash'][:12]}"}
    return None


def _none_inside(venv: Path, paths: dict[str, str | Path]) -> None:
    """The old venv is moved aside and removed, and its files with it: none of PATHS (the run's inputs, and where
    it runs from) may be inside it."""
    for what, path in paths.items():
        if lies_inside(path, venv):
            raise RigError(f"the {what} {path} is inside {venv}, which the unpack replaces (and removes with the old "
                           f"venv): move it out of {venv} first")


def unpack(archive: str | Path, manifest: dict, venv: str | Path, lock_hash: str | None = None,
           check: bool = False, patches: dict | str | None = ANY_PATCHES) -> dict:
    """The archive MANIFEST (as read_manifest returns it) describes, as the venv VENV: refused before anything is
    written where it does not fit (fits(), with LOCK_HASH and PATCHES) or its bytes are not the manifest's; a no-op where the
    venv already holds its lock. Every member must be the manifest's next entry, bytes and all, or the staging
    directory is removed and nothing at VENV changes."""
    venv = absolute(venv)
    done = settle(manifest, venv, lock_hash, {"archive": archive}, patches)
    if done is not None:
        return done
    zstd, name = zstd_binary(), manifest["archive"]["name"]
    with os.fdopen(open_plain(archive, os.O_RDONLY, "the venv archive"), "rb") as handle:
        if digest_of(handle) != (manifest["archive"]["sha256"], manifest["archive"]["size"]):
            raise RigError(f"{archive} is not the archive its manifest describes (sha256 or size differs): pull or "
                           "copy it again")
        if check:  # every precondition of the run, the archive's bytes included, checked; only the writing skipped
            return {"changed": True, "venv": str(venv), "msg": f"would unpack {name} into {venv}" +
                    (", replacing the venv there" if venv.exists() else "")}
        handle.seek(0)  # zstd reads the very file just hashed, not whatever the path names by now
        with made_parents(venv.parent):
            try:
                staging = Path(tempfile.mkdtemp(dir=venv.parent, prefix=f".{venv.name}.rig-unpack-"))  # one filesystem
            except OSError as exc:
                raise RigError(f"cannot make the staging directory beside {venv}: {exc.strerror or exc}") from None
            try:
                progress(f"unpacking {name} ({len(manifest['entries'])} entries) into {venv}")
                _decompress(zstd, handle, manifest, staging, str(archive))
                marked(lambda: read_marker(staging), manifest, str(archive))
                _swap(staging, venv)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
    return {"changed": True, "venv": str(venv), "lock_hash": manifest["lock_hash"], "entries": len(manifest["entries"]),
            "msg": f"unpacked {name} into {venv}"}


@contextlib.contextmanager
def made_parents(directory: Path) -> Iterator[None]:
    """DIRECTORY made with whatever of its parents is missing, and those removed again where the block fails: a
    refused run leaves nothing it made (a directory that still holds something, a download to resume, stays)."""
    missing = [path for path in (directory, *directory.parents) if not os.path.lexists(path)]  # the deepest first
    try:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RigError(f"cannot make {directory}: {exc.strerror or exc}; give a --venv whose parent rig can "
                           "write") from None
        yield
    except BaseException:
        for path in missing:
            with contextlib.suppress(OSError):
                path.rmdir()
        raise


def _decompress(zstd: str, handle, manifest: dict, staging: Path, source: str) -> None:
    """`zstd -dc` of HANDLE read member by member (members.read_tar), each one written into STAGING
    (decompressing and writing on two cores); directories take their mode and time once filled."""
    dirs: list[Path] = []

    def write(tar: tarfile.TarFile, member: tarfile.TarInfo, kind: str, entry: list) -> None:
        target = staging / member.name  # checked: inside STAGING, under no link
        try:
            if kind == "dir":
                os.mkdir(target, 0o700)  # its mode once it is filled: a directory packed read-only still takes its files
                dirs.append(target)
            elif kind == "file":
                _write(tar, member, target, entry[4], source)
            else:
                os.symlink(member.linkname, target)
                os.utime(target, (FIXED_MTIME, FIXED_MTIME), follow_symlinks=False)
        except OSError as exc:
            raise RigError(f"{source}: cannot write {member.name[:200]!r}: {exc.strerror or exc}") from None

    with unzstd(zstd, handle) as child:
        read_tar(child, manifest["entries"], source, write)
        unzstd_ended(child, source)
    for path in [*reversed(dirs), staging]:  # innermost first: filling a directory changes its mtime
        os.chmod(path, 0o755)
        os.utime(path, (FIXED_MTIME, FIXED_MTIME), follow_symlinks=False)


def _write(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path, sha: str, source: str) -> None:
    """MEMBER's bytes into TARGET, a new file (O_EXCL, no link followed), hashed as written."""
    # created here, never opened before (O_EXCL): open_plain's checks of an existing file have nothing to look at
    made = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, member.mode)
    with os.fdopen(made, "wb") as out:
        hashed(tar, member, sha, source, out)
        os.fchmod(out.fileno(), member.mode)
    os.utime(target, (FIXED_MTIME, FIXED_MTIME), follow_symlinks=False)


def _swap(staging: Path, venv: Path) -> None:
    """STAGING, whole and checked, takes VENV's place (take_place: the old venv put back if that fails); the old
    venv is removed after. The two renames leave a moment with no venv at VENV: Python has no RENAME_EXCHANGE
    (renameat2), which would swap them in one step."""
    old = Path(tempfile.mkdtemp(dir=venv.parent, prefix=f".{venv.name}.rig-old-")) if os.path.lexists(venv) else None
    try:
        take_place(staging, venv, old / venv.name if old else None, "the old venv")
    except BaseException:
        if old is not None:
            with contextlib.suppress(OSError):  # empty, unless the old venv could not be put back: then it is there
                old.rmdir()
        raise
    if old is not None:
        _remove(old)


def _remove(path: Path) -> None:
    """PATH's tree removed, even where its owner made a directory read-only (a tree rig moved aside: nothing in
    it is followed through a link)."""
    shutil.rmtree(path, ignore_errors=True)
    if not os.path.lexists(path):
        return
    for root, dirs, _ in os.walk(path):  # top down: each directory made writable before it is listed
        for name in dirs:
            inner = os.path.join(root, name)
            if not os.path.islink(inner):
                try:
                    os.chmod(inner, 0o700)
                except OSError:
                    pass
    shutil.rmtree(path, ignore_errors=True)


