"""The rig command line: every step is a subcommand; --json for machines,
--check for a dry run wherever something would change.

One module per command group (rig/cli/NAME.py), each only parse -> call the
engine -> print; what they share is in rig.cli.common. This module holds the
root group and main(), the one error boundary.

Heavy controller-only libraries (yaml, docker) are imported inside commands so
that the engine bundle runs on targets with python3 alone.
"""
from __future__ import annotations

import json
import os
import sys

import click

from rig import __version__
from rig.cli import (
    audit,
    bundle,
    cuda,
    doctor,
    env,
    image,
    ldconfig,
    lock,
    machine,
    patch,
    plumbing,
    prove,
    server,
    smoke,
    stack,
    testmodel,
    tool,
    tune,
    upgrade,
    validate,
    venv,
    wheelhouse,
    wheels,
)
from rig.cli.common import DEFAULT_BUNDLE, DEFAULT_CACHE, DEFAULT_STACK, ERROR, INTERNAL, INTERRUPTED, SIGNALLED, moved
from rig.core import RigError
from rig.core.escape import terminal

__all__ = ["DEFAULT_BUNDLE", "DEFAULT_CACHE", "DEFAULT_STACK", "cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rig")
@click.option("--debug", is_flag=True, help="On failure, print the traceback too (anywhere on the line; or RIG_DEBUG=1).")
def cli(debug: bool) -> None:
    """Provision, build and prove an SGLang + EAGLE-3 stack on CUDA 13.

    Versions come from a stack file (stacks/NAME.yml). Ansible roles and the
    Dockerfile call these same subcommands. Every failure is one `rig: error:`
    line and exit 2 (bad input, or a host problem to fix).
    """


# Commands by what users do; the tools under them in their groups (cuda, machine, image, plumbing).
cuda.cuda.add_command(ldconfig.ldconfig_conf)
machine.machine.add_command(machine.probe)
image.image.add_command(image.sbom)
for _command in (stack.stack, lock.lock_cmd, wheelhouse.wheelhouse, venv.venv, env.env_group, server.server,
                 smoke.smoke, smoke.bench, tune.tune, prove.prove, upgrade.upgrade, testmodel.testmodel,
                 machine.machine, image.image, cuda.cuda, doctor.doctor, patch.patch, audit.audit,
                 validate.validate_cmd, wheels.wheels, plumbing.plumbing):
    cli.add_command(_command)
# the old top-level spellings, for one release
for _command, _now in ((ldconfig.ldconfig_conf, "cuda ldconfig-conf"), (machine.probe, "machine probe"),
                       (image.sbom, "image sbom"), (tool.tool, "plumbing tool"), (bundle.bundle, "plumbing bundle")):
    cli.add_command(moved(_command, _now))


class Terminated(BaseException):
    """SIGTERM/SIGHUP as an exception, so `finally` blocks remove scratch and subprocess.run kills its child."""


def _terminate(signum, frame) -> None:
    raise Terminated(signum)


def _explain(exc: BaseException) -> str | None:
    """One line for an error that input or the host caused; None for a defect of rig's own."""
    import tarfile
    import zipfile

    if isinstance(exc, RigError):
        return str(exc)
    if isinstance(exc, UnicodeError):
        return f"an input is not UTF-8 text: {exc}"
    if isinstance(exc, OSError):
        where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
        return f"{where or 'system'}: {exc.strerror or exc}"
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON: {exc}"
    if isinstance(exc, (zipfile.BadZipFile, tarfile.TarError)):
        return f"not a readable archive: {exc}"
    if type(exc).__module__.split(".")[0] in ("yaml", "requests", "urllib3", "http", "aiohttp"):
        return f"{type(exc).__name__}: {exc}"
    return None


def _said(text: str) -> str:
    """An error as the terminal should show it, whatever an input put in it: control characters written
    escaped, and lines after the first indented, so that only the first one starts with `rig: error:`."""
    return terminal(text).replace("\n", "\n  ")


def main(argv: list[str] | None = None) -> None:
    """The one error boundary: every failure is one `rig: error:` line and exit 2 (bad input or host),
    70 for a defect of rig's own; --debug (or RIG_DEBUG=1) adds the traceback."""
    import signal
    import traceback

    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv or os.environ.get("RIG_DEBUG") == "1"
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _terminate)
    try:
        cli(args=[a for a in argv if a != "--debug"], prog_name="rig", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("rig: interrupted", err=True)
        sys.exit(INTERRUPTED)
    except Terminated as exc:
        click.echo("rig: terminated", err=True)
        sys.exit(SIGNALLED + exc.args[0])
    except click.exceptions.ClickException as exc:
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        click.echo(f"rig: error: {_said(exc.format_message())}{hint}", err=True)
        sys.exit(exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - this is the boundary
        if debug:
            traceback.print_exc()
        line = _explain(exc)
        if line is None:
            click.echo(f"rig: error: internal error: {type(exc).__name__}: {_said(str(exc))} "
                       "(a defect of rig's: rerun with --debug and report the traceback)", err=True)
            sys.exit(INTERNAL)
        click.echo(f"rig: error: {_said(line)}", err=True)
        sys.exit(ERROR)
