"""The archive's tar read member by member, each one checked against the manifest's next entry before anything is
done with it: what unpack writes into its staging directory and what image writes anew for mksquashfs. The one
reading of an untrusted tar both share: a member that is not its entry (another kind, name, mode, size, bytes or
link text; a FIFO, a device, a hard link, a set-id bit), a path that leads out, or a link that comes before a file
or lies under another link ends the read with one RigError."""
from __future__ import annotations

import contextlib
import hashlib
import io
import tarfile
from collections.abc import Callable, Iterator

from rig.core import RigError
from rig.core.proc import PIPE, Running, TimeoutExpired, running
from rig.python.venv import MARKER
from rig.python.venv_archive.manifest import path_problem

# bytes of headers before one member: rig packs a PAX header of a few kB at most (a path and a link text of 4096);
# a chain of the smallest headers this long is ~128 deep, well within Python's recursion limit
HEADERS_LIMIT = 64 << 10
ZSTD_EXIT = 5.0  # seconds zstd takes to exit once it has failed and closed its output
TRAILER_LIMIT = 1 << 20  # bytes after the tar's end: tar pads its last record (10 kB); not a stream to drain
READ = 1 << 20  # bytes per read: tarfile's default 10 KiB record made a third of the unpack's time


class Bounded(io.RawIOBase):
    """The tar stream as tarfile reads it, never more than HEADERS_LIMIT bytes past the data of the member before.
    tarfile reads what precedes a member (a PAX header, a GNU long name, a sparse map) whole into memory and
    follows a chain of headers by recursion, so a few kB of zstd could claim gigabytes or a chain thousands deep;
    bounded where tarfile reads, neither can happen, whatever tarfile's parsing does within the bound.

    What was read after the last member admitted is kept (`after`, at most HEADERS_LIMIT and one read): tarfile
    ends the tar at a header it cannot read (a mode of "4755 xxx") as at zero blocks, and another tar reader would
    take that header for a member."""

    def __init__(self, stream) -> None:
        super().__init__()
        self.stream, self.taken, self.allowed = stream, 0, HEADERS_LIMIT
        self.after, self.kept_from = bytearray(), 0  # the bytes read from offset kept_from on

    def readable(self) -> bool:
        return True

    def admit(self, member: tarfile.TarInfo, kind: str) -> None:
        """MEMBER has come, checked: its data (a file's, in whole blocks) may be read, then the next member's
        headers; only what lies after its data is kept."""
        data = -(-member.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE if kind == "file" else 0
        self.allowed = self.taken + data + HEADERS_LIMIT
        end = member.offset_data + data
        del self.after[:max(0, end - self.kept_from)]
        self.kept_from = end

    def read(self, size: int = -1) -> bytes:
        room = self.allowed - self.taken
        if room <= 0:
            raise tarfile.ReadError(f"more than {HEADERS_LIMIT >> 10} kB of headers before one member (rig packs a "
                                    "few kB)")
        data = self.stream.read(room if size < 0 else min(size, room))
        start, self.taken = self.taken, self.taken + len(data)
        self.after += data[max(0, self.kept_from - start):]  # a member's data is never kept
        return data


def kind_of(member: tarfile.TarInfo) -> str:
    return "dir" if member.isdir() else "link" if member.issym() else \
        "file" if member.type in (tarfile.REGTYPE, tarfile.AREGTYPE) and not member.issparse() else "other"


def checked(tar: tarfile.TarFile, stream: Bounded, entries: list, source: str) -> Iterator[tuple]:
    """Each member of TAR (read through STREAM) as (member, kind, entry), once it is ENTRIES' next one (kind, path,
    mode, size, link text), its path leads nowhere outside, and no link comes before it or lies above it; then
    admitted (its data may be read). The entries must all come: a tar that ends early is not whole."""
    expected, linked, links = iter(entries), False, set()
    for member in tar:
        entry = next(expected, None)
        kind = kind_of(member)
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
        # under no link of the archive, with every link after every file, cannot land outside the venv
        if problem := path_problem(member.name):
            raise RigError(f"{source}: member {problem} (it leads outside the venv)")
        if kind == "link":
            parts = member.name.split("/")
            if any("/".join(parts[:end]) in links for end in range(1, len(parts))):
                raise RigError(f"{source}: {member.name[:200]!r} lies under a link of the archive; the links of a "
                               "venv lie in its directories")
            linked = True
            links.add(member.name)
        stream.admit(member, kind)
        yield member, kind, entry
    if (missing := next(expected, None)) is not None:
        raise RigError(f"{source}: ends before {missing[1]!r}, which its manifest lists; the archive is not whole")


def hashed(tar: tarfile.TarFile, member: tarfile.TarInfo, sha: str, source: str, out=None) -> None:
    """MEMBER's bytes, read once, hashed (and written to OUT, where given): a RigError unless their sha256 is SHA."""
    digest = hashlib.sha256()
    reader = tar.extractfile(member)
    assert reader is not None  # a regular file
    while chunk := reader.read(READ):
        digest.update(chunk)
        if out is not None:
            out.write(chunk)
    if digest.hexdigest() != sha:
        raise RigError(f"{source}: {member.name[:200]!r} is not the file its manifest describes (sha256 differs); "
                       "the archive and its manifest do not belong together")


def marked(load: Callable[[], dict | None], manifest: dict, source: str) -> None:
    """The venv's marker (LOAD reads it: None where there is none), which says which lock a venv holds (a later
    unpack, verify, install read it), must name the manifest's lock: a manifest that claims a lock its archive does
    not hold is refused."""
    try:
        marker = load()
    except RigError as exc:
        raise RigError(f"{source}: its venv's marker {MARKER} is not one rig wrote ({exc}); the archive is not one "
                       "rig packs: pack the venv again") from None
    if marker is None or marker["lock_hash"] != manifest["lock_hash"]:
        said = f"names lock {marker['lock_hash'][:16]}" if marker else "is missing"
        raise RigError(f"{source}: its venv's marker {MARKER} {said}, its manifest lock {manifest['lock_hash'][:16]}; "
                       "the archive and its manifest do not belong together: pack the venv again")


@contextlib.contextmanager
def unzstd(zstd: str, archive) -> Iterator[Running]:
    """`zstd -dc` of ARCHIVE (an open file, or a pipe's end) running for the block: its stdout is the tar (read_tar
    reads it); killed where it still runs once the block ends."""
    with running([zstd, "-q", "-dc"], "decompressing the venv archive", stdin=archive, stdout=PIPE) as child:
        yield child


def unzstd_failed(zstd: Running, source: str, code: int) -> RigError:
    return RigError(f"{source}: zstd could not decompress it (exit {code}): {zstd.said()}")


def unzstd_ended(zstd: Running, source: str) -> None:
    """zstd's exit awaited (its output was read to its end): a RigError where it failed."""
    if code := zstd.child.wait():
        raise unzstd_failed(zstd, source, code)


def read_tar(zstd: Running, entries: list, source: str,
             each: Callable[[tarfile.TarFile, tarfile.TarInfo, str, list], None]) -> None:
    """The tar that `zstd -dc` (ZSTD, unzstd()) writes, read member by member: EACH(tar, member, kind, entry) of
    every checked one. Whatever the tar holds, the read ends: its headers are bounded, and at most TRAILER_LIMIT
    bytes follow its end, all of them zeros (a few kB of zstd decompress to terabytes; anything else there is what
    another reader might take for members). A tar tarfile cannot read is zstd's failure where zstd failed, else
    the tar's."""
    output = zstd.child.stdout
    assert output  # a pipe
    try:
        stream = Bounded(output)
        with tarfile.open(fileobj=stream, mode="r|", bufsize=READ) as tar:
            for member, kind, entry in checked(tar, stream, entries, source):
                each(tar, member, kind, entry)
        rest = output.read(TRAILER_LIMIT + 1)
    except (tarfile.TarError, EOFError, ValueError) as exc:  # ValueError: tarfile's of a malformed header
        try:  # zstd that failed has ended; zstd still writing what nobody reads would wait for good
            code = zstd.child.wait(ZSTD_EXIT)
        except TimeoutExpired:
            code = 0  # it decompresses: the tar is what is wrong (unzstd() kills it)
        raise unzstd_failed(zstd, source, code) if code else \
            RigError(f"{source}: not a tar as rig packs it ({exc})") from None
    if len(rest) > TRAILER_LIMIT:
        raise RigError(f"{source}: holds more than {TRAILER_LIMIT >> 20} MiB after the tar's end; not an archive rig "
                       "packs: pack it again")
    if (stream.after + rest).strip(b"\0"):
        raise RigError(f"{source}: holds bytes other than zeros after its last member (a header tarfile cannot "
                       "read ends its tar there; another tar reader would take it for a member); not an archive "
                       "rig packs: pack it again")
