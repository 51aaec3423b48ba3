"""Each patch's status in an environment (a row: applied, needed, upstream, not-applicable, drifted or opt-in), and
the rows as a table."""
from __future__ import annotations

from collections.abc import Mapping

from rig.core.documents import read_text
from rig.core.fs import confined
from rig.patches.env import Env
from rig.patches.hunks import patched
from rig.patches.patchset import Patch, in_range


def status(env: Env, patches: list[Patch], opted: frozenset[str] = frozenset(),
           texts: Mapping[str, str] | None = None) -> list[dict]:
    """Each patch's row, judged on its file as it is on disk, or as TEXTS (resolved path -> text) has it: a plan
    judges the files it would restore before writing anything. An opt-in patch whose feature is not in OPTED is
    "opt-in" unless its code is in the file (then "applied", saying that an apply without the feature takes it
    out)."""
    return [_row(env, patch, opted, texts or {}) for patch in patches]


def _row(env: Env, patch: Patch, opted: frozenset[str], texts: Mapping[str, str]) -> dict:
    row = {"id": patch.id, "package": patch.package, "file": patch.file, "summary": patch.summary}
    installed = env.packages.get(patch.package)
    if not installed:
        return {**row, "version": None, "status": "not-applicable", "detail": "not installed"}
    root = env.inside(installed["root"], f"{patch.package}'s install")
    version, path = installed["version"], confined(root, patch.file, f"patch {patch.id}: file")
    row.update(version=version, path=str(path))
    if patch.upstream and in_range(version, patch.upstream):
        return {**row, "status": "upstream",
                "detail": f"{patch.package} {version} has it (fixed in {patch.provenance['fixed_in']})"}
    if not patch.needs(version):
        return {**row, "status": "not-applicable", "detail": f"{version} is outside {patch.needed}"}
    text = texts.get(str(path))
    if text is None:
        if not path.is_file():
            return {**row, "status": "drifted", "detail": f"{patch.file} is not in {patch.package} {version}"}
        text = read_text(path, "patch target")
    state, result = patched(text, patch)
    detail = result if state == "drifted" else ""
    if not patch.wanted(opted):
        state, detail = (state, f"opt-in {patch.opt_in}, not asked for: an apply without it takes it out") \
            if state == "applied" else ("opt-in", f"applied where opt-in {patch.opt_in} is asked for")
    return {**row, "status": state, "detail": detail}


def summary(rows: list[dict], verb: str) -> str:
    todo = [r["id"] for r in rows if r["status"] == "needed"]
    head = f"{verb} {len(todo)} patch(es)" if todo else "nothing to apply"
    return head + "\n" + table(rows)


def table(rows: list[dict]) -> str:
    width = max(len(r["id"]) for r in rows)
    lines = [f"{'patch'.ljust(width)}  {'status':14}  package"]
    for r in rows:
        version = f"{r['package']} {r['version']}" if r["version"] else r["package"]
        detail = f"  ({r['detail']})" if r.get("detail") else ""
        lines.append(f"{r['id'].ljust(width)}  {r['status']:14}  {version}{detail}")
    return "\n".join(lines)
