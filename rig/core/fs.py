"""Files rig writes and paths that come from input: one way to write, hash and confine them.

Every file rig writes goes through atomic_write, so a crash, a kill or a full
disk leaves the old file or the new one, never a torn one. Paths that come from
input (archive members, lock filenames, patch targets) stay under their root.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rig.core import RigError, progress


def confined(root: str | Path, relative: str, what: str, follow: bool = True) -> Path:
    """ROOT/RELATIVE, resolved, or a RigError when it would land outside ROOT (`..`, an absolute path,
    a link out): nothing is written through a path that escapes its root. follow=False leaves a link at the
    last component unresolved, for a caller that replaces what is there (and never writes through it)."""
    base = Path(root).resolve()
    if not relative or "\0" in relative or Path(relative).is_absolute():
        raise RigError(f"{what}: {relative!r} is not a relative path under {base}; refusing it")
    try:  # resolve() raises on a loop of links (RuntimeError before Python 3.13, OSError after)
        if follow:
            target = (base / relative).resolve()
        elif ".." in Path(relative).parts or (base / relative).parent.resolve() / Path(relative).name == base:
            raise RigError(f"{what}: {relative!r} leads outside {base}; refusing it (path traversal)")
        else:
            target = (base / relative).parent.resolve() / Path(relative).name
    except (RuntimeError, OSError) as exc:
        raise RigError(f"{what}: {relative!r} under {base} cannot be resolved ({exc}); a loop of links? "
                       "refusing it") from None
    if target != base and base not in target.parents:
        raise RigError(f"{what}: {relative!r} leads outside {base}; refusing it (path traversal)")
    return target


def kind(path: str | Path) -> str:
    """What stands at PATH, in words (a link is followed): a directory, a regular file, a FIFO, a socket, a device."""
    import stat

    mode = os.stat(path).st_mode
    return next((said for test, said in ((stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a file"),
                                         (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
                 if test(mode)), "a device")


def output_dir(path: str | Path, option: str) -> None:
    """An output directory given on the command line may be new or a directory, never anything else."""
    if Path(path).exists() and not Path(path).is_dir():
        raise RigError(f"{option} {path} is {kind(path)}; give a directory")


@contextmanager
def atomic_file(path: str | Path, mode: int | None = None) -> Iterator:
    """A binary file to write that replaces PATH in one rename when the block ends: readers see the old file
    or the new one, whole (fsynced first). MODE defaults to the old file's mode, else 0644. The temporary file
    sits beside PATH (same filesystem) and is removed if anything fails, ENOSPC included."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.rig-")
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:  # a write or fsync names no file: ENOSPC would read
            exc.filename = str(path)                           # "system: No space left on device"
        raise


def atomic_write(path: str | Path, data: str | bytes, mode: int | None = None) -> Path:
    """Replace PATH with DATA in one rename (atomic_file)."""
    with atomic_file(path, mode) as handle:
        handle.write(data.encode() if isinstance(data, str) else data)
    return Path(path)


def atomic_copy(src: str | Path, dest: str | Path) -> Path:
    """atomic_write for a file too big to hold in memory (a wheel): copied beside DEST, then renamed."""
    with atomic_file(dest, 0o644) as handle, open(src, "rb") as source:
        shutil.copyfileobj(source, handle, 1 << 20)
    return Path(dest)


def link_or_copy(src: str | Path, dest: str | Path) -> Path:
    """DEST as a hard link to SRC (no bytes copied; size and times stay SRC's), or an atomic copy where the
    two sit on different filesystems. DEST must not exist."""
    try:
        os.link(src, dest)
    except OSError:
        atomic_copy(src, dest)
    return Path(dest)


class MissingFile(RigError, FileNotFoundError):
    """A file rig was to read is not there: a RigError for the user, a FileNotFoundError for a caller to whom
    absence is an answer (no marker yet)."""


MAX_READ = 16 << 20  # bytes: the largest document, patch target or state file rig reads whole


def open_plain(path: str | Path, flags: int, what: str, follow: bool = True) -> int:
    """A descriptor of PATH opened with FLAGS, or a RigError when it is not a regular file (a FIFO, a device,
    a directory). The one way rig opens a file it did not just create: the check is on the open file itself
    (fstat), so nothing swapped in between is used; the open never blocks (a FIFO answers at once instead of
    waiting for its other end); follow=False refuses a link at PATH."""
    verb = "read" if flags & os.O_ACCMODE == os.O_RDONLY else "write"
    try:  # before opening: opening a device can act (a watchdog arms, a tape rewinds)
        seen = os.stat(path, follow_symlinks=follow).st_mode
    except FileNotFoundError:
        seen = None  # created by the open, or missing: the open says which
    except OSError as exc:
        raise RigError(f"cannot {verb} {what} {path}: {exc.strerror or exc}") from exc
    if seen is not None and stat.S_ISLNK(seen):
        raise RigError(f"cannot {verb} {what} {path}: it is a link, and a link there is never followed")
    if seen is not None and not stat.S_ISREG(seen):
        raise RigError(f"{what} {path} is not a regular file")
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW), 0o644)
    except FileNotFoundError as exc:
        raise MissingFile(f"cannot {verb} {what} {path}: No such file or directory") from exc
    except OSError as exc:
        hint = {errno.ELOOP: " (a link there is never followed)", errno.ENXIO: " (a FIFO is never opened)"}
        raise RigError(f"cannot {verb} {what} {path}: {exc.strerror or exc}{hint.get(exc.errno or 0, '')}") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # checked again on what was opened: it may have been swapped
        os.close(fd)
        raise RigError(f"{what} {path} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def open_regular(path: str | Path, what: str, follow: bool = True):
    """PATH opened for reading (open_plain), as a binary file object."""
    return os.fdopen(open_plain(path, os.O_RDONLY, what, follow), "rb")


def read_bytes(path: str | Path, what: str, limit: int = MAX_READ, follow: bool = True) -> bytes:
    """A regular file's bytes, at most LIMIT of them (more is a RigError naming the file)."""
    with open_regular(path, what, follow) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise RigError(f"{what} {path} is larger than {limit >> 20} MiB; it is not a {what}")
    return data


def read_tail(path: str | Path, what: str, limit: int) -> tuple[bytes, int]:
    """The last LIMIT bytes of a regular file (a log that may be huge) and the file's size."""
    with open_regular(path, what) as handle:
        size = handle.seek(0, 2)
        handle.seek(max(0, size - limit))
        return handle.read(limit), size


def sha256_file(path: str | Path, what: str = "file") -> str:
    digest = hashlib.sha256()
    with open_regular(path, what) as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_data(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def tree(root: str | Path, what: str, skip: Callable[[tuple[str, ...]], bool] | None = None) -> list[tuple]:
    """Every entry under the directory ROOT as (kind, relative path, link text): "dir", "file" or "link", in
    sorted order (a directory before what it holds), walked without following a link. A link is kept as a link
    (its text, never what it points to) and only while it is relative and resolves under ROOT; a link out, an
    absolute link and anything that is not a directory, a regular file or such a link (a FIFO, a device, a
    socket) is a RigError naming it. SKIP(parts) leaves an entry out, unlooked at (build leftovers)."""
    base = Path(root)
    found: list[tuple] = []

    def visit(parts: tuple[str, ...]) -> None:
        with os.scandir(base.joinpath(*parts)) as listed:
            entries = sorted(listed, key=lambda entry: entry.name)
        for entry in entries:
            inner = (*parts, entry.name)
            if skip and skip(inner):
                continue
            relative, mode = "/".join(inner), entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                text = os.readlink(entry.path)
                try:  # an absolute link would point elsewhere once the tree is copied, even one into ROOT
                    if os.path.isabs(text):
                        raise RigError("absolute")
                    confined(base, relative, what)
                except RigError:
                    raise RigError(f"{what}: {relative} is a link to {text!r}, which does not resolve inside {base}; "
                                   "replace it with what it points to (a link out of the tree is never followed)"
                                   ) from None
                found.append(("link", relative, text))
            elif stat.S_ISDIR(mode):
                found.append(("dir", relative, None))
                visit(inner)
            elif stat.S_ISREG(mode):
                found.append(("file", relative, None))
            else:
                raise RigError(f"{what}: {relative} is not a regular file, a directory or a link (a FIFO, a device "
                               f"or a socket); remove it from {base}")

    if not base.is_dir() or base.is_symlink():
        raise RigError(f"{what}: {base} is not a directory")
    visit(())
    return found


def copy_tree(src: str | Path, dest: str | Path, what: str,
              skip: Callable[[tuple[str, ...]], bool] | None = None) -> Path:
    """A copy of the tree SRC (as tree() lists it, every entry checked before anything is written) in DEST, which
    must not exist: regular files with their bytes, mode and times, links as links. A file swapped for a link
    or a FIFO after the check is refused when it is opened, never followed or waited on."""
    src, dest = Path(src), Path(dest)
    entries = tree(src, what, skip)
    dest.mkdir(parents=True)
    for kind, relative, text in entries:
        target = dest / relative
        if kind == "dir":
            target.mkdir()
        elif kind == "link":
            os.symlink(text, target)
        else:
            source = open_plain(src / relative, os.O_RDONLY, f"{what}: file", follow=False)
            with os.fdopen(source, "rb") as handle:
                made = open_plain(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, f"{what}: copy", follow=False)
                with os.fdopen(made, "wb") as out:
                    shutil.copyfileobj(handle, out, 1 << 20)
                    seen = os.fstat(handle.fileno())
                    os.fchmod(out.fileno(), seen.st_mode & 0o777)  # never a set-id bit
                os.utime(target, ns=(seen.st_atime_ns, seen.st_mtime_ns), follow_symlinks=False)
    return dest


def plain_dir(path: str | Path, why: str) -> None:
    """PATH, where it is there, a directory and no link (rig writes into it: a link would lead that elsewhere, and
    one lstat answers both, with nothing to swap between two looks); else a RigError, WHY saying whose it must be."""
    try:
        seen = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(seen.st_mode):
        raise RigError(f"{path} is a link or not a directory; {why}", hint=f"remove {path} and run again")


def take_place(new: Path, path: Path, aside: Path | None, what: str) -> None:
    """NEW renamed to PATH, what is at PATH moved to ASIDE first (a rename cannot put NEW over a directory; without
    ASIDE, NEW replaces a link or nothing). Where the last rename fails, what was at PATH is put back: a failed run
    never leaves PATH empty. WHAT names what is at PATH, for the refusal to move it."""
    if aside is not None:
        try:
            os.rename(path, aside)
        except OSError as exc:  # a directory its owner made read-only cannot move to another directory
            raise RigError(f"cannot move {what} {path} aside: {exc.strerror or exc}",
                           hint="make it writable or remove it") from None
    try:
        os.replace(new, path)
    except BaseException:
        if aside is not None:
            os.rename(aside, path)
        raise


def private_dir(path: str | Path, what: str) -> None:
    """PATH (where it exists) and every directory above it, as written and once links are followed, owned by root
    or this user and writable by nobody else (a directory above may be sticky, as /tmp is): else a RigError. What
    rig keeps there (an image to mount, a .pth every start of a venv runs) cannot be swapped by another user
    between rig's check and its use."""
    path = Path(os.path.abspath(path))
    trusted = {0, os.geteuid()}
    for chain in (path, Path(os.path.realpath(path))):
        for inner in (chain, *chain.parents):
            try:
                seen = os.lstat(inner)
            except FileNotFoundError:
                continue  # made by rig, after
            if stat.S_ISLNK(seen.st_mode):
                continue  # its target is in the resolved chain; the link itself, in the directory above
            if seen.st_uid not in trusted:
                raise RigError(f"{what}: {inner} is owned by uid {seen.st_uid}, not root; whoever owns it may change "
                               f"what rig keeps in {path}", hint=f"chown root {inner}, or give another directory")
            if seen.st_mode & 0o022 and not (inner != path and seen.st_mode & stat.S_ISVTX):
                raise RigError(f"{what}: {inner} is writable by group or others (mode {seen.st_mode & 0o7777:o}); "
                               f"they may change what rig keeps in {path}",
                               hint=f"chmod go-w {inner}, or give another directory")


@contextmanager
def held(path: str | Path) -> Iterator[None]:
    """An exclusive lock on the lock file PATH while the block runs (another run waits, saying so).

    The file is created if need be and opened without following a link or blocking, and must be a regular
    file: a link someone left there is never written through, a FIFO never waited on."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = open_plain(path, os.O_RDWR | os.O_CREAT, "the lock file", follow=False)
    except RigError as exc:
        raise RigError(f"{exc}; remove it") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for another rig run that holds {path}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
