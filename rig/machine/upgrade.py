"""A day-two upgrade of one serving host: the lock that keeps two rollouts apart, the plan (what the upgrade
would change, and whether it may), and the record of what the host ran before, which a rollback restores: the
driver's packages by their versions, the toolkit and the stack by the stack file that made them, which a rollback
must name (-e rig_stack) and which is checked against the record.

The playbook (playbooks/upgrade.yml) asks these through `rig upgrade ...`; it judges nothing itself.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from rig.core import RigError
from rig.core.cuda_releases import RELEASES
from rig.core.documents import dump_json
from rig.core.fs import MissingFile, atomic_write, open_plain
from rig.core.schema import Field, sha256, validate
from rig.machine import driver, gpu_health

STATE_DIR = "/var/lib/rig/upgrade"
LOCK = "rollout.lock"
RECORD = "previous.json"
OWNER_LIMIT = 128  # characters: a playbook draws 16; the lock that holds one stays far under the reader's 4 KiB


def _owner(value: str) -> str | None:
    rule = f"a rollout lock needs its rollout's id: 1 to {OWNER_LIMIT} printable ASCII characters"
    if not value.strip():
        return f"is blank; {rule}"
    if len(value) > OWNER_LIMIT:
        return f"is {len(value)} characters long; {rule}"
    if not all(" " <= c <= "~" for c in value):
        return f"{value[:40]!r} holds a character that is not printable ASCII; {rule}"
    return None


# the one rule for a rollout's id: what lock() takes is what _holder() reads back
OWNER = Field(str, required=True, check=_owner)
LOCK_SPEC = Field(dict, open=True, fields={"owner": OWNER, "since": Field(required=True)})
ROLES = ("driver", "fabricmanager", "container_toolkit")
PACKAGE = Field(dict, required=True, fields={
    "package": Field(str, required=True, check=lambda v: None if driver.PACKAGE_NAME.fullmatch(v) else
                     "is not a Debian package name"),
    "version": Field(str, required=True, check=lambda v: None if driver.PACKAGE_VERSION.fullmatch(v) else
                     "is not a Debian package version")})
STACK = {  # what the stack made: the release PREFIX/cuda points at and the venv's lock; "": none, or not rig's
    "toolkit": Field(str, default="", check=lambda v: None if not v or v in RELEASES else "is not a CUDA release"),
    "lock_hash": Field(str, default="", check=lambda v: v and sha256(v))}
RECORD_SPEC = Field(dict, open=True, fields={**{role: PACKAGE for role in ROLES}, **STACK,
                                             "recorded": Field(required=True),
                                             # false until the upgrade it was made for served again
                                             "finished": Field(bool, default=True)})


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _holder(path: Path) -> dict | None:
    """The lock's holder; never read through a link, and anything but a lock is named with the fix."""
    from rig.core.documents import parse_json

    try:
        fd = open_plain(path, os.O_RDONLY, "the rollout lock", follow=False)
    except MissingFile:
        return None
    except RigError as exc:
        raise RigError(f"{exc}; if no rollout runs, remove it") from None
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(4097)
    try:
        if len(data) > 4096:
            raise RigError(f"{path} is larger than a rollout lock")
        return parse_json(data.decode("utf-8", "replace"), str(path), LOCK_SPEC)
    except RigError as exc:
        raise RigError(f"{exc}; if no rollout runs, remove {path}") from None


def _owner_given(owner: str) -> None:
    """OWNER checked by the rule the lock's reader applies, before anything is written: a lock no later run
    could read would keep every rollout out."""
    validate(owner, OWNER, "--owner", "the rollout's id")


def lock(state_dir: str, owner: str, check: bool = False) -> dict:
    """Take the host's rollout lock for OWNER (one rollout's id); another rollout holding it is an error that
    names it. Taking a lock OWNER already holds changes nothing."""
    _owner_given(owner)
    path = Path(state_dir) / LOCK
    holder = _holder(path)
    if not holder and not check:
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_EXCL: of two rollouts starting at once, one takes it; never through a link left there
        fd = open_plain(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, "the rollout lock", follow=False)
        with os.fdopen(fd, "w") as out:
            out.write(dump_json({"owner": owner, "since": _now()}, "the rollout lock"))
        return {"changed": True, "path": str(path), "msg": f"took {path}"}
    if holder and holder["owner"] != owner:
        raise RigError(f"another rollout ({holder['owner']}, since {holder['since']}) holds {path} on this host: "
                       "wait for it to finish, or remove the file if that rollout is gone")
    return {"changed": not holder, "path": str(path), "msg": f"{'holds' if holder else 'would take'} {path}"}


def unlock(state_dir: str, owner: str, check: bool = False) -> dict:
    """Give the lock back if OWNER holds it; another rollout's lock is left where it is."""
    _owner_given(owner)
    path = Path(state_dir) / LOCK
    holder = _holder(path)
    mine = holder is not None and holder["owner"] == owner
    if mine and not check:
        path.unlink()
    return {"changed": mine, "path": str(path),
            "msg": f"{'gave back' if mine else 'does not hold'} {path}"}


def _package_change(role: str, package: str, target: str) -> tuple[dict, list[str]]:
    have = driver.installed(package)
    wanted = target or have["version"]
    change = have["version"] != wanted or not have["version"]
    said = [f"{role}: {package} {have['version'] or 'not installed'} -> {wanted or 'the newest'}"] if change else []
    return {**have, "package": package, "target": wanted, "change": change}, said


def plan(packages: dict[str, tuple[str, str]], module_path: str, branch: str, flavour: str, cuda: str | None,
         archs: list[str]) -> dict:
    """What the driver upgrade would change on this host (its fabric manager's with it), and the guard rails
    (a refused driver is an error naming why). PACKAGES: role -> (package, target version; "" for whatever is
    installed), the driver's first. steady: the loaded module is the installed driver's, so what is installed
    now is a state to come back to."""
    found: dict[str, dict] = {}
    changes: list[str] = []
    for role, (package, target) in packages.items():
        # the fabric manager goes where the driver goes: an unpinned one to the driver's installed version
        target = target or (found["driver"]["target"] if role == "fabricmanager" else "")
        found[role], said = _package_change(role, package, target)
        changes += said
    wanted = found["driver"]
    refused = driver.refusals(branch, wanted["target"], flavour, cuda, archs)
    if refused:
        raise RigError("refusing the driver upgrade: " + "; ".join(refused))
    module = gpu_health.module_version(module_path)
    loaded = bool(wanted["upstream"]) and module == wanted["upstream"]
    steady = loaded and all(found[role]["version"] == wanted["version"] for role in found if role == "fabricmanager")
    if not wanted["change"] and not loaded:
        changes.append(f"driver: the loaded module is {module or 'none'}, the installed driver "
                       f"{wanted['upstream']}: the host needs its reboot")
    return {**found, "module_version": module, "steady": steady, "changes": changes,
            "changed": bool(changes),
            "msg": "\n".join(changes) or f"nothing to upgrade: driver {wanted['version']} installed and loaded"}


def _stack_now(cuda_prefix: str | None, venv: str | None) -> dict:
    from rig.cuda import toolkit
    from rig.python import venv as venvs

    marker = venvs.read_marker(venv) if venv else None
    return {"toolkit": toolkit.default_release(cuda_prefix) if cuda_prefix else "",
            "lock_hash": marker["lock_hash"] if marker else ""}


def record(state_dir: str, packages: dict[str, str], cuda_prefix: str | None = None, venv: str | None = None,
           check: bool = False) -> dict:
    """Write what the host runs now (ROLES -> each package's installed version; the toolkit PREFIX/cuda points
    at and VENV's lock) as the state a rollback restores."""
    if sorted(packages) != sorted(ROLES):
        raise RigError(f"an upgrade record names the packages of {', '.join(ROLES)}")
    path = Path(state_dir) / RECORD
    kept = _read_record(path)
    if kept and not kept["finished"]:  # a run again after a failed one: the state before both is the one to keep
        return {"changed": False, "path": str(path), **{k: kept[k] for k in (*ROLES, *STACK)},
                "msg": f"kept {path}: the upgrade it was made for ({kept['recorded']}) did not finish, and what "
                       f"the host ran before it is what a rollback puts back ({_said(kept)})"}
    now = {role: {"package": package, "version": driver.installed(package)["version"]}
           for role, package in packages.items()}
    now.update(_stack_now(cuda_prefix, venv))
    text = dump_json({**now, "recorded": _now(), "finished": False}, "the upgrade record", indent=1) + "\n"
    if not check:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, text)
    return {"changed": True, "path": str(path), **now,
            "msg": f"{'would record' if check else 'recorded'} {_said(now)} in {path}"}


def _said(state: dict) -> str:
    said = [f"{state[r]['package']} {state[r]['version'] or 'not installed'}" for r in ROLES if r in state]
    said += [f"CUDA {state['toolkit']} the default"] if state.get("toolkit") else []
    said += [f"the venv at lock {state['lock_hash'][:12]}"] if state.get("lock_hash") else []
    return ", ".join(said)


def _read_record(path: Path) -> dict | None:
    from rig.core.documents import load_json

    try:
        return load_json(path, "upgrade record", RECORD_SPEC)
    except MissingFile:
        return None
    except RigError as exc:
        raise RigError(f"{exc}; it is not rig's upgrade record: remove it (a rollback has nothing to go back to "
                       "then)") from None


def finish(state_dir: str, check: bool = False, reopen: bool = False) -> dict:
    """Mark the record finished: the host serves again after the upgrade (or the rollback) it was made for, so
    the next upgrade records what the host runs then. REOPEN: mark it unfinished, as a rollback starts (one
    that fails keeps the record, as a failed upgrade does)."""
    path = Path(state_dir) / RECORD
    kept = _read_record(path)
    if not kept or kept["finished"] != reopen:
        return {"changed": False, "path": str(path),
                "msg": f"no {'finished' if reopen else 'unfinished'} upgrade recorded in {path}"}
    if not check:
        atomic_write(path, dump_json({**kept, "finished": not reopen}, "the upgrade record", indent=1) + "\n")
    return {"changed": True, "path": str(path), "msg": f"{'would mark' if check else 'marked'} {path} "
            f"{'unfinished' if reopen else 'finished'} (recorded {kept['recorded']})"}


def previous(state_dir: str, toolkit: str | None = None, lock_hash: str | None = None) -> dict:
    """The state recorded before the last upgrade: the versions a rollback installs. TOOLKIT (the release the
    rollback's stack makes the default) and LOCK_HASH (its venv's lock), where given, must be what the record
    holds: the toolkit and the venv come back by the stack file that made them."""
    for given, key in ((toolkit, "toolkit"), (lock_hash, "lock_hash")):
        said = None if given is None else STACK[key].check(given) if given else "is empty"  # type: ignore[misc]
        if said:
            raise RigError(f"--{key.replace('_', '-')} {given!r}: {said}")
    path = Path(state_dir) / RECORD
    found = _read_record(path)
    if found is None:
        raise RigError(f"no upgrade was recorded on this host ({path}): there is nothing to roll back to")
    if not found["driver"]["version"]:
        raise RigError(f"{path} records no installed driver: there is nothing to roll back to")
    for key, given, what in (("toolkit", toolkit, "makes CUDA {} the default"), ("lock_hash", lock_hash,
                                                                                 "installs lock {}")):
        if found[key] and given is not None and given != found[key]:
            raise RigError(f"before its last upgrade the host ran {_said({key: found[key]})} ({path}); the stack "
                           f"given {what.format(given[:12] if key == 'lock_hash' else given)}: roll back with "
                           "the stack file the host ran then (-e rig_stack=...)")
    return {**found, "path": str(path), "msg": f"before the last upgrade: {_said(found)}"}
