"""Commands the tests run on this machine: any command, rig's own CLI, and the check that one succeeded."""
from __future__ import annotations

import subprocess

from harness.paths import BIN, REPO


def run(cmd: list[str], check: bool = False, **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    return subprocess.run(cmd, check=check, **kwargs)


def rig(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return run([str(BIN / "rig"), *args], cwd=REPO, **kwargs)


def ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done
