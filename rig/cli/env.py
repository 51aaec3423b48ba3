"""The `rig env` group: the CUDA environment module of a stack's venv."""
from __future__ import annotations

import click

from rig.cli.common import (
    check_option,
    emit,
    group,
    json_option,
    need_stack,
    one_venv_change,
    prefix_option,
    stack_option,
    venv_of,
    venv_option,
)
from rig.core import RigError
from rig.core.documents import dump_json, parse_json
from rig.core.schema import Field, distribution
from rig.python.runtime_env import environment, hook, install, remove, render
from rig.stack.spec import load


@group("env")
def env_group() -> None:
    """The CUDA 13 environment every process of the stack's venv starts with (a sitecustomize)."""


def _env_source(func):
    func = click.option("--env-json", metavar="JSON", help="The environment as `rig env show --json` prints it "
                        "(roles pass this; default: from --stack).")(func)
    func = stack_option(required=False, help="Render the stack's environment section, CUDA version and archs "
                        "(unless --env-json is given).")(func)
    return prefix_option(func)


def _environment(stack_path: str, env_json: str | None, prefix: str) -> tuple[dict, str]:
    """(environment, stack name) from a stack file, or from the JSON a role passes."""
    if env_json:
        spec = Field(dict, fields={"pinned": Field(dict, required=True, values=Field()),
                                   "defaults": Field(dict, required=True, values=Field()),
                                   "home": Field(dict, default={}, values=Field()),
                                   "stack": Field(required=True, check=distribution)})
        try:
            data = parse_json(env_json, "--env-json", spec)
        except RigError as exc:
            raise RigError(f"--env-json is not what `rig env show --json` prints: {exc}") from exc
        return {"pinned": data["pinned"], "defaults": data["defaults"], "home": data["home"]}, data["stack"]
    stack = load(need_stack(stack_path))
    return environment(stack, prefix), stack["name"]


@env_group.command("show")
@_env_source
@json_option
def env_show(stack_path, env_json, prefix, as_json) -> None:
    """Print the sitecustomize module a stack renders (or its variables as JSON)."""
    env, name = _environment(stack_path, env_json, prefix)
    click.echo(dump_json({**env, "stack": name}, "the environment", sort_keys=True) if as_json else render(env, name))


@env_group.command("install")
@venv_option(help="The stack's venv (never the system Python).")
@_env_source
@check_option
@json_option
def env_install(venv_path, stack_path, env_json, prefix, check, as_json) -> None:
    """Write the environment module and the .pth that loads it into the venv; a no-op when current.

    Any sitecustomize already there keeps running, after rig's module.
    """
    env, name = _environment(stack_path, env_json, prefix)
    emit(install(venv_of(venv_path, stack_path), env, name, check), as_json)


@env_group.command("remove")
@one_venv_change()
def env_remove(venv_path, stack_path, check, as_json) -> None:
    """Take rig's environment module out of the venv."""
    emit(remove(venv_of(venv_path, stack_path), check), as_json)


@env_group.command("hook")
@one_venv_change(help="The venv directory about to be packed (rig venv pack) for a read-only image.")
def env_hook(venv_path, stack_path, check, as_json) -> None:
    """Ready a venv for packing into a read-only image: a .pth that reads the environment from the venv path's
    own writable site directory, and rig's environment module taken out (each host writes its own there).
    """
    emit(hook(venv_of(venv_path, stack_path), check), as_json)
