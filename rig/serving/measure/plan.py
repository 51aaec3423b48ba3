"""The measurement plan: the stack's bench section with the options given over it, checked by the stack
schema's own fields (one place for the defaults and the limits), and the levels it measures at."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from rig.core import RigError
from rig.core.schema import validate
from rig.serving.sglang_api import context_length
from rig.serving.workload import Workload, builtin

# An open-loop round sends this many seconds of arrivals: a request lasts a second or two, so the running batch has
# long settled. 2C arrivals at 20/s take 26 s a round under a cap of 256 (12.8 s under run 16's 128, issue 71):
# about 5 minutes of a four-server tune's device time at 256.
OPEN_LOOP_S = 10


@dataclass(frozen=True)
class Level:
    concurrency: int
    rate: float | None = None

    @property
    def name(self) -> str:
        return f"C={self.concurrency}" if self.rate is None else f"R={self.rate:g}/s"


@dataclass(frozen=True)
class Plan:
    concurrency: list[int]
    max_tokens: int
    serial_runs: int
    serial_tokens: int
    rounds: int
    min_requests: int
    warmup: int
    read_timeout: float  # seconds without a byte before a request counts as failed
    request_timeout: float  # seconds a whole request may take, however steadily it streams
    min_seconds: float  # each level keeps sending until it has run this long, too
    slo_ttft_ms: float  # goodput: requests within both SLOs per second (0: that SLO is not set)
    slo_tpot_ms: float
    seed: int  # Poisson arrivals and the prompt file's order
    temperature: float  # 0: greedy; sampling makes acceptance what a trained draft's is
    top_p: float
    # open-loop Poisson levels (rig tune's tune.request_rates or --request-rate), each at the largest concurrency
    request_rates: tuple[float, ...] = ()

    @property
    def levels(self) -> list[Level]:
        """Every level measured, in order: each concurrency closed-loop, then each request rate."""
        return [Level(c) for c in self.concurrency] + [Level(max(self.concurrency), r) for r in self.request_rates]

    def record(self) -> dict:
        """The plan as a run's record writes it: the bench section's keys (the request rates are the record's
        levels)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "request_rates"}

    def requests_at(self, level: Level) -> int:
        """A round's requests: two waves of the level's C (closed loop), or OPEN_LOOP_S of its Poisson arrivals,
        at most those two waves."""
        waves = max(self.min_requests, 2 * level.concurrency)
        return waves if level.rate is None else max(self.min_requests, min(waves, math.ceil(level.rate * OPEN_LOOP_S)))

    @property
    def metric(self) -> str:
        return "goodput" if self.slo_ttft_ms or self.slo_tpot_ms else "output_throughput"

    def sampling(self) -> dict:
        """SGLang's sampling_params for every measured request."""
        return {"temperature": self.temperature, "top_p": self.top_p}


def plan_from(bench: dict | None = None, request_rates: Sequence[float] = (), **given: Any) -> Plan:
    """BENCH (a stack's bench section; None: the schema's defaults) with each option in GIVEN that is not None over
    it, checked by the schema that checks stack files: an option gets the same limits and words as the stack key.
    REQUEST_RATES: open-loop levels, checked where they were read (tune.request_rates, --request-rate)."""
    from rig.stack.spec import SCHEMA

    merged = {**(bench or {}), **{k: v for k, v in given.items() if v is not None}}
    unknown = set(merged) - {f.name for f in fields(Plan)}
    if unknown:
        raise RigError(f"the bench plan has no {', '.join(sorted(unknown))}")
    checked = validate(merged, SCHEMA["bench"], "the bench plan (the stack's bench section and the options)")
    return Plan(**checked, request_rates=tuple(request_rates))


# Byte-level and byte-fallback tokenizers make at most one token per byte; a few more for BOS and templates.
PROMPT_TOKENS_MAX = max(len(builtin(i).encode()) for i in (-9, 10_000_000)) + 8


def check_fits(plan: Plan, label: str, info: dict, workload: Workload | None = None,
               serial: bool = True) -> str | None:
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
    longest = max(plan.serial_tokens if serial else 0, plan.max_tokens)
    if longest + PROMPT_TOKENS_MAX > context:
        which = "serial_tokens" if serial and plan.serial_tokens >= plan.max_tokens else "max_tokens"
        if context - PROMPT_TOKENS_MAX < 1:
            raise RigError(f"{label}: the server's context length is {context} tokens, too small for rig's prompts "
                           f"({PROMPT_TOKENS_MAX} tokens at most): serve with a longer --context-length")
        raise RigError(f"{label}: the plan asks for {longest} output tokens ({which}) plus up to {PROMPT_TOKENS_MAX} "
                       f"prompt tokens, but the server's context length is {context} tokens: lower bench.{which} "
                       f"(or --{which.replace('_', '-')}) to at most {context - PROMPT_TOKENS_MAX}")
    return None
