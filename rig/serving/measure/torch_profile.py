"""Where a decode step's time goes: SGLang's own torch profiler, started over HTTP once every stream of a level is
decoding, and its traces summed per kernel.

POST /start_profile {"output_dir", "num_steps", "activities": ["GPU"], "profile_id"} (SGLang's
ProfileReqInput) records the next NUM_STEPS forward steps and writes one Chrome trace per TP rank,
`{output_dir}/{profile_id}-TP-{rank}.trace.json.gz`; CUDA kernels are its complete events ("ph": "X") of
category "kernel", their `ts` and `dur` in microseconds (kernels replayed from a CUDA graph included). The servers
rig profiles are its own (rig tune), so the traces are on this machine.

Beside the sums: how long the GPU ran any kernel (the union of their intervals) against the span from the first
kernel to the last. A step whose GPU sits idle for much of that span waits on the host (the scheduler's Python,
launches), which no kernel sum shows: run 21 on an H200 found step 0 and the policy slower per step than the
baseline where the GPU's step was shorter than on the H100.
"""
from __future__ import annotations

import gzip
import time
import zlib
from pathlib import Path
from typing import TypeGuard

from rig.core import RigError, progress
from rig.core.documents import dump_json, parse_json
from rig.core.fs import open_regular
from rig.serving.sglang_api import call

MAX_TRACE = 1 << 30  # bytes of one trace, unzipped
TOP = 15
HOST_API = ("cuda_runtime", "cuda_driver")  # Kineto's categories of the host's CUDA calls (the GPU activity records them)
HOST_CODE = ("python_function", "cpu_op", "user_annotation")  # and of the host's own code (the CPU activity)


async def start(client, url: str, out: Path, steps: int, name: str, host: bool = False) -> None:
    """Ask the server to profile its next STEPS forward steps into OUT, where HOST its Python too (the CPU activity:
    SGLang's profiler records stacks unless SGLANG_PROFILE_WITH_STACK=false, as python_function events); a refusal
    is said, never fatal."""
    body = {"output_dir": str(out), "num_steps": steps, "activities": ["CPU", "GPU"] if host else ["GPU"],
            "profile_id": name}
    async with client.post(url + "/start_profile", data=dump_json(body, "the profile request"),
                           headers={"Content-Type": "application/json"}, allow_redirects=False) as answer:
        if answer.status != 200:
            progress(f"{url}/start_profile answered HTTP {answer.status}: "
                     f"{(await answer.content.read(300)).decode(errors='replace')}")


def traces(out: Path, name: str, wait: float = 120.0) -> list[Path]:
    """The trace files the profile wrote, once their sizes stop changing (or none after WAIT seconds)."""
    deadline, sizes = time.monotonic() + wait, None
    while time.monotonic() < deadline:
        found = sorted(p for p in out.glob(f"{name}-TP-*.trace.json.gz") if p.is_file() and not p.is_symlink())
        now = [p.stat().st_size for p in found]
        if found and now == sizes:
            return found
        sizes = now
        time.sleep(1.0)
    return []


def stopped_short(url: str, api_key_env: str) -> bool:
    """Once the round is over: SGLang's POST /stop_profile. True (200) when the profile was still running, the round
    having ended before its steps were in: what the server writes now is partial. Its scheduler refuses the stop of a
    profile that ended by itself (an error answer), and a server without the endpoint says 404: then the whole trace
    is, or will be, there."""
    status, _ = call(url, "/stop_profile", body={}, api_key_env=api_key_env)
    return status == 200


def _events(path: Path) -> list:
    with open_regular(path, "profile trace") as raw, gzip.GzipFile(fileobj=raw) as unzipped:
        try:
            data = unzipped.read(MAX_TRACE + 1)
        except (OSError, EOFError, zlib.error) as exc:
            raise RigError(f"profile trace {path}: not a whole gzip file ({exc})") from exc
    if len(data) > MAX_TRACE:
        raise RigError(f"profile trace {path} is larger than {MAX_TRACE >> 30} GiB unzipped; profile fewer steps")
    trace = parse_json(data.decode(errors="replace"), f"profile trace {path}")
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        raise RigError(f"profile trace {path} holds no traceEvents list")
    return events


def read(paths: list[Path], steps: int, host_code: bool = False) -> dict:
    """summarize(), or {"error": why} when a trace cannot be read: a missing profile is a note in the report, never
    the end of the measurement it was taken beside."""
    try:
        return summarize(paths, steps, host_code)
    except RigError as exc:
        progress(f"profile not read: {exc}")
        return {"error": str(exc)}


def summarize(paths: list[Path], steps: int, host_code: bool = False) -> dict:
    """Milliseconds per step of each CUDA kernel over the traces (every TP rank's, averaged), the largest first; per
    step the GPU's busy time, the kernels' span and the share of that span the GPU sat idle (None where a kernel has
    no usable timestamp: time that cannot be placed makes no idle share); and the host's CUDA API calls per step,
    the longest first: eager launches show as cudaLaunchKernel calls, a host waiting on the GPU as a synchronize.
    Where HOST_CODE (the CPU activity was asked for too), each host function's own time per step (less its
    callees'), the longest first; else that is None."""
    totals: dict[str, float] = {}
    host: dict[str, list[float]] = {}  # name -> [microseconds, calls]
    own: dict[str, float] = {}
    busy = span = 0.0
    placed = True
    for path in paths:
        intervals = []
        threads: dict[tuple, list[tuple[float, float, str]]] = {}
        for event in _events(path):
            if not (isinstance(event, dict) and event.get("ph") == "X" and _microseconds(dur := event.get("dur"))):
                continue
            name = _short(str(event.get("name", "?")))
            cat, start = event.get("cat"), event.get("ts")
            if host_code and (cat in HOST_API or cat in HOST_CODE) and _microseconds(start, limit=1e18):
                threads.setdefault((str(event.get("pid")), str(event.get("tid"))), []).append((start, dur, name))
            if cat in HOST_API:
                spent = host.setdefault(name, [0.0, 0])
                spent[0], spent[1] = spent[0] + dur, spent[1] + 1
            elif cat == "kernel":
                totals[name] = totals.get(name, 0.0) + dur
                if _microseconds(start, limit=1e18):
                    intervals.append((start, start + dur))
                else:
                    placed = False
        for calls in threads.values():
            for name, took in _own_times(calls).items():
                own[name] = own.get(name, 0.0) + took
        busy_here, span_here = _busy_and_span(intervals)
        busy, span = busy + busy_here, span + span_here
    scale = 1 / (1000 * steps * max(len(paths), 1))  # microseconds over every rank -> ms per step per rank
    total = sum(totals.values()) * scale
    top = sorted(totals.items(), key=lambda kv: -kv[1])[:TOP]
    timed = placed and span > 0
    return {"steps": steps, "ranks": len(paths), "kernel_ms_per_step": round(total, 4),
            "gpu_busy_ms_per_step": round(busy * scale, 4) if timed else None,
            "span_ms_per_step": round(span * scale, 4) if timed else None,
            "gpu_idle_share": round(1 - busy / span, 4) if timed else None,
            "kernels": [{"name": n, "ms_per_step": round(t * scale, 4),
                         "share": round(t * scale / total, 4) if total else None} for n, t in top],
            "host_calls": [{"name": n, "ms_per_step": round(t * scale, 4), "calls_per_step": round(c * scale * 1000, 2)}
                           for n, (t, c) in sorted(host.items(), key=lambda kv: -kv[1][0])[:TOP]],
            "host_own": [{"name": n, "ms_per_step": round(t * scale, 4)}
                         for n, t in sorted(own.items(), key=lambda kv: -kv[1])[:TOP]] if host_code else None}


def _short(name: str) -> str:
    """A trace's name for a report: a Python function's path from its package on (Kineto writes the file's full
    path on the machine that ran it), at most 200 characters."""
    return name.rpartition("site-packages/")[2][:200]


def _own_times(calls: list[tuple[float, float, str]]) -> dict[str, float]:
    """Each name's own time in one thread's nested calls (start, duration, name): its calls' durations less those
    of the calls made inside them. A call that outlasts its caller (the clock's rounding, a trace cut at its end) is
    clipped to the caller's end, so nesting stays strict and no time counts twice."""
    own: dict[str, float] = {}
    open_calls: list[list] = []  # [end, name, own time so far], innermost last
    for start, dur, name in sorted(calls, key=lambda c: (c[0], -c[1])):
        while open_calls and open_calls[-1][0] <= start:
            _, done, spent = open_calls.pop()
            own[done] = own.get(done, 0.0) + spent
        end = start + dur
        if open_calls:
            end = min(end, open_calls[-1][0])
            open_calls[-1][2] -= end - start
        open_calls.append([end, name, end - start])
    for _, done, spent in open_calls:
        own[done] = own.get(done, 0.0) + spent
    return own


def _microseconds(value: object, limit: float = 1e12) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < limit


def _busy_and_span(intervals: list[tuple[float, float]]) -> tuple[float, float]:
    """The union of the kernels' intervals (kernels on other streams overlap) and first start to last end."""
    if not intervals:
        return 0.0, 0.0
    intervals.sort()
    busy, (start, end) = 0.0, intervals[0]
    for begin, finish in intervals[1:]:
        if begin > end:
            busy, start = busy + end - start, begin
        end = max(end, finish)
    return busy + end - start, end - intervals[0][0]  # END: the latest end seen, sorted by start
