"""`rig plumbing mount-unit`: the venv image's mount as a systemd mount unit (the python_stack role runs it)."""
from __future__ import annotations

import click

from rig.cli.common import emit, one_venv_change, store_option, venv_of
from rig.python.venv_archive.place import STORE
from rig.python.venv_archive.unit import persist


@click.command("mount-unit")
@one_venv_change(help="The venv rig venv mount linked to its image.")
@store_option(default=str(STORE), help="The --store rig venv mount was given: only a link into the venv's store "
                                       "there is made a mount at boot.")
def mount_unit(venv_path, stack_path, store, check, as_json) -> None:
    """Mount the venv's image at every boot: an enabled systemd .mount unit of the mount rig venv mount made (where
    systemd is PID 1; else it says the mount will not survive a reboot). Units of images the venv left go."""
    emit(persist(venv_of(venv_path, stack_path), check, root=store), as_json)
