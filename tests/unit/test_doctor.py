"""Doctor's report shape and its python layer, on this host (no GPU, no toolkit needed)."""
import json
import subprocess
import sys

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
    assert doctor.failed(checks)
    assert set(doctor.as_json(checks)["checks"][0]) == {"layer", "name", "status", "detail", "fix", "required"}


def test_a_venv_that_matches_its_marker_passes(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (venv / ".rig-stack.json").write_text(json.dumps({"lock_hash": "ab" * 32, "packages": []}))
    check = _named(doctor.run("13.0.2", ["12.0a"], prefix=str(tmp_path), venv=str(venv)), "venv")
    assert check.status == "pass" and "0 packages as locked" in check.detail
    (venv / ".rig-stack.json").write_text(json.dumps({"lock_hash": "ab" * 32, "packages": ["click==0.1"]}))
    check = _named(doctor.run("13.0.2", ["12.0a"], prefix=str(tmp_path), venv=str(venv)), "venv")
    assert check.status == "fail" and "click" in check.detail


def _named(checks, name):
    return next(c for c in checks if c.name == name)
