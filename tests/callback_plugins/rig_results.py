"""The suite's reading of a play: each host's recap counts and the tasks that changed something, as JSON in the
file $RIG_RESULTS names (tests/conftest.py Play), so that no test parses Ansible's human output for them."""
from __future__ import annotations

import base64
import dataclasses
import io
import json
import os
import re
import time
import zipfile

from ansible import constants as C
from ansible.executor import module_common
from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import connection_loader

from rig.core.bytecode import unchecked_pyc

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
  - Only where $RIG_ANSIBALLZ_CACHE names a directory (a test marked ansible_payload_cache, tests/conftest.py;
    unset, ansible-core runs unpatched), keeps the modules' AnsiballZ payloads there instead of in
    this run's own temporary directory. Ansible builds each module's payload (the module and the
    module_utils it imports, found by parsing their sources) once per ansible-playbook run and drops it at
    exit, so every play of the suite built again the payloads of the same modules (see docs/BENCHMARKS.md).
    A payload is the same bytes for every run of one Ansible install; the suite shares one directory per run.
  - A payload kept there carries its module_utils' bytecode beside their sources (name.pyc, the layout
    zipimport reads, unchecked-hash, by rig.core.bytecode as for the engine bundle). A payload is imported from
    its zip, where Python never writes bytecode, so each module run compiled ansible.module_utils again
    (0.20 -> 0.14 CPU-s of a box per module run, docs/BENCHMARKS.md). A target whose Python is another
    version reads the sources. The bytecode names its file by its path in the zip (the zip's place on the
    target is a new temporary directory each run), so a frame in module_utils shows that relative path, and a
    deprecation raised there is reported from an indeterminate source where Ansible would say ansible-core.
    The module itself stays source, so that its own deprecations and frames are as Ansible reports them.
requirements:
  - RIG_RESULTS, the file to write
"""

CONNECTIONS = ("community.docker.docker_api", "community.docker.docker")  # the suite's boxes, Molecule's


LIBRARY = re.compile(r"^ansible/module_utils/|^ansible_collections/\w+/\w+/plugins/module_utils/")


def _with_bytecode(zip_data: bytes) -> bytes:
    """ZIP_DATA (a base64 payload zip) with each module_utils source's bytecode beside it, for this Python's
    version; a source this Python cannot compile (newer syntax a target may still run) keeps no bytecode."""
    source = zipfile.ZipFile(io.BytesIO(base64.b64decode(zip_data)))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as payload:
        for member in source.infolist():
            data = source.read(member)
            payload.writestr(member, data)
            if not (member.filename.endswith(".py") and LIBRARY.match(member.filename)):
                continue
            try:
                pyc = unchecked_pyc(data, member.filename)
            except (SyntaxError, ValueError):
                continue
            payload.writestr(zipfile.ZipInfo(member.filename + "c", member.date_time), pyc, member.compress_type)
    return base64.b64encode(out.getvalue())


def _keep_bytecode() -> None:
    """Payloads written to the cache from now on carry bytecode (see DOCUMENTATION); set before any fork."""
    dump = module_common._CachedModule.dump
    if getattr(dump, "with_bytecode", False):
        return

    def dump_with_bytecode(self, path: str) -> None:
        dump(dataclasses.replace(self, zip_data=_with_bytecode(self.zip_data)), path)

    dump_with_bytecode.with_bytecode = True  # type: ignore[attr-defined]
    module_common._CachedModule.dump = dump_with_bytecode  # type: ignore[method-assign]


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "rig_results"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        for name in CONNECTIONS:  # before any fork: see DOCUMENTATION
            connection_loader.get(name, class_only=True)
        shared = os.environ.get("RIG_ANSIBALLZ_CACHE")
        if shared:  # before any task: see DOCUMENTATION (this run's directory is new, so nothing is there yet)
            os.makedirs(shared, exist_ok=True)
            os.symlink(shared, os.path.join(C.DEFAULT_LOCAL_TMP, "ansiballz_cache"))
            _keep_bytecode()
        self.changed: list[dict] = []
        self.timings: list[dict] = []  # each task's seconds on each host, from the task's start to its result
        self.started = 0.0

    def v2_playbook_on_task_start(self, task, is_conditional) -> None:
        self.started = time.monotonic()

    def v2_playbook_on_handler_task_start(self, task) -> None:
        self.started = time.monotonic()

    def _timed(self, result) -> None:
        self.timings.append({"task": result._task.get_name(), "host": result._host.get_name(),
                             "seconds": round(time.monotonic() - self.started, 3)})

    def v2_runner_on_ok(self, result) -> None:
        self._timed(result)
        if result._result.get("changed"):
            self.changed.append({"task": result._task.get_name(), "host": result._host.get_name()})

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
