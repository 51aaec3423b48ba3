"""`rig audit` of a large real wheel (sgl-kernel 0.3.21) and `rig wheels build` of the test extension with an
empty and a warm ccache: the audit must stay quick enough to run on every wheel, and ccache must pay off."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from .common import BIN, REPO, STACK, median, table, timed, write_section


def bench_wheels(rounds: int) -> None:
    """Audit and build times, in a venv and CUDA tree rig makes from its own caches."""
    sys.path.insert(0, str(REPO))
    from rig.python.lock import read
    from rig.python.pip import download, target_args

    if not shutil.which("ccache"):
        subprocess.run(["apt-get", "install", "-y", "-q", "ccache"], check=True, capture_output=True)
    cache = Path(os.environ.get("RIG_CACHE", Path.home() / ".cache" / "rig"))
    env = {**os.environ}
    work = Path(tempfile.mkdtemp(prefix="rig-bench-wheels-"))
    lock = STACK.with_suffix(".lock")
    rig = str(BIN / "rig")
    for cmd in ([rig, "wheelhouse", "fetch", str(lock)], [rig, "wheelhouse", "export", str(lock), str(work / "house")],
                [rig, "venv", "install", "--venv", str(work / "venv"), "--lock-hash", read(lock)["lock_hash"],
                 "--python-version", "3.11", "--wheelhouse", str(work / "house")]):
        subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
    fetched = subprocess.run([rig, "cuda", "fetch", "--version", "13.0.2", "--json"], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout
    subprocess.run([rig, "cuda", "install", "--version", "13.0.2", "--prefix", str(work),
                    "--source", json.loads(fetched)["dir"]], cwd=REPO, check=True, capture_output=True)
    wheel_dir = cache / "index-wheels" / "sgl-kernel-0.3.21"
    if not list(wheel_dir.glob("*.whl")):
        download(["sgl-kernel==0.3.21"], wheel_dir, target_args("3.11"), [])
    big = next(wheel_dir.glob("*.whl"))
    build = [rig, "wheels", "build", "tests/data/rig_scale_ext", "--venv", str(work / "venv"),
             "--cuda-home", str(work / "cuda-13.0"), "--cache", str(work / "rig-cache")]
    results: dict[str, list] = {"audit sgl-kernel 0.3.21": [], "build, empty ccache": [], "build, warm ccache": []}
    for _ in range(rounds):
        results["audit sgl-kernel 0.3.21"].append(audit_time([rig, "audit", str(big)], env))
        env["CCACHE_DIR"] = tempfile.mkdtemp(prefix="rig-bench-ccache-", dir=work)
        for kind in ("build, empty ccache", "build, warm ccache"):
            results[kind].append(timed(build, env))
    shutil.rmtree(work, ignore_errors=True)
    write_section("wheels", f"""
## `rig audit` and `rig wheels build`

Measured {datetime.now(timezone.utc):%Y-%m-%d} with `python scripts/bench.py wheels`, {rounds} rounds,
interleaved. **audit**: `rig audit` of the {big.stat().st_size / 1e6:.0f} MB sgl-kernel 0.3.21 wheel against
the default stack (unpack the shared objects, read their ELF and the archs of each fat binary);
exit 1 is its verdict. **build**: `rig wheels build tests/data/rig_scale_ext` against torch 2.14.1
with nvcc 13.0 (wheels method) for 12.0a and 9.0a, with a fresh ccache directory, then the same
build again with that ccache warm. The build includes the audit of the wheel it makes.

{table(results)}

- audit: **{median(results, 'audit sgl-kernel 0.3.21'):.1f} s** (goal: under 15 s)
- warm ccache / empty ccache: **{median(results, 'build, warm ccache') / median(results, 'build, empty ccache'):.2f}**
""")


def audit_time(cmd: list[str], env: dict) -> tuple[float, int]:
    """Like timed(), but the audit's verdict (exit 1: the wheel fails) is not an error."""
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return time.monotonic() - start, 0
