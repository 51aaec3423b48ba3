"""Verify the python_stack role on the converged container (testinfra)."""
import json
from pathlib import Path

LOCK = json.loads((Path(__file__).resolve().parent.parent / "tiny.lock").read_text())


def test_every_locked_wheel_is_installed_at_its_version(host):
    listing = host.check_output("/opt/rig/venv/bin/python -m pip list --format json")
    installed = {p["name"].lower(): p["version"] for p in json.loads(listing)}
    for wheel in LOCK["wheels"]:
        assert installed.get(wheel["name"]) == wheel["version"], wheel["name"]


def test_the_venv_records_its_lock(host):
    marker = json.loads(host.file("/opt/rig/venv/.rig-stack.json").content_string)
    assert marker["lock_hash"] == LOCK["lock_hash"]


def test_the_copied_wheelhouse_is_gone(host):
    assert host.run("ls /var/cache/rig 2>/dev/null | grep -c wheelhouse").stdout.strip() in ("", "0")
