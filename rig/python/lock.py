"""`rig lock`: resolve a stack into exact, hashed artifacts, or refuse and say why.

pip does the resolving (`pip install --dry-run --report` for the stack's Python
and platform); rig adds what pip cannot know: that the packages' own pins agree
with the stack, and that torch's CUDA is the stack's CUDA. Nothing is written
unless every check passes; a stack that cannot be fully resolved here (an index
that does not answer) gets a partial lock that says exactly what is missing.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from rig.core import RigError, progress
from rig.core.cuda_releases import major
from rig.core.documents import dump_json
from rig.core.fs import atomic_write, sha256_data
from rig.core.schema import Field, distribution, sha256, validate
from rig.core.wheelfile import read_requirement
from rig.python.pip import PipError, index_args, platform_tags, resolve, target_args
from rig.stack.spec import RUNTIME_KEYS

LOCK_VERSION = 1
UNREACHABLE = ("Could not fetch URL", "Failed to establish a new connection", "Connection refused",
               "Name or service not known", "Max retries exceeded", "Temporary failure in name resolution")


def expand(url: str, where: str) -> str:
    """${VAR} in an index URL comes from the environment; unset is an error naming it."""
    def sub(match: re.Match) -> str:
        if match.group(1) not in os.environ:
            raise RigError(f"{where} refers to ${{{match.group(1)}}}, which is not set; set it to the "
                           "URL of a PEP 503 index (or a local mirror) that serves the package")
        return os.environ[match.group(1)]
    return re.sub(r"\$\{(\w+)\}", sub, url)


def pinned(stack: dict) -> list[dict]:
    """The stack's top-level packages, in install order, with where each comes from."""
    entries = []
    torch = stack["torch"]
    if torch.get("version"):
        entries.append({"key": "torch", "name": "torch", "version": torch["version"],
                        "index_url": torch["index_url"], "extras": []})
    for key in ("kernel", "flashinfer", "sglang"):
        spec = stack[key]
        if spec.get("version"):
            entries.append({"key": key, "name": spec["package"], "version": spec["version"],
                            "index_url": "", "extras": spec["extras"],
                            "source": spec["source"] if any(spec["source"].values()) else None})
    flashinfer = stack["flashinfer"]
    if flashinfer.get("version") and flashinfer["cubin"]:  # prebuilt kernels, versioned with flashinfer
        entries.append({"key": "flashinfer", "name": "flashinfer-cubin", "version": flashinfer["version"],
                        "index_url": "", "extras": []})
    if not entries and not stack["extra_packages"]:
        raise RigError(f"stack {stack['name']!r} pins no packages (torch, sglang, kernel, flashinfer, "
                       "extra_packages): there is nothing to lock")
    return entries


def requirement(entry: dict) -> str:
    extras = f"[{','.join(entry['extras'])}]" if entry["extras"] else ""
    return f"{entry['name']}{extras}=={entry['version']}"


def _target_env(stack: dict) -> dict:
    """Marker environment of the target, for evaluating Requires-Dist."""
    return {"python_version": stack["python"], "python_full_version": f"{stack['python']}.0",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "os_name": "posix"}


class Unreachable(RigError):
    """An index that does not answer: what it serves is left out of a partial lock."""


def _explain(exc: PipError, entry: dict, stack: dict, source: str) -> RigError:
    where = entry["index_url"] or "the default index"
    if any(marker in exc.stderr for marker in UNREACHABLE):
        return Unreachable(f"{source}: {entry['key']}: the index {where} does not answer, so "
                        f"{requirement(entry)} cannot be resolved here ({exc.stderr.splitlines()[-1]})")
    if "from versions:" in exc.stderr or "No matching distribution" in exc.stderr:
        return RigError(f"{source}: {entry['key']}: no wheel of {requirement(entry)} on {where} for Python "
                        f"{stack['python']} on {platform_tags(glibc=stack['glibc'])[0]} (or older glibc); "
                        "change python/glibc in the stack, or pick a version that has one")
    return RigError(f"{source}: {entry['key']}: {exc}")


def pin_conflicts(items: dict[str, dict], entries: list[dict], stack: dict, source: str) -> list[str]:
    """Every place a package's own Requires-Dist does not admit a version the stack pins."""
    found = []
    stack_pins = {canonicalize_name(e["name"]): e for e in entries}
    kernel_names = {"sgl-kernel", "sglang-kernel"}
    env = _target_env(stack)
    for entry in entries:
        meta = items[entry["name"]]["metadata"]
        for text in meta.get("requires_dist", []):
            req = read_requirement(text, f"{entry['name']} {entry['version']}")
            if req.marker and not req.marker.evaluate({**env, "extra": ""}):
                if not any(req.marker.evaluate({**env, "extra": x}) for x in entry["extras"]):
                    continue
            name = canonicalize_name(req.name)
            other = stack_pins.get(name)
            if other and not req.specifier.contains(other["version"], prereleases=True):
                found.append(f"{source}: {entry['name']} {entry['version']} requires {req.name}{req.specifier}"
                             f" but the stack pins {other['name']} {other['version']} ({other['key']}.version);"
                             " change one of them")
            if name in kernel_names and stack["kernel"].get("version") and \
                    name != canonicalize_name(stack["kernel"]["package"]):
                found.append(f"{source}: {entry['name']} {entry['version']} requires {req}, but the stack's "
                             f"kernel.package is {stack['kernel']['package']}; set kernel.package: {req.name}")
    return found


def torch_cuda_major(meta: dict) -> int | None:
    """The CUDA major a torch wheel is built for, from its version label or its CUDA dependencies."""
    try:
        local = Version(str(meta["version"])).local or ""
    except (KeyError, InvalidVersion) as exc:
        raise RigError(f"the torch wheel's metadata has no PEP 440 version ({meta.get('version')!r}); "
                       "that wheel is broken: pin another torch") from exc
    if local.startswith("cu"):
        return int(local[2:-1]) if len(local) == 5 else int(local[2:4])
    for text in meta.get("requires_dist", []):
        req = read_requirement(text, "torch")
        suffix = re.search(r"-cu(\d+)$", req.name)
        if suffix and req.name.startswith("nvidia-"):
            return int(suffix.group(1))
        if req.name in ("cuda-toolkit", "nvidia-cuda-runtime") and req.specifier:
            return int(str(next(iter(req.specifier)).version).split(".")[0])
    return None  # a CPU build


def cuda_conflicts(items: dict, stack: dict, source: str) -> list[str]:
    """torch, pinned or pulled in by another package, must be built for the stack's CUDA major."""
    if "torch" not in items:
        return []
    meta = items["torch"]["metadata"]
    found = torch_cuda_major(meta)
    wanted = major(stack["cuda"]["version"])
    if found == wanted:
        return []
    built = f"CUDA {found}" if found else "no CUDA (a CPU build)"
    return [f"{source}: torch {meta['version']} is built for {built}, but the stack's CUDA toolkit "
            f"is {stack['cuda']['version']} (cuda.version); pick a torch build for CUDA {wanted} "
            "(torch.version / torch.index_url) or change the toolkit"]


def refuse(problems: list[str]) -> None:
    """All of a stack's conflicts in one answer: one round trip, not one per conflict."""
    if len(problems) == 1:
        raise RigError(problems[0])
    if problems:
        raise RigError(f"{len(problems)} conflicts; fix them all, then lock again:\n" +
                       "\n".join(f"  - {p}" for p in problems))


def _artifact(item: dict, index_url: str) -> dict:
    info = item["download_info"]
    return {"name": canonicalize_name(item["metadata"]["name"]), "version": item["metadata"]["version"],
            "filename": info["url"].rsplit("/", 1)[-1],
            "sha256": info.get("archive_info", {}).get("hashes", {}).get("sha256")
            or info["archive_info"]["hash"].split("=", 1)[1],
            "index": index_url or "default"}


def pin_check(stack: dict, source: str) -> tuple[dict, list[dict], list[str]]:
    """Each pinned package alone, its metadata only (cheap): (resolved, unresolved, every problem)."""
    entries = pinned(stack)
    target = target_args(stack["python"], "x86_64", stack["glibc"])
    tops, unresolved, problems = {}, [], []
    for entry in entries:  # each pinned package alone first: its own metadata, cheaply
        try:
            url = expand(entry["index_url"], f"{source}: {entry['key']}.index_url")
            tops[entry["name"]] = resolve([requirement(entry)], target, index_args(url), no_deps=True)[0]
        except PipError as exc:
            err = _explain(exc, {**entry, "index_url": url}, stack, source)
            if not isinstance(err, Unreachable):
                problems.append(str(err))
                continue
            unresolved.append({"name": entry["name"], "version": entry["version"],
                               "index": entry["index_url"], "reason": str(err)})
        except RigError as exc:  # an index named through a variable this machine does not set
            unresolved.append({"name": entry["name"], "version": entry["version"],
                               "index": entry["index_url"], "reason": str(exc)})
    problems += pin_conflicts(tops, [e for e in entries if e["name"] in tops], stack, source)
    problems += cuda_conflicts(tops, stack, source)
    return tops, unresolved, problems


def build_lock(stack: dict, source: str) -> dict:
    """Resolve STACK for its target; raise RigError naming every problem before anything is written."""
    entries = pinned(stack)
    target = target_args(stack["python"], "x86_64", stack["glibc"])
    tops, unresolved, problems = pin_check(stack, source)
    refuse(problems)

    builds = [e for e in entries if e.get("source")]
    builds += [{"name": x["package"], "version": x["version"], "source": x["source"]} for x in stack["extensions"]]
    if stack["flashinfer"].get("jit_cache"):  # AOT-compiled for the stack's archs by `rig wheels build`
        builds.append({"name": "flashinfer-jit-cache", "version": stack["flashinfer"]["version"],
                       "source": {"archs": stack["archs"]}})
    wheels: list[dict] = []
    if unresolved:  # lock what can be locked: the pinned wheels that resolved, without their closure
        wheels = [_artifact(tops[e["name"]], e["index_url"]) for e in entries
                  if e["name"] in tops and not e.get("source")]
    else:
        extra = tuple(sorted({expand(e["index_url"], e["key"]) for e in entries if e["index_url"]}))
        # pip itself rides along: targets install from the wheelhouse with no pip of their own
        reqs = [requirement(e) for e in entries] + list(stack["extra_packages"]) + ["pip"]
        items = resolve(reqs, target, index_args("", extra))
        refuse(cuda_conflicts({canonicalize_name(i["metadata"]["name"]): i for i in items}, stack, source))
        built_names = {canonicalize_name(e["name"]) for e in builds}
        for item in items:
            art = _artifact(item, _index_of(item, entries))
            if art["name"] not in built_names:  # those come from `rig wheels build`
                wheels.append(art)
    wheels.sort(key=lambda w: w["name"])
    lock = {
        "lock_version": LOCK_VERSION,
        "stack": stack["name"],
        "python": stack["python"],
        "glibc": stack["glibc"],
        "platform": platform_tags(glibc=stack["glibc"])[0],
        "cuda": stack["cuda"]["version"],
        "stack_digest": stack_digest(stack),
        "complete": not unresolved,
        "wheels": wheels,
        "source_builds": [{"name": e["name"], "version": e["version"], **e["source"]} for e in builds],
        "unresolved": unresolved,
    }
    lock["lock_hash"] = lock_hash(lock)
    return lock


def _index_of(item: dict, entries: list[dict]) -> str:
    """The index a top-level package was pinned to, as the stack spells it (${VAR} kept)."""
    name = canonicalize_name(item["metadata"]["name"])
    for e in entries:
        if canonicalize_name(e["name"]) == name:
            return e["index_url"]
    return ""


def lock_hash(lock: dict) -> str:
    body = {k: v for k, v in lock.items() if k != "lock_hash"}
    return sha256_data(dump_json(body, "the lock", sort_keys=True))


def lock_path(stack_path: str | Path, python: str | None = None) -> Path:
    """STACK.lock beside the stack file (beside its target, when the stack is a link); a lock for one of
    the stack's extra Pythons is STACK.pyXY.lock."""
    suffix = f".py{python.replace('.', '')}.lock" if python else ".lock"
    return Path(stack_path).resolve().with_suffix(suffix)


def variants(stack: dict, stack_path: str | Path) -> list[tuple[str, dict, Path]]:
    """(Python, the stack as locked for it, its lock file): the stack's own Python, then each of `pythons`."""
    out = [(stack["python"], stack, lock_path(stack_path))]
    for python in stack["pythons"]:
        if python != stack["python"]:
            out.append((python, {**stack, "python": python}, lock_path(stack_path, python)))
    return out


def stale(stack: dict, stack_path: str | Path) -> tuple[list[dict], list[str]]:
    """(the locks that are current, why each other one is not): missing, unreadable or made from another stack."""
    current, problems = [], []
    for _python, variant, path in variants(stack, stack_path):
        if not path.exists():
            problems.append(f"{path} is missing: run `rig lock --stack {stack_path}`")
            continue
        try:
            lock = read(path)
        except RigError as exc:
            problems.append(str(exc))
            continue
        if lock["stack_digest"] != stack_digest(variant):
            problems.append(f"{path} is stale: the stack changed since it was locked. Run `rig lock --stack {stack_path}`")
        else:
            current.append(lock)
    return current, problems


def check(stack: dict, stack_path: str | Path) -> dict:
    """`rig lock --verify`: every lock of the stack current, else one answer naming each that is not."""
    done, problems = stale(stack, stack_path)
    refuse(problems)
    return {"changed": False, "lock": str(lock_path(stack_path)), "lock_hash": done[0]["lock_hash"],
            "locks": len(done), "msg": f"{len(done)} lock(s) of {stack_path} up to date"}


def lock_all(stack: dict, stack_path: str) -> dict:
    """Lock the stack for its own Python and each of `pythons`: the first lock's summary, every lock's under
    "locks", and "complete" only when all of them are."""
    summaries = []
    for python, variant, path in variants(stack, stack_path):
        progress(f"resolving {stack['name']} for Python {python}")
        result = build_lock(variant, stack_path)
        old = path.read_text() if path.exists() else None
        write(result, path)
        summary = {"changed": old != path.read_text(), "lock": str(path), "lock_hash": result["lock_hash"],
                   "python": python, "complete": result["complete"], "wheels": len(result["wheels"]),
                   "unresolved": [u["reason"] for u in result["unresolved"]]}
        summary["msg"] = (f"locked {len(result['wheels'])} wheels into {path}" if result["complete"] else
                          f"PARTIAL lock written to {path}: " + "; ".join(summary["unresolved"]))
        summaries.append(summary)
    first = summaries[0]
    return {**first, "locks": summaries, "changed": any(x["changed"] for x in summaries),
            "complete": all(x["complete"] for x in summaries), "msg": "\n".join(x["msg"] for x in summaries)}


def write(lock: dict, path: Path) -> None:
    atomic_write(path, dump_json(lock, "the lock", indent=1, sort_keys=True) + "\n")


def read(path: str | Path) -> dict:
    from rig.core.documents import load_json

    try:
        raw = load_json(path, "lock")
        lock = validate(raw, LOCK_SPEC, str(path))
    except RigError as exc:
        raise RigError(f"{exc}; run `rig lock` on its stack") from exc
    if lock["lock_hash"] != lock_hash(raw):  # over what the file says, before defaults are filled in
        raise RigError(f"{path}: lock_hash does not match its content; the lock was edited by hand. "
                       "Run `rig lock` again")
    return lock


def _wheel_file(value: str) -> str | None:
    return None if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+!-]*\.whl", value) and ".." not in value else \
        f"{value[:80]!r} is not a wheel's file name"


def _wheel_version(value: str) -> str | None:
    return None if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.+!_-]*", value) else f"{value[:80]!r} is not a version"


# The hash anyone can recompute: every field that reaches a file name or pip's command line stays input.
LOCK_SPEC = Field(dict, open=True, fields={
    "lock_hash": Field(required=True, check=sha256),
    "python": Field(required=True, check=lambda v: None if re.fullmatch(r"3\.\d+", v) else f"{v!r} is not 3.X"),
    "glibc": Field(required=True, check=lambda v: None if re.fullmatch(r"2\.\d+", v) else f"{v!r} is not 2.X"),
    "complete": Field(bool, required=True),
    "stack_digest": Field(default=""),
    "wheels": Field(list, required=True, item=Field(dict, open=True, fields={
        "name": Field(required=True, check=distribution), "version": Field(required=True, check=_wheel_version),
        "filename": Field(required=True, check=_wheel_file), "sha256": Field(required=True, check=sha256),
        "index": Field(required=True)})),
    "unresolved": Field(list, default=[], item=Field(dict, open=True, fields={
        "reason": Field(required=True, multiline=True)})),
    "source_builds": Field(list, default=[], item=Field(dict, open=True, fields={
        "name": Field(required=True, check=distribution), "version": Field(required=True, check=_wheel_version)})),
})


def stack_digest(stack: dict) -> str:
    """What the lock was made from, so `rig lock --verify` can tell a stale lock."""
    packages = {k: v for k, v in stack.items() if k not in RUNTIME_KEYS}
    for later in ("extensions", "pythons"):  # later keys: absent or empty, the locks made before them stay current
        if not packages.get(later):
            packages.pop(later, None)
    return sha256_data(dump_json(packages, "the packages", sort_keys=True))
