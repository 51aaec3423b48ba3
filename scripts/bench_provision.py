#!/usr/bin/env python3
"""Time `make provision` cold, warm and as a no-op re-run; write docs/BENCHMARKS.md.

cold:  empty caches: a new RIG_CACHE and pip cache, and the base image removed,
       so the base image is bootstrapped and every wheel downloaded again;
warm:  caches kept, a fresh box;
no-op: the same box again (FRESH=0): everything already converged.
The three kinds are interleaved round by round so that machine noise hits
them alike; medians are reported. Bytes downloaded are the host's received
bytes on its non-loopback, non-container interfaces during each run.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def received_bytes() -> int:
    total = 0
    for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
        name, data = line.split(":", 1)
        name = name.strip()
        if name == "lo" or name.startswith(("docker", "veth", "br-")):
            continue
        total += int(data.split()[0])
    return total


def provision(env: dict, fresh: bool) -> tuple[float, int]:
    before, start = received_bytes(), time.monotonic()
    done = subprocess.run(["make", "provision", f"FRESH={int(fresh)}", "BOX=rig-bench-box"],
                          cwd=REPO, env=env, capture_output=True, text=True)
    elapsed = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"make provision failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return elapsed, received_bytes() - before


def base_image_tags() -> list[str]:
    out = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", "rig-base"],
                         capture_output=True, text=True).stdout
    return out.split()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "docs" / "BENCHMARKS.md"))
    args = parser.parse_args()

    results: dict[str, list[tuple[float, int]]] = {"cold": [], "warm": [], "no-op": []}
    for round_ in range(1, args.rounds + 1):
        cache = Path(tempfile.mkdtemp(prefix="rig-bench-cache-"))
        env = {**os.environ, "RIG_CACHE": str(cache), "PIP_CACHE_DIR": str(cache / "pip")}
        for tag in base_image_tags():
            subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
        for kind, fresh in (("cold", True), ("warm", True), ("no-op", False)):
            seconds, downloaded = provision(env, fresh)
            results[kind].append((seconds, downloaded))
            print(f"round {round_}: {kind:5} {seconds:7.1f} s  {downloaded / 1e6:8.1f} MB", flush=True)
        shutil.rmtree(cache, ignore_errors=True)
    subprocess.run(["docker", "rm", "-f", "rig-bench-box"], capture_output=True)
    write_report(results, Path(args.out))


def write_report(results: dict, out: Path) -> None:
    med = {k: statistics.median(s for s, _ in v) for k, v in results.items()}
    mb = {k: statistics.median(b for _, b in v) / 1e6 for k, v in results.items()}
    rows = "\n".join(
        f"| {k} | {med[k]:.1f} | {min(s for s, _ in v):.1f}–{max(s for s, _ in v):.1f} | {mb[k]:.1f} |"
        for k, v in results.items())
    text = f"""# Benchmarks

## `make provision`: cold, warm, no-op

Measured {datetime.now(timezone.utc):%Y-%m-%d} with `make bench` (scripts/bench_provision.py) on
this project's development machine (2 cores, 24 GiB), {len(results['cold'])} rounds. Each round runs, in
order: **cold** (a new, empty RIG_CACHE and pip cache, the base image removed, a fresh box),
**warm** (caches kept, a fresh box) and **no-op** (`FRESH=0`: the same box, already
converged). Kinds are interleaved round by round so noise hits them alike. Seconds are
wall-clock for the whole `make provision` (Docker check, base image, box, site.yml,
`rig doctor`); MB are bytes received on the host's network interfaces during the run.

| run | median s | range s | median MB downloaded |
| --- | --- | --- | --- |
{rows}

- warm / cold: **{med['warm'] / med['cold']:.2f}** (goal: under 0.33)
- no-op: **{med['no-op']:.1f} s** (goal: under 30 s)

Cold time is dominated by bootstrapping the base image with debootstrap and by
downloading the CUDA wheels (nvcc, nvrtc, nvvm, cudart, cccl, crt); warm runs copy the
cached wheels into the box and assemble the tree; the no-op run fetches and copies
nothing because the engine's plan step finds the toolkit already in place.
"""
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
