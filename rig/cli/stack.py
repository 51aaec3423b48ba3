"""The `rig stack` group: read and validate stack files."""
from __future__ import annotations

from pathlib import Path

import click

from rig.cli.common import emit, group, json_option, output_option, stack_option, to_file_or_stdout
from rig.core import progress
from rig.core.defaults import cache_dir
from rig.core.documents import dump_json, yaml_dump
from rig.core.fs import atomic_write, confined, sha256_data
from rig.python.stack_vars import ansible_vars
from rig.stack.spec import load


@group()
def stack() -> None:
    """Read and validate stack files."""


@stack.command("show")
@stack_option(positional=True, help="The stack file to validate and print.")
@json_option
def stack_show(stack_path: str, as_json: bool) -> None:
    """Validate a stack file and print it with defaults filled in; stderr says which file was read (a link
    resolved: stacks/default.yml names another)."""
    data = load(stack_path)
    resolved = Path(stack_path).resolve()
    progress(f"read {stack_path}" + (f" (a link to {resolved})" if Path(stack_path).is_symlink() else ""))
    click.echo(dump_json(data, "the stack", indent=2) if as_json else yaml_dump(data))


@stack.command("vars")
@stack_option(positional=True, help="The stack whose variables to print.")
@output_option()
@click.option("--keep", is_flag=True, help="Write to the controller's cache under stack-vars/, named by the "
              "content's sha256, and print that path (playbooks/stack.yml): runs at once write the same bytes "
              "to the same name, and no run has a scratch file to remove.")
@json_option
def stack_vars(stack_path: str, output: str | None, keep: bool, as_json: bool) -> None:
    """Print the Ansible role variables a stack implies (JSON).

    They are one JSON object with or without --json; with --keep, --json prints {"path": ...}.
    """
    if output and keep:
        raise click.UsageError("give --output or --keep, not both")
    text = dump_json(ansible_vars(load(stack_path), stack_path), "the stack's variables", indent=2) + "\n"
    if keep:  # confined: a link planted at stack-vars/ is never written through
        kept = confined(cache_dir(), f"stack-vars/{sha256_data(text)}.json", "the stack's kept variables", follow=False)
        path = atomic_write(kept, text, 0o600)  # the stack's environment may say more than others should read
        emit({"path": str(path), "msg": str(path)}, as_json)
    else:
        to_file_or_stdout(text, output)
