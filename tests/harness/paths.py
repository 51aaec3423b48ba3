"""Where the suite finds things: the repository, this venv's commands, rig's cache, the stacks and locks it uses."""
from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CACHE = os.environ.get("RIG_CACHE", str(Path.home() / ".cache" / "rig"))
# CUDA alone: the toolkit tests converge site.yml with it, without the packages' venv
CUDA_STACK = str(REPO / "stacks" / "cuda-13.0.yml")
DEFAULT_LOCK = REPO / "stacks" / "sm120-sglang-0.5.23.lock"
LOCK_059 = REPO / "stacks" / "sm120-sglang-0.5.9.lock"
