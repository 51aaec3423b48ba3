"""Servers a rig run starts itself: each from its rendered argv, health-gated by `rig smoke`, its log kept,
and every one stopped when the run ends, however it ends (a failure, Ctrl-C, SIGTERM)."""
from __future__ import annotations

import contextlib
import os
import shlex
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from rig.core import RigError, outdir, proc, progress
from rig.core.escape import inline
from rig.core.fs import atomic_write
from rig.serving import smoke
from rig.serving.sglang_api import KEY_ENV
from rig.stack.spec import switch_problem

# what moves where a Python imports from: rig asks a venv with -I, which ignores them, and a unit never sets them
IMPORT_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE")

# rig's free-off patch's switches (RIG_FREE_OFF, its _DRAFT, _HOLD, _CHECK): one set in rig's own environment reaches
# every server rig starts, over the stack's environment.vars (the venv's defaults), unrecorded
FREE_OFF_PREFIX = "RIG_FREE_OFF"


def inherited_switches() -> dict[str, str]:
    """The RIG_FREE_OFF* variables of rig's own environment, which every server it starts inherits: a value the
    stack would refuse is refused here too, so a dry run and the run stop alike."""
    found = {name: value for name, value in sorted(os.environ.items()) if name.startswith(FREE_OFF_PREFIX)}
    for name, value in found.items():
        if problem := switch_problem(name, value):
            raise RigError(f"rig's own environment sets {problem}; every server rig starts would inherit it: "
                           f"unset {name} (env -u {name} rig ...) or give it one of its values")
    return found


def inherited_said(found: dict[str, str]) -> list[str]:
    """FOUND (inherited_switches) as the line a dry run and a run say it in, or no line."""
    if not found:
        return []
    shown = inline(" ".join(f"{name}={shlex.quote(value)}" for name, value in found.items()))  # a value forges no line
    return [f"every server inherits {shown} from rig's own environment, over the stack's environment.vars "
            "(a server's own assignments win): unset what you did not mean"]


@dataclass
class Launched:
    label: str
    url: str
    log: Path
    child: proc.Child
    smoke: dict = field(default_factory=dict)
    started_s: float = 0.0

    def alive(self) -> bool:
        return self.child.poll() is None


def _answers(url: str) -> bool:
    parts = urlsplit(url)
    with socket.socket(socket.AF_INET6 if ":" in (parts.hostname or "") else socket.AF_INET) as probe:
        probe.settimeout(1.0)
        return probe.connect_ex((parts.hostname, parts.port or 80)) == 0


class Servers:
    """A context: `start` launches and gates one server; leaving the context stops every one still running."""

    def __init__(self, start_timeout: float = 900.0, api_key_env: str = KEY_ENV):
        self.start_timeout, self.api_key_env = start_timeout, api_key_env
        self.running: list[Launched] = []

    def __enter__(self) -> Servers:
        return self

    def __exit__(self, *exc) -> None:
        for server in list(self.running):
            self.stop(server)

    def start(self, label: str, argv: list[str], url: str, log: Path, env: dict | None = None) -> Launched:
        """Start ARGV (with ENV added to rig's environment, less what changes where Python imports from), wait until
        URL is healthy and generates; a server that exits or never gets healthy is stopped and its log tail is in
        the error."""
        if _answers(url):
            raise RigError(f"{label}: something already listens at {url}; stop it (rig starts its own servers "
                           "there) or set server.port to a free port")
        progress(f"{label}: starting ({argv[0]} {' '.join(argv[1:4])} ...), log {log}")
        began = time.monotonic()
        # the server imports what rig found its venv imports (asked with python -I) and what its systemd unit will
        server = Launched(label, url, log, proc.start(argv, log, label, {
            **{k: v for k, v in os.environ.items() if k not in IMPORT_ENV}, **(env or {})}))
        self.running.append(server)
        try:
            # tune and prove judge a server by what they measure (a draft the target rejects loses tune's
            # comparison; prove's numerics draft proposes one fixed token, rejected by design): acceptance is
            # reported here, not judged
            server.smoke = smoke.run(url, self.start_timeout, log=str(log), pid=server.child.pid,
                                     api_key_env=self.api_key_env, min_accept_length=None)
        except BaseException:
            self.stop(server)
            raise
        server.started_s = round(time.monotonic() - began, 1)
        if not all(r["ok"] for r in server.smoke["requests"]):
            self.stop(server)
            raise RigError(f"{label}: {server.smoke['msg']}")
        return server

    def stop(self, server: Launched) -> int:
        code = proc.stop(server.child)
        if server in self.running:
            self.running.remove(server)
        progress(f"{server.label}: stopped (exit {code})")
        return code


Lines = dict[str, list[str]]


@contextlib.contextmanager
def config_checked(text: str, real: Path) -> Iterator[tuple[Path, Callable[[Lines], Lines]]]:
    """A config file that server lines name (an adaptive config), for sglang's parser to check while the lines are
    rendered: TEXT at a scratch copy of REAL's name, and what turns the lines rendered with that copy into lines
    naming REAL, where the run writes TEXT before its servers start. Nothing is written at REAL here, so a dry run
    writes nothing and a refused line leaves nothing behind."""
    with tempfile.TemporaryDirectory() as scratch:
        copy_at = atomic_write(Path(scratch) / real.name, text)
        yield copy_at, lambda lines: {name: [str(real) if word == str(copy_at) else word for word in argv]
                                      for name, argv in lines.items()}


def results_dir(given: str | Path, outputs: tuple[str, ...]) -> Path:
    """--out as a run that starts servers writes it: the one output rule (rig.core.outdir.results_dir), with the
    servers' logs/ and profiles/ directories rig makes or ones that are not links."""
    return outdir.results_dir(given, outputs, "--out", places=("logs", "profiles"))


def make_logs(out: Path) -> Path:
    try:
        (out / "logs").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RigError(f"--out {out}: cannot make {out / 'logs'}: {exc.strerror or exc}; give a directory rig "
                       "can write") from exc
    return out / "logs"
