"""`rig lock`: resolve a stack into its lock files."""
from __future__ import annotations

import sys

import click

from rig.cli.common import PARTIAL, emit, json_option, stack_option
from rig.python import lock as locking
from rig.stack.spec import load


@click.command("lock")
@stack_option(positional=True, help="The stack to lock.")
@click.option("--verify", is_flag=True,
              help="Fail if STACK.lock is missing or stale; write nothing (CI runs this before any box sees the stack).")
@click.option("--check", "old_check", is_flag=True, hidden=True)  # the old spelling of --verify, for one release
@json_option
def lock_cmd(stack_path, verify, old_check, as_json) -> None:
    """Resolve a stack into STACK.lock: every wheel with version, file and sha256.

    A stack whose hosts have other Pythons lists them under `pythons`; each gets a
    lock of its own, STACK.pyXY.lock, and hosts install the one of their python3.
    """
    if old_check:
        click.echo("rig: `rig lock --check` is now `rig lock --verify`; the old spelling goes in the next release",
                   err=True)
    stack = load(stack_path)
    if verify or old_check:
        emit(locking.check(stack, stack_path), as_json)
        return
    result = locking.lock_all(stack, stack_path)
    emit(result, as_json)
    if not result["complete"]:
        sys.exit(PARTIAL)
