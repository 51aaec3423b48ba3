"""What an apply or a revert would change, decided whole before anything is written.

A plan reads every file it touches and settles each one's new bytes and the record (.rig-patches.json) that
will describe them. Whatever would stop it is found here, before anything is written, in one error that names
every problem: a package version no patch knows, drifted code, two patches on the same code, a file changed
since rig patched it, a backup missing. rig.patches.transaction writes a plan; --check only shows it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rig.core import RigError
from rig.core.documents import read_text
from rig.core.fs import read_bytes, sha256_data
from rig.patches.env import Env
from rig.patches.hunks import patched, unified_diff
from rig.patches.patchset import Patch
from rig.patches.report import status


@dataclass(frozen=True)
class Change:
    path: Path
    name: str              # the file as the patch set names it (the diff's name)
    before: bytes | None   # None: not there now
    after: bytes


@dataclass
class Plan:
    rows: list[dict]       # each patch's status now
    changes: list[Change]
    state: dict            # the record once done
    interim: dict          # the record while the files are written: names every file that may be patched then
    keep: dict[str, bytes] = field(default_factory=dict)  # originals to back up, by sha256
    drop: set[str] = field(default_factory=set)           # backups no record names once done
    backups: Path | None = None                           # where the originals are kept
    applying: list[str] = field(default_factory=list)     # the patches this plan applies
    taken_out: list[str] = field(default_factory=list)    # opt-in patches no longer asked for
    checks: list[dict] = field(default_factory=list)      # every applied patch's check, run once written

    @property
    def changed(self) -> bool:
        return bool(self.changes)

    @property
    def idle(self) -> bool:
        """Nothing to write: no file, no record, no backup."""
        return not self.changes and not self.drop and self.state == self.interim

    def diff(self) -> str:
        """The unified diff of every change (for a reader: bytes that are not UTF-8 show as U+FFFD)."""
        return "".join(unified_diff(c.name, (c.before or b"").decode("utf-8", "replace"),
                                    c.after.decode("utf-8", "replace")) for c in self.changes)


# ------------------------------------------------------------------ apply

def for_apply(env: Env, patches: list[Patch], opted: frozenset[str], force: bool) -> Plan:
    """Every wanted patch in range applied, and the opt-in ones no longer asked for taken out: their files go back
    to the originals and the wanted patches of those files go on again, all in the one plan."""
    if not force:
        refuse_unknown_versions(env, patches, opted)
    rows = status(env, patches, opted)
    record = env.read_state()
    # the opt-in patches to take out: their files as they will be once restored, and every patch judged on that
    taken_out = _taken_out(rows, record, patches, opted)
    restored = _restorable(env, _files_with(record, taken_out), force, "Nothing was changed")
    view = {name: _text(original, name) for name, (_, original) in restored.items()}
    judged = status(env, patches, opted, view) if view else rows
    _refuse_drift(judged, force)
    # each file's new text: its needed patches applied in the set's order (a restored file: at least its original)
    by_id = {p.id: p for p in patches}
    todo = _needed(judged, by_id)
    texts = {**view, **{name: _applied(_base(name, view), file_patches) for name, file_patches in todo.items()}}
    current = {name: restored[name][0] if name in restored else read_bytes(Path(name), "patch target")
               for name in texts}
    # the record once done, and while the files are written (the restored ones still named until they are)
    state, keep = _record(record, restored, todo, current, texts)
    interim = {"files": {**{n: record["files"][n] for n in restored}, **state["files"]}}
    return Plan(rows=rows, changes=_changes(rows, current, texts), state=state, interim=interim, keep=keep,
                drop=_unnamed(record, state), backups=env.backups() if keep or restored else None,
                applying=[p.id for file_patches in todo.values() for p in file_patches], taken_out=taken_out,
                checks=[{"id": r["id"], "file": r["path"], "code": by_id[r["id"]].check}
                        for r in status(env, patches, opted, texts) if r["status"] == "applied"])


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


def _refuse_drift(rows: list[dict], force: bool) -> None:
    drifted = [r for r in rows if r["status"] == "drifted"]
    if drifted and not force:
        raise RigError("; ".join(f"{r['id']}: {r['package']} {r['version']} {r['file']}: {r['detail']}" for r in drifted)
                       + ". Nothing was changed. Re-read the upstream code and update the patch (or its "
                       "version range), or pass --force to apply the others")


def _taken_out(rows: list[dict], record: dict, patches: list[Patch], opted: frozenset[str]) -> list[str]:
    """The opt-in patches in the files that are no longer asked for, and that rig applied (its record names them:
    code that was there before rig, a build that carries it, is not rig's to take out)."""
    ours = {i for entry in record["files"].values() for i in entry["patches"]}
    wanted = {p.id for p in patches if p.wanted(opted)}
    return [r["id"] for r in rows if r["status"] == "applied" and r["id"] in ours and r["id"] not in wanted]


def _files_with(record: dict, ids: list[str]) -> dict:
    return {name: entry for name, entry in record["files"].items() if set(entry["patches"]) & set(ids)}


def _needed(rows: list[dict], by_id: dict[str, Patch]) -> dict[str, list[Patch]]:
    """File -> the patches it needs, in the set's order."""
    todo: dict[str, list[Patch]] = {}
    for row in rows:
        if row["status"] == "needed":
            todo.setdefault(row["path"], []).append(by_id[row["id"]])
    return todo


def _base(name: str, view: dict[str, str]) -> str:
    return view[name] if name in view else read_text(Path(name), "patch target")


def _applied(text: str, file_patches: list[Patch]) -> str:
    """TEXT with each patch applied in turn; one that no longer finds its code after an earlier one is a conflict."""
    for patch in file_patches:
        outcome, text = patched(text, patch)
        if outcome == "drifted":
            others = ", ".join(p.id for p in file_patches if p is not patch)
            raise RigError(f"{patch.id} and {others} change the same code in {patch.file} ({text}): they cannot "
                           "both be applied. Nothing was changed")
    return text


def _changes(rows: list[dict], current: dict[str, bytes | None], texts: dict[str, str]) -> list[Change]:
    """The files whose bytes the plan changes, each under the name its patches give it."""
    names = {r["path"]: r["file"] for r in rows if r.get("path")}
    return [Change(Path(name), names.get(name, name), current[name], text.encode())
            for name, text in texts.items() if current[name] != text.encode()]


def _record(record: dict, restored: dict, todo: dict[str, list[Patch]], current: dict,
            texts: dict[str, str]) -> tuple[dict, dict[str, bytes]]:
    """The record once done, and the originals it names that are not backed up yet. A file rig patched before
    keeps its original; one that is not what rig left (a reinstall) has a new original: what is there now."""
    files = {name: entry for name, entry in record["files"].items() if name not in restored}
    keep: dict[str, bytes] = {}
    for name, file_patches in todo.items():
        old, ids = record["files"].get(name), {p.id for p in file_patches}
        if name in restored:
            entry = {"original_sha256": old["original_sha256"], "patches": sorted(ids)}
        elif old and old["patched_sha256"] == sha256_data(current[name]):
            entry = {"original_sha256": old["original_sha256"], "patches": sorted(set(old["patches"]) | ids)}
        else:
            entry = {"original_sha256": sha256_data(current[name]), "patches": sorted(ids)}
            keep[entry["original_sha256"]] = current[name]
        files[name] = {**entry, "patched_sha256": sha256_data(texts[name].encode())}
    return {"files": files}, keep


def _unnamed(before: dict, after: dict) -> set[str]:
    """The backups BEFORE's record names and AFTER's does not."""
    return ({e["original_sha256"] for e in before["files"].values()}
            - {e["original_sha256"] for e in after["files"].values()})


# ------------------------------------------------------------------ revert

def for_revert(env: Env, force: bool) -> Plan:
    """Every file rig patched back to its original, the record and the backups gone."""
    record = env.read_state()
    restored = _restorable(env, record["files"], force, "Nothing was reverted")
    changes = [Change(Path(name), name, current, original) for name, (current, original) in restored.items()
               if current != original]
    return Plan(rows=[], changes=changes, state={"files": {}}, interim=record, drop=_unnamed(record, {"files": {}}),
                backups=env.backups() if record["files"] else None)


def _restorable(env: Env, files: dict, force: bool, tail: str) -> dict[str, tuple[bytes | None, bytes]]:
    """File -> (its bytes now, its original) for each recorded file of FILES; refused, naming every file that
    cannot go back, when one changed since rig patched it (unless FORCE) or its backup is missing or altered."""
    found: dict[str, tuple[bytes | None, bytes]] = {}
    problems = []
    for name, entry in sorted(files.items()):
        path = Path(name)
        current = read_bytes(path, "patched file") if path.is_file() else None
        now = sha256_data(current) if current is not None else None
        if current is not None and now == entry["original_sha256"]:
            found[name] = (current, current)  # already the original (e.g. the package was reinstalled)
            continue
        if now != entry["patched_sha256"] and not force:
            problems.append(f"{path} changed since rig patched it (sha256 {now or 'none: the file is gone'}); "
                            "reinstall the package, or pass --force to restore rig's backup over it")
            continue
        backup = env.backups() / entry["original_sha256"]  # a sha256 (the record's schema): one name, no path
        original = read_bytes(backup, "backup") if backup.is_file() else None
        if original is None or sha256_data(original) != entry["original_sha256"]:
            problems.append(f"the backup of {path} is missing or altered; reinstall the package to restore it")
            continue
        found[name] = (current, original)
    if problems:
        raise RigError("; ".join(problems) + f". {tail}")
    return found


def _text(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RigError(f"{name} is not UTF-8 text (byte {exc.start}); rig patches only text: reinstall the package "
                       "that owns it") from exc
