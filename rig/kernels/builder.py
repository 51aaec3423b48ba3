"""One builder workflow, for the wheel_build role's builder host and the image's builder stage:
the controller lays out what a builder needs (the stack file, clean copies of the
sources) and says the `rig wheels build` commands the builder runs on it."""
from __future__ import annotations

import shutil
from pathlib import Path

from rig.core import RigError
from rig.kernels.wheels import copy_source, plan, source_spec, stack_lock_hash

# what a torch extension build needs on a Debian builder beyond the stack's venv and toolkit
BUILD_TOOLS = ["g++", "python3-dev"]


def stage(builds: list[dict], stack_path: str, lock_hash: str, cache: str | Path, dest: Path, root: str,
          venv: str, cuda_home: str | None = None, jobs: int | None = None) -> dict:
    """Lay BUILDS ({key, spec} each) out in DEST, a new directory that the builder sees as ROOT.

    The answer names the dir, the Debian packages the builds need, and each build's argv for rig
    (the builder keeps its wheels under ROOT/cache/built/KEY, which the controller takes back)."""
    if not root.startswith("/"):
        raise RigError(f"--root {root!r}: give the absolute path the builder sees the staged dir at")
    if dest.exists() and any(dest.iterdir()):
        raise RigError(f"{dest} is not empty: staging writes a fresh dir (remove it first)")
    builds = list({build["key"]: build for build in builds}.values())  # one source, one key: staged once
    specs = [source_spec(build["spec"]) for build in builds]  # every source checked before anything is written
    _apart(dest, specs)
    made = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    try:
        staged = _lay_out(builds, specs, stack_path, lock_hash, cache, dest, root, venv, cuda_home, jobs)
    except BaseException:
        if made:  # nothing half-staged is left behind
            shutil.rmtree(dest)
        raise
    tools = BUILD_TOOLS + (["git"] if any(b["argv"][-1].startswith("git+") for b in staged) else [])
    return {"changed": True, "dir": str(dest), "root": root, "tools": tools, "builds": staged,
            "msg": f"staged {len(staged)} build(s) in {dest}"}


def _lay_out(builds: list[dict], specs: list[str], stack_path: str, lock_hash: str, cache: str | Path, dest: Path,
             root: str, venv: str, cuda_home: str | None, jobs: int | None) -> list[dict]:
    """Write the builder's files into DEST and say each build's argv."""
    shutil.copyfile(stack_path, dest / "stack.yml")  # the archs and CUDA major
    staged = []
    for build, spec in zip(builds, specs, strict=True):
        key = build["key"]
        if spec.startswith("git+"):
            where = spec
        elif Path(spec).is_dir():  # as `rig wheels build` copies it: the same tree, so the same key
            copy_source(spec, dest / "src" / key)
            where = f"{root}/src/{key}"
        else:
            (dest / "src" / key).mkdir(parents=True)
            shutil.copyfile(spec, dest / "src" / key / Path(spec).name)
            where = f"{root}/src/{key}/{Path(spec).name}"
        argv = ["wheels", "build", "--venv", venv, "--stack", f"{root}/stack.yml", "--lock-hash", lock_hash,
                "--cache", f"{root}/cache"]
        argv += ["--cuda-home", cuda_home] if cuda_home else []
        argv += ["--jobs", str(jobs)] if jobs else []
        staged.append({"key": key, "argv": [*argv, where]})
    return staged


def _apart(dest: Path, specs: list[str]) -> None:
    """Refuse a source that holds the staged dir or lies inside it: a copy would recurse or be removed."""
    where = dest.resolve()
    for spec in specs:
        if spec.startswith("git+"):
            continue
        source = Path(spec).resolve()
        if source == where or source.is_relative_to(where) or where.is_relative_to(source):
            raise RigError(f"{spec}: the source and the staged dir {dest} overlap; keep the source outside "
                           "rig's cache (and the cache outside the source)")


def stage_for_host(source: str, stack_path: str, archs: list[str], cache: str | Path, root: str, venv: str,
                   cuda_home: str | None = None, jobs: int | None = None, check: bool = False) -> dict:
    """Stage one build for a builder host in CACHE/staged/KEY (rig's own dir: a leftover is replaced)."""
    lock_hash = stack_lock_hash(stack_path)
    key = plan(source, archs, Path(cache), lock_hash)["key"]
    dest = Path(cache) / "staged" / key
    _apart(dest, [source_spec(source)])
    if check:  # the source is read and keyed (every check above ran); nothing is copied
        if not root.startswith("/"):
            raise RigError(f"--root {root!r}: give the absolute path the builder sees the staged dir at")
        return {"changed": True, "dir": str(dest), "root": root, "key": key,
                "msg": f"would stage {source} (key {key}) in {dest}" + (", replacing the leftover there"
                                                                        if dest.exists() else "")}
    if dest.exists():  # a leftover of a run that was killed
        shutil.rmtree(dest)
    return stage([{"key": key, "spec": source}], stack_path, lock_hash, cache, dest, root, venv, cuda_home, jobs)
