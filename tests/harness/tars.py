"""Tar archives laid out by hand for the hostile-input tests: a member's header, a member padded to the tar's
blocks, a member tarfile cannot read, and bytes compressed by the zstd binary (as a venv archive is)."""
from __future__ import annotations

import subprocess
import tarfile


def zstd_of(raw: bytes) -> bytes:
    return subprocess.run(["zstd", "-q", "-c"], input=raw, capture_output=True, check=True).stdout


def header(name: str, kind: bytes, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    return info.tobuf(tarfile.USTAR_FORMAT)


def padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % tarfile.BLOCKSIZE)


def unreadable(name: str, data: bytes) -> bytes:
    """A set-uid file whose mode field, "4755 xxx", is no octal number: tarfile takes its header for the tar's end,
    mksquashfs 4.5 reads it as a member of mode 4755."""
    block = bytearray(header(name, tarfile.REGTYPE, len(data)))
    block[100:108] = b"4755 xxx"
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)  # a checksum that holds: only the mode is unreadable
    return bytes(block) + padded(data)
