"""Servers under test, measured level by level in rounds.

Noise must not decide a comparison: each level runs in several rounds, the servers interleaved round by round
(their order alternating), every round after a /flush_cache (which also resets SGLang's acceptance counters,
so the server's own accept length read after a round is that round's). Prompts are distinct across levels
and rounds, so the prefix cache serves none.
"""
from __future__ import annotations

import asyncio
from typing import Any

from rig.core import numbers, progress
from rig.serving.measure import client, torch_profile
from rig.serving.measure.plan import Level, Plan
from rig.serving.measure.stats import REQUEST_SPEED, aggregate, median, shown, summarize
from rig.serving.sglang_api import context_length, generate_body, server_accept_length, server_info
from rig.serving.workload import Workload, builtin


def count(value: object) -> int | None:
    """A positive whole number a server reports (a batch size, its max_running_requests), or None."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= numbers.MAX_RUNNING_REQUESTS:
        return value
    return None


def said(round_: dict, accepted: float | None) -> str:
    """One round's numbers as its progress line says them (a run killed later keeps them in its log)."""
    return (f"{round_['completed']}/{round_['requests']} completed, {shown(round_.get('output_throughput'), 1)} output "
            f"tok/s, the median request {shown(round_.get(REQUEST_SPEED), 1)} tok/s"
            + (f", server accept length {accepted:.2f}" if accepted else ""))


class Server:
    """One server under test and what was measured against it (its run record)."""

    def __init__(self, url: str, label: str, plan: Plan, api_key_env: str, workload: Workload | None = None,
                 profile: dict | None = None):
        """PROFILE: {"levels": concurrencies, "steps": N, "host": bool, "dir": Path}: at those closed-loop levels,
        a round of its own before the measured ones has its full batch profiled by the server for N steps, its
        host's Python too where HOST (rig.serving.measure.torch_profile)."""
        self.url, self.plan, self.key, self.profile = url.rstrip("/"), plan, api_key_env, profile
        self.workload = workload or Workload(None, plan.max_tokens, plan.seed)
        self.info = server_info(self.url, api_key_env)
        self.run: dict[str, Any] = {
            "url": self.url, "label": label, "speculative_algorithm": self.info.get("speculative_algorithm"),
            "context_length": context_length(self.info), "max_running_requests":
                count(self.info.get("max_running_requests")), "serial": None, "levels": [], "stopped": None}

    @property
    def label(self) -> str:
        return self.run["label"]

    def _send(self, body_for, n: int, concurrency: int, rate: float | None = None, min_seconds=None,
              when_full=None) -> list[dict]:
        most = self.run["max_running_requests"]  # a server never runs more at once
        return asyncio.run(client.run_requests(self.url, self.plan, self.key, body_for, n, concurrency, rate,
                                             min_seconds, when_full, min(concurrency, most) if most else None))

    def body(self, text: str, tokens: int) -> dict:
        return generate_body(text, tokens, True, self.plan.sampling())

    def warmup(self) -> None:
        progress(f"{self.label}: warm-up ({self.plan.warmup} requests)")
        self._send(lambda i: self.body(builtin(-i), 16), self.plan.warmup, 1, min_seconds=0.0)
        client.flush(self.url, self.key)

    def serial(self) -> None:
        plan = self.plan
        progress(f"{self.label}: serial, {plan.serial_runs} x {plan.serial_tokens} tokens")
        runs = self._send(lambda i: self.body(builtin(10_000 + i), plan.serial_tokens), plan.serial_runs, 1)
        speeds = [r["speed"] for r in runs if r["ok"]]  # each run's output tokens/s: a round of one request
        self.run["serial"] = {"requests": len(runs), "completed": len(speeds), "failed": len(runs) - len(speeds),
                              "errors": sorted({r["error"] for r in runs if not r["ok"]})[:5],
                              "output_throughput": median(speeds),
                              "round_output_throughput": speeds}
        client.down_if_lost(runs)

    def profiles(self, level: Level) -> bool:
        """Whether LEVEL's full batch is profiled on this server (closed-loop levels the profile names)."""
        return self.profile is not None and level.rate is None and level.concurrency in self.profile["levels"]

    def round(self, level: Level, round_no: int, profiled: bool = False) -> tuple[list[dict], float | None]:
        """One round of one level: C requests in flight (closed loop), or Poisson arrivals at RATE with at
        most C in flight; its results and the server's own accept length over it. PROFILED: the level's profile
        round instead, prompts of its own (below 0: no measured round's), its numbers for no median (the profiler
        slows the steps it records, and SGLang writes the trace from the scheduler's own thread, the batch
        waiting)."""
        client.flush(self.url, self.key)
        c, n = level.concurrency, self.plan.requests_at(level)
        what = f"concurrency {c}" if level.rate is None else f"request rate {level.rate:g}/s (at most {c} in flight)"
        which, of = ("the profile's round", " (not measured)") if profiled else \
            (f"round {round_no + 1}", f"/{self.plan.rounds}")
        progress(f"{self.label}: {what}, {which}{of}, {n} requests"
                 + (f" and {self.plan.min_seconds:g} s" if self.plan.min_seconds else ""))

        def body(i: int) -> dict:
            chosen = self.workload(-(c * 100_000 + i) - 1 if profiled else c * 100_000 + round_no * 10_000 + i)
            return self.body(chosen.text, chosen.max_tokens)

        wanted = self.profile if profiled else None
        name, asked = f"{self.label}-C{c}", []

        async def full(http) -> None:
            assert wanted  # only handed over when profiling
            asked.append(name)
            await torch_profile.start(http, self.url, wanted["dir"], wanted["steps"], name, wanted["host"])

        results = self._send(body, n, c, level.rate, when_full=full if wanted else None)
        client.down_if_lost(results)
        if wanted:
            self.run.setdefault("profiles", {})[level.name] = self._profile_of(wanted, name) if asked else \
                {"error": "the batch never filled: nothing profiled"}
        accepted = server_accept_length(server_info(self.url, self.key)) if self.run["speculative_algorithm"] else None
        progress(f"{self.label}: {what}, {which}: {said(summarize(results, c), accepted)}")
        return results, accepted

    def _profile_of(self, wanted: dict, name: str) -> dict:
        """The round's profile, read once whole; one the round ended short of its steps is stopped and not read."""
        if torch_profile.stopped_short(self.url, self.key):
            return {"error": f"the round ended before the profile's {wanted['steps']} steps were in (stopped; its "
                             "partial trace is not read): profile a level whose rounds run longer, or fewer steps "
                             "(tune.profile_steps)"}
        found = torch_profile.traces(wanted["dir"], name)
        return torch_profile.read(found, wanted["steps"], wanted["host"]) if found else \
            {"error": "the server wrote no trace"}

    def stop(self, exc: Exception) -> None:
        self.run["stopped"] = f"the server stopped answering: {exc}"
        progress(f"{self.label}: {self.run['stopped']}; keeping what was measured")


def measure(servers: list[Server], levels: list[Level], serial: bool = False) -> None:
    """Warm-up (and the serial runs), then every level in rounds, the servers interleaved: each server's levels
    go to its run record. A server that stops answering is stopped there (its record says why); the rest go on."""
    for server in servers:
        try:
            server.warmup()
            if serial:
                server.serial()
        except client.ServerDown as exc:
            server.stop(exc)
    plan = servers[0].plan
    for level in levels:
        rounds: dict[str, list] = {s.label: [] for s in servers}
        for server in servers:  # a profile first, in a round of its own that no median counts
            if server.profiles(level) and not server.run["stopped"]:
                try:
                    server.round(level, 0, profiled=True)
                except client.ServerDown as exc:
                    server.stop(exc)
        for round_no in range(plan.rounds):
            for server in servers if round_no % 2 == 0 else servers[::-1]:  # neither always goes first
                if server.run["stopped"]:
                    continue
                try:
                    rounds[server.label].append(server.round(level, round_no))
                except client.ServerDown as exc:
                    server.stop(exc)
        for server in servers:
            if measured := rounds[server.label]:
                result = aggregate([r for r, _ in measured], level.concurrency, plan, [a for _, a in measured])
                result.update({"level": level.name, "rate": level.rate,
                               "profile": server.run.get("profiles", {}).get(level.name)})
                server.run["levels"].append(result)
        if all(s.run["stopped"] for s in servers):
            break
