"""`rig smoke` and `rig bench`: prove and measure a running server."""
from __future__ import annotations

import click

from rig.cli.common import (
    FILE,
    SERVER_URL,
    Number,
    PathArg,
    Seconds,
    Url,
    emit,
    json_option,
    judged,
    out_option,
    plan_options,
    prompts_option,
    refuse_unused,
    stack_option,
)
from rig.core import RigError
from rig.core.schema import validate
from rig.serving import bench as serve_bench
from rig.serving import smoke as smoking
from rig.serving.measure.plan import plan_from
from rig.serving.sglang_api import KEY_ENV
from rig.serving.workload import Workload
from rig.stack.spec import SCHEMA, load

api_key_env_option = click.option("--api-key-env", default=KEY_ENV, show_default=True,
                                  help="Environment variable holding the server's API key (sent, never printed).")


@click.command()
@click.option("--url", type=Url(), default=SERVER_URL, show_default=True, help="The SGLang server.")
@click.option("--start-timeout", "--timeout", "timeout", type=Seconds(), default=900, show_default=True,
              help="Seconds to wait for the server to start: /health_generate answering 200 (a big model loads "
                   "in about 10 minutes; --timeout is the old name).")
@click.option("--max-tokens", type=Number(int), default=64, show_default=True, help="Tokens per test completion.")
@click.option("--log", "log_path", type=FILE, metavar="FILE",
              help="The server's log file: its tail is shown when the server fails.")
@click.option("--speculation/--no-speculation", default=None,
              help="Require (or not) speculative decoding; default: as /server_info says the server runs.")
@click.option("--health-only", is_flag=True, help="Only wait for /health_generate (a service's start gate).")
@click.option("--pid", type=Number(int, 1),
              help="The server's process (systemd: $MAINPID): stop waiting once it has exited.")
@click.option("--request-timeout", type=Seconds(), default=300, show_default=True,
              help="Seconds to wait for one test completion.")
@api_key_env_option
@json_option
def smoke(url, timeout, max_tokens, log_path, speculation, health_only, pid, request_timeout, api_key_env,
          as_json) -> None:
    """Wait for the server, send a few prompts, check the completions and the accept length.

    Each completion must be non-empty with completion_tokens matching its
    output_ids. When speculation is configured, the accept length comes from
    meta_info (spec_accept_length, or completion_tokens / spec_verify_ct), else
    from /server_info; no speculative request at all is a failure. Exit 1 on a
    failed check, 2 when the server does not come up or answer.
    """
    if health_only:
        refuse_unused("--health-only", "url", "timeout", "log_path", "pid", "api_key_env", "health_only")
        waited = smoking.wait_healthy(url, timeout, log_path, api_key_env, pid=pid)
        emit({"ok": True, "url": url, "health_wait_s": round(waited, 1), "msg": f"{url} healthy after {waited:.0f} s"},
             as_json)
        return
    result = smoking.run(url, timeout, max_tokens, log_path, speculation, api_key_env, pid, request_timeout)
    emit(result, as_json)
    judged(result["ok"])


@click.command()
@click.option("--url", type=Url(), default=SERVER_URL, show_default=True, help="The server under test (EAGLE-3).")
@click.option("--baseline-url", type=Url(), help="A server without speculation, measured with the same plan.")
@click.option("--baseline-results", type=PathArg(exists=True, dir_okay=False),
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
