"""Where the box tests' time goes: with $RIG_PLAY_LOG set, one JSON line per play and per box, each naming the
running test."""
from __future__ import annotations

import json
import os
from pathlib import Path

from harness.commands import run


def log(**fields) -> None:
    """With $RIG_PLAY_LOG set, one JSON line of FIELDS and the running test."""
    path = os.environ.get("RIG_PLAY_LOG")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0], **fields})
                      + "\n")


def log_play(cmd: list[str], seconds: float, cpu: float, results: dict | None) -> None:
    """A play's line: the playbook, its wall and controller CPU seconds, each task's seconds per host."""
    log(playbook=next((Path(a).name for before, a in zip(cmd, cmd[1:], strict=False)
                       if a.endswith(".yml") and before != "-i"), "?"),
        check="--check" in cmd, seconds=round(seconds, 2), controller_cpu=round(cpu, 2),
        timings=(results or {}).get("timings", []))


def log_box_cpu(names: list[str]) -> None:
    """Each box's line before it goes: its CPU seconds over its life (its cgroup's count)."""
    if not os.environ.get("RIG_PLAY_LOG"):
        return
    ids = run(["docker", "inspect", "-f", "{{.Id}}", *names]).stdout.split()
    for name, cid in zip(names, ids, strict=False):
        for usage in (Path("/sys/fs/cgroup/cpuacct/docker", cid, "cpuacct.usage"),
                      Path("/sys/fs/cgroup/system.slice", f"docker-{cid}.scope", "cpu.stat")):
            if usage.is_file():
                text = usage.read_text()
                ns = int(text) if usage.name == "cpuacct.usage" else int(text.split()[1]) * 1000
                log(box=name, box_cpu=round(ns / 1e9, 2))
                break
