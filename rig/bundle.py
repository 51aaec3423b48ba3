"""The engine bundle: rig and click in one zipapp (`python3 rig.pyz ...`).

Roles and `rig doctor --container` run the engine on targets through it, so a
target needs nothing but python3: no pip, no venv, no package index.
"""
from __future__ import annotations

import hashlib
import shutil
import tempfile
import zipapp
from pathlib import Path

import click

import rig


def _sources() -> list[tuple[Path, Path]]:
    """(file, path inside the bundle) for every module the engine needs."""
    files = []
    for package in (Path(rig.__file__).parent, Path(click.__file__).parent):
        for path in sorted(package.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".typed"):
                files.append((path, Path(package.name) / path.relative_to(package)))
    return files


def build(out: str | Path) -> dict:
    """Write the bundle unless an identical one is there (keyed by a hash of its sources)."""
    out = Path(out)
    digest = hashlib.sha256()
    for path, name in _sources():
        digest.update(str(name).encode() + b"\0" + path.read_bytes())
    stamp = out.with_suffix(".sha256")
    if out.exists() and stamp.exists() and stamp.read_text() == digest.hexdigest():
        return {"changed": False, "path": str(out), "sha256": digest.hexdigest()}
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for path, name in _sources():
            (Path(tmp) / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, Path(tmp) / name)
        partial = out.with_suffix(".partial")
        zipapp.create_archive(tmp, partial, interpreter="/usr/bin/env python3", main="rig.cli:main")
        partial.replace(out)
    stamp.write_text(digest.hexdigest())
    return {"changed": True, "path": str(out), "sha256": digest.hexdigest()}
