"""The `rig venv` group: the stack's virtualenv on a target."""
from __future__ import annotations

import click

from rig.cli.common import (
    DIR,
    FILE,
    Choice,
    check_option,
    emit,
    group,
    json_option,
    judged,
    stack_option,
    venv_of,
    venv_option,
)
from rig.python import lock as locking
from rig.python.installer import INSTALLERS
from rig.python.venv import add, install, verify


@group()
def venv() -> None:
    """The stack's virtualenv on a target, installed offline from a wheelhouse."""


@venv.command("install")
@venv_option()
@stack_option(required=False, help="The stack whose venv it is (when --venv is not given).")
@click.option("--lock", "lock_file", type=FILE, metavar="FILE",
              help="The stack's lock: with --find-links, pull everything from that URL, "
              "pip's wheel and requirements checked against the lock (hosts of a fleet).")
@click.option("--lock-hash", help="lock_hash of the lock being installed (without --lock).")
@click.option("--python-version", help="The lock's Python, checked against this host (without --lock).")
@click.option("--wheelhouse", "house", type=DIR, metavar="DIR", help="An exported wheelhouse dir (rig wheelhouse export).")
@click.option("--find-links", help="Take the wheels from this URL; the wheelhouse dir then needs only its "
              "requirements file and pip wheel (image builds), or none with --lock.")
@click.option("--installer", type=Choice(INSTALLERS), default="pip", show_default=True,
              help="uv (rig's pinned wheel, from the wheelhouse; about twice as fast) or pip (the lock's own).")
@click.option("--compile/--no-compile", "byte_compile", default=True, show_default=True,
              help="Byte-compile every module at install. A server whose account cannot write the venv needs it; "
                   "a throwaway venv that imports a few modules (a CI job's) starts sooner without it.")
@check_option
@json_option
def venv_install(venv_path, stack_path, lock_file, lock_hash, python_version, house, find_links, installer,
                 byte_compile, check, as_json) -> None:
    """Install a lock's wheels with --no-index --require-hashes; a no-op when current."""
    lock = locking.read(lock_file) if lock_file else None
    if lock is not None:
        lock_hash, python_version = lock["lock_hash"], lock["python"]
    elif not (lock_hash and python_version):
        raise click.UsageError("give --lock, or --lock-hash and --python-version")
    emit(install(venv_of(venv_path, stack_path), lock_hash, python_version, house, check, find_links, lock, installer,
                 byte_compile), as_json)


@venv.command("verify")
@venv_option()
@stack_option(required=False, help="The stack whose venv it is (when --venv is not given).")
@json_option
def venv_verify(venv_path, stack_path, as_json) -> None:
    """Check every locked package is installed at its locked version."""
    venv_path = venv_of(venv_path, stack_path)
    result = verify(venv_path)
    emit({**result, "msg": f"{venv_path}: {result['packages']} packages as locked" if result["ok"]
          else f"{venv_path}: differs from its lock: {result['mismatched']}"}, as_json)
    judged(result["ok"])


@venv.command("add")
@venv_option()
@stack_option(required=False, help="The stack whose venv it is (when --venv is not given).")
@click.option("--requirements-sha256", required=True, help="sha256 of the export's list (rig wheels export prints it).")
@click.option("--wheelhouse", type=DIR, metavar="DIR",
              help="The exported dir holding the wheels (needed only when something changes).")
@click.option("--find-links", help="Take the wheels from this URL; the wheelhouse dir then needs only its "
                                   "requirements file (image builds).")
@check_option
@json_option
def venv_add(venv_path, stack_path, requirements_sha256, wheelhouse, find_links, check, as_json) -> None:
    """Install rig-built wheels into a stack venv, hash-checked; a no-op when already there."""
    emit(add(venv_of(venv_path, stack_path), wheelhouse, requirements_sha256, check, find_links), as_json)
