"""`rig prove`: the box proves itself, numerics included."""
from __future__ import annotations

import socket

import click

from rig.cli.common import (
    api_key_env_option,
    check_option,
    emit,
    json_option,
    judged,
    junit_option,
    moved_option,
    out_option,
    port_option,
    stack_option,
    tp_option,
    venv_of,
    venv_option,
    write_junit,
)
from rig.cli.types import Choice, OutDir
from rig.core import outdir
from rig.core.check import Check
from rig.serving import prove as proving
from rig.stack.spec import load


@click.command()
@stack_option(help="The stack: its CUDA and archs for the doctor, its server line for the servers.")
@venv_option(help="The venv whose sglang serves.")
@tp_option(help="The TP size to prove beside 1 (default: the stack's server.tp).")
@out_option("prove-results", "prove.json, report.md, prove.png, logs/ and (without --models) models/.",
            proving.OUTPUTS)
@click.option("--models", "models_dir", type=OutDir(), metavar="DIR",
              help="Where the numerics test model is written (default: OUT/models).")
@click.option("--skip", multiple=True, type=Choice(proving.STEPS),
              help="Leave out a step (repeat); it is reported as skipped, never as passed.")
@port_option(help="Serve on this port instead of the stack's: a host being upgraded proves where its balancer, "
                  "which checks the stack's port, sends no traffic.")
@moved_option("--summary", "fleet summary", "0.2.0")
@api_key_env_option
@junit_option
@check_option
@json_option
def prove(stack_path, venv_path, tp, out_dir, models_dir, skip, port, api_key_env, junit, check, as_json) -> None:
    """Prove this box: doctor, all-reduce probe, numerics test model, then the baseline and EAGLE-3 servers.

    Each server comes from the stack's own line with the numerics test model
    (rig testmodel --kind numerics) in place of the real one, at TP 1 and at
    the stack's TP where the box has the GPUs, one at a time on the stack's
    port: health-gated by rig smoke, asked for the numerics prompts' greedy
    tokens (the baseline must give the rule's tokens, EAGLE-3 the baseline's),
    benchmarked briefly, stopped. One report: prove.json, report.md and a plot,
    with the versions that ran and each step's verdict and time. Exit 0 only
    when no step fails; a step that cannot run here is skipped with its
    reason. --check renders the server lines and starts nothing. Interrupted,
    it stops every server it started and writes what it has. --junit writes
    the steps as JUnit test cases for CI (a skipped step is skipped there too).
    """
    if junit and check:
        raise click.UsageError("--junit has no effect with --check (nothing is proved): leave one out")
    if junit:  # written after the record: never over it
        outdir.apart(junit, "--junit", out_dir, proving.OUTPUTS)
    stack = load(stack_path)
    if port:
        stack["server"]["port"] = port
    result = proving.run(stack, stack_path, venv_of(venv_path, stack_path), out_dir, tp, tuple(skip), models_dir,
                         api_key_env, check)
    if junit:
        write_junit(junit, [Check(**step) for step in result["steps"]], f"rig prove {socket.gethostname()}")
    emit(result, as_json)
    judged(result["ok"])
