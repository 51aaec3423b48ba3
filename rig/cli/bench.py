"""`rig bench`: measure a running server against a baseline."""
from __future__ import annotations

import click

from rig.cli.common import (
    api_key_env_option,
    emit,
    json_option,
    judged,
    out_option,
    plan_options,
    prompts_option,
    stack_option,
    url_option,
)
from rig.cli.types import PathArg, Url
from rig.core import RigError
from rig.core.schema import validate
from rig.serving import bench as serve_bench
from rig.serving.measure.plan import plan_from
from rig.serving.workload import Workload
from rig.stack.spec import SCHEMA, load


@click.command()
@url_option(help="The server under test (EAGLE-3).")
@click.option("--baseline-url", type=Url(), help="A server without speculation, measured with the same plan.")
@click.option("--baseline-results", type=PathArg(exists=True, dir_okay=False), metavar="FILE",
              help="results.json of an earlier run against the baseline (when both cannot run at once).")
@stack_option(required=False, help="Plan defaults: its bench section (none found: the schema's defaults).")
@prompts_option
@plan_options(serial=True)
@out_option("bench-results", "results.json, report.md and the plots.", serve_bench.OUTPUTS)
@api_key_env_option
@json_option
def bench(url, baseline_url, baseline_results, stack_path, prompts_path, out_dir, api_key_env, as_json,
          **given) -> None:
    """Benchmark EAGLE-3 against a baseline: serial runs, then a concurrency sweep.

    Reports total and per-request tokens/s, TTFT, TPOT and latency at
    p50/p90/p99 and the accept length per level (each request's and the
    server's own), at the plan's temperature (greedy by default; sampling
    makes acceptance what a trained draft's is), and, with a baseline, the
    highest concurrency at which EAGLE-3 still wins. Each level runs in
    rounds with the two servers interleaved; a level is won or lost only when
    every round agrees, else it is "within noise". A plan that cannot fit the
    server's context length is refused before anything is measured, a URL
    where nothing answers before anything is written. Refused and failed
    requests are recorded with their reason, not retried; when a server
    stops answering, what was measured is still written. Exit 1 when any
    request failed, a run stopped early or measured nothing.
    """
    if baseline_url and baseline_results:
        raise RigError("give --baseline-url or --baseline-results, not both")
    section = load(stack_path)["bench"] if stack_path else validate({}, SCHEMA["bench"], "bench")
    plan = plan_from(section, **given)
    summary = serve_bench.run(url, plan, out_dir, baseline_url, baseline_results, api_key_env,
                              Workload.of(prompts_path, plan.max_tokens, plan.seed))
    emit(summary, as_json)
    judged(summary["ok"])
