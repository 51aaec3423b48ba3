"""Child processes: one way to run them, so every failure reads the same.

Every short-lived child of rig goes through run(): a program that cannot start or does not finish is a
RigError naming what it was for, and an exit status outside OK is one too, unless the caller reads the
status itself (ok=None). Long-lived ones (servers) go through start() and stop()."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import IO, NamedTuple, TypeAlias

from rig.core import RigError
from rig.core.documents import parse_json
from rig.core.fs import open_plain
from rig.core.hints import CREATE_VENV


def run(argv: list[str], what: str, *, timeout: float, ok: tuple[int, ...] | None = (0,),
        **kwargs) -> subprocess.CompletedProcess:
    """Run ARGV to completion; a missing program, a timeout or an exit status outside OK is a RigError naming
    WHAT. ok=None: any status comes back to the caller, who reads it. Output is captured as text unless the
    caller says otherwise (capture_output=False, stdout=...). TIMEOUT is required: a child that hangs (an
    import that never returns) must end rig's wait with an error, never hold it forever."""
    if "stdout" not in kwargs and "stderr" not in kwargs:
        kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    try:
        done = subprocess.run(argv, timeout=timeout, check=False, **kwargs)
    except OSError as exc:
        raise RigError(f"{what}: cannot run {argv[0]}: {exc.strerror or exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise RigError(f"{what}: {argv[0]} did not finish within {timeout:.0f} s; find what it waits on (a "
                       "lock, the network, an import that hangs), then run rig again") from exc
    if ok is not None and done.returncode not in ok:
        err = (done.stderr or "").strip().splitlines()[-8:] if kwargs.get("text") else []
        raise RigError(f"{what}: {argv[0]} exited {done.returncode}" + (": " + " | ".join(err) if err else ""))
    return done


def interpreter(python: str | Path) -> Path:
    """A venv's (or a given) Python that rig runs its scripts with, as the absolute path to start it by. A name
    with a slash is a path (./mypython is this directory's, never one on PATH); a bare name is looked up on PATH,
    as a shell would. Give it what the user typed: Path("./mypython") is already "mypython". Links are kept (a
    venv's bin/python is one, and the venv is found through it). Missing is the user's to fix."""
    text = str(python)
    if "/" not in text:
        found = shutil.which(text)
        if not found:
            raise RigError(f"{text} is not on PATH", hint=f"give the interpreter's path (./{text} for one in this "
                           f"directory), or the stack's venv's python; {CREATE_VENV}")
        text = found
    path = Path(text).absolute()
    if not path.exists():
        raise RigError(f"{path} does not exist", hint=f"give --python an interpreter, or install the stack's venv "
                       f"there ({CREATE_VENV})")
    if path.is_dir() or not os.access(path, os.X_OK):
        raise RigError(f"{path} is not an executable file", hint="give --python the interpreter itself")
    return path


def venv_python(venv: str | Path) -> Path:
    """VENV's interpreter: the one check of whether a directory is a venv."""
    python = Path(venv) / "bin" / "python"
    if not python.exists():
        raise RigError(f"{venv} is not a virtualenv (no bin/python)",
                       hint=f"give --venv one, or set the stack's venv key to one, or {CREATE_VENV}")
    return python


def last_json(out: str, what: str, kind: type = dict):
    """The JSON value (a KIND) a child printed on its last line."""
    lines = (out or "").strip().splitlines()
    try:
        value = parse_json(lines[-1] if lines else "", what)
    except RigError as exc:
        why = str(exc).removeprefix(f"{what}: ")
        raise RigError(f"{what}: expected one JSON line at the end of its output, got {(out or '')[-300:]!r} ({why})") \
            from exc
    if not isinstance(value, kind):
        raise RigError(f"{what}: expected a JSON {kind.__name__}, got {lines[-1][:200]!r}")
    return value


def script(*names: str) -> str:
    """The sources of rig/foreign/NAME.py, one after the other: a script another interpreter runs (never
    imported by rig), read from the package, so that it travels in the engine bundle too. A file put after
    another can have no `from __future__` import, and its tracebacks' line numbers count from the first."""
    return "\n".join(resources.files("rig").joinpath("foreign", f"{name}.py").read_text(encoding="utf-8")
                     for name in names)


def ask(python: str | Path, name: str, args: list[str], what: str, kind: type = dict, *, timeout: float, **kwargs):
    """What an environment's own Python says about itself: the script NAME (rig/foreign) run there, isolated
    from the caller's PYTHONPATH and user site, its last line read as JSON."""
    done = run([str(python), "-I", "-c", script(name), *args], f"{python} could not {what}", timeout=timeout,
               **kwargs)
    return last_json(done.stdout, f"{python} asked to {what}", kind)


PIPE, DEVNULL, STDOUT, TimeoutExpired = subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT, subprocess.TimeoutExpired
# the types callers annotate with, so that no module but this one imports subprocess
Completed: TypeAlias = subprocess.CompletedProcess
Child: TypeAlias = subprocess.Popen


def spawn(argv: list[str], what: str, **kwargs) -> subprocess.Popen:
    """A child rig talks to while it runs (pipes, a log): one that cannot start is a RigError naming WHAT."""
    try:
        return subprocess.Popen(argv, **kwargs)
    except OSError as exc:
        raise RigError(f"{what}: cannot run {argv[0]}: {exc.strerror or exc}") from exc


class Running(NamedTuple):
    """A child running() runs: what it wrote to stderr (and stdout, where no other was given) is kept in LOG."""
    child: subprocess.Popen
    log: IO[bytes]

    def said(self, limit: int = 2000) -> str:
        """What it wrote so far, at most LIMIT bytes of it."""
        self.log.seek(0)
        return self.log.read(limit).decode(errors="replace").strip()


@contextlib.contextmanager
def running(argv: list[str], what: str, **kwargs) -> Iterator[Running]:
    """ARGV spawn()ed for the block, its stderr (and stdout, unless given) kept in a temporary file. However the
    block ends, the child has ended after it, killed where it still runs (one still writing what nobody reads, or
    reading what nobody writes, would wait for good), and the pipes made for it are closed."""
    with tempfile.TemporaryFile() as log:
        kwargs.setdefault("stdout", log)
        child = spawn(argv, what, stderr=log, **kwargs)
        try:
            yield Running(child, log)
        finally:
            if child.poll() is None:
                child.kill()
            child.wait()
            for pipe in (child.stdin, child.stdout):
                if pipe is not None:
                    with contextlib.suppress(BrokenPipeError):  # what a killed child never read
                        pipe.close()


def reap(child: subprocess.Popen, grace: float = 10.0) -> int:
    """A spawn()ed child that was told to end (its input closed): waited for GRACE seconds, then killed; its exit
    status."""
    try:
        return child.wait(grace)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()


def start(argv: list[str], log: str | Path, what: str, env: dict | None = None) -> subprocess.Popen:
    """A long-running child (a server) in a session of its own, stdout and stderr to LOG, which is created
    new or truncated and never followed through a link. stop() ends the whole session: SGLang's scheduler
    and detokenizer are the server's children."""
    try:
        fd = open_plain(log, os.O_WRONLY | os.O_CREAT, "its log", follow=False)
    except RigError as exc:
        raise RigError(f"{what}: {exc}; give another --out") from exc
    try:
        os.ftruncate(fd, 0)
        return spawn(argv, what, stdin=subprocess.DEVNULL, stdout=fd, stderr=subprocess.STDOUT, env=env,
                     start_new_session=True)
    except OSError as exc:
        raise RigError(f"{what}: cannot truncate its log {log}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)


def stop(child: subprocess.Popen, grace: float = 30.0) -> int:
    """SIGTERM to the child's session (SGLang drains on it), SIGKILL after GRACE seconds; its exit status."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        if child.poll() is not None:
            break
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            break
        try:
            child.wait(wait)
        except subprocess.TimeoutExpired:
            continue
    try:  # the leader may be gone while the session's other processes still run
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return child.wait()
