"""`rig patch apply` and `rig patch revert`: a plan, shown (--check) or written as one transaction."""
from __future__ import annotations

from rig.patches.env import Env
from rig.patches.patchset import Patch
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
    files = [str(c.path) for c in plan.changes]
    result = {"changed": plan.changed, "files": files,
              "msg": f"{'would restore' if check else 'restored'} {len(files)} file(s)" + "".join(f"\n  {p}" for p in files)}
    if not check:
        commit(env, plan)
    return result
