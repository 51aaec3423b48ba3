"""Hostile files and processes, generated: source trees with links and FIFOs, rollout ids, environment values,
wheel metadata and names, ldconfig roots, interpreter paths. Each mechanism is closed in one place; each
property holds it to one contract: the input is taken whole, or refused with one RigError and nothing
changed."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from harness.paths import CACHE, REPO
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


# ------------------------------------------------------------------ round two: environment values, wheel names and
# metadata, ldconfig roots, interpreters

@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory):
    path = tmp_path_factory.mktemp("env") / "venv"
    subprocess.run([os.sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path


@settings(FUZZ, max_examples=25)
@given(st.text(max_size=12))
def test_an_environment_value_is_written_only_where_every_start_of_the_venv_still_works(bare_venv, value):
    from rig.python.runtime_env import install

    env = {"pinned": {}, "defaults": {"RIG_FUZZ_VALUE": value}, "home": {}}
    try:
        install(bare_venv, env, "t")
    except RigError as exc:
        assert str(exc).startswith("environment RIG_FUZZ_VALUE: ")
        return
    code = "import os, sys; sys.stdout.buffer.write(os.environb[b'RIG_FUZZ_VALUE'])"
    done = subprocess.run([str(bare_venv / "bin" / "python"), "-c", code], capture_output=True, env={}, check=False)
    assert done.returncode == 0 and done.stdout == value.encode(), done.stderr


@FUZZ
@given(st.text(max_size=40))
def test_a_requires_dist_is_one_requirement_or_one_error_naming_the_distribution_and_field(text):
    from rig.core.wheelfile import read_requirement, requires_dist

    try:
        parsed = read_requirement(text, "evil 1.0")
    except RigError as exc:
        assert str(exc).startswith("evil 1.0 declares a dependency rig cannot read (Requires-Dist ")
    else:
        assert str(read_requirement(str(parsed), "again")) == str(parsed)  # what rig read is a requirement
    line = text.replace("\r", " ").replace("\n", " ")
    metadata = f"Metadata-Version: 2.1\nName: evil\nVersion: 1.0\nRequires-Dist: {line}\n"
    try:
        requires_dist(metadata, "evil 1.0")
    except RigError as exc:
        assert "evil 1.0 declares a dependency rig cannot read" in str(exc)


def test_an_installed_distribution_with_a_broken_requires_dist_is_named(tmp_path):
    from rig.python.introspect import held

    site = tmp_path / "v" / "lib" / f"python{os.sys.version_info.major}.{os.sys.version_info.minor}" / "site-packages"
    (site / "evil-1.0.dist-info").mkdir(parents=True)
    (site / "evil-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\nRequires-Dist: torch (>=2.0\n")
    (site / "evil-1.0.dist-info" / "RECORD").write_text("")
    (tmp_path / "v" / "bin").mkdir()
    (tmp_path / "v" / "bin" / "python").symlink_to(os.sys.executable)
    (tmp_path / "v" / "pyvenv.cfg").write_text("include-system-site-packages = false\n")
    assert held(tmp_path / "v" / "bin" / "python", ["evil"]).packages["evil"]["version"] == "1.0"  # not asked: read
    with pytest.raises(RigError, match=r"evil 1.0 \(installed\) declares a dependency rig cannot read "
                                       r"\(Requires-Dist 'torch \(>=2.0'"):
        held(tmp_path / "v" / "bin" / "python", ["evil"], metadata=True)


WHEEL_NAMES = st.one_of(
    st.text(alphabet=st.characters(blacklist_characters="/\0", blacklist_categories=("Cs",)), min_size=1,
            max_size=30),
    st.lists(st.sampled_from(["pkg", "1.0", "py3", "none", "any", "", "x_y", "1.0+local", "-"]), max_size=6)
    .map("-".join))


@FUZZ
@given(WHEEL_NAMES)
def test_an_export_takes_a_wheel_named_as_one_or_refuses_it_naming_it_and_writes_nothing(stem):
    from rig.kernels.wheels import export

    if stem in (".", "..") or len((stem + ".whl").encode()) > 255:
        return
    with tempfile.TemporaryDirectory() as scratch:
        built, dest = Path(scratch) / "built", Path(scratch) / "dest"
        built.mkdir()
        (built / f"{stem}.whl").write_bytes(b"not read as a zip")
        try:
            done = export([built], dest)
        except RigError as exc:
            assert "is not named as a wheel" in str(exc) and repr(str(built / f"{stem}.whl")) in str(exc)
            assert not dest.exists()
            return
        lines = (dest / "built-requirements.txt").read_text().splitlines()
        assert done["wheels"] == [f"{stem}.whl"] and len(lines) == 1 and "==" in lines[0]


LINK_AT = st.sampled_from(["usr", "usr/local", "usr/local/cuda-13.0", "usr/local/cuda-13.0/lib64"])


@FUZZ
@given(LINK_AT, st.booleans(), st.booleans())
def test_an_ldconfig_root_is_scanned_only_inside_itself(where, inside, absolute):
    from rig.cuda.ldconfig import conf_for

    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch).resolve()
        root = base / "root"
        elsewhere = root / "elsewhere" if inside else base / "outside"  # a whole toolkit tree, LINK_AT's levels
        (elsewhere / "usr/local/cuda-13.0/lib64").mkdir(parents=True)
        (elsewhere / "usr/local/cuda-13.0/lib64/libcudart.so.13").write_bytes(b"\x7fELF")
        real, link = elsewhere / where, root / where
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(real if absolute else os.path.relpath(real, link.parent))
        try:
            conf = conf_for("13.0.2", "/usr/local", root=str(root))
        except RigError as exc:
            assert str(exc).startswith(f"--root {root}: the toolkit tree /usr/local/cuda-13.0 there goes through a link")
            assert not inside and not where.endswith("lib64")
            return
        assert inside or where.endswith("lib64")
        if where.endswith("lib64"):  # a link inside the tree is not scanned: the conventional dir, as seen from /
            assert conf["dirs"] == ["/usr/local/cuda-13.0/lib64"]
        else:  # the tree where its link leads inside the root, written as the root's own system will see it
            assert conf["dirs"] == ["/elsewhere/usr/local/cuda-13.0/lib64"]


def test_ldconfig_write_under_replaces_a_link_at_its_file_and_never_writes_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    confdir = tmp_path / "image" / "etc" / "ld.so.conf.d"
    confdir.mkdir(parents=True)
    (confdir / "rig-cuda-13-0.conf").symlink_to(victim)
    done = subprocess.run([str(Path(os.sys.executable).parent / "rig"), "cuda", "ldconfig-conf", "--version",
                           "13.0.2", "--root", str(tmp_path / "image"), "--write-under", str(tmp_path / "image")],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "keep me" and not (confdir / "rig-cuda-13-0.conf").is_symlink()


def test_a_python_given_with_a_slash_is_that_file_and_a_bare_name_is_looked_up_on_path(tmp_path, monkeypatch):
    from rig.core.proc import interpreter

    here, onpath = tmp_path / "here", tmp_path / "onpath"
    for where in (here, onpath):
        where.mkdir()
        (where / "mypython").write_text(f"#!/bin/sh\ntouch {where}/ran\nexit 3\n")
        (where / "mypython").chmod(0o755)
    monkeypatch.setenv("PATH", f"{onpath}:{os.environ['PATH']}")
    monkeypatch.chdir(here)
    assert interpreter("./mypython") == here / "mypython" and interpreter("mypython") == onpath / "mypython"
    assert interpreter(here / "mypython") == here / "mypython"
    for missing, says in (("./nothere", "does not exist"), ("nothere-on-path", "is not on PATH"), ("./", "not an exec")):
        with pytest.raises(RigError, match=says):
            interpreter(missing)
    done = subprocess.run([str(Path(os.sys.executable).parent / "rig"), "patch", "status", "--python", "./mypython"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stderr.count("rig: error:") == 1
    assert (here / "ran").exists() and not (onpath / "ran").exists()  # the file in this directory, not PATH's


# ------------------------------------------------------------------ the engine's keep dir on a target

def _safe_says(keep: Path) -> subprocess.CompletedProcess:
    """The action's keep-dir check (the one snippet its run and keep scripts share), run by sh on KEEP."""
    from harness.rig_action import action

    script = f"d={shlex.quote(str(keep))}\n{action.ActionModule._safe()}echo \"ok $p\"\n"
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False)


MODES = st.sampled_from([0o700, 0o755, 0o750, 0o775, 0o757, 0o777, 0o1777, 0o2755, 0o1755])


@FUZZ
@given(MODES, MODES, st.sampled_from(["me", "root", "nobody"]), st.sampled_from(["me", "root", "nobody"]))
def test_a_keep_dir_is_used_only_where_nobody_else_can_change_it_or_a_dir_above(mode, above, owner, above_owner):
    me = os.getuid()
    uids = {"me": me, "root": 0, "nobody": 65534}
    if me != 0 and {owner, above_owner} - {"me"}:
        return  # only root can give a directory away
    with tempfile.TemporaryDirectory() as scratch:
        parent = Path(scratch).resolve() / "cache"
        keep = parent / "engine"
        keep.mkdir(parents=True)
        for path, m, who in ((keep, mode, owner), (parent, above, above_owner)):
            os.chown(path, uids[who], -1)
            os.chmod(path, m)
        done = _safe_says(keep)
        trusted = {0, me}
        wrong = (uids[owner] not in trusted or uids[above_owner] not in trusted or mode & 0o022
                 or (above & 0o022 and not above & 0o1000))
        if wrong:
            assert done.returncode == action_unsafe() and done.stderr.startswith("rig-keep-unsafe: ")
            assert str(keep if (uids[owner] not in trusted or mode & 0o022) else parent) in done.stderr
        else:
            assert done.returncode == 0 and done.stdout == f"ok {keep}\n", done.stderr


def action_unsafe() -> int:
    from harness.rig_action import action

    return action.UNSAFE


def test_a_keep_dir_others_may_write_fails_the_task_naming_it_and_nothing_runs(tmp_path):
    from harness.rig_action import SHOW, play

    (tmp_path / "kept").mkdir()
    (tmp_path / "kept").chmod(0o777)
    rc, result = play(tmp_path, [SHOW])
    assert rc != 0 and result["failed"] is True and "name" not in result  # the engine never answered
    assert result["msg"].startswith(f"rig_engine_keep_dir {tmp_path / 'kept'} is not safe to run the engine from: "
                                    f"{tmp_path / 'kept'} is writable by group or others (mode 777)")
    assert "chmod 0755" in result["msg"] and list((tmp_path / "kept").iterdir()) == []


def test_the_bytes_checked_are_the_bytes_that_run_whatever_happens_to_the_kept_file(tmp_path):
    """The interpreter stands in for an attacker racing the run: it replaces the kept bundle just before python
    starts. The run is of the private copy that was hashed, so the real engine answers."""
    import hashlib
    import sys

    from harness.rig_action import SHOW, play

    assert play(tmp_path, [SHOW])[0] == 0  # the bundle kept once
    kept = next((tmp_path / "kept").glob("rig-*.pyz"))
    digest = hashlib.sha256(kept.read_bytes()).hexdigest()
    racer = tmp_path / "racer"
    racer.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$1\" >> {tmp_path}/ran\nsha256sum < \"$1\" >> {tmp_path}/ran\n"
                     f"printf 'import sys; sys.exit(9)\\n' > {kept}\nexec {sys.executable} \"$@\"\n")
    racer.chmod(0o755)
    rc, result = play(tmp_path, [SHOW], "-e", f"rig_engine_python={racer}")
    assert rc == 0 and result["name"] == "sm120-sglang-0.5.23", result.get("msg")
    path, ran = (tmp_path / "ran").read_text().splitlines()
    assert ran.split()[0] == digest and not path.startswith(str(tmp_path / "kept"))
    assert "ansible-tmp" not in path  # the kept bundle's copy, not one sent for this task
    assert not Path(path).exists()  # the private copy is removed after the run
