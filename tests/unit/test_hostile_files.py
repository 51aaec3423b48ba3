"""Hostile files and processes, generated: source trees with links and FIFOs, rollout ids, environment values,
wheel metadata and names, ldconfig roots, interpreter paths. Each mechanism is closed in one place; each
property holds it to one contract: the input is taken whole, or refused with one RigError and nothing
changed."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import CACHE, REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rig.core import RigError
from rig.core.fs import copy_tree
from rig.kernels.builder import stage
from rig.kernels.wheels import source_digest
from rig.machine import upgrade

FUZZ = settings(max_examples=int(os.environ.get("RIG_FUZZ_EXAMPLES", "60")), deadline=None, derandomize=True,
                database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
SECRET = b"outside the source: never copied"
STACK = str(REPO / "tests" / "data" / "stacks" / "torch-extension.yml")


# ------------------------------------------------------------------ a source tree's links and special files

NAMES = st.sampled_from(["a", "b", "c"])
TARGETS = st.lists(st.sampled_from(["..", "a", "b", "c", "secret", "d"]), min_size=1, max_size=4).map("/".join)
ENTRY = st.tuples(st.lists(NAMES, min_size=1, max_size=3).map(tuple),
                  st.sampled_from(["file", "dir", "link", "abslink", "fifo"]), TARGETS)


def _grow(root: Path, entries: list) -> None:
    """Lay ENTRIES out under ROOT, skipping one whose place is taken or whose parent is not a directory."""
    for parts, kind, target in entries:
        path = root.joinpath(*parts)
        if not path.parent.is_dir() or path.parent.is_symlink() or os.path.lexists(path):
            continue
        if kind == "file":
            path.write_bytes("/".join(parts).encode())
        elif kind == "dir":
            path.mkdir()
        elif kind == "link":
            path.symlink_to(target)
        elif kind == "abslink":
            path.symlink_to(root / target)  # absolute even where it points inside: elsewhere once copied
        else:
            os.mkfifo(path)


def _should_refuse(root: Path) -> bool:
    """The oracle, apart from rig's walker: a FIFO, an absolute link, or a link that resolves out of ROOT."""
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(here) / name
            if path.is_symlink():
                text = os.readlink(path)
                real = os.path.realpath(path)
                if os.path.isabs(text) or not (real + "/").startswith(str(root) + "/"):
                    return True
                try:
                    os.stat(path)
                except OSError as exc:
                    if exc.errno == 40:  # ELOOP: a loop of links resolves nowhere
                        return True
            elif not (path.is_dir() or path.is_file()):
                return True
    return False


@FUZZ
@given(st.lists(ENTRY, max_size=10))
def test_a_source_tree_is_copied_whole_or_refused_and_nothing_outside_it_is_ever_read(entries):
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch).resolve()
        (base / "secret").write_bytes(SECRET)
        root = base / "src"
        root.mkdir()
        _grow(root, entries)
        dest = base / "copy"
        if _should_refuse(root):
            with pytest.raises(RigError, match=r"src: .* (is a link to|is not a regular file)"):
                copy_tree(root, dest, "source src")
            with pytest.raises(RigError):
                source_digest(str(root))
            assert not dest.exists()
            return
        copy_tree(root, dest, "source src")
        for here, dirs, files in os.walk(root):
            for name in dirs + files:
                path = Path(here) / name
                copied = dest / path.relative_to(root)
                assert copied.is_symlink() == path.is_symlink()
                if path.is_symlink():
                    assert os.readlink(copied) == os.readlink(path)
                elif path.is_file():
                    assert copied.read_bytes() == path.read_bytes()
        for here, _, files in os.walk(dest):
            for name in files:
                path = Path(here) / name
                assert (os.path.realpath(path) + "/").startswith(str(dest) + "/")
                assert not path.is_file() or path.read_bytes() != SECRET
        assert source_digest(str(dest)) == source_digest(str(root))  # the copy is keyed as its source


@pytest.mark.parametrize("kind", ["file link", "dir link", "fifo"])
def test_stage_refuses_a_source_that_reaches_out_and_leaves_no_staged_dir(tmp_path, kind):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "id_rsa").write_bytes(SECRET)
    tree = tmp_path / "ext"
    shutil.copytree(REPO / "tests" / "data" / "rig_scale_ext", tree)
    if kind == "file link":
        (tree / "README").symlink_to(outside / "id_rsa")
    elif kind == "dir link":
        (tree / "vendor").symlink_to(outside)
    else:
        os.mkfifo(tree / "pipe")
    out = tmp_path / "staged"
    with pytest.raises(RigError, match="is a link to|is not a regular file"):
        stage([{"key": "k", "spec": str(tree)}], STACK, "h", CACHE, out, "/r", "/v")
    assert not out.exists()
    assert not any(SECRET in p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and outside not in p.parents
                   and not p.is_symlink())


def test_a_link_inside_the_source_is_staged_as_that_link(tmp_path):
    tree = tmp_path / "ext"
    shutil.copytree(REPO / "tests" / "data" / "rig_scale_ext", tree)
    (tree / "docs").mkdir()
    (tree / "docs" / "setup.py").symlink_to("../setup.py")
    out = tmp_path / "staged"
    stage([{"key": "k", "spec": str(tree)}], STACK, "h", CACHE, out, "/r", "/v")
    assert os.readlink(out / "src" / "k" / "docs" / "setup.py") == "../setup.py"


def test_a_source_that_is_a_fifo_is_refused_without_opening_it(tmp_path):
    os.mkfifo(tmp_path / "ext.tar.gz")
    with pytest.raises(RigError, match="neither a source dir nor an sdist"):
        stage([{"key": "k", "spec": str(tmp_path / "ext.tar.gz")}], STACK, "h", CACHE, tmp_path / "out", "/r", "/v")


# ------------------------------------------------------------------ a rollout lock's owner

@FUZZ
@given(st.one_of(st.text(max_size=300), st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126),
                                                 min_size=100, max_size=5000)))
def test_a_rollout_lock_is_taken_only_for_an_owner_its_reader_takes_back(owner):
    with tempfile.TemporaryDirectory() as scratch:
        state = str(Path(scratch) / "upgrade")
        try:
            taken = upgrade.lock(state, owner)
        except RigError as exc:
            assert str(exc).startswith("--owner: the rollout's id: ")
            assert not Path(state).exists()  # refused before anything was written
            with pytest.raises(RigError, match="--owner"):
                upgrade.unlock(state, owner)
            return
        assert taken["changed"]
        assert not upgrade.lock(state, owner)["changed"]  # read back: held by the same owner
        with pytest.raises(RigError, match="another rollout"):
            upgrade.lock(state, owner + "x" if len(owner) < upgrade.OWNER_LIMIT else owner[:-1])
        assert upgrade.unlock(state, owner)["changed"] and not (Path(state) / upgrade.LOCK).exists()


def test_the_cli_refuses_a_long_owner_with_one_error_and_no_lock(tmp_path):
    done = subprocess.run([str(Path(os.sys.executable).parent / "rig"), "upgrade", "lock", "--owner", "x" * 5000,
                           "--state-dir", str(tmp_path / "s")], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stderr.count("rig: error:") == 1 and "5000 characters long" in done.stderr
    assert not (tmp_path / "s").exists()
