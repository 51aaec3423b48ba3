"""`rig plumbing`: what roles and images use under the hood (the engine bundle, NVIDIA tools' paths, a venv
image's mount unit)."""
from __future__ import annotations

from rig.cli.bundle import bundle
from rig.cli.common import group
from rig.cli.mount_unit import mount_unit
from rig.cli.tool import tool


@group()
def plumbing() -> None:
    """What roles and images use under the hood: the engine bundle and NVIDIA tools' paths."""


plumbing.add_command(bundle)
plumbing.add_command(tool)
plumbing.add_command(mount_unit)
