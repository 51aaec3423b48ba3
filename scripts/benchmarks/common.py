"""What every benchmark shares: the repository's paths, the timing of a command with the bytes the host received
meanwhile, fresh caches, the results table, and writing a section of docs/BENCHMARKS.md between its markers."""
from __future__ import annotations

import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "BENCHMARKS.md"
BIN = REPO / ".venv" / "bin"
STACK = REPO / "stacks" / "sm120-sglang-0.5.23.yml"


def received_bytes() -> int:
    total = 0
    for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
        name, data = line.split(":", 1)
        if name.strip() == "lo" or name.strip().startswith(("docker", "veth", "br-")):
            continue
        total += int(data.split()[0])
    return total


def timed(cmd: list[str], env: dict) -> tuple[float, int]:
    before, start = received_bytes(), time.monotonic()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    elapsed = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return elapsed, received_bytes() - before


def fresh_caches() -> tuple[Path, dict]:
    cache = Path(tempfile.mkdtemp(prefix="rig-bench-cache-"))
    return cache, {**os.environ, "RIG_CACHE": str(cache), "PIP_CACHE_DIR": str(cache / "pip")}


def table(results: dict[str, list[tuple[float, int]]]) -> str:
    rows = ["| run | median s | range s | median MB received |", "| --- | --- | --- | --- |"]
    for kind, runs in results.items():
        seconds = [s for s, _ in runs]
        rows.append(f"| {kind} | {statistics.median(seconds):.1f} | {min(seconds):.1f}–{max(seconds):.1f} "
                    f"| {statistics.median(b for _, b in runs) / 1e6:.1f} |")
    return "\n".join(rows)


def median(results: dict, kind: str) -> float:
    return statistics.median(s for s, _ in results[kind])


def write_section(name: str, body: str) -> None:
    """Replace (or append) the section between this benchmark's markers."""
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    section = f"{begin}\n{body.strip()}\n{end}"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip() + "\n\n" + section + "\n"
    DOC.write_text(text)
    print(body)
