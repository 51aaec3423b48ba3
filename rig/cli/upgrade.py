"""`rig upgrade`: the steps of a day-two upgrade on one host that playbooks/upgrade.yml asks the engine."""
from __future__ import annotations

import click

from rig.cli.common import (
    arch_option,
    check_option,
    driver_package_option,
    emit,
    group,
    json_option,
    lock_hash_option,
    module_version_option,
    pci_root_option,
    state_dir_option,
    venv_option,
)
from rig.cli.types import DIR, Choice
from rig.machine import gpu_health
from rig.machine import upgrade as steps
from rig.machine.upgrade import STATE_DIR

state_option = state_dir_option(default=STATE_DIR, help="Where the host keeps its rollout lock and its upgrade record.")
owner_option = click.option("--owner", required=True, metavar="ID", help="The rollout's id (one per playbook run).")
package_options = [
    driver_package_option(required=True),
    click.option("--fabricmanager-package", required=True, metavar="PACKAGE",
                 help="The fabric manager's (nvidia-fabricmanager-580)."),
    click.option("--container-toolkit-package", default="nvidia-container-toolkit", show_default=True,
                 metavar="PACKAGE"),
]


def _packages(command):
    for option in reversed(package_options):
        command = option(command)
    return command


@group()
def upgrade() -> None:
    """A day-two upgrade of a serving host, step by step (playbooks/upgrade.yml runs them in order)."""


@upgrade.command("lock")
@state_option
@owner_option
@click.option("--give-back", is_flag=True, help="Give the lock back instead (another rollout's is left alone).")
@check_option
@json_option
def lock_cmd(state_dir, owner, give_back, check, as_json) -> None:
    """Take the host's rollout lock (refused while another rollout holds it), or give it back."""
    emit((steps.unlock if give_back else steps.lock)(state_dir, owner, check), as_json)


@upgrade.command("plan")
@package_options[0]
@package_options[1]
@click.option("--driver-version", default="", metavar="VERSION",
              help="The driver package's target version; \"\": the installed one.")
@click.option("--nvswitch", type=Choice(["auto", "true", "false"]), default="auto", show_default=True,
              help="Whether the board has NVSwitches (then the fabric manager goes to the driver's version too); "
                   "auto reads the PCI bus.")
@pci_root_option()
@click.option("--branch", required=True, metavar="BRANCH", help="The driver branch (580).")
@click.option("--flavour", type=Choice(["open", "proprietary"]), required=True, help="The kernel modules.")
@click.option("--cuda-version", metavar="VERSION", help="The stack's CUDA release: the driver must be new enough for it.")
@arch_option(help="A GPU arch the stack targets; repeat. Blackwell's (10.x and 12.x) need the open modules.")
@module_version_option()
@json_option
def plan_cmd(driver_package, fabricmanager_package, driver_version, nvswitch, pci_root, branch, flavour,
             cuda_version, archs, module_version_path, as_json) -> None:
    """What a driver upgrade would change here (changed: something would; steady: the loaded module is the
    installed driver's), after its guard rails: a driver below what the stack's CUDA needs, or proprietary
    modules for Blackwell, is refused naming both."""
    switched = nvswitch == "true" or (nvswitch == "auto" and gpu_health.pci_devices(pci_root)["nvswitches"] > 0)
    packages = {"driver": (driver_package, driver_version),
                **({"fabricmanager": (fabricmanager_package, driver_version)} if switched else {})}
    emit(steps.plan(packages, module_version_path, branch, flavour, cuda_version, list(archs)), as_json)


@upgrade.command("record")
@state_option
@_packages
@click.option("--cuda-prefix", type=DIR, metavar="DIR",
              help="Where the toolkits live: the release PREFIX/cuda points at is recorded.")
@venv_option(optional="no venv lock is recorded.", help="The stack's venv: the lock it holds is recorded.")
@check_option
@json_option
def record_cmd(state_dir, driver_package, fabricmanager_package, container_toolkit_package, cuda_prefix, venv_path,
               check, as_json) -> None:
    """Record the versions installed now: what a rollback puts back."""
    emit(steps.record(state_dir, {"driver": driver_package, "fabricmanager": fabricmanager_package,
                                  "container_toolkit": container_toolkit_package}, cuda_prefix, venv_path, check), as_json)


@upgrade.command("finish")
@state_option
@click.option("--reopen", is_flag=True, help="Mark it unfinished instead, as a rollback starts.")
@check_option
@json_option
def finish_cmd(state_dir, reopen, check, as_json) -> None:
    """Mark the upgrade record finished once the host serves again: until then a run again keeps the record
    of what the host ran before the upgrade that failed, and takes the host through again (changed, in plan
    mode: the record is unfinished)."""
    emit(steps.finish(state_dir, check, reopen), as_json)


@upgrade.command("previous")
@state_option
@click.option("--toolkit", metavar="VERSION",
              help="The CUDA release the rollback's stack makes the default: it must be the recorded one.")
@lock_hash_option(help="The lock the rollback's stack installs: it must be the recorded one.")
@json_option
def previous_cmd(state_dir, toolkit, lock_hash, as_json) -> None:
    """The versions recorded before the last upgrade (an error where none was, or where the rollback's stack
    is not the one the host ran then)."""
    emit(steps.previous(state_dir, toolkit, lock_hash), as_json)
