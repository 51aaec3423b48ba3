"""Source patches (rig's patch set, rig/patches/set/*.yml) on an installed environment: status, apply, revert.

A patch names its package, the versions that need it and the versions whose
upstream already has it, the file, and hunks anchored on the exact code they
expect: an anchor that is not found once is drift, and nothing is written.
Originals are kept by sha256 under the environment's prefix with a state file,
so revert restores them byte for byte. After apply the patched modules must
compile and every applied patch's check must pass in that environment's
Python, or the run's files are put back.

A patch may be opt-in (its `opt_in` names a feature, e.g. free-off): it is
applied only where the feature is asked for (a stack's patches.opt_in, or
--opt-in), and an apply without the feature takes it out again.
"""
from __future__ import annotations

import difflib
import importlib.resources
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rig.core import RigError
from rig.core.documents import dump_json
from rig.core.fs import atomic_write, confined, read_bytes, sha256_data
from rig.core.proc import interpreter, last_json, run, script, venv_python
from rig.core.schema import Field, distribution, feature, sha256, validate
from rig.python.introspect import held

STATE = ".rig-patches.json"
BACKUPS = ".rig-patches"
STATUSES = ("applied", "needed", "upstream", "not-applicable", "drifted", "opt-in")


PATCH_SET = importlib.resources.files("rig.patches") / "set"  # a directory, or a folder inside the zipapp


@dataclass(frozen=True)
class Patch:
    id: str
    summary: str
    package: str
    needed: str
    upstream: str
    file: str
    hunks: tuple
    check: str
    why: str
    provenance: dict
    opt_in: str = ""  # the feature that turns it on; "" for a patch every environment in its range needs

    def needs(self, version: str) -> bool:
        return _in(version, self.needed)

    def wanted(self, opted: frozenset[str]) -> bool:
        """Whether this patch is asked for: always, unless it is opt-in and OPTED lacks its feature."""
        return not self.opt_in or self.opt_in in opted

    def knows(self, version: str) -> bool:
        return self.needs(version) or bool(self.upstream and _in(version, self.upstream))


def _in(version: str, spec: str) -> bool:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    return SpecifierSet(spec).contains(Version(version), prereleases=True)


# ------------------------------------------------------------------ loading

def _schema():
    text = Field(required=True, multiline=True)  # prose and code; names and paths stay one line

    def spec(value: str) -> str | None:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        try:
            SpecifierSet(value)
        except InvalidSpecifier:
            return f"{value!r} is not a version range like '>=0.5.9,<0.5.10'"
        return None if value else "must not be empty"

    return {
        "id": Field(required=True, check=distribution), "summary": text, "package": Field(required=True, check=distribution),
        "opt_in": Field(default="", nonempty=True, check=lambda v: v and feature(v)),
        "needed": Field(required=True, check=spec),
        "upstream": Field(default="", check=lambda v: v and spec(v)),
        "file": Field(required=True), "why": text, "check": text,
        "hunks": Field(list, required=True, check=lambda v: None if v else "needs at least one hunk",
                       item=Field(dict, fields={"find": Field(required=True, multiline=True,
                                                              check=lambda v: None if v else "must not be empty"),
                                                "replace": text})),
        "provenance": Field(dict, required=True, fields={
            "mirrors": text, "fixed_in": text, "checked": text, "drop_when": text}),
    }


def patch_files(source: str | Path | None):
    """The patch files: SOURCE's, else rig's own patch set (package data: a checkout, an installed rig or the
    engine bundle alike)."""
    if source:
        return sorted(Path(source).glob("*.yml"))
    if not PATCH_SET.is_dir():  # an image's engine: its patch set lies beside it
        raise RigError("this rig carries no patch set of its own; give --patches (in an image: /opt/rig/patches)")
    return sorted((p for p in PATCH_SET.iterdir() if p.name.endswith(".yml")), key=lambda p: p.name)


def load(source: str | Path | None = None) -> list[Patch]:
    from rig.core.documents import parse_yaml, read_text

    patches: list[Patch] = []
    seen: dict[str, str] = {}  # patch id -> the file that defines it
    for path in patch_files(source):
        data = parse_yaml(read_text(path, "patch file"), path.name)
        if not isinstance(data, dict):
            raise RigError(f"{path.name}: a patch file must be a mapping of keys")
        data = validate(data, Field(dict, fields=_schema()), path.name)
        if data["id"] in seen:
            raise RigError(f"{path.name}: patch id {data['id']!r} is also used by {seen[data['id']]}")
        if data["id"] + ".yml" != path.name:
            raise RigError(f"{path.name}: the file must be named after its id ({data['id']}.yml)")
        seen[data["id"]] = path.name
        hunks = tuple((h["find"], h["replace"]) for h in data.pop("hunks"))
        patches.append(Patch(hunks=hunks, **data))
    if not patches:
        raise RigError(f"no patch files (*.yml) in {source or PATCH_SET}: a patch set is never empty; "
                       "give --patches a directory of patch files")
    return patches


# ------------------------------------------------------------------ the environment

STATE_SPEC = Field(dict, fields={"files": Field(dict, default={}, values=Field(dict, fields={
    "original_sha256": Field(required=True, check=sha256), "patched_sha256": Field(required=True, check=sha256),
    "patches": Field(list, default=[], item=Field(check=distribution))}))})


@dataclass
class Env:
    python: str
    prefix: Path
    packages: dict  # name -> {"version", "root"}

    @property
    def state_path(self) -> Path:
        return self.prefix / STATE

    def inside(self, path: str | Path, what: str) -> Path:
        """PATH resolved, or a RigError when it lies outside this environment (a link out of the venv, a
        site-packages that is a link elsewhere): rig patches and backs up only files of the environment."""
        try:
            return confined(self.prefix, os.path.relpath(Path(path).resolve(), self.prefix.resolve()), what)
        except RigError as exc:
            raise RigError(f"{exc}: it lies outside the environment {self.prefix}; rig patches only what an "
                           "environment holds (patch the one that owns it)") from exc

    def read_state(self) -> dict:
        """What rig patched here; a record of the wrong shape, or one naming a file outside this
        environment, is refused before anything is read or restored through it."""
        from rig.core.documents import load_json

        if not self.state_path.exists():
            return {"files": {}}
        try:
            state = load_json(self.state_path, "patch record", STATE_SPEC)
            for name in state["files"]:  # recorded resolved; the prefix may be reached through a link
                self.inside(name, f"{self.state_path}: file")
        except (RigError, ValueError) as exc:
            raise RigError(f"{exc}; restore {self.state_path} or remove it after reinstalling the patched "
                           "packages") from exc
        return state


def probe(python: str, packages: list[str]) -> Env:
    from packaging.version import InvalidVersion, Version

    found = held(python, packages)
    env = Env(python=found.python, prefix=found.prefix,
              packages={name: {"version": p["version"], "root": p["root"]} for name, p in found.packages.items()})
    for name, installed in env.packages.items():  # an installed package's metadata is input like any other
        try:
            Version(installed["version"])
        except InvalidVersion as exc:
            raise RigError(f"{name} is installed with version {str(installed['version'])[:60]!r}, which is "
                           "not a PEP 440 version; reinstall it") from exc
    return env


def environment(venv: str | None, python: str | None, stack_path: str | None, source: str | Path | None,
                opt_in: tuple[str, ...] = ()) -> tuple[Env, list[Patch], frozenset[str]]:
    """The environment named by --venv, --python or --stack (its venv), probed for the packages of the patch
    set at SOURCE; that patch set; and the opt-in features asked for (OPT_IN and the stack's patches.opt_in), not
    yet checked against the set (asked() does, where they are used)."""
    if venv and python:
        raise RigError("give --venv or --python, not both")
    stack = None
    if stack_path:
        from rig.stack.spec import load as load_stack

        stack = load_stack(stack_path)
    if not python:
        if not venv:
            if not stack:
                raise RigError("name the environment: --venv DIR, --python PATH or --stack FILE (its venv)")
            venv = stack["venv"]
        python = str(venv_python(venv))
    python = str(interpreter(python))  # --python as typed: ./mypython is a path, never looked up on PATH
    found = load(source)
    wanted = list(dict.fromkeys([*(stack["patches"]["opt_in"] if stack else []), *opt_in]))
    return probe(python, [p.package for p in found]), found, frozenset(wanted)


# ------------------------------------------------------------------ status

def _patched(text: str, patch: Patch) -> tuple[str, str]:
    """(status, new text or why): applied/needed with the result, or drifted with the reason."""
    if all(text.count(new) >= 1 for _, new in patch.hunks):
        return "applied", text
    for find, _ in patch.hunks:
        count = text.count(find)
        if count != 1:
            where = "not found" if count == 0 else f"found {count} times"
            first = next(line.strip() for line in find.splitlines() if line.strip())
            return "drifted", f"expected code {where} (anchor begins {first!r})"
    for find, new in patch.hunks:
        text = text.replace(find, new, 1)
    return "needed", text


def status(env: Env, patches: list[Patch], opted: frozenset[str] = frozenset()) -> list[dict]:
    """Each patch's row; an opt-in patch whose feature is not in OPTED is "opt-in" unless its code is in the file
    (then "applied", saying that an apply without the feature takes it out)."""
    rows = []
    for patch in patches:
        row = {"id": patch.id, "package": patch.package, "file": patch.file, "summary": patch.summary}
        installed = env.packages.get(patch.package)
        if not installed:
            rows.append({**row, "version": None, "status": "not-applicable", "detail": "not installed"})
            continue
        root = env.inside(installed["root"], f"{patch.package}'s install")
        version, path = installed["version"], confined(root, patch.file, f"patch {patch.id}: file")
        row.update(version=version, path=str(path))
        if patch.upstream and _in(version, patch.upstream):
            rows.append({**row, "status": "upstream", "detail": f"{patch.package} {version} has it "
                         f"(fixed in {patch.provenance['fixed_in']})"})
        elif not patch.needs(version):
            rows.append({**row, "status": "not-applicable", "detail": f"{version} is outside {patch.needed}"})
        elif not path.is_file():
            rows.append({**row, "status": "drifted", "detail": f"{patch.file} is not in {patch.package} {version}"})
        else:
            state, text = _patched(read_bytes(path, "patch target").decode(), patch)
            detail = text if state == "drifted" else ""
            if not patch.wanted(opted):
                state, detail = (state, f"opt-in {patch.opt_in}, not asked for: an apply without it takes it out") \
                    if state == "applied" else ("opt-in", f"applied where opt-in {patch.opt_in} is asked for")
            rows.append({**row, "status": state, "detail": detail})
    return rows


def refuse_unknown_versions(env: Env, patches: list[Patch], opted: frozenset[str] = frozenset()) -> None:
    """A package version no patch knows about (of those that apply: an opt-in one where OPTED asks for it) is
    refused: its code was never read."""
    patches = [p for p in patches if p.wanted(opted)]
    for package in sorted({p.package for p in patches}):
        installed = env.packages.get(package)
        mine = [p for p in patches if p.package == package]
        if installed and not any(p.knows(installed["version"]) for p in mine):
            ranges = sorted({r for p in mine for r in (p.needed, p.upstream) if r})
            raise RigError(f"{package} {installed['version']} is outside every patch's range "
                           f"({'; '.join(ranges)}): no patch was checked against it. Read its sources "
                           "and extend the patch set (or give --patches), or pass --force to act on the known "
                           "patches anyway")


# ------------------------------------------------------------------ apply / revert


def _verify(env: Env, sources: dict[str, str], checks: list[dict]) -> dict:
    done = run([env.python, "-I", "-c", script("sglang_bare", "patch_checks")], "checking the patched modules",
               cwd="/", ok=None, input=dump_json({"sources": sources, "checks": checks}, "the patch checks"),
               timeout=600)  # it imports sglang's patched modules (torch with them)
    if done.returncode != 0 or not done.stdout.strip():
        return {"checks": done.stderr.strip()[-2000:] or f"exit {done.returncode}"}
    try:
        return last_json(done.stdout, "checking the patched modules")
    except RigError as exc:  # the environment's startup printed over the answer: the check did not run
        return {"checks": str(exc)}


def _diff(path: str, old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}"))


def asked(patches: list[Patch], opted: Iterable[str]) -> frozenset[str]:
    """The opt-in features OPTED, each one some patch of the set turns on (else a RigError naming those it knows)."""
    opted = sorted(opted)
    known = sorted({p.opt_in for p in patches if p.opt_in})
    if unknown := [name for name in opted if name not in known]:
        raise RigError(f"no patch of the set is opt-in {', '.join(repr(name[:60]) for name in unknown)}; the opt-in "
                       f"features are: {', '.join(known) or 'none'}. Fix the stack's patches.opt_in (or --opt-in)")
    return frozenset(opted)


def apply(env: Env, patches: list[Patch], check: bool = False, force: bool = False,
          opted: frozenset[str] = frozenset()) -> dict:
    """Apply what is needed: every patch in range, an opt-in one only where OPTED asks for its feature (one applied
    before but no longer asked for is taken out: the files go back to their originals, then the rest is applied)."""
    if not force:
        refuse_unknown_versions(env, patches, opted)
    rows = status(env, patches, opted)
    drifted = [r for r in rows if r["status"] == "drifted"]
    if drifted and not force:
        raise RigError("; ".join(f"{r['id']}: {r['package']} {r['version']} {r['file']}: {r['detail']}" for r in drifted)
                       + ". Nothing was changed. Re-read the upstream code and update the patch (or its "
                       "version range), or pass --force to apply the others")
    # an opt-in patch no longer asked for, which rig applied (its record names it: code that was there before rig,
    # a build that carries it, is not rig's to take out)
    ours = {i for entry in env.read_state()["files"].values() for i in entry["patches"]}
    wanted = {p.id for p in patches if p.wanted(opted)}
    dropped = [r for r in rows if r["status"] == "applied" and r["id"] in ours and r["id"] not in wanted]
    if dropped:
        names = ", ".join(r["id"] for r in dropped)
        if check:
            return {"changed": True, "patches": rows, "diff": "",
                    "msg": f"would take out {names} (opt-in, not asked for): its files go back to their originals, "
                           "then the other patches are applied again\n" + table(rows)}
        revert(env, force=force)
        try:
            again = apply(env, patches, check, force, opted)
        except RigError as exc:
            raise RigError(f"took out {names} (opt-in, not asked for): every file rig patched is back to its "
                           f"original; applying the others again failed: {exc}") from None
        return {**again, "changed": True, "msg": f"took out {names} (opt-in, not asked for)\n" + again["msg"]}
    by_id = {p.id: p for p in patches}
    todo: dict[Path, list[Patch]] = {}
    for row in rows:
        if row["status"] == "needed":
            todo.setdefault(Path(row["path"]), []).append(by_id[row["id"]])
    originals, results, diffs = {}, {}, []
    for path, file_patches in todo.items():
        originals[path] = read_bytes(path, "patch target")
        text = originals[path].decode()
        for patch in file_patches:
            outcome, text = _patched(text, patch)
            if outcome == "drifted":  # an earlier patch of this run took the code it anchors on
                raise RigError(f"{patch.id} and {', '.join(p.id for p in file_patches if p is not patch)} change the "
                               f"same code in {patch.file} ({text}): they cannot both be applied. Nothing was changed")
        results[path] = text
        diffs.append(_diff(file_patches[0].file, originals[path].decode(), text))
    applied_ids = [r["id"] for r in rows if r["status"] in ("needed", "applied")]
    result: dict[str, Any] = {"changed": bool(todo), "patches": rows, "diff": "".join(diffs),
                              "msg": _summary(rows, "would apply" if check else "applied")}
    if check or not todo:
        return result
    errors = _verify(env, {str(p): t for p, t in results.items()}, [])
    if errors:
        raise RigError(f"a patched module does not compile, nothing was changed: {errors}")
    state = env.read_state()
    before = read_bytes(env.state_path, "patch state") if env.state_path.exists() else None
    backups, new_backups = env.inside(env.prefix / BACKUPS, "the patch backups"), []
    backups.mkdir(exist_ok=True)
    for path, text in results.items():
        entry = state["files"].get(str(path))
        if not entry or entry.get("patched_sha256") != sha256_data(originals[path]):
            entry = {"original_sha256": sha256_data(originals[path]), "patches": []}
            new_backups.append(backups / entry["original_sha256"])
            atomic_write(new_backups[-1], originals[path])
        entry["patches"] = sorted(set(entry["patches"]) | {p.id for p in todo[path]})
        entry["patched_sha256"] = sha256_data(text.encode())
        state["files"][str(path)] = entry
    # the state goes first: a run cut short still leaves what revert needs
    atomic_write(env.state_path, (dump_json(state, str(env.state_path), indent=2, sort_keys=True) + "\n").encode())
    try:
        for path, text in results.items():
            atomic_write(path, text.encode())
        errors = _verify(env, {}, [{"id": r["id"], "file": r["path"], "code": by_id[r["id"]].check}
                                   for r in rows if r["id"] in applied_ids])
        if errors:
            raise RigError("a patch's check failed after apply; the files were put back: "
                           + "; ".join(f"{k}: {v}" for k, v in errors.items()))
    except BaseException:
        for path in results:
            atomic_write(path, originals[path])
        if before is None:
            env.state_path.unlink()
        else:
            atomic_write(env.state_path, before)
        for backup in new_backups:
            backup.unlink(missing_ok=True)
        if not any(backups.iterdir()):
            backups.rmdir()
        raise
    result["patches"] = status(env, patches, opted)
    result["msg"] = _summary(rows, "applied").splitlines()[0] + "\n" + table(result["patches"])
    return result


def revert(env: Env, check: bool = False, force: bool = False) -> dict:
    state = env.read_state()
    restored, problems = [], []
    for name, entry in sorted(state["files"].items()):
        path = Path(name)
        current = sha256_data(read_bytes(path, "patched file")) if path.is_file() else None
        if current == entry["original_sha256"]:
            continue  # already the original (e.g. the package was reinstalled)
        if current != entry["patched_sha256"] and not force:
            problems.append(f"{path} changed since rig patched it (sha256 {current}); "
                            "reinstall the package, or pass --force to restore rig's backup over it")
            continue
        backup = env.inside(env.prefix / BACKUPS / entry["original_sha256"], "a patch backup")
        if not backup.is_file() or sha256_data(read_bytes(backup, "backup")) != entry["original_sha256"]:
            problems.append(f"the backup of {path} is missing or altered; reinstall the package to restore it")
            continue
        restored.append((path, backup))
    if problems:
        raise RigError("; ".join(problems) + ". Nothing was reverted")
    result = {"changed": bool(restored), "files": [str(p) for p, _ in restored],
              "msg": f"{'would restore' if check else 'restored'} {len(restored)} file(s)"
                     + "".join(f"\n  {p}" for p, _ in restored)}
    if check or not state["files"]:
        return result
    backups = env.inside(env.prefix / BACKUPS, "the patch backups")
    for path, backup in restored:
        atomic_write(path, read_bytes(backup, "backup"))
    for entry in state["files"].values():
        (backups / entry["original_sha256"]).unlink(missing_ok=True)
    env.state_path.unlink()
    if backups.is_dir() and not any(backups.iterdir()):
        backups.rmdir()
    return result


def _summary(rows: list[dict], verb: str) -> str:
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
