"""Input text never becomes extra lines or options in what rig generates: the ld.so.conf.d file, the
environment module, the JUnit report, pip's command line; broken metadata is named, not a crash.
Each case was an outside attack's on this tree."""
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import yaml
from harness.commands import rig

from rig.core import RigError
from rig.core.check import Check, junit
from rig.core.wheelfile import read_requirement
from rig.python.lock import torch_cuda_major
from rig.stack.spec import validate


def stack_with(**extra) -> dict:
    return {"name": "t", "cuda": {"version": "13.0.2"}, **extra}


@pytest.mark.parametrize("prefix", ["/p\n/evil/lib", "/p /evil", "/p:/evil", "/p,/evil", "/p\t/x"])
def test_a_prefix_that_would_add_loader_lines_is_refused_and_nothing_written(tmp_path, prefix):
    done = rig("cuda", "ldconfig-conf", "--version", "13.0.2", "--prefix", prefix, "--write-under", str(tmp_path))
    assert done.returncode == 2 and "cannot be a line of an ld.so.conf.d file" in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("key", ["null", "~", "true", ".inf", "1"])
def test_an_environment_key_yaml_reads_as_no_string_is_refused_naming_the_fix(tmp_path, key):
    path = tmp_path / "s.yml"
    path.write_text(f"name: t\ncuda: {{version: 13.0.2}}\nenvironment:\n  vars:\n    {key}: x\n    ZED: y\n")
    for args in (["env", "show", "--stack", str(path)], ["stack", "show", "--stack", str(path)]):
        done = rig(*args)
        assert done.returncode == 2 and "is not an environment variable name" in done.stderr, done.stderr
        assert "quote it" in done.stderr and "internal error" not in done.stderr
    quoted = tmp_path / "q.yml"
    quoted.write_text(f"name: t\ncuda: {{version: 13.0.2}}\nenvironment:\n  vars:\n    '{key}': x\n")
    assert rig("stack", "show", "--stack", str(quoted)).returncode == (0 if key.isidentifier() else 2)


def test_a_value_no_environment_can_hold_is_refused():
    with pytest.raises(RigError, match="X: inf is a fraction as YAML reads it; quote it"):
        validate(stack_with(environment={"vars": {"X": float("inf")}}))


def test_control_characters_in_a_stack_path_leave_the_junit_report_well_formed():
    stack = "bad\x01\x1b[31m\x0bname\ud800.yml"
    check = Check("validate", "schema", "fail", "", question="q\x02?", problems=["in \x07 " + stack])
    text = junit([check], f"rig validate {stack}")
    root = ET.fromstring(text.split("?>", 1)[1])
    suite = root.find("testsuite")
    assert suite.get("name") == "rig validate bad\\x01\\x1b[31m\\x0bname\\ud800.yml"
    assert suite.find("testcase/failure").get("message").startswith("in \\x07 bad\\x01")


@pytest.mark.parametrize("item", ["--no-binary=:all:", "--find-links=/tmp/x", "--report=/tmp/outside.json",
                                  "-e .", "evil @ https://example.invalid/evil.whl", "not a ! requirement"])
def test_extra_packages_take_requirements_only_never_pip_options_or_urls(item):
    with pytest.raises(RigError, match="extra_packages"):
        validate(stack_with(extra_packages=["rich", item]))
    assert validate(stack_with(extra_packages=["rich==13.7.1", "numpy>=2; python_version >= '3.11'"]))


def test_a_lock_refuses_an_option_in_extra_packages_before_pip_runs(tmp_path):
    path = tmp_path / "s.yml"
    outside = tmp_path / "outside.json"
    path.write_text(yaml.safe_dump(stack_with(extra_packages=[f"--report={outside}"])))
    done = rig("lock", "--stack", str(path))
    assert done.returncode == 2 and "is a pip option" in done.stderr and not outside.exists()


def test_broken_wheel_metadata_is_named_not_a_crash():
    with pytest.raises(RigError, match="declares a dependency rig cannot read"):
        read_requirement("nvidia-cuda-runtime (>=13", "torch 2.14.1")
    for meta in ({"requires_dist": []}, {"version": "not-a-version", "requires_dist": []}):
        with pytest.raises(RigError, match="no PEP 440 version"):
            torch_cuda_major(meta)


def test_the_stack_file_check_runs_in_a_fresh_interpreter_too():
    """The schema's requirement check imports packaging lazily: it must work in a process that never did."""
    code = ("from rig.stack.spec import validate\n"
            "try:\n    validate({'name': 't', 'cuda': {'version': '13.0.2'}, 'extra_packages': ['-e .']})\n"
            "except Exception as exc:\n    print(type(exc).__name__, exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.stdout.startswith("RigError") and "is a pip option" in done.stdout, done.stdout + done.stderr
