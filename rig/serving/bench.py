"""`rig bench`: EAGLE-3 against a baseline server, serially and across concurrency.

Two measurements, as the seeds made them by hand:
- serial: N runs of one long generation, tokens/s per run (median, range);
- a concurrency sweep: at each level C, at least max(30, 2C) streamed requests
  kept C at a time, after a warm-up and a /flush_cache (which also resets
  SGLang's acceptance counters). Per level: total output tokens/s, per-request
  tokens/s, TTFT, TPOT and end-to-end latency at p50/p90/p99, accept length.

Noise must not decide the crossover: each level runs in several rounds, the two
servers interleaved round by round (their order alternating), and a level counts
as won or lost only when the EAGLE-3/baseline ratio of every round is on the same
side of 1; otherwise it is "within noise".

Before anything is measured, each server's context length (from /server_info)
is held against the plan: a plan that cannot fit is refused, naming both numbers.
A request the server refuses (HTTP 4xx, or an error chunk inside a 200 stream, as
SGLang answers a streamed request it rejects) is a failed request with the
server's reason, and the run goes on; only a server that stops answering ends it,
and what was measured so far is still written.
The client parses only the first and the last chunk of a stream in full:
SGLang's chunks carry the cumulative output, so parsing each would make the
client, not the server, the limit at high concurrency.
"""
from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rig.core import RigError, outdir, progress
from rig.core.schema import Field, between
from rig.serving.sglang_api import (
    KEY_ENV,
    accept_length,
    call,
    context_length,
    generate_body,
    headers,
    number,
    server_accept_length,
    server_info,
)
from rig.serving.workload import Workload, builtin

PERCENTILES = (50, 90, 99)


@dataclass
class Plan:
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 5, 10, 30, 70, 100, 250])
    max_tokens: int = 512
    serial_runs: int = 10
    serial_tokens: int = 2048
    rounds: int = 3
    min_requests: int = 30
    warmup: int = 2
    read_timeout: float = 300.0  # seconds without a byte before a request counts as failed
    min_seconds: float = 0.0  # each level keeps sending until it has run this long, too
    slo_ttft_ms: float = 0.0  # goodput: requests within both SLOs per second (0: that SLO is not set)
    slo_tpot_ms: float = 0.0
    seed: int = 0  # Poisson arrivals and the prompt file's order

    def __post_init__(self) -> None:
        counts = {"serial_runs": self.serial_runs, "serial_tokens": self.serial_tokens, "max_tokens": self.max_tokens,
                  "rounds": self.rounds, "min_requests": self.min_requests}
        bad = [f"{k} {v}" for k, v in counts.items() if v < 1] + [f"concurrency {c}" for c in self.concurrency if c < 1]
        if not self.concurrency:
            bad.append("concurrency (no level)")
        if self.read_timeout <= 0:
            bad.append(f"read_timeout {self.read_timeout}")
        bad += [f"{k} {v}" for k, v in (("min_seconds", self.min_seconds), ("slo_ttft_ms", self.slo_ttft_ms),
                                         ("slo_tpot_ms", self.slo_tpot_ms)) if not 0 <= v <= 86400 * 1000]
        if bad:
            raise RigError(f"bench plan: {', '.join(bad)}: each must be a positive number (min_seconds and the "
                       "SLOs may be 0)")

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


prompt = builtin
# Byte-level and byte-fallback tokenizers make at most one token per byte; a few more for BOS and templates.
PROMPT_TOKENS_MAX = max(len(prompt(i).encode()) for i in (-9, 10_000_000)) + 8


def check_fits(plan: Plan, label: str, info: dict, workload: Workload | None = None) -> str | None:
    """Refuse a plan whose longest request cannot fit the server's context; a note when it cannot be told."""
    context = context_length(info)
    if context is None:
        return f"{label}: /server_info gives no context length; requests that do not fit will be refused"
    if workload is not None and workload.prompts:  # a prompt file: each entry's own bytes and output
        worst = max(len(p.text.encode()) + 8 + p.max_tokens for p in workload.prompts)
        if worst > context:
            raise RigError(f"{label}: a prompt of the prompt file with its max_tokens may need {worst} tokens, but "
                           f"the server's context length is {context} tokens: shorten it or lower its max_tokens")
        return None
    longest = max(plan.serial_tokens, plan.max_tokens)
    if longest + PROMPT_TOKENS_MAX > context:
        which = "serial_tokens" if plan.serial_tokens >= plan.max_tokens else "max_tokens"
        if context - PROMPT_TOKENS_MAX < 1:
            raise RigError(f"{label}: the server's context length is {context} tokens, too small for rig's prompts "
                           f"({PROMPT_TOKENS_MAX} tokens at most): serve with a longer --context-length")
        raise RigError(f"{label}: the plan asks for {longest} output tokens ({which}) plus up to {PROMPT_TOKENS_MAX} "
                       f"prompt tokens, but the server's context length is {context} tokens: lower bench.{which} "
                       f"(or --{which.replace('_', '-')}) to at most {context - PROMPT_TOKENS_MAX}")
    return None


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
    first: bytes | None = None
    last: bytes | None = None
    ttft: float | None = None
    done = False
    arrivals: list[float] = []  # each chunk's time: the inter-token latencies (a chunk may carry several tokens)
    try:
        # a redirect is answered as it is: followed, the request (and its API key) would reach another origin
        async with session.post(url + "/generate", json=body, allow_redirects=False) as response:
            if response.status != 200:
                return _refused(response.status, await response.read())
            async for payload in _events(response):
                if payload == b"[DONE]":
                    done = True
                    break
                # a cheap shape check on every chunk; full parsing of the first and last only
                if not (payload.startswith(b"{") and payload.endswith(b"}")):
                    return {"ok": False, "error": f"malformed chunk: {payload[:80]!r}"}
                arrivals.append(time.perf_counter())
                if first is None:
                    first, ttft = payload, arrivals[-1] - start
                last = payload
    except (aiohttp.ClientConnectorError, ConnectionRefusedError) as exc:
        raise ServerDown(str(exc)) from exc
    except asyncio.TimeoutError:  # a server that accepts and never answers is as good as gone
        return {"ok": False, "lost": True, "error": "no data within the read timeout"}
    except (aiohttp.ClientError, ConnectionError) as exc:
        return {"ok": False, "lost": True, "error": f"connection lost: {exc.__class__.__name__}: {exc}"}
    end = time.perf_counter()
    if not done or first is None or last is None or ttft is None:  # the first chunk sets all three
        return {"ok": False, "lost": True, "error": "the stream ended before [DONE] (the server closed it)"}
    try:
        json.loads(first)
        final = json.loads(last)
        if "error" in final:  # SGLang refuses a streamed request inside the stream: HTTP 200, one error chunk
            return _refused(200, last)
        meta = final["meta_info"]
        tokens = int(meta["completion_tokens"])
        if tokens <= 0:
            raise ValueError(f"completion_tokens {tokens}")
        prompt_tokens = number(meta.get("prompt_tokens")) or 0
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
        return {"ok": False, "error": f"malformed chunk: {exc.__class__.__name__}: {str(exc)[:200]}"}
    e2e = end - start
    return {"ok": True, "tokens": tokens, "prompt_tokens": int(prompt_tokens), "start": start, "end": end,
            "ttft": ttft, "e2e": e2e, "tpot": (e2e - ttft) / (tokens - 1) if tokens > 1 else None,
            "itl": [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)],
            "speed": tokens / e2e if e2e > 0 else None, "accept_length": accept_length(meta)}


def _refused(status: int, body: bytes) -> dict:
    """A request the server answered but would not serve; its reason as SGLang gives it ({"error": {"message"}})."""
    reason = body[:300].decode(errors="replace")
    try:
        error = json.loads(body)["error"]
        reason = str(error.get("message", error) if isinstance(error, dict) else error)[:300]
    except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: nested past the parser
        pass
    if 300 <= status < 400:
        return {"ok": False, "refused": True, "error": f"redirected (HTTP {status}): rig does not follow redirects; "
                "give --url the server's own address"}
    kind = "refused" if 400 <= status < 500 or status == 200 else "server error"
    return {"ok": False, "refused": kind == "refused", "error": f"{kind} (HTTP {status}): {reason}"}


def _session(plan: Plan, api_key_env: str, limit: int):
    import aiohttp

    return aiohttp.ClientSession(
        headers=headers(api_key_env),
        connector=aiohttp.TCPConnector(limit=limit, force_close=False),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=plan.read_timeout))


MAX_REQUESTS = 100_000  # one level's bound, whatever min_seconds says


async def _run_requests(url: str, plan: Plan, api_key_env: str, body_for, n: int, concurrency: int,
                        rate: float | None = None) -> list[dict]:
    """Send BODY_FOR(i) for i = 0, 1, ... until N are sent and plan.min_seconds have passed.

    Closed loop (no RATE): CONCURRENCY requests kept in flight. Open loop: Poisson arrivals at RATE per
    second (seeded by plan.seed), at most CONCURRENCY in flight, as sglang.bench_serving's
    --request-rate with --max-concurrency."""
    results: list[dict] = []
    down: list[str] = []
    began = time.perf_counter()
    sent = 0

    def more() -> bool:
        return not down and sent < MAX_REQUESTS and (sent < n or time.perf_counter() - began < plan.min_seconds)

    async def one(session, i: int) -> None:
        try:
            results.append(await _stream(session, url, body_for(i)))
        except ServerDown as exc:
            down.append(str(exc))
            results.append({"ok": False, "error": f"server unreachable: {exc}"})

    async with _session(plan, api_key_env, concurrency) as session:
        if rate is None:
            async def worker() -> None:
                nonlocal sent
                while more():
                    sent += 1
                    await one(session, sent - 1)

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        else:
            arrivals = random.Random(plan.seed)
            slots = asyncio.Semaphore(concurrency)
            tasks = []
            due = began

            async def limited(i: int) -> None:
                async with slots:
                    await one(session, i)

            while more():
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                tasks.append(asyncio.create_task(limited(sent)))
                sent += 1
                due += arrivals.expovariate(rate)
            await asyncio.gather(*tasks)
    return results


def _ms(name: str, values: list[float]) -> dict:
    """sglang.bench_serving's spelling: mean_/median_/p90_/p99_NAME_ms."""
    if not values:
        return {}
    return {f"mean_{name}_ms": statistics.fmean(values) * 1000, f"median_{name}_ms": statistics.median(values) * 1000,
            **{f"p{q}_{name}_ms": (percentile(values, q) or 0) * 1000 for q in (90, 99)}}


def summarize(results: list[dict], concurrency: int, plan: Plan | None = None) -> dict:
    good = [r for r in results if r["ok"]]
    errors = sorted({r["error"] for r in results if not r["ok"]})
    level = {"concurrency": concurrency, "requests": len(results), "ok": len(good),
             "failed": len(results) - len(good), "errors": errors[:5]}
    if not good:
        return level
    span = max(r["end"] for r in good) - min(r["start"] for r in good)
    tokens = sum(r["tokens"] for r in good)
    accepts = [r["accept_length"] for r in good if r["accept_length"]]
    tpots = [r["tpot"] for r in good if r["tpot"] is not None]
    per_second = (lambda x: x / span) if span > 0 else (lambda x: None)
    level.update({
        "output_tokens": tokens, "duration_s": span,
        "throughput": per_second(tokens), "output_throughput": per_second(tokens),
        "total_throughput": per_second(tokens + sum(r.get("prompt_tokens", 0) for r in good)),
        "request_throughput": per_second(len(good)),
        # mean requests in flight (Little's law): the running batch the server saw at this level
        "in_flight": per_second(sum(r["e2e"] for r in good)),
        "per_request_speed": _spread([r["speed"] for r in good if r["speed"]]),
        "ttft_s": _spread([r["ttft"] for r in good]),
        "tpot_s": _spread(tpots),
        "e2e_s": _spread([r["e2e"] for r in good]),
        **_ms("ttft", [r["ttft"] for r in good]), **_ms("tpot", tpots),
        **_ms("itl", [gap for r in good for gap in r.get("itl", [])]), **_ms("e2e_latency", [r["e2e"] for r in good]),
        "accept_length": statistics.fmean(accepts) if accepts else None,
    })
    if plan and (plan.slo_ttft_ms or plan.slo_tpot_ms):
        within = [r for r in good if (not plan.slo_ttft_ms or r["ttft"] * 1000 <= plan.slo_ttft_ms) and
                  (not plan.slo_tpot_ms or (r["tpot"] or 0) * 1000 <= plan.slo_tpot_ms)]
        level["goodput"] = per_second(len(within))
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


def _fail_count(runs: list[dict]) -> dict:
    return {"errors": sorted({r["error"] for r in runs if not r["ok"]})[:5]}


def _down_if_lost(results: list[dict]) -> None:
    """Every request lost its connection or timed out: nothing answers any more. Refusals are answers."""
    if results and all(r.get("lost") for r in results):
        raise ServerDown(results[-1]["error"])


class Server:
    """One server under test and what was measured against it."""

    def __init__(self, url: str, label: str, plan: Plan, api_key_env: str, workload: Workload | None = None):
        self.url, self.plan, self.key = url.rstrip("/"), plan, api_key_env
        self.workload = workload or Workload(None, plan.max_tokens, plan.seed)
        self.info = server_info(self.url, api_key_env)
        self.run: dict[str, Any] = {
            "url": self.url, "label": label, "speculative_algorithm": self.info.get("speculative_algorithm"),
            "context_length": context_length(self.info), "serial": None, "levels": [], "stopped": None}

    @property
    def label(self) -> str:
        return self.run["label"]

    def _requests(self, body_for, n: int, concurrency: int, rate: float | None = None) -> list[dict]:
        return asyncio.run(_run_requests(self.url, self.plan, self.key, body_for, n, concurrency, rate))

    def warmup(self) -> None:
        progress(f"{self.label}: warm-up ({self.plan.warmup} requests)")
        warm = Plan(**{**asdict(self.plan), "min_seconds": 0.0})  # a warm-up is a count, never a duration
        asyncio.run(_run_requests(self.url, warm, self.key, lambda i: generate_body(prompt(-i), 16, True),
                                  self.plan.warmup, 1))
        _flush(self.url, self.key)

    def serial(self) -> None:
        plan = self.plan
        self.warmup()
        progress(f"{self.label}: serial, {plan.serial_runs} x {plan.serial_tokens} tokens")
        runs = self._requests(lambda i: generate_body(prompt(10_000 + i), plan.serial_tokens, True),
                              plan.serial_runs, 1)
        speeds = [r["speed"] for r in runs if r["ok"]]
        self.run["serial"] = {"runs": len(runs), "ok": len(speeds), "tok_s": speeds,
                              "median": statistics.median(speeds) if speeds else None,
                              "min": min(speeds, default=None), "max": max(speeds, default=None), **_fail_count(runs)}
        _down_if_lost(runs)

    def level(self, c: int, round_no: int, rate: float | None = None) -> list[dict]:
        """One round of one level: C requests in flight (closed loop), or Poisson arrivals at RATE with at
        most C in flight; prompts distinct across levels and rounds, so the prefix cache serves none."""
        _flush(self.url, self.key)
        n = self.plan.requests_at(c)
        what = f"concurrency {c}" if rate is None else f"request rate {rate:g}/s (at most {c} in flight)"
        progress(f"{self.label}: {what}, round {round_no + 1}/{self.plan.rounds}, {n} requests"
                 + (f" and {self.plan.min_seconds:g} s" if self.plan.min_seconds else ""))
        def body(i: int) -> dict:
            chosen = self.workload(c * 100_000 + round_no * 10_000 + i)
            return generate_body(chosen.text, chosen.max_tokens, True)

        results = self._requests(body, n, c, rate)
        _down_if_lost(results)
        return results

    def stop(self, exc: Exception) -> None:
        self.run["stopped"] = f"the server stopped answering: {exc}"
        progress(f"{self.label}: {self.run['stopped']}; keeping what was measured")


def aggregate(rounds: list[list[dict]], c: int, server: Server) -> dict:
    """One level over its rounds: latencies over all requests, throughput per round and its median."""
    level = summarize([r for results in rounds for r in results], c, server.plan)
    per_round = [summarize(results, c).get("throughput") for results in rounds]
    level["round_throughput"] = per_round
    done = [t for t in per_round if t]
    level["throughput"] = level["output_throughput"] = statistics.median(done) if done else None
    if level.get("output_tokens") and level["accept_length"] is None and server.run["speculative_algorithm"]:
        level["accept_length"] = server_accept_length(server_info(server.url, server.key))
    return level


def measure(servers: list[Server]) -> None:
    """Serial runs, then the sweep: level by level, round by round, the servers interleaved."""
    for server in servers:
        try:
            server.serial()
        except ServerDown as exc:
            server.stop(exc)
    plan = servers[0].plan
    for c in plan.concurrency:
        rounds: dict[str, list[list[dict]]] = {s.label: [] for s in servers}
        for round_no in range(plan.rounds):
            order = servers if round_no % 2 == 0 else servers[::-1]  # neither always goes first
            for server in order:
                if server.run["stopped"]:
                    continue
                try:
                    rounds[server.label].append(server.level(c, round_no))
                except ServerDown as exc:
                    server.stop(exc)
        for server in servers:
            if rounds[server.label]:
                server.run["levels"].append(aggregate(rounds[server.label], c, server))
        if all(s.run["stopped"] for s in servers):
            break


def within_range(ratios: list[float], tolerance: float = 0.0) -> str:
    """won / lost only when every round agrees, by more than TOLERANCE; otherwise the difference is within noise."""
    if min(ratios) > 1 + tolerance:
        return "won"
    if max(ratios) < 1 - tolerance:
        return "lost"
    return "within noise"


def crossover(eagle: dict, baseline: dict) -> dict:
    """Where EAGLE-3 stops paying, by per-round throughput ratios.

    A level is won (lost) only when every round's EAGLE-3/baseline ratio is above
    (below) 1. The crossover is the highest concurrency up to which every level is
    won; a win above the first level that is not is reported apart.
    """
    base = {lv["concurrency"]: lv for lv in baseline["levels"]}
    rows = []
    for lv in eagle["levels"]:
        other = base.get(lv["concurrency"])
        mine = lv.get("round_throughput") or [lv.get("throughput")]
        theirs = (other or {}).get("round_throughput") or [(other or {}).get("throughput")]
        if len(theirs) == 1:  # an earlier run of one value: hold every round against it
            theirs = theirs * len(mine)
        elif len(mine) == 1:
            mine = mine * len(theirs)
        pairs = list(zip(mine, theirs, strict=False))
        ratios = [e / b for e, b in pairs if e and b]
        if not ratios or other is None:  # no baseline level: theirs is [None], so no ratio either
            continue
        rows.append({"concurrency": lv["concurrency"], "eagle3": lv["throughput"], "baseline": other["throughput"],
                     "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                     "rounds": len(ratios), "verdict": within_range(ratios)})
    first_other = next((i for i, r in enumerate(rows) if r["verdict"] != "won"), len(rows))
    highest = rows[first_other - 1]["concurrency"] if first_other else None
    noisy = [r["concurrency"] for r in rows if r["verdict"] == "within noise"]
    lost = [r["concurrency"] for r in rows if r["verdict"] == "lost"]
    again = [r["concurrency"] for r in rows[first_other:] if r["verdict"] == "won"]
    tail = (f"; within noise at C={', '.join(map(str, noisy))}" if noisy else "") + \
           (f"; it loses at C={', '.join(map(str, lost))}" if lost else "") + \
           (f"; it wins again at C={', '.join(map(str, again))}, above a level it did not win" if again else "")
    if not rows:
        advice = "no level has results from both servers; nothing to compare"
    elif highest is None and not noisy:
        advice = "EAGLE-3 loses at every measured concurrency: serve without speculation"
    elif highest is None:
        advice = "EAGLE-3 wins clearly at no measured concurrency" + tail + \
                 ": serve without speculation, or measure with more rounds"
    elif first_other == len(rows):
        advice = f"EAGLE-3 wins at every measured concurrency (up to {highest}), in every round: serve with it"
    else:
        advice = (f"EAGLE-3 wins in every round up to concurrency {highest}{tail}: serve with it where load "
                  f"stays at or below {highest} request{'s' if highest > 1 else ''} in flight, without it above")
    return {"highest_winning_concurrency": highest, "levels": rows, "recommendation": advice,
            "within_noise": noisy, "wins_after_a_loss": again}


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report_markdown(result: dict) -> str:
    lines = ["# rig bench", ""]
    for run in result["runs"]:
        lines += [f"## {run['label']}: {run['url']} (speculative_algorithm: {run['speculative_algorithm']})", ""]
        serial = run["serial"]
        if serial and serial["median"]:
            lines += [f"Serial, {serial['runs']} runs: median {serial['median']:.1f} tok/s "
                      f"(range {_num(serial['min'], 1)}-{_num(serial['max'], 1)})", ""]
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
        lines += ["## Crossover", "", "Median over rounds; the ratio's range is over the rounds, each measured "
                  "with the two servers interleaved. A level is won or lost only when the whole range is on one side of 1.",
                  "", "| C | EAGLE-3 tok/s | baseline tok/s | ratio (range) | verdict |", "|---|---|---|---|---|"]
        lines += [f"| {r['concurrency']} | {_num(r['eagle3'], 1)} | {_num(r['baseline'], 1)} | {r['ratio']:.2f} "
                  f"({r['ratio_min']:.2f}-{r['ratio_max']:.2f}) | {r['verdict']} |" for r in x["levels"]]
        lines += ["", f"Highest concurrency where EAGLE-3 still wins: {x['highest_winning_concurrency']}",
                  "", f"**Recommendation:** {x['recommendation']}", ""]
    return "\n".join(lines) + "\n"


def figures(result: dict) -> dict:
    """throughput.png and per_request.png: each run's line against concurrency."""
    from matplotlib.figure import Figure

    drawn = {}
    measured = sorted({lv["concurrency"] for run in result["runs"] for lv in run["levels"]})
    for name, title, value in (
            ("throughput.png", "Total output tokens/s", lambda lv: lv.get("throughput")),
            ("per_request.png", "Per-request tokens/s (p50)", lambda lv: (lv.get("per_request_speed") or {}).get("p50"))):
        fig = Figure(figsize=(7, 4.5))
        ax = fig.subplots()
        for run in result["runs"]:
            points = [(lv["concurrency"], value(lv)) for lv in run["levels"] if value(lv)]
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


def write(result: dict, out: str | Path) -> dict:
    """results.json, report.md and the plots; written even for a run that stopped early."""
    return {"files": outdir.write(out, {"results.json": outdir.record(result), "report.md": report_markdown(result)},
                                   lambda: figures(result))}


_NUMBER = Field((int, float, type(None)))
_STATS = Field((dict, type(None)), values=_NUMBER)
# what the report and the comparison read of an earlier run; the rest is kept as it is
RESULTS_SPEC = Field(dict, open=True, fields={"runs": Field(list, required=True, check=lambda v: None if v else "no runs",
                                                            item=Field(dict, open=True, fields={
    "serial": Field((dict, type(None)), open=True, fields={
        "runs": Field(int, required=True), "tok_s": Field(list, required=True, item=Field((int, float))),
        "median": _NUMBER, "min": _NUMBER, "max": _NUMBER}),
    "stopped": Field((str, type(None))), "url": Field(required=True), "speculative_algorithm": Field((str, type(None))),
    "levels": Field(list, required=True, item=Field(dict, open=True, fields={
        "concurrency": Field(int, required=True, check=between(1, 100_000)), "throughput": _NUMBER,
        "round_throughput": Field(list, default=[], item=Field((int, float))), "requests": Field(int, default=0),
        "failed": Field(int, default=0), "accept_length": _NUMBER, "ttft_s": _STATS, "e2e_s": _STATS,
        "tpot_s": _STATS, "per_request_speed": _STATS}))}))})


def _earlier(path: str) -> dict:
    """The first run of an earlier results.json, checked for every field the comparison and report read."""
    from rig.core.documents import load_json

    try:
        earlier = load_json(path, "results.json", RESULTS_SPEC)
    except RigError as exc:
        raise RigError(f"--baseline-results: {exc}: not a results.json of rig bench; give the results.json an "
                       "earlier `rig bench` wrote") from exc
    return {**earlier["runs"][0], "label": "baseline"}


def plan_for(wanted: dict, concurrency: str | None, max_tokens: int | None, serial_runs: int | None,
             serial_tokens: int | None, rounds: int | None, min_requests: int, read_timeout: float,
             min_seconds: float | None = None, **more) -> Plan:
    """The plan `rig bench` measures: each option given, else the stack's bench section (WANTED)."""
    try:
        levels = [int(c) for c in concurrency.split(",")] if concurrency is not None else wanted["concurrency"]
    except ValueError as exc:
        raise RigError(f"--concurrency {concurrency!r}: give comma-separated whole numbers, e.g. 1,2,5") from exc

    def given(value, key):  # an option given as 0 is a bad value, not "use the stack's"
        return wanted[key] if value is None else value

    return Plan(concurrency=levels, max_tokens=given(max_tokens, "max_tokens"),
                serial_runs=given(serial_runs, "serial_runs"), serial_tokens=given(serial_tokens, "serial_tokens"),
                rounds=given(rounds, "rounds"), min_requests=min_requests, read_timeout=read_timeout,
                min_seconds=given(min_seconds, "min_seconds"), **more)


def outcome(result: dict, files: list[str]) -> dict:
    """What a run came to: failed requests, runs stopped early, the crossover; "ok" only with none of the first two."""
    failed = sum(lv["failed"] for run in result["runs"] for lv in run["levels"]) + \
        sum(len(run["serial"]["tok_s"]) < run["serial"]["runs"] for run in result["runs"] if run["serial"])
    stopped = [f"{run['label']}: {run['stopped']}" for run in result["runs"] if run["stopped"]]
    cross = result["crossover"]
    msg = "\n".join([f"wrote {', '.join(files)}",
                     *(f"STOPPED {s}" for s in stopped),
                     *([f"{failed} request(s) failed; the report lists why"] if failed else []),
                     *([cross["recommendation"]] if cross else [])])
    return {"ok": not (failed or stopped), "files": files, "crossover": cross, "failed": failed, "stopped": stopped,
            "msg": msg}


def run(url: str, plan: Plan, baseline_url: str | None = None, baseline_results: str | None = None,
        api_key_env: str = KEY_ENV) -> dict:
    earlier = _earlier(baseline_results) if baseline_results else None
    servers = [Server(url, "EAGLE-3", plan, api_key_env)]
    if baseline_url:
        servers.append(Server(baseline_url, "baseline", plan, api_key_env))
    notes = [n for s in servers if (n := check_fits(plan, s.label, s.info))]
    for note in notes:
        progress(note)
    measure(servers)
    runs = [s.run for s in servers] + ([earlier] if earlier else [])
    return {"plan": asdict(plan), "notes": notes, "runs": runs,
            "crossover": crossover(runs[0], runs[1]) if len(runs) > 1 else None}
