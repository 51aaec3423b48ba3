"""The installer a host runs: uv, from its wheel in the wheelhouse, or pip.

uv installs the default stack's 208 wheels in about half pip's time with the same guarantees
(offline, --require-hashes, no dependency resolution, every module byte-compiled; measured side
by side in docs/BENCHMARKS.md). Its wheel is pinned here by version and sha256, so a host checks
the wheel it pulls against its own copy of rig before it runs anything from it.
"""
from __future__ import annotations

import platform
import stat
from pathlib import Path

from rig.core import RigError, wheelfile
from rig.core.fs import sha256_file

INSTALLERS = ("uv", "pip")
UV_VERSION = "0.13.8"
UV_WHEELS = {"x86_64": ("uv-0.13.8-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
                        "e18a57b8b352eb7c8feb317b9f6f533c8f0ad9673fd6cf34bbe3cf1a9f6a8984")}


def uv_wheel(machine: str | None = None) -> dict:
    """uv's wheel for MACHINE (this one by default) as a lock entry: the wheelhouse fetches and serves it."""
    machine = machine or platform.machine()
    if machine not in UV_WHEELS:
        raise RigError(f"rig pins no uv wheel for {machine}; install with pip (python_stack_installer: pip)")
    filename, sha256 = UV_WHEELS[machine]
    return {"name": "uv", "version": UV_VERSION, "filename": filename, "sha256": sha256, "index": "default"}


def uv_binary(wheel: Path, scratch: Path) -> Path:
    """The uv program from WHEEL (checked against the pin first), unpacked into SCRATCH."""
    pinned = uv_wheel()
    if sha256_file(wheel) != pinned["sha256"]:
        raise RigError(f"{wheel} is not the pinned {pinned['filename']} (sha256 differs); refusing to run it")
    member = f"uv-{UV_VERSION}.data/scripts/uv"
    with wheelfile.opened(wheel) as archive:
        uv = wheelfile.unpack(archive, member, scratch, "uv")
    uv.chmod(stat.S_IRWXU)
    return uv
