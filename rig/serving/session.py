"""One server under test, the one lifecycle that rig tune and rig prove share: started from its line and
smoke-tested (rig.serving.launch), held to whether it speculates, measured, judged on what the measurement
could not do (stopped mid-way, nothing measured), stopped however the block ends. What each stage learnt is
written into the caller's record as it happens, so a run that fails keeps it."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from rig.core import RigError
from rig.serving.launch import Launched, Servers
from rig.serving.measure.plan import Level
from rig.serving.measure.sweep import Server, measure
from rig.serving.measure.verdict import not_speculating, nothing_measured


@contextlib.contextmanager
def serving(servers: Servers, label: str, argv: list[str], url: str, log: Path, record: dict,
            speculative: bool, env: dict | None = None) -> Iterator[Launched]:
    """LABEL's server from ARGV (ENV added), started and smoke-tested, held to SPECULATIVE: a server meant to draft
    that says it runs no speculative algorithm is refused (record["stopped"] says so). Stopped when the block ends."""
    record.update(argv=argv, log=str(log), env=env or {}, stopped=None)
    launched = servers.start(label, argv, url, log, env)
    try:
        record.update(smoke=launched.smoke["msg"], healthy_after_s=launched.started_s,
                      speculative_algorithm=launched.smoke.get("speculative_algorithm"))
        if problem := not_speculating(label, int(speculative), record["speculative_algorithm"]):
            record["stopped"] = problem
            raise RigError(f"{problem}; its log is {log}")
        yield launched
    finally:
        if launched in servers.running:
            servers.stop(launched)


def measured(server: Server, levels: list[Level], label: str, log: Path, record: dict) -> None:
    """SERVER measured at LEVELS into record["levels"] (kept however the measurement ends); a server that stopped
    answering mid-way, or one whose every request failed, is a RigError naming its log, never numbers to use."""
    try:
        measure([server], levels)
    finally:
        record["levels"] = {lv["level"]: lv for lv in server.run["levels"]}
    if server.run["stopped"]:
        record["stopped"] = f"{label}: {server.run['stopped']} during the measurement"
    elif problem := nothing_measured(label, server.run["levels"]):
        record["stopped"] = problem
    if record.get("stopped"):
        raise RigError(f"{record['stopped']}; its log is {log}")
