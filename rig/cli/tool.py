"""`rig plumbing tool`: the path of an NVIDIA tool rig uses."""
from __future__ import annotations

import click

from rig.cli.common import cache_option, emit, json_option
from rig.cli.types import Choice
from rig.python.tools import fetch_tool


@click.command("tool")
@click.argument("name", type=Choice(["cuobjdump"]))
@cache_option()
@json_option
def tool(name, cache, as_json) -> None:
    """Print the path of an NVIDIA tool rig uses, fetching it from its wheel into the cache if needed."""
    path = str(fetch_tool(name, cache))
    emit({"tool": name, "path": path, "msg": path}, as_json)
