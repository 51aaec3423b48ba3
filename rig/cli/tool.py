"""`rig plumbing tool`: the path of an NVIDIA tool rig uses."""
from __future__ import annotations

import click

from rig.cli.common import cache_option


@click.command("tool")
@click.argument("name", type=click.Choice(["cuobjdump"]))
@cache_option()
def tool(name, cache) -> None:
    """Print the path of an NVIDIA tool rig uses, fetching it from its wheel into the cache if needed."""
    from rig.python.tools import fetch_tool

    click.echo(fetch_tool(name, cache))
