"""`rig patch apply` and `rig patch revert`: a plan, shown (--check) or written as one transaction."""
from __future__ import annotations

import os

from rig.core import RigError
from rig.patches.env import Env
from rig.patches.patchset import Patch, identity
from rig.patches.plan import Plan, for_apply, for_revert
from rig.patches.report import status, table
from rig.patches.transaction import commit
from rig.patches.verify import refuse_uncompilable, require_checks


def apply(env: Env, patches: list[Patch], check: bool = False, force: bool = False,
          opted: frozenset[str] = frozenset()) -> dict:
    """Apply what is needed: every patch in range, an opt-in one only where OPTED asks for its feature. One that
    rig applied before and is no longer asked for is taken out in the same run: its files go back to their
    originals and the other patches of those files go on again. A failure anywhere leaves every file as it was."""
    plan = for_apply(env, patches, opted, force)
    _writable(env, plan)
    result = {"changed": plan.changed, "patches": plan.rows, "diff": plan.diff(), "msg": _said(plan, check)}
    if check or plan.idle:
        return result
    refuse_uncompilable(env, {str(c.path): c.after.decode() for c in plan.changes})
    commit(env, plan, lambda: require_checks(env, plan.checks))
    rows = status(env, patches, opted)
    return {**result, "patches": rows, "msg": _said(plan, check, rows)}


def _said(plan: Plan, check: bool, after: list[dict] | None = None) -> str:
    names = ", ".join(plan.taken_out)
    if check and plan.taken_out:
        return (f"would take out {names} (opt-in, not asked for): its files go back to their originals, then the "
                "other patches are applied again\n" + table(plan.rows))
    verb = "would apply" if check else "applied"
    head = f"{verb} {len(plan.applying)} patch(es)" if plan.applying else "nothing to apply"
    if plan.taken_out:
        head = f"took out {names} (opt-in, not asked for)\n{head}"
    return head + "\n" + table(after or plan.rows)


def revert(env: Env, check: bool = False, force: bool = False) -> dict:
    """Put back every file rig patched here, byte for byte, and remove its record and backups."""
    plan = for_revert(env, force)
    _writable(env, plan)
    files = [str(c.path) for c in plan.changes]
    result = {"changed": plan.changed, "files": files,
              "msg": f"{'would restore' if check else 'restored'} {len(files)} file(s)" + "".join(f"\n  {p}" for p in files)}
    if not check:
        commit(env, plan)
    return result


def carried(env: Env, patches: list[Patch], opted: frozenset[str] = frozenset()) -> dict:
    """The patch set OPTED asks for (patchset.identity), once ENV holds it exactly: an apply would change nothing.
    A venv archive or image records it, so that a host asking for another set takes neither."""
    plan = for_apply(env, patches, opted, force=False)
    if not plan.idle:
        asked = "".join(f" --opt-in {name}" for name in sorted(opted))
        raise RigError(f"{env.prefix} does not hold rig's patch set as asked: an apply {_would(plan)}",
                       hint=f"apply it first (rig patch apply --venv {env.prefix}{asked}), then pack")
    return identity(patches, opted)


def _writable(env: Env, plan: Plan) -> None:
    """A plan that would write into a read-only environment (a venv image rig mounted) refused, before anything."""
    if plan.idle or not os.statvfs(env.prefix).f_flag & os.ST_RDONLY:
        return
    raise RigError(f"{env.prefix} is read-only (a venv image: its patches are those it was imaged with), and "
                   f"{_would(plan)}; nothing was changed",
                   hint="give the python_stack role the stack's patches (python_stack_patches: the image of another "
                        "patch set is then not mounted), or take the archive (python_stack_venv_image: false)")


def _would(plan: Plan) -> str:
    said = ([f"would apply {', '.join(plan.applying)}"] if plan.applying else []) + \
        ([f"would take out {', '.join(plan.taken_out)}"] if plan.taken_out else [])
    return "; ".join(said) or f"would change {len(plan.changes)} file(s) and rig's record of them"
