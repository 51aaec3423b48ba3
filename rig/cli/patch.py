"""The `rig patch` group: source patches on an installed environment."""
from __future__ import annotations

import click

from rig.cli.common import (
    check_option,
    emit,
    force_option,
    group,
    json_option,
    opt_in_option,
    patches_option,
    python_option,
    stack_option,
    venv_option,
)
from rig.patches.actions import apply, revert
from rig.patches.env import environment
from rig.patches.patchset import asked
from rig.patches.report import status, table


@group()
def patch() -> None:
    """SM120 / EAGLE-3 source patches on an installed environment.

    Each patch in patches/ knows the package versions that need it and those whose
    upstream has it; status says applied, needed, upstream, not-applicable,
    drifted (the code it anchors on has changed) or opt-in (applied only where a
    stack's patches.opt_in or --opt-in asks for its feature). apply keeps the originals in the
    environment, and revert restores them byte for byte.
    """


_opt_in = opt_in_option()


def _patch_target(func):
    func = patches_option()(func)
    func = stack_option(required=False, help="The stack whose patches.opt_in to ask for, and whose venv to use when neither "
                                                "--venv nor --python is given.")(func)
    func = python_option(help="The environment's Python interpreter.")(func)
    func = venv_option(help="The environment: a virtualenv directory (or --python).")(func)
    return json_option(func)


@patch.command("status")
@_patch_target
@_opt_in
def patch_status(venv_path, python, stack_path, patch_dir, opt_in, as_json) -> None:
    """Say, for every patch, whether this environment needs it."""
    env, found, opted = environment(venv_path, python, stack_path, patch_dir, opt_in)
    rows = status(env, found, asked(found, opted))
    emit({"changed": False, "patches": rows, "msg": table(rows)}, as_json)


@patch.command("apply")
@_patch_target
@_opt_in
@check_option
@force_option(help="Act on package versions no patch knows, skipping drifted patches.")
def patch_apply(venv_path, python, stack_path, patch_dir, opt_in, as_json, check, force) -> None:
    """Apply every needed patch, and the opt-in ones asked for; a no-op when all are applied or upstream.

    An opt-in patch applied before and no longer asked for is taken out (its files go back to their originals)."""
    env, found, opted = environment(venv_path, python, stack_path, patch_dir, opt_in)
    result = apply(env, found, check=check, force=force, opted=asked(found, opted))
    if check and not as_json and result["diff"]:
        click.echo(result["diff"], nl=False)
    emit(result, as_json)


@patch.command("revert")
@_patch_target
@check_option
@force_option(help="Restore the originals even over files changed since.")
def patch_revert(venv_path, python, stack_path, patch_dir, as_json, check, force) -> None:
    """Put back every file rig patched in this environment, byte for byte."""
    env, _, _ = environment(venv_path, python, stack_path, patch_dir)
    emit(revert(env, check=check, force=force), as_json)
