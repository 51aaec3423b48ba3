"""`rig tune`: measure speculation on the box, derive a load-aware serving policy, confirm it."""
from __future__ import annotations

import click

from rig.cli import common as cli
from rig.cli.types import FILE, Number
from rig.core.schema import validate
from rig.serving import load_profile as loads
from rig.serving.measure.plan import plan_from
from rig.serving.tune import run as tuning
from rig.serving.workload import Workload
from rig.stack.spec import SCHEMA, load


@click.command()
@cli.stack_option(help="The stack: its server line, bench (levels, rounds, sampling) and tune sections.")
@cli.venv_option(help="The venv whose sglang serves.")
@cli.out_option("tune-results", "tune.json, report.md, tune.png, adaptive.json, proposed-stack.yml and logs/.",
                tuning.OUTPUTS)
@cli.prompts_option
@click.option("--request-rate", "request_rates", type=Number(float, many=True, letter="R"),
              help="Open-loop Poisson levels in requests/s, e.g. 2,8 (default: tune.request_rates), at most the "
                   "largest concurrency in flight.")
@click.option("--load-profile", "load_profile", type=FILE, metavar="FILE",
              help="Your server's load over time (its log's #running-req lines, a scrape of its "
                   "sglang:num_running_reqs metric, or {\"histogram\": {...}}): also name the one server that pays "
                   "best for it.")
@cli.plan_options()
@cli.api_key_env_option
@cli.check_option
@cli.json_option
def tune(stack_path, venv_path, out_dir, prompts_path, request_rates, load_profile, api_key_env, check, as_json,
         **given) -> None:
    """Find where EAGLE-3 pays on this box and how to serve so that it always does.

    One server at a time from the stack's own line (rig server args), each
    health-gated (rig smoke), measured, stopped, its log kept: per attention
    backend (server.attention_backends) the baseline and fixed EAGLE-3 at
    each of tune.steps, SGLang's step 0 where tune.step0 asks, each
    speculative server again uncapped where SGLang caps its running requests
    below its decode graph; then the policy derived from them (per level the
    best variant, ties to the simpler one; one choice everywhere is served as
    it is, choices that change with load become SGLang's adaptive config).
    The policy's server is measured again against the baseline and the
    per-level best. Sampling (--temperature, --top-p, or the stack's bench
    section) makes acceptance what a trained draft's is. --check renders
    every server line, prints the plan and its estimated time; nothing
    starts. Exit 1 when the policy is not confirmed within noise of the best
    at every level; every server rig started is stopped however the run ends.
    tune.json holds what was measured after each server (a run killed
    outright keeps those), and each round's numbers are in its progress line.
    """
    stack = load(stack_path)
    # the plan carries the levels (the options' or the stack's); the stack goes down as it was read
    if request_rates is not None:  # the limits of tune.request_rates, which the option stands in for
        request_rates = validate(request_rates, SCHEMA["tune"].fields["request_rates"], "--request-rate")
    plan = plan_from(stack["bench"], **{**given, "serial_runs": 1, "serial_tokens": 1},
                     request_rates=stack["tune"]["request_rates"] if request_rates is None else request_rates)
    workload = Workload.of(prompts_path, plan.max_tokens, plan.seed)
    profile = (load_profile, loads.load(load_profile)) if load_profile else None  # read before anything starts
    venv = cli.venv_of(venv_path, stack_path)
    result = tuning.run(stack, stack_path, venv, out_dir, plan, workload, api_key_env, check, profile)
    cli.emit(result, as_json)
    cli.judged(result["ok"])
