"""The lab: real venvs built by rig from its wheelhouse on this machine, once per run, shared by the pytest-xdist
workers (tests/conftest.py lab)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from harness.commands import ok, rig
from harness.paths import CACHE, DEFAULT_LOCK, LOCK_059


def shared_root(tmp_path_factory) -> Path:
    """The run's temporary root, the same for every pytest-xdist worker."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


def built_once(tmp_path_factory, name: str, build) -> Path:
    """NAME under the run's shared temporary root, built by BUILD(path) by the first worker that asks
    (the others wait on a file lock) and reused by all: one copy on disk however many workers need it."""
    import fcntl

    root = shared_root(tmp_path_factory)
    target, done = root / name, root / f"{name}.built"
    with open(root / f"{name}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(target, ignore_errors=True)
            build(target)
            done.touch()
    return target


def default_venv(root: Path) -> None:
    """The default stack's venv at ROOT, installed by rig from its wheelhouse (the 0.5.9 lock's wheels fetched
    too, for the overlays)."""
    from rig.python.lock import read

    for lock in (DEFAULT_LOCK, LOCK_059):
        ok(rig("wheelhouse", "fetch", str(lock), "--cache", CACHE))
    house = root.with_name(root.name + "-house")
    ok(rig("wheelhouse", "export", str(DEFAULT_LOCK), str(house), "--cache", CACHE))
    ok(rig("venv", "install", "--venv", str(root), "--lock-hash", read(DEFAULT_LOCK)["lock_hash"],
           "--python-version", "3.11", "--wheelhouse", str(house), "--installer", "uv",
           "--no-compile"))  # the tests import a small part of it: 2.5 CPU-minutes less
    shutil.rmtree(house)


def overlay(base: Path, lock: Path, dest: Path, names: set[str] | None = None) -> Path:
    """A venv at DEST with LOCK's wheels (those in NAMES, or all) installed in it and BASE's packages under
    them (a .pth file): a few MB of its own, so that a test may patch it while others read BASE."""
    from rig.python.lock import read
    from rig.python.wheelhouse import cached_path

    ok(subprocess.run(["python3", "-m", "venv", "--without-pip", str(dest)], capture_output=True, text=True,
                      check=False))
    wheels = [str(cached_path(CACHE, w)) for w in read(lock)["wheels"] if names is None or w["name"] in names]
    # no bytecode at install: the tests import a small part of these packages, and the first import writes what
    # it needs (the 0.5.23 overlay's install 29-43 -> 10-15 CPU-seconds side by side, docs/BENCHMARKS.md)
    ok(subprocess.run([str(base / "bin" / "python"), "-m", "pip", "--python", str(dest / "bin" / "python"),
                       "install", "-q", "--no-compile", "--no-deps", "--no-index", *wheels], capture_output=True,
                      text=True, check=False))
    site = "lib/python3.11/site-packages"
    (dest / site / "zz-rig-lab-base.pth").write_text(str(base / site) + "\n")
    return dest


class Lab(dict):
    """The lab's venvs by name: v23 at once, v9 made on a worker's first lab["v9"] (a pip install; the modules of
    one lab group use it, the other's never do)."""

    def __init__(self, v23: Path, make_v9):
        super().__init__(v23=v23)
        self._make_v9 = make_v9

    def __missing__(self, key: str) -> Path:
        if key != "v9":
            raise KeyError(key)
        self["v9"] = self._make_v9()
        return self["v9"]
