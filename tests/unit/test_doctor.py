"""Doctor's report shape and its python layer, on this host (no GPU, no toolkit needed)."""
import json
import subprocess
import sys

from rig.core import check as report
from rig.machine import doctor


def test_a_missing_venv_fails_with_the_fix_and_the_report_has_every_layer(tmp_path):
    checks = doctor.run("13.0.2", ["12.0a"], prefix=str(tmp_path), venv=str(tmp_path / "venv"))
    layers = [c.layer for c in checks]
    assert layers.index("driver") < layers.index("toolkit") < layers.index("libraries") \
        < layers.index("nvrtc") < layers.index("python")
    venv = checks[-1]
    assert venv.status == "fail" and "python_stack role" in venv.fix
    toolkit = next(c for c in checks if c.name == "cuda-13.0")
    assert toolkit.status == "fail" and "no CUDA toolkit under" in toolkit.detail
    assert report.failed(checks)
    assert set(report.as_json(checks)["checks"][0]) == {"layer", "name", "status", "detail", "fix", "required",
                                                       "question", "problems", "seconds", "data"}


def test_a_venv_that_matches_its_marker_passes(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (venv / ".rig-stack.json").write_text(json.dumps({"lock_hash": "ab" * 32, "packages": []}))
    check = _named(doctor.run("13.0.2", ["12.0a"], prefix=str(tmp_path), venv=str(venv)), "venv")
    assert check.status == "pass" and "0 packages as locked" in check.detail
    (venv / ".rig-stack.json").write_text(json.dumps({"lock_hash": "ab" * 32, "packages": ["click==0.1"]}))
    check = _named(doctor.run("13.0.2", ["12.0a"], prefix=str(tmp_path), venv=str(venv)), "venv")
    assert check.status == "fail" and "click" in check.detail


def test_doctor_writes_its_checks_as_junit_one_case_per_check_each_failure_with_its_fix(tmp_path):
    import xml.etree.ElementTree as ET

    out = tmp_path / "doctor.xml"
    done = subprocess.run([sys.executable, "-m", "rig", "doctor", "--cuda", "13.0.2", "--arch", "12.0a", "--prefix",
                           str(tmp_path), "--venv", str(tmp_path / "venv"), "--json", "--junit", str(out)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 1, done.stderr
    checks = json.loads(done.stdout)["checks"]
    suite = ET.parse(out).getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [(f"rig.{c['layer']}", c["name"]) for c in checks]
    failures = [c for c in cases if c.find("failure") is not None]
    assert int(suite.get("failures")) == len(failures) == sum(c["status"] == "fail" for c in checks) > 0
    venv = next(c for c in failures if c.get("name") == "venv").find("failure")
    assert "fix: " in venv.text and "python_stack role" in venv.text


def _named(checks, name):
    return next(c for c in checks if c.name == name)


def test_a_failed_doctor_where_the_stacks_venv_is_not_names_the_box_that_is_provisioned():
    failing = [report.Check("python", "venv", "fail", "/opt/rig/venv holds no venv (no bin/python)")]
    said = doctor.render(failing, missing_venv="/opt/rig/venv").splitlines()[-1]
    assert said == ("doctor: FAILED: this machine is not provisioned (no venv at /opt/rig/venv); the box "
                    f"`make provision` provisioned is: `rig doctor --container {doctor.BOX}`")
    assert doctor.render(failing).splitlines()[-1] == "doctor: FAILED"


def test_the_box_doctor_names_is_the_one_make_provision_provisions():
    from harness.paths import REPO

    assert f"BOX ?= {doctor.BOX}\n" in (REPO / "Makefile").read_text()
