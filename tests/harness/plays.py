"""ansible-playbook against boxes, as the suite runs it: real Ansible over the community.docker connection, its
results read from the JSON that the suite's callback (tests/callback_plugins/rig_results.py) writes."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.commands import run
from harness.paths import BIN, REPO
from harness.play_log import log_play

if TYPE_CHECKING:
    from harness.boxes import Box


def ansible_env() -> dict:
    return {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "PATH": f"{BIN}:{os.environ['PATH']}", "ANSIBLE_NOCOLOR": "1",
            # the suite's results callback: a play's recap and changed tasks as JSON (Play.run)
            "ANSIBLE_CALLBACK_PLUGINS": str(REPO / "tests" / "callback_plugins"),
            "ANSIBLE_CALLBACKS_ENABLED": "rig_results",
            # how long community.docker's modules and connection wait on a Docker API answer (default 60 s): on a
            # loaded machine dockerd, busy with the default image's 12 GB, kept Molecule's create waiting longer
            # (ci34, docs/BENCHMARKS.md); a failing call still fails, only later
            "DOCKER_TIMEOUT": "300"}


def playbook_cmd(boxes: list[Box], playbook: str, *args: str, **extra_vars) -> list[str]:
    """ansible-playbook PLAYBOOK against BOXES (the gpu_hosts group), through the Docker API."""
    hosts = "".join(f"        {b.name}:\n          ansible_connection: community.docker.docker_api\n"
                    "          ansible_python_interpreter: /usr/bin/python3\n" for b in boxes)
    inventory = Path(f"/tmp/rig-test-inventory-{boxes[0].name}.yml")
    # the controller's wheelhouse server stops soon after the play, not ten minutes after the test
    inventory.write_text("all:\n  vars:\n    python_stack_serve_idle: 120\n  children:\n    gpu_hosts:\n      hosts:\n"
                         + hosts)
    cmd = [str(BIN / "ansible-playbook"), "-i", str(inventory), str(REPO / "playbooks" / playbook), *args]
    return cmd + ["-e", json.dumps(extra_vars)] if extra_vars else cmd


def play(boxes: list[Box], playbook: str, *args: str, **extra_vars) -> Play:
    return Play.run(playbook_cmd(boxes, playbook, *args, **extra_vars))


@dataclass
class Play:
    done: subprocess.CompletedProcess
    results: dict | None = None  # what tests/callback_plugins/rig_results.py wrote: recap counts, changed tasks

    @classmethod
    def run(cls, cmd: list[str]) -> Play:
        """ansible-playbook CMD, its results read from the JSON the suite's callback writes."""
        with tempfile.TemporaryDirectory(prefix="rig-play-") as scratch:
            path = Path(scratch) / "results.json"
            started, cpu = time.monotonic(), _children_cpu()
            done = run(cmd, cwd=REPO, env={**ansible_env(), "RIG_RESULTS": str(path)})
            play = cls(done, json.loads(path.read_text()) if path.exists() else None)
            log_play(cmd, time.monotonic() - started, _children_cpu() - cpu, play.results)
            return play

    @property
    def output(self) -> str:
        return self.done.stdout + self.done.stderr

    def recap(self, key: str, host: str | None = None) -> int:
        """HOST's count of KEY (ok, changed, failed, ...) in the play's recap; without HOST, every host's."""
        assert self.results, f"the play wrote no results:\n{self.output[-3000:]}"
        stats = self.results["stats"]
        key = {"failed": "failures"}.get(key, key)  # the recap line's name for what Ansible counts as failures
        assert host is None or host in stats, f"{host} is not in the recap of {sorted(stats)}"
        return sum(counts[key] for name, counts in stats.items() if host in (None, name))

    def changed_tasks(self, host: str | None = None) -> list[str]:
        """The tasks that changed something ('task: host'): what to read when a run should not have."""
        assert self.results, f"the play wrote no results:\n{self.output[-3000:]}"
        return [f"{c['task']}: {c['host']}" for c in self.results["changed"] if host in (None, c["host"])]

    @property
    def ok(self) -> bool:
        return self.done.returncode == 0

    def expect_ok(self) -> Play:
        assert self.ok, self.output[-6000:]
        return self


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
