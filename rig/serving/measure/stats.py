"""One round's numbers from its requests, and one level's from its rounds (sglang.bench_serving's names)."""
from __future__ import annotations

import statistics
from collections.abc import Callable

from rig.core.numbers import mean
from rig.serving.measure.plan import Plan

PERCENTILES = (50, 90, 99)
# An open-loop level's output throughput is its arrival rate's for every server that keeps up (issue 71: at 20
# requests/s EAGLE-3 cut the median request from 965 ms to 618 ms, and both made 2.3k tok/s), so there output
# throughput is judged by what each request gets: its own output tokens/s, the median request's per round (a failed
# request's at 0). per_request_speed is the same speed's spread over every request of the level, as bench shows it.
REQUEST_SPEED = "request_speed"


def shown(value: float | None, digits: int) -> str:
    """A measured number in a report: DIGITS decimals, "-" where nothing was measured."""
    return "-" if value is None else f"{value:.{digits}f}"


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def spread(values: list[float]) -> dict:
    return {f"p{q}": percentile(values, q) for q in PERCENTILES}


def median(values: list) -> float | None:
    """The median of the rounds that measured something (None: a round with no request done); 0 is a
    measurement (no request within the SLOs), never dropped."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def ms_key(stat: str, name: str) -> str:
    """sglang.bench_serving's spelling of a latency in ms: STAT (mean, median, p90, p99) of NAME (ttft, ...)."""
    return f"{stat}_{name}_ms"


def _ms(name: str, values: list[float]) -> dict:
    if not values:
        return {}
    return {ms_key("mean", name): statistics.fmean(values) * 1000, ms_key("median", name): statistics.median(values) * 1000,
            **{ms_key(f"p{q}", name): (percentile(values, q) or 0) * 1000 for q in (90, 99)}}


def summarize(results: list[dict], max_concurrency: int, plan: Plan | None = None) -> dict:
    """RESULTS (requests kept at most MAX_CONCURRENCY in flight) as one level of the run record
    (rig.serving.measure.record.LEVEL)."""
    good = [r for r in results if r["ok"]]
    errors = sorted({r["error"] for r in results if not r["ok"]})
    failed = len(results) - len(good)
    level = {"max_concurrency": max_concurrency, "requests": len(results), "completed": len(good),
             "failed": failed, "errors": errors[:5]}
    if not good:
        return level
    span = max(r["end"] for r in good) - min(r["start"] for r in good)
    per_second = (lambda x: x / span) if span > 0 else (lambda x: None)
    level.update({**_rates(good, span, per_second), **_latencies(good),
                  "accept_length": mean([r["accept_length"] for r in good if r["accept_length"]]),
                  # a failed request got nothing: it counts, at 0, where throughput counted it by its missing tokens
                  REQUEST_SPEED: percentile([r["speed"] for r in good if r["speed"]] + [0.0] * failed, 50)})
    if plan and (plan.slo_ttft_ms or plan.slo_tpot_ms):
        level["goodput"] = per_second(len(_within_slo(good, plan)))
    return level


def _rates(good: list[dict], span: float, per_second: Callable[[float], float | None]) -> dict:
    """The completed requests' tokens and throughputs over SPAN seconds."""
    tokens = sum(r["tokens"] for r in good)
    return {
        "total_output_tokens": tokens, "duration": span,
        "output_throughput": per_second(tokens),
        "total_throughput": per_second(tokens + sum(r.get("prompt_tokens", 0) for r in good)),
        "request_throughput": per_second(len(good)),
        # the mean in flight (Little's law; sglang.bench_serving's `concurrency`): the running batch the server saw
        "concurrency": per_second(sum(r["e2e"] for r in good)),
        "per_request_speed": spread([r["speed"] for r in good if r["speed"]]),
    }


def _latencies(good: list[dict]) -> dict:
    """The completed requests' latency statistics, in sglang.bench_serving's names."""
    return {**_ms("ttft", [r["ttft"] for r in good]), **_ms("tpot", [r["tpot"] for r in good if r["tpot"] is not None]),
            **_ms("itl", [gap for r in good for gap in r.get("itl", [])]),
            **_ms("e2e_latency", [r["e2e"] for r in good])}


def _within_slo(good: list[dict], plan: Plan) -> list[dict]:
    """The completed requests within the plan's TTFT and TPOT objectives (those it sets)."""
    return [r for r in good if (not plan.slo_ttft_ms or r["ttft"] * 1000 <= plan.slo_ttft_ms) and
            (not plan.slo_tpot_ms or (r["tpot"] or 0) * 1000 <= plan.slo_tpot_ms)]


def aggregate(rounds: list[list[dict]], c: int, plan: Plan, server_accept: list[float | None]) -> dict:
    """One level over its rounds: latencies over all requests, output throughput, the plan's metric and the median
    request's speed per round (round_NAME) and their medians (NAME); the server's own accept length per round (its
    counters are flushed before each)."""
    level = summarize([r for results in rounds for r in results], c, plan)
    per_round = [summarize(results, c, plan) for results in rounds]
    for metric in dict.fromkeys(("output_throughput", plan.metric, REQUEST_SPEED)):
        level[f"round_{metric}"] = [r.get(metric) for r in per_round]
        level[metric] = median(level[f"round_{metric}"])
    level["server_accept_length"] = mean([a for a in server_accept if a])
    level["round_server_accept_length"] = server_accept
    if level.get("total_output_tokens") and level["accept_length"] is None:
        level["accept_length"] = level["server_accept_length"]
    return level
