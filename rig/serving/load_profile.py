"""A server's load over time, as a histogram of running requests: what `rig tune --load-profile` weighs each
measured level by, to choose the one server that pays best for that load.

Read from what an SGLang box already has, whichever FILE holds:
- the server's log: the scheduler's decode lines, `Decode batch ... #running-req: N, ... gen throughput
  (token/s): G` (one every decode_log_interval steps; a prefill line's running count is not a decode's). A line
  stands for a fixed number of decode steps, so it weighs by how long they took: N / G per token's step, or 1
  where the line gives no throughput;
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
from rig.core.documents import parse_json
from rig.core.fs import open_regular

LOG_LINE = re.compile(r"Decode batch[.,]? .{0,200}?#running-req: ([0-9]{1,7})\b")
THROUGHPUT = re.compile(r"gen throughput \(token/s\): ([0-9]{1,9}(?:\.[0-9]{1,6})?)")
MAX_LINE = 4000  # a decode line is a few hundred bytes; the rest of a longer one is not read
MAX_BYTES = 1 << 34  # a log is read as it streams, up to 16 GiB
METRIC_LINE = re.compile(r"^sglang:num_running_reqs(?:\{[^}\n]{0,2000}\})? ([0-9]{1,7}(?:\.[0-9]{1,12})?)\s*$")
MAX_RUNNING = 1 << 20


def parse(lines, source: str) -> dict[int, float]:
    """{running requests: share of busy time} from LINES (of a log, a metrics scrape or rig's JSON histogram)."""
    lines = iter(lines)
    first = next(lines, "")
    counts: dict[int, float] = {}
    if first.lstrip().startswith("{"):
        histogram = parse_json(first + "".join(lines), source).get("histogram")
        if not isinstance(histogram, dict):
            raise RigError(f"{source}: a JSON load profile is {{\"histogram\": {{\"RUNNING\": WEIGHT, ...}}}}")
        for key, weight in histogram.items():
            running = numbers.parse(str(key), f"{source}: running requests {key!r}", int, 0, MAX_RUNNING, whole=True)
            counts[int(running)] = counts.get(int(running), 0.0) + numbers.read(weight, f"{source}: weight of {key}",
                                                                                  0, 1e12)
    else:
        for line in (first, *lines):
            line = line[:MAX_LINE]
            if found := LOG_LINE.search(line):
                running = int(numbers.parse(found.group(1), source, int, 0, MAX_RUNNING, whole=True))
                rate = THROUGHPUT.search(line)
                speed = numbers.parse(rate.group(1), source, float, 0, 1e9) if rate else 0
                counts[running] = counts.get(running, 0.0) + (running / speed if speed and running else 1.0)
            elif found := METRIC_LINE.match(line):
                running = round(numbers.parse(found.group(1), source, float, 0, MAX_RUNNING))
                counts[running] = counts.get(running, 0.0) + 1
    counts.pop(0, None)
    total = sum(counts.values())
    if not total:
        raise RigError(f"{source}: no busy sample (no `Decode batch ... #running-req: N` log line, no "
                       "sglang:num_running_reqs metric above 0, no histogram weight): give the server's log or a "
                       "scrape of its /metrics")
    return {running: weight / total for running, weight in sorted(counts.items())}


def load(path: str | Path) -> dict[int, float]:
    """A load profile file, a regular file read as it streams (a server's log can be large, and not all UTF-8)."""
    with open_regular(path, "load profile") as handle:
        if handle.seek(0, 2) > MAX_BYTES:
            raise RigError(f"load profile {path} is larger than {MAX_BYTES >> 30} GiB; give a part of the log")
        handle.seek(0)
        return parse((raw.decode("utf-8", errors="replace") for raw in handle), f"load profile {path}")


def nearest(running: int, measured: list[int]) -> int:
    """The measured concurrency that stands for RUNNING requests: the nearest on a log scale (load effects grow
    with the batch's size, not its difference)."""
    return min(measured, key=lambda c: (abs(math.log(c) - math.log(running)), c))
