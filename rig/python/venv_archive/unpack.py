"""An archive as a venv: every refusal that needs no archive first, then the archive hashed whole, then each
member checked against the manifest's next entry and written into a staging directory that takes the venv's
place only once all of it matched.

rig writes each member itself rather than through tarfile's extract() and its extraction filters: a file is
created new and never through a link (O_EXCL | O_NOFOLLOW) and hashed as it is written; the `data` filter would
refuse every venv (its bin/python is an absolute link) and resolve each path (half the unpack's time); and
Python 3.11 before 3.11.4, which rig supports, has no filters."""
from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rig.core import RigError, progress
from rig.core.fs import open_plain
from rig.core.proc import PIPE, TimeoutExpired, spawn
from rig.python.venv import MARKER, read_marker
from rig.python.venv_archive.manifest import (
    ANY_PATCHES,
    FIXED_MTIME,
    absolute,
    digest_of,
    fits,
    path_problem,
    zstd_binary,
)

# bytes of headers before one member: rig packs a PAX header of a few kB at most (a path and a link text of 4096);
# a chain of the smallest headers this long is ~128 deep, well within Python's recursion limit
HEADERS_LIMIT = 64 << 10
ZSTD_EXIT = 5.0  # seconds zstd takes to exit once it has failed and closed its output
TRAILER_LIMIT = 1 << 20  # bytes after the tar's end: tar pads its last record (10 kB); not a stream to drain


def settle(manifest: dict, venv: Path, lock_hash: str | None, check: bool,
           inputs: dict[str, str | Path] | None = None, patches: dict | str | None = ANY_PATCHES) -> dict | None:
    """Every refusal that needs no archive (fits(), with LOCK_HASH and PATCHES), INPUTS (what the run reads:
    {"manifest": path, ...}) inside the venv among them, then the answer where nothing is to be written (the venv
    already holds the lock); None where the archive is to be read."""
    name = manifest["archive"]["name"]
    if why := fits(manifest, lock_hash, venv, patches):
        raise RigError(f"archive {name} does not fit {venv}: {why}")
    if venv.parent == venv:
        raise RigError(f"{venv} is the root directory, no venv's path; give the venv's own directory")
    real = Path(os.path.realpath(venv))
    # the old venv is moved aside and removed, and its files with it: the run's inputs, and where it runs from
    for what, path in {**(inputs or {}), "working directory": os.getcwd()}.items():
        if real == Path(os.path.realpath(path)) or real in Path(os.path.realpath(path)).parents:
            raise RigError(f"the {what} {path} is inside {venv}, which the unpack replaces (and removes with the old "
                           f"venv): move it out of {venv} first")
    try:
        seen = os.lstat(venv)
    except (FileNotFoundError, NotADirectoryError):  # a file above it: said below
        seen = None
    except OSError as exc:
        raise RigError(f"cannot look at the venv {venv}: {exc.strerror or exc}") from None
    from rig.python.venv_archive.mount import rig_link  # mount pulls through this module

    # a link rig made to an image it mounted is replaced (the image stays in rig's store, mounted, for a rollback)
    linked = seen is not None and stat.S_ISLNK(seen.st_mode) and rig_link(venv) is not None
    if seen is not None and not stat.S_ISDIR(seen.st_mode) and not linked:
        raise RigError(f"{venv} is a link or not a directory; rig replaces only a venv directory: remove it")
    if seen is None:  # the venv is made in its parent, which must be a directory (a link to one) or not yet there
        above = next(path for path in venv.parents if os.path.lexists(path))
        if not above.is_dir():
            raise RigError(f"{above} is not a directory (a file, or a link to nothing), so {venv} cannot be made "
                           "under it: remove it or give another --venv")
    marker = read_marker(venv) if seen and not linked else None
    if seen and not linked and marker is None and not os.path.lexists(venv / "pyvenv.cfg") and any(venv.iterdir()):
        raise RigError(f"{venv} holds files but is no venv (no {MARKER}, no pyvenv.cfg); rig replaces only a venv: "
                       "move what is there, or give another --venv")
    if marker and marker["lock_hash"] == manifest["lock_hash"]:
        return {"changed": False, "venv": str(venv), "msg": f"{venv} already has lock {manifest['lock_hash'][:12]}"}
    return None


def unpack(archive: str | Path, manifest: dict, venv: str | Path, lock_hash: str | None = None,
           check: bool = False, patches: dict | str | None = ANY_PATCHES) -> dict:
    """The archive MANIFEST (as read_manifest returns it) describes, as the venv VENV: refused before anything is
    written where it does not fit (fits(), with LOCK_HASH and PATCHES) or its bytes are not the manifest's; a no-op where the
    venv already holds its lock. Every member must be the manifest's next entry, bytes and all, or the staging
    directory is removed and nothing at VENV changes."""
    venv = absolute(venv)
    done = settle(manifest, venv, lock_hash, check, {"archive": archive}, patches)
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
                _marked(staging, manifest, str(archive))
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


class _Bounded(io.RawIOBase):
    """The tar stream as tarfile reads it, never more than HEADERS_LIMIT bytes past the data of the member before.
    tarfile reads what precedes a member (a PAX header, a GNU long name, a sparse map) whole into memory and
    follows a chain of headers by recursion, so a few kB of zstd could claim gigabytes or a chain thousands deep;
    bounded where tarfile reads, neither can happen, whatever tarfile's parsing does within the bound."""

    def __init__(self, stream) -> None:
        super().__init__()
        self.stream, self.taken, self.allowed = stream, 0, HEADERS_LIMIT

    def readable(self) -> bool:
        return True

    def admit(self, member: tarfile.TarInfo, kind: str) -> None:
        """MEMBER has come: its data (a file's, in whole blocks) may be read, then the next member's headers."""
        data = -(-member.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE if kind == "file" else 0
        self.allowed = self.taken + data + HEADERS_LIMIT

    def read(self, size: int = -1) -> bytes:
        room = self.allowed - self.taken
        if room <= 0:
            raise tarfile.ReadError(f"more than {HEADERS_LIMIT >> 10} kB of headers before one member (rig packs a "
                                    "few kB)")
        data = self.stream.read(room if size < 0 else min(size, room))
        self.taken += len(data)
        return data


def _marked(staging: Path, manifest: dict, source: str) -> None:
    """The unpacked venv's marker, which says which lock a venv holds (a later unpack, verify, install read it),
    must name the manifest's lock: a manifest that claims a lock its archive does not hold is refused."""
    try:
        marker = read_marker(staging)
    except RigError as exc:
        raise RigError(f"{source}: its venv's marker {MARKER} is not one rig wrote ({exc}); the archive is not one "
                       "rig packs: pack the venv again") from None
    if marker is None or marker["lock_hash"] != manifest["lock_hash"]:
        said = f"names lock {marker['lock_hash'][:16]}" if marker else "is missing"
        raise RigError(f"{source}: its venv's marker {MARKER} {said}, its manifest lock {manifest['lock_hash'][:16]}; "
                       "the archive and its manifest do not belong together: pack the venv again")


def _decompress(zstd: str, handle, manifest: dict, staging: Path, source: str) -> None:
    """`zstd -dc` of HANDLE piped into tarfile, each member written into STAGING (decompressing and writing on
    two cores)."""
    with tempfile.TemporaryFile() as errors:
        child = spawn([zstd, "-dc"], "decompressing the venv archive", stdin=handle, stdout=PIPE, stderr=errors)
        assert child.stdout  # a pipe
        try:
            try:
                # reads of 1 MiB: tarfile's default 10 KiB record made a third of the unpack's time
                stream = _Bounded(child.stdout)
                with tarfile.open(fileobj=stream, mode="r|", bufsize=1 << 20) as tar:
                    _extract(tar, stream, manifest["entries"], staging, source)
                # the tar's end padding: zstd ends once it is read; more is no tar rig packs, and is not drained (a
                # few kB of zstd decompress to terabytes)
                if len(child.stdout.read(TRAILER_LIMIT + 1)) > TRAILER_LIMIT:
                    raise RigError(f"{source}: holds more than {TRAILER_LIMIT >> 20} MiB after the tar's end; not an "
                                   "archive rig packs: pack it again")
            except (tarfile.TarError, EOFError, ValueError) as exc:  # ValueError: tarfile's of a malformed header
                try:  # zstd that failed has ended; zstd still writing what nobody reads would wait for good
                    code = child.wait(ZSTD_EXIT)
                except TimeoutExpired:
                    code = 0  # it decompresses: the tar is what is wrong (finally kills it)
                errors.seek(0)
                said = errors.read(2000).decode(errors="replace").strip()
                raise RigError(f"{source}: " + (f"zstd could not decompress it (exit {code}): {said}" if code else
                                                f"not a tar as rig packs it ({exc})")) from None
            code = child.wait()
            if code:
                errors.seek(0)
                raise RigError(f"{source}: zstd could not decompress it (exit {code}): "
                               f"{errors.read(2000).decode(errors='replace').strip()}")
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            child.stdout.close()


def _kind(member: tarfile.TarInfo) -> str:
    return "dir" if member.isdir() else "link" if member.issym() else \
        "file" if member.type in (tarfile.REGTYPE, tarfile.AREGTYPE) and not member.issparse() else "other"


def _extract(tar: tarfile.TarFile, stream: _Bounded, entries: list, staging: Path, source: str) -> None:
    """Each member of TAR (read through STREAM), which must be the next of ENTRIES (kind, path, mode, size, bytes,
    link text), into STAGING: files created new and never through a link, links only after every file, every time
    FIXED_MTIME."""
    expected, dirs, linked, links = iter(entries), [], False, set()
    for member in tar:
        entry = next(expected, None)
        kind = _kind(member)
        stream.admit(member, kind)
        if entry is None or [kind, member.name, member.mode] != entry[:3] or \
                (kind == "file" and member.size != entry[3]) or (kind == "link" and member.linkname != entry[4]):
            listed = f"the manifest's next entry is {entry[1]!r} ({entry[0]})" if entry else "the manifest lists no more"
            if entry and [kind, member.name] == entry[:2]:
                listed = f"its {'mode' if member.mode != entry[2] else 'size' if kind == 'file' else 'link text'} differs"
            raise RigError(f"{source}: member {member.name[:200]!r} ({kind}) is not its manifest's: {listed}; the "
                           "archive and its manifest do not belong together")
        if kind != "link" and linked:
            raise RigError(f"{source}: {member.name[:200]!r} comes after a link: the links come last")
        # no resolve() per member (it was half the unpack's time): a name with no absolute start and no `..` part,
        # in a STAGING that is new and holds no link until the last members (the links), with every file created
        # new (O_EXCL | O_NOFOLLOW), cannot land outside STAGING
        if problem := path_problem(member.name):
            raise RigError(f"{source}: member {problem} (it leads outside the venv)")
        target = staging / member.name
        try:
            if kind == "dir":
                os.mkdir(target, 0o700)  # its mode once it is filled: a directory packed read-only still takes its files
                dirs.append(target)
            elif kind == "file":
                _write(tar, member, target, entry[4], source)
            else:
                linked = True
                parts = member.name.split("/")  # a link under a link made here would be made through it, outside
                if any("/".join(parts[:end]) in links for end in range(1, len(parts))):
                    raise RigError(f"{source}: {member.name[:200]!r} lies under a link of the archive; the links of "
                                   "a venv lie in its directories")
                links.add(member.name)
                os.symlink(member.linkname, target)
                os.utime(target, (FIXED_MTIME, FIXED_MTIME), follow_symlinks=False)
        except OSError as exc:
            raise RigError(f"{source}: cannot write {member.name[:200]!r}: {exc.strerror or exc}") from None
    if (missing := next(expected, None)) is not None:
        raise RigError(f"{source}: ends before {missing[1]!r}, which its manifest lists; the archive is not whole")
    for path in [*reversed(dirs), staging]:  # innermost first: filling a directory changes its mtime
        os.chmod(path, 0o755)
        os.utime(path, (FIXED_MTIME, FIXED_MTIME), follow_symlinks=False)


def _write(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path, sha: str, source: str) -> None:
    """MEMBER's bytes into TARGET, a new file (O_EXCL, no link followed), hashed as written."""
    digest = hashlib.sha256()
    reader = tar.extractfile(member)
    assert reader is not None  # a regular file
    # created here, never opened before (O_EXCL): open_plain's checks of an existing file have nothing to look at
    made = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, member.mode)
    with os.fdopen(made, "wb") as out:
        while chunk := reader.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
        os.fchmod(out.fileno(), member.mode)
    if digest.hexdigest() != sha:
        raise RigError(f"{source}: {member.name[:200]!r} is not the file its manifest describes (sha256 differs); "
                       "the archive and its manifest do not belong together")
    os.utime(target, (FIXED_MTIME, FIXED_MTIME), follow_symlinks=False)


def _swap(staging: Path, venv: Path) -> None:
    """STAGING, whole and checked, takes VENV's place; the old venv is removed after. The two renames leave a
    moment with no venv at VENV: Python has no RENAME_EXCHANGE (renameat2), which would swap them in one step."""
    old = None
    if os.path.lexists(venv):
        old = Path(tempfile.mkdtemp(dir=venv.parent, prefix=f".{venv.name}.rig-old-"))
        try:
            os.rename(venv, old / venv.name)
        except OSError as exc:  # a venv directory its owner made read-only cannot move to another directory
            old.rmdir()
            raise RigError(f"cannot move the old venv {venv} aside: {exc.strerror or exc}; make it writable or "
                           "remove it") from None
    try:
        os.rename(staging, venv)
    except OSError:
        if old is not None:
            os.rename(old / venv.name, venv)
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


