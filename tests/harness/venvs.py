"""Venvs rig packs, unpacks, images and patches, made here: a real venv of a lock with rig's marker and hook, its
site-packages, a module's bytecode path, and a file with one byte changed."""
from __future__ import annotations

import compileall
import importlib.util
import json
import os
import py_compile
import random
import subprocess
import sys
from pathlib import Path

from rig.python.runtime_env import hook
from rig.python.venv import MARKER

LOCK = "a" * 64


def make_venv(path: Path, lock: str = LOCK, checked_hash: bool = False) -> Path:
    """A real venv (no pip) with a module compiled as pip would, a module whose bytecode went stale, an
    executable script, 200 kB that does not compress, rig's marker and its environment hook (an image needs it)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    package = next(path.glob("lib/python*/site-packages")) / "tiny"
    package.mkdir()
    (package / "__init__.py").write_text("VALUE = 42\n")
    (package / "stale.py").write_text("OLD = 1\n")
    (package / "blob.bin").write_bytes(random.Random(1).randbytes(200_000))
    mode = py_compile.PycInvalidationMode.CHECKED_HASH if checked_hash else py_compile.PycInvalidationMode.TIMESTAMP
    assert compileall.compile_dir(package, quiet=1, invalidation_mode=mode)
    stale = package / "stale.py"
    if checked_hash:  # a stale timestamp pyc beside the hash-checked ones
        compileall.compile_file(stale, quiet=1, force=True, invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    stale.write_text("OLD = 22\n")  # changed since it was compiled: its pyc no longer matches
    os.utime(stale, (stale.stat().st_mtime + 5,) * 2)
    tool = path / "bin" / "tool"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o750)
    (path / MARKER).write_text(json.dumps({"lock_hash": lock, "packages": ["a==1"]}))
    hook(path)
    return path


def site_of(venv: Path) -> Path:
    return next(venv.glob("lib/python*/site-packages"))


def cached(source: Path) -> Path:
    return Path(importlib.util.cache_from_source(str(source)))


def flip_a_byte(path: Path) -> bytes:
    """PATH with one byte changed, its size kept; its bytes before."""
    before = path.read_bytes()
    path.write_bytes(before[:len(before) // 2] + bytes([before[len(before) // 2] ^ 0xFF]) + before[len(before) // 2 + 1:])
    return before
