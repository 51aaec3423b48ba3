"""The engine bundle: rig, its pure-Python dependencies (click,
jinja2 with markupsafe, packaging, PyYAML) and the patch set in one zipapp
(`python3 rig.pyz ...`).

Roles and `rig doctor --container` run the engine on targets through it, so a
target needs nothing but python3: no pip, no venv, no package index. PyYAML and
markupsafe run without their C extensions there (each has a pure-Python fallback).

Every module carries its bytecode beside it (name.pyc, the layout zipimport reads), compiled by
the Python that builds the bundle: zipimport never writes bytecode, so without it a target
compiles every module it imports on every run (a third of a rig action's CPU time on a box,
measured in docs/BENCHMARKS.md). A target whose Python is another version reads the sources, as before.
"""
from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import shutil
import tempfile
import zipapp
from pathlib import Path

import click
import jinja2
import markupsafe
import packaging
import yaml

import rig
from rig.core import RigError
from rig.core.bytecode import unchecked_pyc
from rig.core.fs import atomic_write, read_bytes

PATCH_SET = Path("rig", "patches", "set")  # the patch set, read by rig.patches on targets
FIXED_MTIME = 1_577_836_800  # 2020-01-01: zip entries carry mtimes, which would differ per checkout


def _sources(with_patches: bool = True) -> list[tuple[Path, Path]]:
    """(file, path inside the bundle) for every module the engine needs."""
    files = []
    for module in (rig, click, jinja2, markupsafe, packaging, yaml):
        if module.__file__ is None:  # a namespace package: no directory to take its files from
            raise RigError(f"{module.__name__} has no __file__; cannot bundle its sources")
        package = Path(module.__file__).parent
        for path in sorted(package.rglob("*")):
            inside = Path(package.name) / path.relative_to(package)
            if not with_patches and inside.parent == PATCH_SET:
                continue
            if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".typed", ".j2", ".yml"):
                files.append((path, inside))
    return files


def build(out: str | Path, with_patches: bool = True, check: bool = False) -> dict:
    """Write the bundle unless an identical one is there (keyed by a hash of its sources); CHECK: say whether
    it would, write nothing.

    Images carry their patch set beside the engine instead (with_patches=False), so
    that a patch change leaves the engine's layers cached."""
    out = Path(out)
    sources = _sources(with_patches)
    digest = hashlib.sha256(importlib.util.MAGIC_NUMBER)  # the bytecode is this Python version's
    for path, name in sources:
        digest.update(str(name).encode() + b"\0" + path.read_bytes())
    stamp = out.with_suffix(".sha256")
    if out.exists() and stamp.exists() and read_bytes(stamp, "bundle stamp") == digest.hexdigest().encode():
        return {"changed": False, "path": str(out), "sha256": digest.hexdigest(), "msg": f"{out} is current"}
    if check:
        return {"changed": True, "path": str(out), "sha256": digest.hexdigest(),
                "msg": f"would write {out} ({len(sources)} files)"}
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for path, name in sources:
            (Path(tmp) / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, Path(tmp) / name)
            if name.suffix == ".py":  # unchecked: the bundle is checked as a whole before it runs
                try:
                    pyc = unchecked_pyc((Path(tmp) / name).read_bytes(), str(name))
                except (SyntaxError, ValueError) as exc:
                    raise RigError(f"cannot bundle {path}: it does not compile ({type(exc).__name__}); reinstall "
                                   "the package it belongs to") from None
                (Path(tmp) / name.with_suffix(".pyc")).write_bytes(pyc)
        for path in Path(tmp).rglob("*"):
            os.utime(path, (FIXED_MTIME, FIXED_MTIME))  # the same sources, the same bytes
        archive = io.BytesIO()  # then one rename: two controllers' runs building at once never share a file
        zipapp.create_archive(tmp, archive, interpreter="/usr/bin/env python3", main="rig.cli:main")
        atomic_write(out, archive.getvalue(), 0o755)
    atomic_write(stamp, digest.hexdigest())
    return {"changed": True, "path": str(out), "sha256": digest.hexdigest(), "msg": f"wrote {out}"}
