"""The environment rig patches: its Python, its prefix, the installed versions of the patched packages, and the
record (state file and backups) of what rig changed there."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rig.core import RigError
from rig.core.fs import confined
from rig.core.proc import interpreter, venv_python
from rig.core.schema import Field, distribution, sha256
from rig.patches.patchset import Patch, load
from rig.python.introspect import held

STATE = ".rig-patches.json"
BACKUPS = ".rig-patches"  # the originals, each named by its sha256

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

    def backups(self) -> Path:
        return self.inside(self.prefix / BACKUPS, "the patch backups")

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
    yet checked against the set (patchset.asked does, where they are used)."""
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
