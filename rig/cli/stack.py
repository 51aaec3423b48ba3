"""The `rig stack` group: read and validate stack files."""
from __future__ import annotations

import json

import click

from rig.cli.common import DEFAULT_STACK, json_option, to_file_or_stdout
from rig.core.documents import yaml_dump


@click.group()
def stack() -> None:
    """Read and validate stack files."""


@stack.command("show")
@click.argument("path", default=DEFAULT_STACK)
@json_option
def stack_show(path: str, as_json: bool) -> None:
    """Validate a stack file and print it with defaults filled in."""
    from rig.stack.spec import load

    data = load(path)
    click.echo(json.dumps(data, indent=2) if as_json else yaml_dump(data))


@stack.command("vars")
@click.argument("path", default=DEFAULT_STACK)
@click.option("--out", type=click.Path(dir_okay=False), help="Write to this file instead of stdout.")
def stack_vars(path: str, out: str | None) -> None:
    """Print the Ansible role variables a stack implies (JSON)."""
    from rig.python.stack_vars import ansible_vars
    from rig.stack.spec import load

    to_file_or_stdout(json.dumps(ansible_vars(load(path), path), indent=2) + "\n", out)
