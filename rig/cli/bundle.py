"""`rig plumbing bundle`: the engine zipapp roles run on targets."""
from __future__ import annotations

import click

from rig.cli.common import DEFAULT_BUNDLE, check_option, emit, json_option, output_option
from rig.engine.bundle import build


@click.command()
@output_option("Where to write rig.pyz.", default=DEFAULT_BUNDLE, show_default=True)
@check_option
@json_option
def bundle(output, check, as_json) -> None:
    """Build the engine zipapp that roles run on targets (needs only python3 there); a no-op when current."""
    emit(build(output, check=check), as_json)
