"""A server's load over time, as a histogram of running requests: what `rig tune --load-profile` weighs each
measured level by, to choose the one server that pays best for that load.

Read from what an SGLang box already has, whichever FILE holds:
- the server's log: the scheduler's decode lines, `Decode batch ... #running-req: N, ...` (one every
  decode_log_interval steps, so each line stands for about the same number of decode steps);
- a scrape of its Prometheus endpoint (`--enable-metrics`): lines `sglang:num_running_reqs{...} N`, e.g.
  `while sleep 1; do curl -s http://HOST:PORT/metrics | grep '^sglang:num_running_reqs'; done > load.txt`;
- a JSON object {"histogram": {"RUNNING": WEIGHT, ...}} (weights need not sum to 1).
Idle samples (0 running) are dropped: a server with nothing to run serves nothing whatever its config.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

from rig.core import RigError, numbers
from rig.core.documents import parse_json, read_text

LOG_LINE = re.compile(r"#running-req: ([0-9]{1,7})\b")
METRIC_LINE = re.compile(r"^sglang:num_running_reqs(?:\{[^}\n]{0,2000}\})? ([0-9]{1,7}(?:\.[0-9]{1,12})?)\s*$")
MAX_RUNNING = 1 << 20


def parse(text: str, source: str) -> dict[int, float]:
    """{running requests: share of samples} from TEXT (a log, a metrics scrape or rig's JSON histogram)."""
    counts: dict[int, float] = {}
    if text.lstrip().startswith("{"):
        histogram = parse_json(text, source).get("histogram")
        if not isinstance(histogram, dict):
            raise RigError(f"{source}: a JSON load profile is {{\"histogram\": {{\"RUNNING\": WEIGHT, ...}}}}")
        for key, weight in histogram.items():
            running = numbers.parse(str(key), f"{source}: running requests {key!r}", int, 0, MAX_RUNNING, whole=True)
            counts[int(running)] = counts.get(int(running), 0.0) + numbers.read(weight, f"{source}: weight of {key}",
                                                                                  0, 1e12)
    else:
        for line in text.split("\n"):
            if found := LOG_LINE.search(line[:4000]) or METRIC_LINE.match(line[:4000]):
                running = round(numbers.parse(found.group(1), source, float, 0, MAX_RUNNING))
                counts[running] = counts.get(running, 0.0) + 1
    counts.pop(0, None)
    total = sum(counts.values())
    if not total:
        raise RigError(f"{source}: no busy sample (no `#running-req: N` log line, no sglang:num_running_reqs metric "
                       "above 0, no histogram weight): give the server's log or a scrape of its /metrics")
    return {running: weight / total for running, weight in sorted(counts.items())}


def load(path: str | Path) -> dict[int, float]:
    return parse(read_text(path, "load profile"), f"load profile {path}")


def nearest(running: int, measured: list[int]) -> int:
    """The measured concurrency that stands for RUNNING requests: the nearest on a log scale (load effects grow
    with the batch's size, not its difference)."""
    return min(measured, key=lambda c: (abs(math.log(c) - math.log(running)), c))
