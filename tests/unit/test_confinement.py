"""Paths from input stay under their root: CUDA wheel members, lock filenames, patch targets, stack names."""
import json
import zipfile

import pytest
from harness.commands import rig
from harness.paths import REPO

from rig.core import RigError
from rig.core.fs import confined
from rig.python.lock import lock_hash, read
from rig.python.wheelhouse import cached_path


@pytest.mark.parametrize("rel", ["../x", "a/../../x", "/etc/passwd", "", "a\0b"])
def test_a_path_outside_its_root_is_refused(tmp_path, rel):
    with pytest.raises(RigError, match="refusing it"):
        confined(tmp_path, rel, "test")


def test_a_link_out_of_the_root_is_refused(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "out").symlink_to(tmp_path)
    with pytest.raises(RigError, match="leads outside"):
        confined(tmp_path / "root", "out/x", "test")
    assert confined(tmp_path / "root", "a/b", "test") == (tmp_path / "root" / "a" / "b").resolve()


def test_a_lock_whose_filename_climbs_out_of_the_cache_is_refused(tmp_path):
    """The lock hash is a checksum anyone can recompute: a recomputed hash does not make a field safe."""
    lock = json.loads((REPO / "roles" / "python_stack" / "molecule" / "default" / "tiny.lock").read_text())
    lock["wheels"][0]["filename"] = "../../../../tmp/victim.whl"
    lock["lock_hash"] = lock_hash(lock)
    bad = tmp_path / "bad.lock"
    bad.write_text(json.dumps(lock))
    with pytest.raises(RigError, match=r"wheels\[0\]\.filename: '../../../../tmp/victim.whl' is not a wheel's file name"):
        read(bad)
    with pytest.raises(RigError, match="leads outside"):
        cached_path(tmp_path, lock["wheels"][0])
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    done = rig("wheelhouse", "fetch", str(bad), "--cache", str(tmp_path / "cache"))
    assert done.returncode == 2 and "not a wheel's file name" in done.stderr
    assert victim.read_text() == "keep me"


@pytest.mark.parametrize("field, value, says", [
    ("name", "click\n--find-links /tmp/evil", "is not a package name"),
    ("version", "8.1.7 --hash=sha256:0", "is not a version"),
    ("sha256", "../../x", "is not 64 hex digits")])
def test_every_lock_field_that_reaches_a_file_or_pip_is_checked(tmp_path, field, value, says):
    lock = json.loads((REPO / "roles" / "python_stack" / "molecule" / "default" / "tiny.lock").read_text())
    lock["wheels"][0][field] = value
    lock["lock_hash"] = lock_hash(lock)
    bad = tmp_path / "bad.lock"
    bad.write_text(json.dumps(lock))
    with pytest.raises(RigError, match=says):
        read(bad)


def test_a_cuda_wheel_member_that_climbs_out_is_refused(tmp_path):
    from rig.cuda.toolkit import _assemble_from_wheels

    wheel = tmp_path / "nvidia_cuda_evil-13.0.0-py3-none-manylinux_2_27_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("nvidia/cu13/bin/../../../../../escaped", "x")
    staging = tmp_path / "deep" / "er" / "staging"
    staging.mkdir(parents=True)
    with pytest.raises(RigError, match="leads outside|refusing"):
        _assemble_from_wheels(tmp_path, {"wheels": [wheel.name]}, staging)
    assert not list(tmp_path.rglob("escaped"))


@pytest.mark.parametrize("name, says", [
    ("x\\nimport os; os.system('id')", "is not a package name"),
    ("x; import os", "is not a package name"),
])
def test_a_stack_name_is_a_plain_name(tmp_path, name, says):
    stack = tmp_path / "s.yml"
    stack.write_text(f'name: "{name}"\ncuda: {{version: "13.0.2"}}\n')
    done = rig("stack", "show", "--stack", str(stack))
    assert done.returncode == 2 and "name: " in done.stderr and says in done.stderr


@pytest.mark.parametrize("path, says", [("/dev/zero", "is not a regular file"), ("/", "File '/' is a directory")])
def test_a_stack_path_that_is_not_a_file_is_refused_without_reading_it(path, says):
    done = rig("stack", "show", "--stack", path)
    assert done.returncode == 2 and says in done.stderr


def test_stack_json_from_a_role_is_read_by_the_same_layer(tmp_path):
    done = rig("server", "args", "--stack-json", "[" * 5000, "--venv", str(tmp_path))
    assert done.returncode == 2 and "--stack-json is not JSON of a stack" in done.stderr


def test_a_description_may_span_lines_but_an_environment_value_may_not(tmp_path):
    stack = tmp_path / "s.yml"
    stack.write_text('name: s\ndescription: |\n  two\n  lines\ncuda: {version: "13.0.2"}\n')
    assert rig("stack", "show", "--stack", str(stack)).returncode == 0
    stack.write_text('name: s\ncuda: {version: "13.0.2"}\nenvironment: {vars: {A: "x\\u0000y"}}\n')
    done = rig("stack", "show", "--stack", str(stack))
    assert done.returncode == 2 and "environment.vars: A:" in done.stderr and "must be one line" in done.stderr
