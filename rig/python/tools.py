"""NVIDIA command-line tools rig needs beside a toolkit, from their PyPI wheels.

cuobjdump lists the cubin and PTX archs inside a binary; its wheels start at
13.2, which reads the cubins of every CUDA 13 release.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from rig.core import wheelfile
from rig.core.fs import atomic_write
from rig.python.pip import download, target_args

TOOLS = {"cuobjdump": ("nvidia-cuda-cuobjdump", "13.2.51", "nvidia/cu13/bin/cuobjdump")}


def _cached(name: str, cache: str | Path) -> Path:
    _, version, _ = TOOLS[name]
    return Path(cache) / "tools" / f"{name}-{version}" / name


def find_tool(name: str, cache: str | Path, *dirs: Path) -> Path | None:
    """The tool's binary without downloading: rig's cached copy, one on PATH (a CUDA 13
    toolkit's, on an offline GPU host), or one in DIRS; None when there is none."""
    found = [_cached(name, cache), Path(shutil.which(name) or "/nonexistent"), *(Path(d) / name for d in dirs)]
    return next((path for path in found if path.is_file()), None)


def fetch_tool(name: str, cache: str | Path) -> Path:
    """find_tool, else the tool downloaded from its wheel into the cache on first use."""
    found = find_tool(name, cache)
    if found:
        return found
    package, version, member = TOOLS[name]
    binary = _cached(name, cache)
    with tempfile.TemporaryDirectory() as tmp:
        download([f"{package}=={version}"], Path(tmp), target_args(None), [])
        wheel = next(Path(tmp).glob("*.whl"))
        with wheelfile.opened(wheel) as archive:
            atomic_write(binary, wheelfile.read(archive, member), mode=0o755)
    return binary
