"""`rig plumbing bundle`: the engine zipapp roles run on targets."""
from __future__ import annotations

import click

from rig.cli.common import DEFAULT_BUNDLE, emit, json_option


@click.command()
@click.option("--out", default=DEFAULT_BUNDLE, show_default=True, help="Where to write rig.pyz.")
@json_option
def bundle(out, as_json) -> None:
    """Build the engine zipapp that roles run on targets (needs only python3 there)."""
    from rig.engine.bundle import build

    emit(build(out), as_json)
