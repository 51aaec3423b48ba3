"""`rig venv unpack` writes and deletes only its target (issue 73, mechanism 4): an input inside the venv it
replaces is refused before anything moves, and a refused unpack removes the parent directories it made."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness.commands import rig

from rig.python.venv import MARKER

pytestmark = pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd binary (apt-get install zstd)")


def packed(venv: Path, out: Path) -> tuple[Path, Path]:
    """A small venv rig would pack at VENV, packed into OUT: (archive, manifest)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (venv / MARKER).write_text(json.dumps({"lock_hash": "a" * 64, "packages": ["a==1"]}))
    done = rig("venv", "pack", "--venv", str(venv), "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    return Path(result["archive"]), Path(result["manifest"])


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("inside", ["manifest", "archive", "both"])
def test_an_input_inside_the_venv_is_refused_before_anything_moves(tmp_path, inside):
    """`--manifest V/x.manifest.json` deleted its own inputs with the old venv, and exited 0."""
    venv = tmp_path / "venv"
    archive, manifest = packed(venv, tmp_path / "out")
    (venv / MARKER).write_text(json.dumps({"lock_hash": "b" * 64, "packages": ["a==1"]}))  # an older venv there
    if inside in ("manifest", "both"):
        manifest = Path(shutil.copy(manifest, venv))
    if inside in ("archive", "both"):
        archive = Path(shutil.copy(archive, venv))
    before = tree(tmp_path)
    for check in (("--check",), ()):
        done = rig("venv", "unpack", "--venv", str(venv), "--manifest", str(manifest), "--archive", str(archive),
                   *check)
        assert done.returncode == 2 and done.stderr.startswith("rig: error: ") and \
            done.stderr.count("\n") == 1, done.stderr
        assert f"inside {venv}, which the unpack replaces" in done.stderr and "move it out" in done.stderr
        assert tree(tmp_path) == before


@pytest.mark.parametrize("where", ["stack", "working directory"])
def test_a_stack_read_from_the_venv_or_a_run_from_inside_it_is_refused(tmp_path, where):
    """`--stack V/stack.yml` was deleted with the old venv, and a run from inside V removed its own working
    directory, both exiting 0: they are inputs too."""
    from harness.commands import run
    from harness.paths import BIN, REPO

    venv = tmp_path / "venv"
    archive, manifest = packed(venv, tmp_path / "out")
    (venv / MARKER).write_text(json.dumps({"lock_hash": "b" * 64, "packages": ["a==1"]}))
    stack = Path(shutil.copy(REPO / "stacks" / "default.yml", venv / "stack.yml" if where == "stack" else tmp_path))
    before = tree(tmp_path)
    for check in (("--check",), ()):
        done = run([str(BIN / "rig"), "venv", "unpack", "--venv", str(venv), "--stack", str(stack), "--manifest",
                    str(manifest), "--archive", str(archive), *check], cwd=venv if where != "stack" else tmp_path)
        assert done.returncode == 2 and f"the {where} " in done.stderr and "which the unpack replaces" in done.stderr, \
            done.stderr
        assert tree(tmp_path) == before


def test_an_input_reached_through_a_link_inside_the_venv_is_refused(tmp_path):
    venv = tmp_path / "venv"
    archive, manifest = packed(venv, tmp_path / "out")
    (venv / MARKER).write_text(json.dumps({"lock_hash": "b" * 64, "packages": ["a==1"]}))
    shutil.move(archive, venv / archive.name)
    archive.symlink_to(venv / archive.name)
    done = rig("venv", "unpack", "--venv", str(venv), "--manifest", str(manifest))
    assert done.returncode == 2 and "which the unpack replaces" in done.stderr, done.stderr
    assert (venv / archive.name).is_file()


def test_a_refused_unpack_removes_the_parents_it_made(tmp_path):
    """The unpack made VENV's missing parents, then refused the archive, and left them."""
    venv = tmp_path / "a" / "b" / "venv"
    archive, manifest = packed(venv, tmp_path / "out")
    shutil.rmtree(tmp_path / "a")
    data = json.loads(manifest.read_text())
    data["entries"] = [e for e in data["entries"] if e[1] != MARKER]  # an archive member its manifest lacks
    manifest.write_text(json.dumps(data))
    done = rig("venv", "unpack", "--venv", str(venv), "--manifest", str(manifest))
    assert done.returncode == 2 and "rig: error: " in done.stderr, done.stderr
    assert not (tmp_path / "a").exists()
