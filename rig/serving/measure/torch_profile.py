"""Where a decode step's time goes: SGLang's own torch profiler, started over HTTP once every stream of a level is
decoding, and its traces summed per kernel.

POST /start_profile {"output_dir", "num_steps", "activities": ["GPU"], "profile_id"} (SGLang's
ProfileReqInput) records the next NUM_STEPS forward steps and writes one Chrome trace per TP rank,
`{output_dir}/{profile_id}-TP-{rank}.trace.json.gz`; CUDA kernels are its complete events ("ph": "X") of
category "kernel", their `dur` in microseconds (kernels replayed from a CUDA graph included). The servers rig
profiles are its own (rig tune), so the traces are on this machine.
"""
from __future__ import annotations

import gzip
import time
import zlib
from pathlib import Path

from rig.core import RigError, progress
from rig.core.documents import dump_json, parse_json
from rig.core.fs import open_regular

MAX_TRACE = 1 << 30  # bytes of one trace, unzipped
TOP = 15


async def start(client, url: str, out: Path, steps: int, name: str) -> None:
    """Ask the server to profile its next STEPS forward steps into OUT; a refusal is said, never fatal."""
    body = {"output_dir": str(out), "num_steps": steps, "activities": ["GPU"], "profile_id": name}
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


def read(paths: list[Path], steps: int) -> dict:
    """summarize(), or {"error": why} when a trace cannot be read: a missing profile is a note in the report, never
    the end of the measurement it was taken beside."""
    try:
        return summarize(paths, steps)
    except RigError as exc:
        progress(f"profile not read: {exc}")
        return {"error": str(exc)}


def summarize(paths: list[Path], steps: int) -> dict:
    """Milliseconds per step of each CUDA kernel over the traces (every TP rank's, averaged), the largest first."""
    totals: dict[str, float] = {}
    for path in paths:
        for event in _events(path):
            if isinstance(event, dict) and event.get("ph") == "X" and event.get("cat") == "kernel":
                dur = event.get("dur")
                if isinstance(dur, (int, float)) and not isinstance(dur, bool) and 0 <= dur < 1e12:
                    name = str(event.get("name", "?"))[:200]
                    totals[name] = totals.get(name, 0.0) + dur
    scale = 1 / (1000 * steps * max(len(paths), 1))  # microseconds over every rank -> ms per step per rank
    total = sum(totals.values()) * scale
    top = sorted(totals.items(), key=lambda kv: -kv[1])[:TOP]
    return {"steps": steps, "ranks": len(paths), "kernel_ms_per_step": round(total, 4),
            "kernels": [{"name": n, "ms_per_step": round(t * scale, 4),
                         "share": round(t * scale / total, 4) if total else None} for n, t in top]}
