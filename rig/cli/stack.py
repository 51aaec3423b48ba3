"""The `rig stack` group: read and validate stack files."""
from __future__ import annotations

import click

from rig.cli.common import DEFAULT_STACK, json_option, to_file_or_stdout
from rig.core.documents import dump_json, yaml_dump


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
    click.echo(dump_json(data, "the stack", indent=2) if as_json else yaml_dump(data))


@stack.command("vars")
@click.argument("path", default=DEFAULT_STACK)
@click.option("--out", type=click.Path(dir_okay=False), help="Write to this file instead of stdout.")
@click.option("--keep", is_flag=True, help="Write to the controller's cache under stack-vars/, named by the "
              "content's sha256, and print that path (playbooks/stack.yml): runs at once write the same bytes "
              "to the same name, and no run has a scratch file to remove.")
def stack_vars(path: str, out: str | None, keep: bool) -> None:
    """Print the Ansible role variables a stack implies (JSON)."""
    from rig.python.stack_vars import ansible_vars
    from rig.stack.spec import load

    if out and keep:
        raise click.UsageError("give --out or --keep, not both")
    text = dump_json(ansible_vars(load(path), path), "the stack's variables", indent=2) + "\n"
    if keep:  # confined: a link planted at stack-vars/ is never written through
        from rig.core.defaults import cache_dir
        from rig.core.fs import atomic_write, confined, sha256_data

        kept = confined(cache_dir(), f"stack-vars/{sha256_data(text)}.json", "the stack's kept variables", follow=False)
        click.echo(atomic_write(kept, text, 0o600))  # the stack's environment may say more than others should read
    else:
        to_file_or_stdout(text, out)
