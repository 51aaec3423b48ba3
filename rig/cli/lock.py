"""`rig lock`: resolve a stack into its lock files."""
from __future__ import annotations

import sys

import click

from rig.cli.common import DEFAULT_STACK, PARTIAL, emit, json_option


@click.command("lock")
@click.argument("stack_path", metavar="STACK", default=DEFAULT_STACK)
@click.option("--check", is_flag=True, help="Fail if STACK.lock is missing or stale; write nothing.")
@json_option
def lock_cmd(stack_path, check, as_json) -> None:
    """Resolve a stack into STACK.lock: every wheel with version, file and sha256.

    A stack whose hosts have other Pythons lists them under `pythons`; each gets a
    lock of its own, STACK.pyXY.lock, and hosts install the one of their python3.
    """
    from rig import lock as locking
    from rig.stack import load

    stack = load(stack_path)
    if check:
        done, problems = locking.stale(stack, stack_path)
        locking.refuse(problems)
        emit({"changed": False, "lock": str(locking.lock_path(stack_path)), "lock_hash": done[0]["lock_hash"],
              "locks": len(done), "msg": f"{len(done)} lock(s) of {stack_path} up to date"}, as_json)
        return
    summaries = []
    for python, variant, path in locking.variants(stack, stack_path):
        click.echo(f"rig: resolving {stack['name']} for Python {python}", err=True)
        result = locking.build_lock(variant, stack_path)
        old = path.read_text() if path.exists() else None
        locking.write(result, path)
        summary = {"changed": old != path.read_text(), "lock": str(path), "lock_hash": result["lock_hash"],
                   "python": python, "complete": result["complete"], "wheels": len(result["wheels"]),
                   "unresolved": [u["reason"] for u in result["unresolved"]]}
        summary["msg"] = (f"locked {len(result['wheels'])} wheels into {path}" if result["complete"] else
                          f"PARTIAL lock written to {path}: " + "; ".join(summary["unresolved"]))
        summaries.append(summary)
    first = summaries[0]
    emit({**first, "locks": summaries, "changed": any(x["changed"] for x in summaries),
          "complete": all(x["complete"] for x in summaries), "msg": "\n".join(x["msg"] for x in summaries)}, as_json)
    if not all(x["complete"] for x in summaries):
        sys.exit(PARTIAL)
