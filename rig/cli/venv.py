"""The `rig venv` group: the stack's virtualenv on a target."""
from __future__ import annotations

import click

from rig.cli.common import check_option, emit, json_option, judged, venv_option
from rig.core import defaults
from rig.python.installer import INSTALLERS


@click.group()
def venv() -> None:
    """The stack's virtualenv on a target, installed offline from a wheelhouse."""


@venv.command("install")
@venv_option(default=defaults.VENV, show_default=True)
@click.option("--lock", "lock_file", help="The stack's lock: with --find-links, pull everything from that URL, "
              "pip's wheel and requirements checked against the lock (hosts of a fleet).")
@click.option("--lock-hash", help="lock_hash of the lock being installed (without --lock).")
@click.option("--python-version", help="The lock's Python, checked against this host (without --lock).")
@click.option("--wheelhouse", "house", help="An exported wheelhouse dir (rig wheelhouse export).")
@click.option("--find-links", help="Take the wheels from this URL; the wheelhouse dir then needs only its "
              "requirements file and pip wheel (image builds), or none with --lock.")
@click.option("--installer", type=click.Choice(INSTALLERS), default="pip", show_default=True,
              help="uv (rig's pinned wheel, from the wheelhouse; about twice as fast) or pip (the lock's own).")
@click.option("--compile/--no-compile", "byte_compile", default=True, show_default=True,
              help="Byte-compile every module at install. A server whose account cannot write the venv needs it; "
                   "a throwaway venv that imports a few modules (a CI job's) starts sooner without it.")
@check_option
@json_option
def venv_install(venv_path, lock_file, lock_hash, python_version, house, find_links, installer, byte_compile, check,
                 as_json) -> None:
    """Install a lock's wheels with --no-index --require-hashes; a no-op when current."""
    from rig.python import lock as locking
    from rig.python.venv import install

    lock = locking.read(lock_file) if lock_file else None
    if lock is not None:
        lock_hash, python_version = lock["lock_hash"], lock["python"]
    elif not (lock_hash and python_version):
        raise click.UsageError("give --lock, or --lock-hash and --python-version")
    emit(install(venv_path, lock_hash, python_version, house, check, find_links, lock, installer, byte_compile),
         as_json)


@venv.command("verify")
@venv_option(default=defaults.VENV, show_default=True)
@json_option
def venv_verify(venv_path, as_json) -> None:
    """Check every locked package is installed at its locked version."""
    from rig.python.venv import verify

    result = verify(venv_path)
    emit({**result, "msg": f"{venv_path}: {result['packages']} packages as locked" if result["ok"]
          else f"{venv_path}: differs from its lock: {result['mismatched']}"}, as_json)
    judged(result["ok"])


@venv.command("add")
@venv_option(default=defaults.VENV, show_default=True)
@click.option("--requirements-sha256", required=True, help="sha256 of the export's list (rig wheels export prints it).")
@click.option("--wheelhouse", help="The exported dir holding the wheels (needed only when something changes).")
@click.option("--find-links", help="Take the wheels from this URL; the wheelhouse dir then needs only its "
                                   "requirements file (image builds).")
@check_option
@json_option
def venv_add(venv_path, requirements_sha256, wheelhouse, find_links, check, as_json) -> None:
    """Install rig-built wheels into a stack venv, hash-checked; a no-op when already there."""
    from rig.python.venv import add

    emit(add(venv_path, wheelhouse, requirements_sha256, check, find_links), as_json)
