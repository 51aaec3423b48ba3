"""`rig bench`: EAGLE-3 against a baseline server, serially and across concurrency.

Two measurements, as the seeds made them by hand:
- serial: N runs of one long generation, tokens/s per run (median, range);
- a concurrency sweep: at each level C, at least max(30, 2C) streamed requests
  kept C at a time, after a warm-up and a /flush_cache (which also resets
  SGLang's acceptance counters). Per level: total output tokens/s, per-request
  tokens/s, TTFT, TPOT and end-to-end latency at p50/p90/p99, accept length.

A failed request is recorded with its reason, never retried; when the server
stops answering, the run stops and what was measured so far is still written.
The client parses only the first and the last chunk of a stream in full:
SGLang's chunks carry the cumulative output, so parsing each would make the
client, not the server, the limit at high concurrency.
"""
from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rig import RigError, progress
from rig.sglang_api import accept_length, call, generate_body, headers, server_accept_length, server_info

PERCENTILES = (50, 90, 99)


@dataclass
class Plan:
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 5, 10, 30, 70, 100, 250])
    max_tokens: int = 512
    serial_runs: int = 10
    serial_tokens: int = 2048
    min_requests: int = 30
    warmup: int = 2
    read_timeout: float = 300.0  # seconds without a byte before a request counts as failed

    def requests_at(self, c: int) -> int:
        return max(self.min_requests, 2 * c)


class ServerDown(Exception):
    """Nothing answers at the URL any more: the run stops."""


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _spread(values: list[float]) -> dict:
    return {f"p{q}": percentile(values, q) for q in PERCENTILES}


def prompt(i: int) -> str:
    # distinct prompts, so the prefix cache cannot serve one request from another
    return f"Request {i}: write a long, detailed story about a lighthouse keeper number {i * 7919 % 10007}."


async def _events(response):
    """SSE events (the bytes after "data:"), however the chunks are cut; no line-length limit."""
    buffer = b""
    async for data in response.content.iter_any():
        buffer += data
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            if event.startswith(b"data:"):
                yield event[5:].strip()


async def _stream(session, url: str, body: dict) -> dict:
    """One streamed /generate: timings from the client's clock, counts from the last chunk."""
    import aiohttp

    start = time.perf_counter()
    first = last = ttft = None
    done = False
    try:
        async with session.post(url + "/generate", json=body) as response:
            if response.status != 200:
                return {"ok": False, "error": f"HTTP {response.status}: {(await response.text())[:200]}"}
            async for payload in _events(response):
                if payload == b"[DONE]":
                    done = True
                    break
                # a cheap shape check on every chunk; full parsing of the first and last only
                if not (payload.startswith(b"{") and payload.endswith(b"}")):
                    return {"ok": False, "error": f"malformed chunk: {payload[:80]!r}"}
                if first is None:
                    first, ttft = payload, time.perf_counter() - start
                last = payload
    except (aiohttp.ClientConnectorError, ConnectionRefusedError) as exc:
        raise ServerDown(str(exc)) from exc
    except asyncio.TimeoutError:
        return {"ok": False, "error": "no data within the read timeout"}
    except (aiohttp.ClientError, ConnectionError) as exc:
        return {"ok": False, "error": f"connection lost: {exc.__class__.__name__}: {exc}"}
    end = time.perf_counter()
    if not done or last is None:
        return {"ok": False, "error": "the stream ended before [DONE] (the server closed it)"}
    try:
        json.loads(first)
        final = json.loads(last)
        if "error" in final:
            return {"ok": False, "error": f"server error: {final['error']}"}
        meta = final["meta_info"]
        tokens = int(meta["completion_tokens"])
    except (ValueError, KeyError, TypeError) as exc:
        return {"ok": False, "error": f"malformed chunk: {exc.__class__.__name__}: {exc}"}
    e2e = end - start
    return {"ok": True, "tokens": tokens, "start": start, "end": end, "ttft": ttft, "e2e": e2e,
            "tpot": (e2e - ttft) / (tokens - 1) if tokens > 1 else None,
            "speed": tokens / e2e if e2e > 0 else None, "accept_length": accept_length(meta)}


def _session(plan: Plan, api_key_env: str, limit: int):
    import aiohttp

    return aiohttp.ClientSession(
        headers=headers(api_key_env),
        connector=aiohttp.TCPConnector(limit=limit, force_close=False),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=plan.read_timeout))


async def _run_requests(url: str, plan: Plan, api_key_env: str, bodies: list[dict], concurrency: int) -> list[dict]:
    """Keep `concurrency` requests in flight until all bodies are sent."""
    results: list[dict | None] = [None] * len(bodies)
    pending = iter(range(len(bodies)))
    down: list[str] = []

    async def worker(session) -> None:
        for i in pending:
            if down:
                results[i] = {"ok": False, "error": f"not sent: the server stopped answering ({down[0]})"}
                continue
            try:
                results[i] = await _stream(session, url, bodies[i])
            except ServerDown as exc:
                down.append(str(exc))
                results[i] = {"ok": False, "error": f"server unreachable: {exc}"}

    async with _session(plan, api_key_env, concurrency) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return results


def summarize(results: list[dict], concurrency: int) -> dict:
    good = [r for r in results if r["ok"]]
    errors = sorted({r["error"] for r in results if not r["ok"]})
    level = {"concurrency": concurrency, "requests": len(results), "ok": len(good),
             "failed": len(results) - len(good), "errors": errors[:5]}
    if not good:
        return level
    span = max(r["end"] for r in good) - min(r["start"] for r in good)
    tokens = sum(r["tokens"] for r in good)
    accepts = [r["accept_length"] for r in good if r["accept_length"]]
    level.update({
        "output_tokens": tokens, "duration_s": span,
        "throughput": tokens / span if span > 0 else None,
        "per_request_speed": _spread([r["speed"] for r in good if r["speed"]]),
        "ttft_s": _spread([r["ttft"] for r in good]),
        "tpot_s": _spread([r["tpot"] for r in good if r["tpot"] is not None]),
        "e2e_s": _spread([r["e2e"] for r in good]),
        "accept_length": statistics.fmean(accepts) if accepts else None,
    })
    return level


def _flush(url: str, api_key_env: str, wait: float = 60.0) -> None:
    """Empty the prefix cache and the acceptance counters; SGLang refuses (400) while requests run."""
    deadline = time.monotonic() + wait
    while True:
        status, body = call(url, "/flush_cache", body={}, api_key_env=api_key_env)
        if status in (200, 404):  # 404: a server without the endpoint; nothing to flush
            return
        if status == 0:
            raise ServerDown(body.decode(errors="replace"))
        if time.monotonic() > deadline:
            raise RigError(f"{url}/flush_cache kept answering HTTP {status}: {body[:200]!r}")
        time.sleep(0.5)


def run_server(url: str, plan: Plan, api_key_env: str = "SGLANG_API_KEY", label: str = "") -> dict:
    """The serial runs and the sweep against one server; a dead server ends it with what was measured."""
    url = url.rstrip("/")
    info = server_info(url, api_key_env)
    result = {"url": url, "label": label, "speculative_algorithm": info.get("speculative_algorithm"),
              "serial": None, "levels": [], "stopped": None}
    try:
        progress(f"{label or url}: warm-up ({plan.warmup} requests)")
        asyncio.run(_run_requests(url, plan, api_key_env,
                                  [generate_body(prompt(-i), 16, True) for i in range(plan.warmup)], 1))
        _flush(url, api_key_env)
        progress(f"{label or url}: serial, {plan.serial_runs} x {plan.serial_tokens} tokens")
        runs = asyncio.run(_run_requests(url, plan, api_key_env, [generate_body(prompt(10_000 + i), plan.serial_tokens, True)
                                                                   for i in range(plan.serial_runs)], 1))
        speeds = [r["speed"] for r in runs if r["ok"]]
        result["serial"] = {"runs": len(runs), "ok": len(speeds), "tok_s": speeds,
                            "median": statistics.median(speeds) if speeds else None,
                            "min": min(speeds, default=None), "max": max(speeds, default=None),
                            "errors": sorted({r["error"] for r in runs if not r["ok"]})[:5]}
        _down_if_all_failed(runs)
        for c in plan.concurrency:
            _flush(url, api_key_env)
            n = plan.requests_at(c)
            progress(f"{label or url}: concurrency {c}, {n} requests of {plan.max_tokens} tokens")
            bodies = [generate_body(prompt(c * 100_000 + i), plan.max_tokens, True) for i in range(n)]
            results = asyncio.run(_run_requests(url, plan, api_key_env, bodies, c))
            level = summarize(results, c)
            if level.get("output_tokens") and level["accept_length"] is None and result["speculative_algorithm"]:
                level["accept_length"] = server_accept_length(server_info(url, api_key_env))
            result["levels"].append(level)
            _down_if_all_failed(results)
    except ServerDown as exc:
        result["stopped"] = f"the server stopped answering: {exc}"
        progress(f"{label or url}: {result['stopped']}; keeping what was measured")
    return result


def _down_if_all_failed(results: list[dict]) -> None:
    if results and not any(r["ok"] for r in results):
        raise ServerDown(results[-1]["error"])


def crossover(eagle: dict, baseline: dict) -> dict:
    """The highest concurrency up to which EAGLE-3 out-generates the baseline at every level.

    Levels are compared by total output tokens/s; a win above the first loss is
    reported apart, as it is more likely noise than a second regime.
    """
    base = {lv["concurrency"]: lv.get("throughput") for lv in baseline["levels"]}
    rows = [{"concurrency": lv["concurrency"], "eagle3": lv["throughput"], "baseline": base[lv["concurrency"]],
             "ratio": lv["throughput"] / base[lv["concurrency"]], "eagle3_wins": lv["throughput"] > base[lv["concurrency"]]}
            for lv in eagle["levels"] if lv.get("throughput") and base.get(lv["concurrency"])]
    first_loss = next((i for i, r in enumerate(rows) if not r["eagle3_wins"]), len(rows))
    highest = rows[first_loss - 1]["concurrency"] if first_loss else None
    if not rows:
        advice = "no level has results from both servers; nothing to compare"
    elif highest is None:
        advice = "EAGLE-3 does not pay at any measured concurrency: serve without speculation"
    elif first_loss == len(rows):
        advice = f"EAGLE-3 pays at every measured concurrency (up to {highest}): serve with it"
    else:
        advice = (f"EAGLE-3 pays up to concurrency {highest}: serve with it where load stays at or below "
                  f"{highest} requests in flight, without it above")
    return {"highest_winning_concurrency": highest, "levels": rows, "recommendation": advice,
            "wins_after_a_loss": [r["concurrency"] for r in rows[first_loss:] if r["eagle3_wins"]]}


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report_markdown(result: dict) -> str:
    lines = ["# rig bench", ""]
    for run in result["runs"]:
        lines += [f"## {run['label']}: {run['url']} (speculative_algorithm: {run['speculative_algorithm']})", ""]
        serial = run["serial"]
        if serial and serial["median"]:
            lines += [f"Serial, {serial['runs']} runs: median {serial['median']:.1f} tok/s "
                      f"(range {serial['min']:.1f}-{serial['max']:.1f})", ""]
        lines += ["| C | requests | failed | output tok/s | per-request tok/s p50 | TTFT p50/p90/p99 (s) "
                  "| TPOT p50 (ms) | e2e p50/p90/p99 (s) | accept length |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for lv in run["levels"]:
            t, e, tpot = (lv.get(k) or {} for k in ("ttft_s", "e2e_s", "tpot_s"))
            lines.append(" | ".join(["", str(lv["concurrency"]), str(lv["requests"]), str(lv["failed"]),
                                     _num(lv.get("throughput"), 1), _num((lv.get("per_request_speed") or {}).get("p50"), 1),
                                     "/".join(_num(t.get(f"p{q}"), 3) for q in PERCENTILES),
                                     _num(tpot.get("p50") and tpot["p50"] * 1000, 1),
                                     "/".join(_num(e.get(f"p{q}"), 2) for q in PERCENTILES),
                                     _num(lv.get("accept_length"), 2), ""]).strip())
        if run["stopped"]:
            lines += ["", f"**Stopped early:** {run['stopped']}"]
        lines.append("")
    if result.get("crossover"):
        x = result["crossover"]
        lines += ["## Crossover", "", "| C | EAGLE-3 tok/s | baseline tok/s | ratio |", "|---|---|---|---|"]
        lines += [f"| {r['concurrency']} | {r['eagle3']:.1f} | {r['baseline']:.1f} | {r['ratio']:.2f} |"
                  for r in x["levels"]]
        lines += ["", f"Highest concurrency where EAGLE-3 still wins: {x['highest_winning_concurrency']}",
                  "", f"**Recommendation:** {x['recommendation']}", ""]
    return "\n".join(lines) + "\n"


def plot(result: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    written = []
    for name, title, value in (
            ("throughput.png", "Total output tokens/s", lambda lv: lv.get("throughput")),
            ("per_request.png", "Per-request tokens/s (p50)", lambda lv: (lv.get("per_request_speed") or {}).get("p50"))):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for run in result["runs"]:
            points = [(lv["concurrency"], value(lv)) for lv in run["levels"] if value(lv)]
            if points:
                ax.plot(*zip(*points), marker="o", label=run["label"])
        ax.set_xscale("log")
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel(title)
        ax.set_title(title + " vs concurrency")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(str(out / name))
    return written


def write(result: dict, out: str | Path) -> dict:
    """results.json, report.md and the plots; written even for a run that stopped early."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "report.md").write_text(report_markdown(result))
    files = [str(out / "results.json"), str(out / "report.md"), *plot(result, out)]
    return {"files": files}


def run(url: str, plan: Plan, baseline_url: str | None = None, baseline_results: str | None = None,
        api_key_env: str = "SGLANG_API_KEY") -> dict:
    runs = [run_server(url, plan, api_key_env, "EAGLE-3")]
    if baseline_url:
        runs.append(run_server(baseline_url, plan, api_key_env, "baseline"))
    elif baseline_results:
        earlier = json.loads(Path(baseline_results).read_text())
        runs.append({**earlier["runs"][0], "label": "baseline"})
    result = {"plan": asdict(plan), "runs": runs, "crossover": crossover(runs[0], runs[1]) if len(runs) > 1 else None}
    return result
