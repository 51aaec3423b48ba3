"""`rig tune` as the tune tests run it: against the SGLang stand-in's servers (tests/conftest.py tune_case), its
JSON on stdout."""
from __future__ import annotations

import subprocess
from pathlib import Path

from harness.commands import rig


def tune(stack: Path, out: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return rig("tune", "--stack", str(stack), "--out", str(out), "--min-requests", "8", "--json", *args,
               env=env, timeout=600)
