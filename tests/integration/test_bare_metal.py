"""A fresh box from bare metal: the driver roles against the signed stand-in NVIDIA repository
(tests/nvidia_repo.py), and the stack's lock picked by the host's Python. Real ansible-playbook,
real apt and dpkg in a real container."""
from __future__ import annotations

import json
import os

import pytest
from harness.boxes import Box
from harness.commands import ok, rig
from harness.paths import REPO

pytestmark = pytest.mark.box

TWO_PYTHONS = REPO / "tests" / "data" / "stacks" / "two-pythons.yml"
DRIVER = {"nvidia_driver_repo_url": "file:///srv/nvidia/repo", "nvidia_driver_keyring_url": "file:///srv/nvidia/key.gpg",
          "nvidia_driver_version": "580.159.04-1", "nvidia_driver_manage_services": False,
          "nvidia_container_toolkit_manage_services": False, "nvidia_driver_pci_root": "/srv/fake/pci-no-switch",
          "nvidia_driver_module_version_path": "/srv/fake/old-module-version"}


def prepared(box: Box, tmp_path) -> Box:
    os.environ["MOLECULE_EPHEMERAL_DIRECTORY"] = str(tmp_path)  # where the prepare play builds the repository
    try:
        box.play("../tests/molecule/prepare-nvidia-repo.yml").expect_ok()
    finally:
        del os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]
    box.sh("mkdir -p /srv/fake/pci-no-switch && cp -r /srv/fake/pci/0000:01:00.0 /srv/fake/pci-no-switch/"
           " && echo 580.95.05 > /srv/fake/old-module-version")
    return box


def test_a_fresh_box_stops_with_reboot_required_and_no_fabric_manager_without_nvswitch(box, tmp_path):
    prepared(box, tmp_path)
    before = box.sh("dpkg -l | sort; ls /etc/apt/sources.list.d").stdout
    check = box.play("bare-metal.yml", "--check", "--diff", **DRIVER).expect_ok()
    assert check.recap("changed") > 0 and box.sh("dpkg -l | sort; ls /etc/apt/sources.list.d").stdout == before
    run = box.play("bare-metal.yml", **DRIVER)
    assert not run.ok
    assert ("reboot required on " + box.name + ": the installed NVIDIA driver is 580.159.04, the loaded kernel "
            "module is 580.95.05") in run.output
    assert box.sh("dpkg-query -W -f='${Version}' nvidia-driver-580-open").stdout == "580.159.04-1"
    assert box.sh("dpkg-query -W nvidia-fabricmanager-580", check=False).returncode != 0  # no NVSwitch: none
    # rebooted into the new module: the same run completes, and a second changes nothing
    loaded = {**DRIVER, "nvidia_driver_module_version_path": "/srv/fake/module-version"}
    box.play("bare-metal.yml", **loaded).expect_ok()
    assert box.play("bare-metal.yml", **loaded).expect_ok().recap("changed") == 0
    assert json.loads(box.sh("cat /etc/docker/daemon.json").stdout)["runtimes"]["nvidia"]


def test_the_host_python_picks_its_lock_or_stops_before_any_change(box):
    """rig's boxes run Debian 12 (python3 3.11); the stack is locked for 3.12 and, as an extra, 3.11."""
    stack_vars = {k: v for k, v in json.loads(ok(rig("stack", "vars", "--stack", str(TWO_PYTHONS))).stdout).items()
                  if k.startswith("python_stack_")}
    assert set(stack_vars["python_stack_locks"]) == {"3.11", "3.12"}
    only_312 = {**stack_vars, "python_stack_locks": {"3.12": str(TWO_PYTHONS.with_suffix(".lock"))}}
    refused = box.play("python.yml", **only_312)
    assert not refused.ok
    assert (f"{box.name}'s python3 is 3.11; the stack is locked for Python 3.12. Add \"3.11\" to the stack's "
            "pythons") in refused.output
    assert not box.exists("/opt/rig/venv")
    box.play("python.yml", **stack_vars).expect_ok()
    marker = json.loads(box.sh("cat /opt/rig/venv/.rig-stack.json").stdout)
    lock311 = json.loads(TWO_PYTHONS.with_suffix(".py311.lock").read_text())
    assert marker["lock_hash"] == lock311["lock_hash"]
    assert box.sh("/opt/rig/venv/bin/python -c 'import click; print(click.__version__)'").stdout.strip() == "8.1.7"
