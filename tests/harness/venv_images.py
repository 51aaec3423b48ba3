"""Venv images made here (rig venv image on a packed venv of harness.venvs), and what a host's image holds: an
image's name and the environment a stack gives its venv."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from harness.venvs import LOCK, make_venv, site_of
from rig.python.venv_archive.image import image
from rig.python.venv_archive.pack import pack

LONG = "x" * 150  # a name past ustar's 100 bytes: the archive holds it in a PAX header
NAME = "venv-0123456789abcdef-py3.11-x86_64"
ENV = {"pinned": {"CUDA_HOME": "/usr/local/cuda-13.0"}, "defaults": {"NCCL_P2P_LEVEL": "SYS"},
       "home": {"FLASHINFER_WORKSPACE_BASE": ".cache/rig/flashinfer-jit/cuda-13.0.2-flashinfer-0.7.2"}}


def imaged(tmp_path: Path, lock: str = LOCK, out: str = "images") -> dict:
    """A venv of LOCK at tmp_path/venv packed and imaged into tmp_path/OUT; the venv moved out of the way (the
    absolute path its bin/python linked to kept as "interpreter")."""
    venv = make_venv(tmp_path / "venv", lock)
    (site_of(venv) / f"{LONG}.txt").write_text("long\n")
    packed = pack(venv, tmp_path / f"archive-{lock[:4]}")
    built = image(packed["manifest"], tmp_path / out)
    link = venv / "bin" / "python"
    while not os.path.isabs(text := os.readlink(link)):  # python -> python3.11 -> the interpreter venv ran as
        link = link.with_name(text)
    shutil.rmtree(venv)
    return {**built, "archive_manifest": packed["manifest"], "interpreter": text}


def three_images(tmp_path: Path) -> list[Path]:
    """Image manifests of three locks' venvs at one path (tmp_path/venv)."""
    return [Path(imaged(tmp_path, lock * 64, out=f"images-{lock}")["image_manifest"]) for lock in "abc"]
