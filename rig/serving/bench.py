"""`rig bench`: EAGLE-3 against a baseline server, serially and across concurrency.

Two measurements, as the seeds made them by hand:
- serial: N runs of one long generation, tokens/s per run (median, range);
- a concurrency sweep: at each level C, at least max(min_requests, 2C) streamed requests
  kept C at a time, after a warm-up and a /flush_cache (which also resets SGLang's
  acceptance counters). Per level: total output tokens/s, per-request tokens/s, TTFT,
  TPOT and end-to-end latency at p50/p90/p99, the accept length (per request and the
  server's own), at the plan's temperature and top_p.

The measuring itself is rig.serving.measure's (plan, load, stats, sweep, verdict, record):
this module composes it and writes the report. Noise must not decide the crossover: a
level counts as won or lost only when the EAGLE-3/baseline ratio of every round is on the
same side of 1; otherwise it is "within noise". A plan that cannot fit a server's context
is refused before anything is measured, and a URL where nothing answers before anything
is written; what was measured is written however the run ends.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rig.core import RigError, outdir, progress
from rig.core.markdown import cell, table
from rig.core.schema import Field
from rig.serving.measure.plan import Plan, check_fits
from rig.serving.measure.record import FORMAT_FIELD, RUN, read, recorded, rounds_of
from rig.serving.measure.stats import ms_key, shown
from rig.serving.measure.sweep import Server, measure
from rig.serving.measure.verdict import crossover, nothing_measured
from rig.serving.sglang_api import KEY_ENV, call
from rig.serving.workload import Workload

# what a run writes into --out, each refused up front where a directory stands in its place
OUTPUTS = ("results.json", "report.md", "throughput.png", "per_request.png")


def report_markdown(result: dict) -> str:
    plan = result["plan"]
    lines = ["# rig bench", "", f"Temperature {plan.get('temperature', 0)}, top_p {plan.get('top_p', 1)}; "
             f"{plan.get('rounds')} round(s) per level. Accept length: per request (meta_info) / the server's own "
             "counters over the level.", ""]
    for run in result["runs"]:
        lines += [f"## {cell(run['label'])}: {cell(run['url'])} (speculative_algorithm: "
                  f"{cell(run['speculative_algorithm'])})", ""]
        serial = run["serial"]
        if serial and serial["output_throughput"]:
            speeds = [v for v in rounds_of(serial, "output_throughput") if v is not None]
            lines += [f"Serial, {serial['requests']} runs: median {serial['output_throughput']:.1f} tok/s "
                      f"(range {shown(min(speeds), 1)}-{shown(max(speeds), 1)})", ""]
        lines += table(("C", "requests", "failed", "output tok/s", "per-request tok/s p50",
                        "TTFT median/p90/p99 (ms)", "TPOT median (ms)", "e2e median/p90/p99 (ms)", "accept length"),
                       ((lv["max_concurrency"], lv["requests"], lv["failed"], shown(lv.get("output_throughput"), 1),
                         shown((lv.get("per_request_speed") or {}).get("p50"), 1), _spread(lv, "ttft"),
                         shown(lv.get(ms_key("median", "tpot")), 1), _spread(lv, "e2e_latency"),
                         f"{shown(lv.get('accept_length'), 2)} / {shown(lv.get('server_accept_length'), 2)}")
                        for lv in run["levels"]))
        if run["stopped"]:
            lines += ["", f"**Stopped early:** {cell(run['stopped'])}"]
        lines.append("")
    if result.get("crossover"):
        x = result["crossover"]
        lines += ["## Crossover", "", "Median over rounds; the ratio's range is over the rounds, each measured "
                  "with the two servers interleaved. A level is won or lost only when the whole range is on one side of 1.",
                  ""]
        lines += table(("C", "EAGLE-3 tok/s", "baseline tok/s", "ratio (range)", "verdict"),
                       ((r["max_concurrency"], shown(r["eagle3"], 1), shown(r["baseline"], 1),
                         f"{r['ratio']:.2f} ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})", r["verdict"])
                        for r in x["levels"]))
        lines += ["", f"Highest concurrency where EAGLE-3 still wins: {x['highest_winning_concurrency']}",
                  "", f"**Recommendation:** {x['recommendation']}", ""]
    return "\n".join(lines) + "\n"


def _spread(level: dict, name: str) -> str:
    """NAME's median/p90/p99 in ms, as sglang.bench_serving names them in the level."""
    return "/".join(shown(level.get(ms_key(q, name)), 1) for q in ("median", "p90", "p99"))


def figures(result: dict) -> dict:
    """throughput.png and per_request.png: each run's line against concurrency."""
    from matplotlib.figure import Figure

    drawn: dict = {}
    measured = sorted({lv["max_concurrency"] for run in result["runs"] for lv in run["levels"]
                       if lv.get("output_throughput")})
    if not measured:  # nothing to draw: no empty plot stands for a measurement
        return drawn
    for name, title, value in (
            ("throughput.png", "Total output tokens/s", lambda lv: lv.get("output_throughput")),
            ("per_request.png", "Per-request tokens/s (p50)", lambda lv: (lv.get("per_request_speed") or {}).get("p50"))):
        fig = Figure(figsize=(7, 4.5))
        ax = fig.subplots()
        for run in result["runs"]:
            points = [(lv["max_concurrency"], value(lv)) for lv in run["levels"] if value(lv)]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=run["label"])
        ax.set_xscale("log", base=2)
        ax.set_xticks(measured, [str(c) for c in measured])  # the levels measured, as numbers people type
        ax.minorticks_off()
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel(title)
        ax.set_title(title + " vs concurrency")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # a run that measured nothing has no line to name
            ax.legend()
        fig.tight_layout()
        drawn[name] = fig
    return drawn


# results.json: the plan, each server's run record, the crossover
RESULTS = Field(dict, open=True, fields={"format": FORMAT_FIELD, "runs": Field(
    list, required=True, check=lambda v: None if v else "no runs", item=RUN)})


def _earlier(path: str) -> dict:
    """The first run of an earlier results.json, read through the run record (rig's older formats converted)."""
    try:
        earlier = read(path, "results.json", RESULTS)
    except RigError as exc:
        raise RigError(f"--baseline-results: {exc}: not a results.json of rig bench; give the results.json an "
                       "earlier `rig bench` wrote") from exc
    return {**earlier["runs"][0], "label": "baseline"}


def outcome(result: dict, files: list[str]) -> dict:
    """What a run came to: failed requests, runs stopped early, the crossover; "ok" only with none of the first two."""
    failed = sum(lv["failed"] for run in result["runs"] for lv in run["levels"]) + \
        sum(run["serial"]["failed"] for run in result["runs"] if run["serial"])
    stopped = [f"{run['label']}: {run['stopped']}" for run in result["runs"] if run["stopped"]]
    empty = [why for run in result["runs"] if (why := nothing_measured(run["label"], run["levels"]))]
    cross = result["crossover"]
    msg = "\n".join([f"wrote {', '.join(files)}",
                     *(f"STOPPED {s}" for s in stopped), *empty,
                     *([f"{failed} request(s) failed; the report lists why"] if failed else []),
                     *([cross["recommendation"]] if cross else [])])
    return {"ok": not (failed or stopped or empty), "files": files, "crossover": cross, "failed": failed, "stopped": stopped,
            "msg": msg}


def _answering(url: str, api_key_env: str) -> None:
    status, body = call(url, "/health", api_key_env=api_key_env)
    if status == 0:
        raise RigError(f"nothing answers at {url}/health ({body.decode(errors='replace')[:200]}): start the server "
                       "or give its address")


def run(url: str, plan: Plan, out: str | Path, baseline_url: str | None = None, baseline_results: str | None = None,
        api_key_env: str = KEY_ENV, workload: Workload | None = None) -> dict:
    out = outdir.results_dir(out, OUTPUTS)  # as tune's and prove's: before anything is read or measured
    earlier = _earlier(baseline_results) if baseline_results else None
    for address in filter(None, (url, baseline_url)):
        _answering(address, api_key_env)
    servers = [Server(url, "EAGLE-3", plan, api_key_env, workload)]
    if baseline_url:
        servers.append(Server(baseline_url, "baseline", plan, api_key_env, workload))
    notes = [n for s in servers if (n := check_fits(plan, s.label, s.info))]
    for note in notes:
        progress(note)
    result: dict[str, Any] = {"plan": plan.record(), "notes": notes, "crossover": None,
                              "runs": [s.run for s in servers] + ([earlier] if earlier else [])}
    with recorded(out, result, "results.json", RESULTS, report_markdown, figures) as written:
        measure(servers, plan.levels, serial=True)
        runs = result["runs"]
        result["crossover"] = crossover(runs[0], runs[1]) if len(runs) > 1 else None
    return outcome(result, written)
