"""Where rig keeps things, named once for its Python. Ansible and Docker cannot import this: the roles'
defaults/main.yml and rig/image/Dockerfile spell the same paths, and tests/unit/test_repo.py holds them to
these values."""
from __future__ import annotations

import os
from pathlib import Path

VENV = "/opt/rig/venv"  # the stack's virtualenv on a box and in the image
STATE_DIR = "/var/lib/rig"  # a box's state: CUDA rollback records, test models, prove's output
TESTMODEL_DIR = f"{STATE_DIR}/testmodel"
IMAGE_ROOT = "/opt/rig"  # in the image: rig.pyz, the venv, the patch set, the SBOM


def cache_dir() -> str:
    """The controller's cache (wheels, CUDA wheels, tools, the engine bundle): RIG_CACHE, else ~/.cache/rig."""
    return os.environ.get("RIG_CACHE") or str(Path.home() / ".cache" / "rig")
