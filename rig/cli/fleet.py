"""`rig fleet`: what a fleet's hosts reported, read together on the controller."""
from __future__ import annotations

import click

from rig.cli.common import emit, group, json_option, judged
from rig.cli.types import OutDir
from rig.serving import fleet as fleets


@group()
def fleet() -> None:
    """A fleet's reports, read together on the controller."""


@fleet.command("summary")
@click.argument("reports", type=OutDir(fleets.OUTPUTS))  # summary.md is written there: the output rule
@json_option
def fleet_summary(reports, as_json) -> None:
    """Tabulate REPORTS/HOST/prove.json of every host into REPORTS/summary.md.

    REPORTS is where the hosts' `rig prove` reports were fetched, one
    directory per host (playbooks/prove.yml fetches them). One line per host:
    its verdict, its smallest numerics margin, its sglang and its failed
    steps; a report that is missing or unreadable fails its host. Exit 1
    unless every host passed.
    """
    table = fleets.summary(reports)
    emit(table, as_json)
    judged(table["ok"])
