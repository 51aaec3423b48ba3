"""The SGLang stand-in (tests/sglang_api_server.py): a port for it to listen on, and the cases a test gives it
(tests/conftest.py serve starts it on this machine)."""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from harness.paths import REPO

STAND_IN = REPO / "tests" / "sglang_api_server.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
