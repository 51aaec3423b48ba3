"""`rig tune`: measure speculation on the box, derive a load-aware serving policy, confirm it."""
from __future__ import annotations

import click

from rig.cli.common import Seconds, check_option, emit, json_option, judged, stack_option, venv_option
from rig.cli.smoke import api_key_env_option
from rig.core import RigError


def _numbers(text: str | None, option: str, kind: type, low: float) -> list | None:
    """Comma-separated plain decimal numbers (no `1_0`, no other scripts' digits), each from LOW to 100000."""
    if text is None:
        return None
    import re

    items = text.split(",")
    if not all(re.fullmatch(r"[0-9]+" if kind is int else r"[0-9]+(\.[0-9]+)?", v) for v in items):
        raise RigError(f"{option} {text!r}: give comma-separated numbers, e.g. 1,4,16")
    values = [kind(v) for v in items]
    if not all(low <= v <= 100_000 for v in values):
        raise RigError(f"{option} {text!r}: each value must be from {low:g} to 100000")
    return values


@click.command()
@stack_option(help="The stack: its server line, bench (levels, rounds, min_seconds) and tune sections.")
@venv_option(help="The venv whose sglang serves (default: the stack's).")
@click.option("--out", "out_dir", default="tune-results", show_default=True,
              help="tune.json, report.md, tune.png, adaptive.json, proposed-stack.yml and logs/.")
@click.option("--prompts", "prompts_path", type=click.Path(dir_okay=False),
              help="A JSONL ({\"prompt\", \"max_tokens\"} per line) or ShareGPT JSON prompt file (default: rig's).")
@click.option("--concurrency", help="Closed-loop levels, e.g. 1,4,16,64 (default: bench.concurrency).")
@click.option("--request-rate", "request_rates", help="Open-loop Poisson levels in requests/s, e.g. 2,8 "
              "(default: tune.request_rates), at most the largest concurrency in flight.")
@click.option("--max-tokens", type=click.IntRange(1, 1_000_000), help="Output tokens per request (default: the stack's).")
@click.option("--rounds", type=click.IntRange(1, 100), help="Rounds per level (default: bench.rounds).")
@click.option("--min-seconds", type=click.FloatRange(0, 3600), help="Each round lasts at least this long "
              "(default: bench.min_seconds).")
@click.option("--min-requests", type=click.IntRange(1, 100_000), default=16, show_default=True,
              help="Each round sends at least max(this, 2C) requests.")
@click.option("--slo-ttft-ms", type=click.FloatRange(0, 3_600_000), default=0, help="Goodput SLO on TTFT (0: none).")
@click.option("--slo-tpot-ms", type=click.FloatRange(0, 3_600_000), default=0, help="Goodput SLO on TPOT (0: none).")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True,
              help="Poisson arrivals and the prompt file's order.")
@click.option("--read-timeout", type=Seconds(), default=300, show_default=True,
              help="Seconds without a byte before a request counts as failed.")
@api_key_env_option
@check_option
@json_option
def tune(stack_path, venv_path, out_dir, prompts_path, concurrency, request_rates, max_tokens, rounds, min_seconds,
         min_requests, slo_ttft_ms, slo_tpot_ms, seed, read_timeout, api_key_env, check, as_json) -> None:
    """Find where EAGLE-3 pays on this box and how to serve so that it always does.

    One server at a time from the stack's own line (rig server args), each
    health-gated (rig smoke), measured, stopped, its log kept: the baseline,
    fixed EAGLE-3 at each of tune.steps, then the policy derived from them
    (per level the best variant, ties to the simpler one; one choice
    everywhere is served as it is, choices that change with load become
    SGLang's adaptive config). The policy's server is measured again against
    the baseline and the per-level best. --check renders every server line
    and prints the plan; nothing starts. Exit 1 when the policy is not
    confirmed within noise of the best at every level; every server rig
    started is stopped however the run ends.
    """
    from rig.serving import tune as tuning
    from rig.serving.workload import Workload
    from rig.serving.workload import load as load_prompts
    from rig.stack.spec import load

    stack = load(stack_path)
    if (levels := _numbers(concurrency, "--concurrency", int, 1)) is not None:
        stack["bench"]["concurrency"] = levels
    if (rates := _numbers(request_rates, "--request-rate", float, 0.001)) is not None:
        stack["tune"]["request_rates"] = rates
    plan = tuning.plan_of(stack, max_tokens=max_tokens, rounds=rounds, min_seconds=min_seconds,
                          min_requests=min_requests, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, seed=seed,
                          read_timeout=read_timeout)
    workload = Workload(load_prompts(prompts_path, plan.max_tokens) if prompts_path else None, plan.max_tokens, seed)
    result = tuning.run(stack, stack_path, venv_path or stack["venv"], out_dir, plan, workload, api_key_env, check)
    emit(result, as_json)
    judged(result["ok"])
