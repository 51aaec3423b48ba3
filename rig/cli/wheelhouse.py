"""The `rig wheelhouse` group: the controller's cache of locked wheels."""
from __future__ import annotations

import click

from rig.cli.common import cache_option, check_option, emit, group, json_option, port_option
from rig.cli.types import DIR, FILE, OutFile, Seconds
from rig.python import lock as locking
from rig.python import wheel_serving
from rig.python.wheelhouse import export, fetch


@group()
def wheelhouse() -> None:
    """The controller's hash-keyed cache of locked wheels."""


@wheelhouse.command("fetch")
@click.argument("lock_path", metavar="LOCK", type=FILE)
@cache_option(help="Controller-side cache.")
@check_option
@json_option
def wheelhouse_fetch(lock_path, cache, check, as_json) -> None:
    """Download every wheel of LOCK once, verifying each sha256; refetch altered ones."""
    emit(fetch(locking.read(lock_path), cache, check), as_json)


@wheelhouse.command("show")
@click.argument("lock_path", metavar="LOCK", type=FILE)
@json_option
def wheelhouse_show(lock_path, as_json) -> None:
    """What a role needs of LOCK, read as rig reads it (its hash checked): its hash, Python, completeness."""
    lock = locking.read(lock_path)
    emit({"lock_hash": lock["lock_hash"], "python": lock["python"], "complete": lock["complete"],
          "unresolved": lock["unresolved"], "wheels": len(lock["wheels"]),
          "msg": f"{lock_path}: {len(lock['wheels'])} wheels for Python {lock['python']}, lock {lock['lock_hash'][:12]}"
                 + ("" if lock["complete"] else " (partial)")}, as_json)


@wheelhouse.command("export")
@click.argument("lock_path", metavar="LOCK", type=FILE)
@click.argument("dest", type=DIR)
@cache_option(help="Controller-side cache.")
@check_option
@json_option
def wheelhouse_export(lock_path, dest, cache, check, as_json) -> None:
    """Lay LOCK's wheels out in DEST with a hash-pinned requirements.txt."""
    emit(export(locking.read(lock_path), cache, dest, check), as_json)


@wheelhouse.command("serve")
@click.argument("directory", type=DIR)
@click.option("--bind", default="0.0.0.0", show_default=True, metavar="ADDRESS", help="The address to listen on.")
@click.option("--idle-exit", type=Seconds(), default=600.0, show_default=True,
              help="Stop once nobody has asked anything for this long.")
@click.option("--stats", type=OutFile(), help="Write the bytes sent to this JSON file when it stops.")
@click.option("--foreground", is_flag=True, help="Serve in this process (prints the port) instead of detaching.")
@json_option
def wheelhouse_serve(directory, bind, idle_exit, stats, foreground, as_json) -> None:
    """Serve an exported wheelhouse (or a venv archive) over HTTP for hosts to pull (every hash checked); detaches, and stops
    by itself once idle."""
    if foreground:
        wheel_serving.serve(directory, bind, idle_exit, stats)
        return
    emit(wheel_serving.detach(directory, bind, idle_exit, stats), as_json)


@wheelhouse.command("route")
@click.argument("host", metavar="HOST")
@port_option(required=True, help="The port `rig wheelhouse serve` took.")
@click.option("--docker/--no-docker", default=False, help="HOST is a container on this machine's Docker engine.")
@json_option
def wheelhouse_route(host, port, docker, as_json) -> None:
    """The URL at which HOST reaches this machine's PORT (the address the kernel would answer it from)."""
    emit(wheel_serving.route(host, port, docker), as_json)
