"""The rig command line: every step is a subcommand; --json for machines,
--check for a dry run wherever something would change.

One module per command group (rig/cli/NAME.py), each only parse -> call the
engine -> print, its imports at its top; what they share is in rig.cli.common.
This module holds the root group, its command table and main(), the one error
boundary.

The table is lazy, as pip's is: it names each command's module and its one-line
summary, so `rig --help` lists the commands in the order users take them
without importing any, and a run imports only its own command's module (the
engine bundle runs on targets with python3 and the bundled libraries alone).
"""
from __future__ import annotations

import contextlib
import errno
import importlib
import json
import os
import signal
import sys
import tarfile
import traceback
import zipfile
from typing import NamedTuple

import click

from rig import __version__
from rig.cli.common import (
    DEFAULT_BUNDLE,
    DEFAULT_CACHE,
    ERROR,
    INTERNAL,
    INTERRUPTED,
    OK,
    REASONS,
    SIGNALLED,
    RigGroup,
    moved,
)
from rig.core import RigError
from rig.core.escape import rig_line
from rig.core.renames import Renamed

__all__ = ["COMMANDS", "DEFAULT_BUNDLE", "DEFAULT_CACHE", "cli", "main"]


class Entry(NamedTuple):
    name: str
    where: str  # MODULE:ATTRIBUTE under rig.cli, or MODULE:GROUP SUBCOMMAND for an old spelling
    summary: str  # what `rig --help` says of it
    renamed: Renamed | None = None  # an old top-level spelling: where the command lives now, and until when


# In the order users take them: the stack and its lock, the CUDA toolkit, the wheels and the venv, the
# environment and patches, the checks, the machine, the test model, serving and measuring, images, upgrades,
# plumbing.
COMMANDS = (
    Entry("stack", "stack:stack", "Read and validate stack files."),
    Entry("lock", "lock:lock_cmd", "Resolve a stack into its lock: every wheel, version, file and sha256."),
    Entry("validate", "validate:validate_cmd", "Gate a stack in CI, with no GPU: every check, every problem."),
    Entry("cuda", "cuda:cuda", "Install CUDA toolkits side by side; the /usr/local/cuda link."),
    Entry("wheelhouse", "wheelhouse:wheelhouse", "The controller's hash-keyed cache of locked wheels."),
    Entry("venv", "venv:venv", "The stack's virtualenv on a target, installed offline."),
    Entry("wheels", "wheels:wheels", "Build kernel wheels against the venv's own torch."),
    Entry("env", "env:env_group", "The CUDA 13 environment the venv's processes start with."),
    Entry("patch", "patch:patch", "SM120 / EAGLE-3 source patches on an installed venv."),
    Entry("doctor", "doctor:doctor", "Check the machine, driver, toolkits and venv; or read a log."),
    Entry("audit", "audit:audit", "Audit wheels, installed packages or shared objects."),
    Entry("machine", "machine:machine", "The GPUs and the machine under the stack: facts, probe."),
    Entry("testmodel", "testmodel:testmodel", "Write a tiny target and EAGLE-3 draft to prove serving."),
    Entry("server", "server:server", "The SGLang server's command line from the stack."),
    Entry("smoke", "smoke:smoke", "Wait for the server, send prompts, check the completions."),
    Entry("bench", "bench:bench", "Benchmark EAGLE-3 against a baseline: serial, then a sweep."),
    Entry("tune", "tune:tune", "Find where EAGLE-3 pays on this box and how to serve it."),
    Entry("prove", "prove:prove", "Prove this box: doctor, probe, numerics, the servers."),
    Entry("fleet", "fleet:fleet", "A fleet's reports, read together on the controller."),
    Entry("image", "image:image", "The stack's serving image, built from its lock."),
    Entry("upgrade", "upgrade:upgrade", "A day-two upgrade of a serving host, step by step."),
    Entry("plumbing", "plumbing:plumbing", "What roles and images use underneath: bundle, tools."),
    # the old top-level spellings, hidden, each until the release it names
    Entry("ldconfig-conf", "cuda:cuda ldconfig-conf", "",
          Renamed("`rig ldconfig-conf`", "`rig cuda ldconfig-conf`", "0.2.0", "name")),
    Entry("probe", "machine:machine probe", "", Renamed("`rig probe`", "`rig machine probe`", "0.2.0", "name")),
    Entry("sbom", "image:image sbom", "", Renamed("`rig sbom`", "`rig image sbom`", "0.2.0", "name")),
    Entry("tool", "plumbing:plumbing tool", "", Renamed("`rig tool`", "`rig plumbing tool`", "0.2.0", "name")),
    Entry("bundle", "plumbing:plumbing bundle", "", Renamed("`rig bundle`", "`rig plumbing bundle`", "0.2.0", "name")),
)
_TABLE = {entry.name: entry for entry in COMMANDS}


class LazyGroup(RigGroup):
    """The root group: its commands from COMMANDS, each module imported when its command is asked for."""

    def list_commands(self, ctx):
        return [entry.name for entry in COMMANDS]

    def get_command(self, ctx, cmd_name):
        entry = _TABLE.get(cmd_name)
        if entry is None:
            return None
        module, _, path = entry.where.partition(":")
        attribute, *sub = path.split()
        command = getattr(importlib.import_module(f"rig.cli.{module}"), attribute)
        if sub:
            return moved(command.commands[sub[0]], entry.renamed)
        command.short_help = entry.summary
        return command

    def format_commands(self, ctx, formatter):
        """The table's summaries, in its order: no command module is imported for `rig --help`."""
        rows = [(entry.name, entry.summary) for entry in COMMANDS if not entry.renamed]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def shown(self, ctx):
        """The commands users see, from the table: no module is imported to suggest one."""
        return [entry.name for entry in COMMANDS if not entry.renamed]


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rig")
@click.option("--debug", is_flag=True, help="On failure, print the traceback too (anywhere on the line; or RIG_DEBUG=1).")
def cli(debug: bool) -> None:
    """Provision, build and prove an SGLang + EAGLE-3 stack on CUDA 13.

    Versions come from a stack file (--stack, $RIG_STACK, or the nearest
    stacks/default.yml). Ansible roles and the Dockerfile call these same
    subcommands. Every failure is one `rig: error:` line, its remedy on a
    `rig: hint:` line, and exit 2 (bad input, or a host problem to fix).
    """


class Terminated(BaseException):
    """SIGTERM/SIGHUP as an exception, so `finally` blocks remove scratch and subprocess.run kills its child."""


def _terminate(signum, frame) -> None:
    raise Terminated(signum)


def _explain(exc: BaseException) -> tuple[str, str | None] | None:
    """The line and its hint (None: none) for an error that input or the host caused; None for a defect of rig's
    own."""
    if isinstance(exc, RigError):
        return exc.message, exc.hint
    if isinstance(exc, UnicodeError):
        return f"an input is not UTF-8 text: {exc}", None
    if isinstance(exc, OSError):
        where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        return f"{where or 'system'}: {exc.strerror or exc}", "free space there and run again" if full else None
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON: {exc}", None
    if isinstance(exc, (zipfile.BadZipFile, tarfile.TarError)):
        return f"not a readable archive: {exc}", None
    if type(exc).__module__.split(".")[0] in ("yaml", "requests", "urllib3", "http", "aiohttp"):
        return f"{type(exc).__name__}: {exc}", None
    return None


def _deleted_cwd() -> str | None:
    """The current directory when it has been deleted under rig (os.getcwd() fails), as the kernel last named
    it; None while it exists."""
    try:
        os.getcwd()
        return None
    except FileNotFoundError:
        try:
            return os.readlink("/proc/self/cwd").removesuffix(" (deleted)")
        except OSError:
            return os.environ.get("PWD") or "(unknown)"


def _fail(line: str, code: int, as_json: bool, kind: str = "error: ", hint: str | None = None,
          reason: str | None = None) -> None:
    """The one way a run fails: `rig: error: LINE` on stderr (an interrupt, no error of input: `rig: LINE`), the
    remedy on a line of its own, `rig: hint: HINT`, as uv says it; under --json also {"error", "hint", "exit"} on
    stdout (a machine reading stdout gets one JSON object either way; hint null where there is none; "reason" too
    where the error names one a caller acts on), then exit CODE."""
    click.echo(rig_line(kind + line), err=True)
    if hint:
        click.echo(rig_line(f"hint: {hint}"), err=True)
    if as_json:
        from rig.core.documents import dump_json

        try:
            said = {"error": line, "hint": hint, "exit": code, **({"reason": reason} if reason else {})}
            click.echo(dump_json(said, "the error"))
        except OSError:  # stdout itself is what failed (a full disk, a closed pipe): the line above said so
            _quiet_stdout()
    sys.exit(code)


def _stdout_failed(exc: OSError) -> bool:
    """Whether EXC is a write to stdout that failed: rig writes its output through click.echo, whose `file` the
    innermost frame holds (then stdout is quieted, so the interpreter's last flush prints no second error)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    stream = tb.tb_frame.f_locals.get("file") if tb is not None else None
    try:
        failed = stream is not None and stream.fileno() == sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a stream, or one without a descriptor
        return False
    if failed:
        _quiet_stdout()
    return failed


def _quiet_stdout() -> None:
    """stdout pointed at /dev/null: what is still buffered for it goes nowhere, with no error at exit."""
    with contextlib.suppress(OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)


def main(argv: list[str] | None = None) -> None:
    """The one error boundary: every failure is one `rig: error:` line, its remedy on a `rig: hint:` line, and
    exit 2 (bad input or host), 70 for a defect of rig's own (under --json also one JSON object on stdout);
    --debug (or RIG_DEBUG=1) adds the traceback; a group given no command prints its help and exits 0."""
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv or os.environ.get("RIG_DEBUG") == "1"
    as_json = "--json" in argv
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _terminate)
    try:
        cli(args=[a for a in argv if a != "--debug"], prog_name="rig", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        _fail("interrupted", INTERRUPTED, as_json, kind="")
    except Terminated as exc:
        _fail("terminated", SIGNALLED + exc.args[0], as_json, kind="")
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help())
        sys.exit(OK)
    except click.exceptions.ClickException as exc:
        ctx = getattr(exc, "ctx", None)
        helped = f"see `{ctx.command_path} --help`" if ctx is not None else None
        _fail(exc.format_message(), exc.exit_code, as_json, hint=getattr(exc, "hint", None) or helped)
    except Exception as exc:  # noqa: BLE001 - this is the boundary
        if debug:
            traceback.print_exc()
        _fail_with(exc, as_json)


def _fail_with(exc: Exception, as_json: bool) -> None:
    """EXC as its one error line and hint: explained (rig's own errors, a host's), or rig's defect."""
    explained = _explained_here(exc)
    if explained is None:
        _fail(f"internal error: {type(exc).__name__}: {exc}", INTERNAL, as_json,
              hint="a defect of rig's: rerun with --debug and report the traceback")
    else:
        line, hint = explained
        reason = exc.reason if isinstance(exc, RigError) else None
        _fail(line, REASONS.get(reason or "", ERROR), as_json, hint=hint, reason=reason)


def _explained_here(exc: Exception) -> tuple[str, str | None] | None:
    """_explain's line and hint for EXC, told where the working directory or stdout is the cause."""
    explained = _explain(exc)
    gone = _deleted_cwd()
    if gone is not None and isinstance(exc, OSError) and exc.filename is None:  # what os.getcwd() raises
        return (f"the current directory {gone} has been deleted",
                "cd to a directory that exists and run rig again")
    if isinstance(exc, OSError) and exc.filename is None and _stdout_failed(exc):
        return f"cannot write the output to stdout: {exc.strerror or exc}", "give it somewhere that takes it"
    if gone is not None and explained is not None:
        return (f"{explained[0]} (the current directory {gone} has been deleted)",
                "; ".join(filter(None, [explained[1], "cd to a directory that exists"])))
    return explained
