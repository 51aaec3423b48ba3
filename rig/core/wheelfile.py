"""Wheels, and every zip rig opens: one reader, so that each is opened, read and unpacked the same way.

A wheel is input like any other. It is opened only as a regular file (a FIFO or a device is refused, never
waited on); a damaged or crafted one is a RigError naming the wheel and the member; a member is read, or
unpacked, up to a limit whatever its header claims; and one is unpacked only under its root, never through a
link."""
from __future__ import annotations

import lzma
import os
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rig.core import RigError
from rig.core.fs import confined, open_plain, open_regular

MEMBER_LIMIT = 1 << 30  # read into memory: metadata, a kernel image, a tool's binary
UNPACK_LIMIT = 8 << 30  # written to disk: the largest library a wheel ships (libtorch_cuda.so) is under 2 GiB
# what zipfile raises on a damaged or crafted archive: bad headers and offsets (OSError: a seek before the
# start), corrupt deflate, bzip2 (OSError) or LZMA data, encrypted members (RuntimeError), unknown methods
DAMAGED = (zipfile.BadZipFile, zlib.error, lzma.LZMAError, EOFError, NotImplementedError, RuntimeError, OSError,
           ValueError)


@contextmanager
def opened(path: str | Path, what: str = "wheel") -> Iterator[zipfile.ZipFile]:
    """PATH as a zip archive; one whose directory cannot be read is a RigError naming it."""
    path = Path(path)
    with open_regular(path, what) as handle:
        try:
            archive = zipfile.ZipFile(handle)
        except DAMAGED as exc:
            raise RigError(f"{path.name} is not a readable {what} ({exc}); it is damaged or crafted: fetch it "
                           "again") from exc
        with archive:
            archive.filename = str(path)  # opened through a descriptor: errors name the file
            yield archive


def read(archive: zipfile.ZipFile, member: str | zipfile.ZipInfo, limit: int = MEMBER_LIMIT) -> bytes:
    """MEMBER's bytes, at most LIMIT of them."""
    info = member if isinstance(member, zipfile.ZipInfo) else _info(archive, member)
    data = []
    for count, chunk in _chunks(archive, info):
        if count > limit:
            raise _too_large(archive, info, limit)
        data.append(chunk)
    return b"".join(data)


def unpack(archive: zipfile.ZipFile, member: str | zipfile.ZipInfo, root: Path, relative: str | None = None,
           limit: int = UNPACK_LIMIT) -> Path:
    """MEMBER written to ROOT/RELATIVE (its own name by default), confined under ROOT, at most LIMIT bytes; its
    mode as pip gives it (0755 where the member is executable for its owner, 0644 otherwise). A directory
    entry is made a directory."""
    info = member if isinstance(member, zipfile.ZipInfo) else _info(archive, member)
    what = f"{_name(archive)}: member {info.filename}"
    path = confined(root, (relative or info.filename).rstrip("/"), what, follow=False)
    try:
        path.mkdir(parents=True, exist_ok=True) if info.is_dir() else path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RigError(f"{what} cannot be unpacked under {root}: {exc.strerror or exc} (another member holds "
                       "that path); the archive is crafted: fetch it again") from exc
    if info.is_dir():
        return path
    fd = open_plain(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, what, follow=False)
    with os.fdopen(fd, "wb") as dst:
        for written, chunk in _chunks(archive, info):  # a write that fails (a full disk) is the host's OSError
            if written > limit:
                raise _too_large(archive, info, limit)
            dst.write(chunk)
        os.fchmod(dst.fileno(), 0o755 if (info.external_attr >> 16) & 0o100 else 0o644)
    return path


def _chunks(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> Iterator[tuple[int, bytes]]:
    """INFO's bytes a MiB at a time, with the count so far; a damaged member is a RigError naming it."""
    written = 0
    try:
        with archive.open(info) as src:
            while chunk := src.read(1 << 20):
                written += len(chunk)
                yield written, chunk
    except DAMAGED as exc:
        raise _damaged(archive, info, exc) from exc


def _damaged(archive: zipfile.ZipFile, info: zipfile.ZipInfo, exc: BaseException) -> RigError:
    return RigError(f"{_name(archive)}: its member {info.filename} cannot be read ({exc}); the archive is "
                    "damaged or crafted: fetch it again")


def _too_large(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> RigError:
    size = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"
    return RigError(f"{_name(archive)}: its member {info.filename} is larger than {size}; refusing it")


def _info(archive: zipfile.ZipFile, name: str) -> zipfile.ZipInfo:
    try:
        return archive.getinfo(name)
    except KeyError:
        raise RigError(f"{_name(archive)} has no {name}; it is not the archive rig expects") from None


def _name(archive: zipfile.ZipFile) -> str:
    return Path(archive.filename or "archive").name


# ------------------------------------------------------------------ what a wheel's name and metadata say

def name_version(path: str | Path) -> tuple[str, str]:
    """(distribution, version) from a wheel's file name (NAME-VERSION[-BUILD]-PY-ABI-PLATFORM.whl), or a RigError
    naming PATH: a name rig did not check never reaches a requirements line."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        name, version, _, _ = parse_wheel_filename(Path(path).name)
    except InvalidWheelFilename as exc:
        raise RigError(f"{str(path)!r} is not named as a wheel ({exc}); remove it or build the wheel again "
                       "(NAME-VERSION-PY-ABI-PLATFORM.whl)") from None
    return str(name), str(version)


def read_requirement(text: object, who: str):
    """One Requires-Dist value of WHO's metadata (input like any other) as a packaging Requirement, or a RigError
    naming WHO and the field."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        if not isinstance(text, str):
            raise InvalidRequirement("not text")
        return Requirement(text)
    except InvalidRequirement as exc:
        why = str(exc).splitlines()[0][:200] if str(exc) else "not a requirement"
        raise RigError(f"{who} declares a dependency rig cannot read (Requires-Dist {str(text)[:120]!r}: {why}); "
                       "that distribution's metadata is broken: pin or install another version") from None


def requires_dist(metadata: str, who: str) -> list:
    """Every Requires-Dist of WHO's METADATA text, each read by read_requirement()."""
    import email.parser

    fields = email.parser.Parser().parsestr(metadata).get_all("Requires-Dist") or []
    return [read_requirement(text, who) for text in fields]
