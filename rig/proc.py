"""Child processes: one way to run them, so every failure reads the same."""
from __future__ import annotations

import subprocess

from rig import RigError


def run(argv: list[str], what: str, timeout: float | None = None, **kwargs) -> subprocess.CompletedProcess:
    """Run ARGV to completion; a missing program, a timeout or a non-zero exit is a RigError naming WHAT."""
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    try:
        done = subprocess.run(argv, timeout=timeout, check=False, **kwargs)
    except OSError as exc:
        raise RigError(f"{what}: cannot run {argv[0]}: {exc.strerror or exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise RigError(f"{what}: {argv[0]} did not finish within {timeout:.0f} s") from exc
    if done.returncode != 0:
        err = (done.stderr or "").strip().splitlines()[-5:] if kwargs.get("text") else []
        raise RigError(f"{what}: {argv[0]} exited {done.returncode}" + (": " + " | ".join(err) if err else ""))
    return done
