"""Patched code judged in the environment's own Python (rig/foreign/patch_checks.py): that it compiles, and that
each patch's check passes."""
from __future__ import annotations

from rig.core import RigError
from rig.core.documents import dump_json
from rig.core.proc import last_json, run, script
from rig.patches.env import Env


def verify(env: Env, sources: dict[str, str], checks: list[dict]) -> dict:
    """Problem -> error, empty when SOURCES (path -> text) all compile and every check of CHECKS ({"id", "file",
    "code"}) passes."""
    done = run([env.python, "-I", "-c", script("sglang_bare", "patch_checks")], "checking the patched modules",
               cwd="/", ok=None, input=dump_json({"sources": sources, "checks": checks}, "the patch checks"),
               timeout=600)  # it imports sglang's patched modules (torch with them)
    if done.returncode != 0 or not done.stdout.strip():
        return {"checks": done.stderr.strip()[-2000:] or f"exit {done.returncode}"}
    try:
        return last_json(done.stdout, "checking the patched modules")
    except RigError as exc:  # the environment's startup printed over the answer: the check did not run
        return {"checks": str(exc)}


def refuse_uncompilable(env: Env, sources: dict[str, str]) -> None:
    """Before anything is written: every new source compiles in the environment's Python."""
    if errors := verify(env, sources, []):
        raise RigError(f"a patched module does not compile, nothing was changed: {errors}")


def require_checks(env: Env, checks: list[dict]) -> None:
    """Once written: every applied patch's check passes (raised inside the transaction, which puts the files back)."""
    if errors := verify(env, {}, checks):
        raise RigError("a patch's check failed after apply; the files were put back: "
                       + "; ".join(f"{k}: {v}" for k, v in errors.items()))
