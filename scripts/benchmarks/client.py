"""Is `rig bench`'s own client ever the limit? Its throughput against what the SGLang API stand-in generated,
and the tokens it takes in per second of its own CPU."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone

from .common import BIN, REPO, write_section


def bench_client(rounds: int) -> None:
    """Is rig bench's client ever the limit? Client pinned to one core, the stand-in server to the other."""
    import asyncio
    import socket
    import urllib.request

    sys.path.insert(0, str(REPO))
    from rig.serving.measure import client
    from rig.serving.measure.plan import plan_from
    from rig.serving.measure.stats import summarize
    from rig.serving.sglang_api import generate_body
    from rig.serving.workload import builtin

    cores = sorted(os.sched_getaffinity(0))
    client_core, server_core = cores[-1], cores[0]
    os.sched_setaffinity(0, {client_core})
    plan = plan_from()
    concurrency, requests, tokens = 256, 512, 256

    def serve(*options: str):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen(["taskset", "-c", str(server_core), str(BIN / "python"),
                                 str(REPO / "tests" / "sglang_api_server.py"), "--port", str(port), *options])
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                return proc, url
            except OSError:
                time.sleep(0.1)
        raise SystemExit("the stand-in did not start")

    def sweep(url: str) -> tuple[dict, float]:
        urllib.request.urlopen(urllib.request.Request(url + "/rig_test/stats", data=b"", method="POST"))
        bodies = [generate_body(builtin(i), tokens, True) for i in range(requests)]
        cpu = time.process_time()
        results = asyncio.run(client.run_requests(url, plan, "SGLANG_API_KEY", bodies.__getitem__, requests,
                                                concurrency))
        cpu = time.process_time() - cpu
        level = summarize(results, concurrency)
        if level["failed"]:
            raise SystemExit(f"failed requests: {level['errors']}")
        return level, cpu

    ratios, intake, seen, made = [], [], [], []
    for _ in range(rounds):
        # paced like a loaded server: 256 streams at 20 tok/s each, 5120 tok/s in all
        proc, url = serve("--rate", "20")
        level, _ = sweep(url)
        stats = json.loads(urllib.request.urlopen(url + "/rig_test/stats").read())
        generated = stats["tokens"] / (stats["last_emit"] - stats["first_emit"])
        seen.append(level["output_throughput"])
        made.append(generated)
        ratios.append(level["output_throughput"] / generated)
        proc.kill()
        # unpaced: the stand-in sends as fast as its core allows; tokens per second of client CPU
        proc, url = serve("--rate", "1000000")
        level, cpu = sweep(url)
        intake.append(level["output_tokens"] / cpu)
        proc.kill()
    write_section("client", f"""
## `rig bench`: is the client the limit?

Measured {datetime.now(timezone.utc):%Y-%m-%d} with `python scripts/bench.py client`, {rounds} rounds. The
client (rig bench's own request loop) runs pinned to one core, the SGLang API stand-in
(tests/sglang_api_server.py) to the other. Each round sends {requests} streamed requests of {tokens}
tokens, {concurrency} at a time, one token per chunk (no speculation: the most chunks per token).

- **paced**: the stand-in generates 20 tok/s per stream ({concurrency} streams, {concurrency * 20} tok/s nominal).
  The client's throughput (its output tokens over first send to last byte) against what the
  stand-in generated (its tokens over its first to last emit) in the same run:
  {statistics.median(seen):.0f} vs {statistics.median(made):.0f} tok/s, ratio median
  **{statistics.median(ratios):.3f}** (range {min(ratios):.3f}–{max(ratios):.3f}; goal at least 0.98).
- **unpaced**: the stand-in sends as fast as it can; the client's tokens per second of its own
  CPU time: median **{statistics.median(intake):,.0f} streamed tok/s per client core**
  (range {min(intake):,.0f}–{max(intake):,.0f}). A real server is far below that: the seeds'
  baseline saturated near 773 tok/s on 8 GPUs.
""")
