"""Wheels, and every zip rig opens: one reader, so that each is opened, read and unpacked the same way.

A wheel is input like any other. It is opened only as a regular file (a FIFO or a device is refused, never
waited on); a damaged or crafted one is a RigError naming the wheel and the member; a member is read up to a
limit whatever its header claims; and one is unpacked only under its root, never through a link."""
from __future__ import annotations

import os
import shutil
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rig.core import RigError
from rig.core.fs import confined, open_plain, open_regular

MEMBER_LIMIT = 1 << 30  # read into memory: metadata, a kernel image, a tool's binary
DAMAGED = (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, ValueError)


@contextmanager
def opened(path: str | Path, what: str = "wheel") -> Iterator[zipfile.ZipFile]:
    """PATH as a zip archive; a damaged one, while it is open or read, is a RigError naming it."""
    path = Path(path)
    with open_regular(path, what) as handle:
        try:
            with zipfile.ZipFile(handle) as archive:
                archive.filename = str(path)  # opened through a descriptor: errors name the file
                yield archive
        except DAMAGED as exc:
            raise RigError(f"{path.name} is not a readable {what} ({exc}); it is damaged or crafted: fetch it "
                           "again") from exc


def read(archive: zipfile.ZipFile, member: str | zipfile.ZipInfo, limit: int = MEMBER_LIMIT) -> bytes:
    """MEMBER's bytes, at most LIMIT of them."""
    info = member if isinstance(member, zipfile.ZipInfo) else _info(archive, member)
    try:
        with archive.open(info) as src:
            data = src.read(limit + 1)
    except DAMAGED as exc:
        raise RigError(f"{_name(archive)}: its member {info.filename} cannot be read ({exc}); the archive is "
                       "damaged or crafted: fetch it again") from exc
    if len(data) > limit:
        size = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"
        raise RigError(f"{_name(archive)}: its member {info.filename} is larger than {size}; refusing it")
    return data


def unpack(archive: zipfile.ZipFile, member: str | zipfile.ZipInfo, root: Path, relative: str | None = None) -> Path:
    """MEMBER written to ROOT/RELATIVE (its own name by default), confined under ROOT; its mode
    as pip gives it (0755 where the member is executable for its owner, 0644 otherwise)."""
    info = member if isinstance(member, zipfile.ZipInfo) else _info(archive, member)
    relative = relative or info.filename
    path = confined(root, relative, f"{_name(archive)}: member {info.filename}", follow=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = 0o755 if (info.external_attr >> 16) & 0o100 else 0o644
    fd = open_plain(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, f"{_name(archive)}: member {info.filename}",
                    follow=False)
    try:
        with os.fdopen(fd, "wb") as dst, archive.open(info) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
    except DAMAGED as exc:
        raise RigError(f"{_name(archive)}: its member {info.filename} cannot be read ({exc}); the archive is "
                       "damaged or crafted: fetch it again") from exc
    os.chmod(path, mode)
    return path


def _info(archive: zipfile.ZipFile, name: str) -> zipfile.ZipInfo:
    try:
        return archive.getinfo(name)
    except KeyError:
        raise RigError(f"{_name(archive)} has no {name}; it is not the archive rig expects") from None


def _name(archive: zipfile.ZipFile) -> str:
    return Path(archive.filename or "archive").name
