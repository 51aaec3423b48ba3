"""The SGLang stand-in (tests/sglang_api_server.py, its sglang package in tests/data/sglang_standin): a venv whose
sglang it is, a port for it to listen on, whether it listens, the servers still running, its cost model and the
cases a test gives it (tests/conftest.py serve starts it on this machine; standin_venv and tune_case give rig tune
one)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from harness.paths import REPO

STAND_IN = REPO / "tests" / "sglang_api_server.py"
STANDIN = REPO / "tests" / "data" / "sglang_standin"  # the sglang package a stand-in venv imports
# Costs in ms: a step's fixed part, each verified token of each running request, each draft step.
# With 80% acceptance per position, 3 steps make 2.95 tokens a step: EAGLE-3 (3 steps) serves one
# stream at ~1.9x the baseline and 64 at ~0.8x; 1 step sits in between.
MODEL = ["--step-ms", "4", "--token-ms", "0.5", "--draft-ms", "0.25", "--accept-rate", "0.8"]


def make_standin_venv(venv: Path, package: Path = STANDIN) -> Path:
    """A venv whose sglang is the stand-in PACKAGE (and the stand-in server and aiohttp beside it)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    ours = [p for p in sys.path if p.endswith("site-packages")]
    (site / "standin.pth").write_text("\n".join([str(package), str(REPO / "tests"), *ours]) + "\n")
    return venv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _venv_processes(venv: Path) -> dict[int, str]:
    """pid -> command line of every process that runs the venv's Python."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if proc.name.isdigit() and argv and argv[0].decode(errors="replace").startswith(str(venv)):
            found[int(proc.name)] = " ".join(a.decode(errors="replace") for a in argv)
    return found


def servers_running(venv: Path) -> list[str]:
    """Command lines of processes that run the venv's Python: every stand-in server a run started."""
    return list(_venv_processes(venv).values())


def kill_servers(venv: Path) -> None:
    """Every stand-in server of VENV killed: what a rig that was itself killed outright leaves running (again, until
    none is left: a server starting up may spawn its helpers meanwhile)."""
    deadline = time.monotonic() + 30
    while (found := _venv_processes(venv)) and time.monotonic() < deadline:
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def standin_case(tmp_path: Path, stack: dict):
    """STACK as a stack file for servers that are the SGLang stand-in, and CASE(*options): the stand-in's
    options for the next run (its faults and performance model) -> (stack path, the run's environment)."""
    import yaml

    path = tmp_path / "stack.yml"
    path.write_text(yaml.safe_dump(stack))
    faults = tmp_path / "faults.json"

    def case(*model: str) -> tuple[Path, dict]:
        faults.write_text(json.dumps({"args": list(model)}))
        return path, {**os.environ, "SGLANG_STANDIN_FAULTS": str(faults)}

    return case
