"""`rig lock`: resolve a stack into its lock files."""
from __future__ import annotations

import sys

import click

from rig.cli.common import PARTIAL, RenamedOption, emit, json_option, stack_option
from rig.python import lock as locking
from rig.stack.spec import load


@click.command("lock")
@stack_option(positional=True, help="The stack to lock.")
@click.option("--verify", is_flag=True, cls=RenamedOption, old="--check", removed_in="0.2.0",
              help="Fail if STACK.lock is missing or stale; write nothing (CI runs this before any box sees the stack).")
@json_option
def lock_cmd(stack_path, verify, as_json) -> None:
    """Resolve a stack into STACK.lock: every wheel with version, file and sha256.

    A stack whose hosts have other Pythons lists them under `pythons`; each gets a
    lock of its own, STACK.pyXY.lock, and hosts install the one of their python3.
    """
    stack = load(stack_path)
    if verify:
        emit(locking.check(stack, stack_path), as_json)
        return
    result = locking.lock_all(stack, stack_path)
    emit(result, as_json)
    if not result["complete"]:
        sys.exit(PARTIAL)
