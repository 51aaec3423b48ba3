"""The suite's reading of a play: each host's recap counts and the tasks that changed something, as JSON in the
file $RIG_RESULTS names (tests/harness/plays.py Play), so that no test parses Ansible's human output for them."""
from __future__ import annotations

import json
import os
import time

from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import connection_loader

DOCUMENTATION = """
name: rig_results
type: aggregate
short_description: each host's recap and changed tasks as JSON, for rig's tests
description:
  - At the play's end, writes each host's recap counts and the tasks that changed to the file $RIG_RESULTS names.
  - Loads the boxes' connection plugins (community.docker's docker_api, and docker for Molecule) in the
    controller's own process, so that the worker Ansible forks for each task finds them imported instead of
    importing them and the Docker client again (measured, about 0.45 s of controller CPU per task before and
    0.15-0.3 after).
requirements:
  - RIG_RESULTS, the file to write
"""

CONNECTIONS = ("community.docker.docker_api", "community.docker.docker")  # the suite's boxes, Molecule's


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "rig_results"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        for name in CONNECTIONS:  # before any fork: see DOCUMENTATION
            connection_loader.get(name, class_only=True)
        self.changed: list[dict] = []
        self.timings: list[dict] = []  # each task's seconds on each host, from the task's start to its result
        self.started = 0.0

    def v2_playbook_on_task_start(self, task, is_conditional) -> None:
        self.started = time.monotonic()

    def v2_playbook_on_handler_task_start(self, task) -> None:
        self.started = time.monotonic()

    def _timed(self, result) -> None:
        self.timings.append({"task": result.task.get_name(), "host": result.host.get_name(),
                             "seconds": round(time.monotonic() - self.started, 3)})

    def v2_runner_on_ok(self, result) -> None:
        self._timed(result)
        if result.result.get("changed"):
            self.changed.append({"task": result.task.get_name(), "host": result.host.get_name()})

    def v2_runner_on_failed(self, result, ignore_errors: bool = False) -> None:
        if ignore_errors:  # the recap counts an ignored failure's change too
            self.v2_runner_on_ok(result)
        else:
            self._timed(result)

    def v2_runner_on_skipped(self, result) -> None:
        self._timed(result)

    def v2_playbook_on_stats(self, stats) -> None:
        path = os.environ.get("RIG_RESULTS")
        if path:
            with open(path, "w") as out:
                json.dump({"stats": {host: stats.summarize(host) for host in sorted(stats.processed)},
                           "changed": self.changed, "timings": self.timings}, out)
