"""`make test` on a fresh clone of HEAD as CI runs it: the install, each pytest run, the rest, and the peak
disk: what a CI run costs and where its time goes."""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from .common import REPO, write_section


class DiskPeak:
    """The most disk used on PATH's filesystem above what was used at the start, sampled every 2 s
    (the suite's temporary trees, the Docker engine's images and containers: all on one filesystem in CI)."""

    def __init__(self, path: str) -> None:
        self.path, self.peak, self._stop = path, 0, threading.Event()

    def __enter__(self) -> DiskPeak:
        start = shutil.disk_usage(self.path).used

        def sample() -> None:
            while not self._stop.wait(2):
                self.peak = max(self.peak, shutil.disk_usage(self.path).used - start)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def bench_suite(rounds: int) -> None:
    """make test on a fresh clone of HEAD, as CI runs it (.ci/run), with this machine's caches: the install,
    each pytest run (from its JUnit file) and what is left (lint, the Docker engine, the base image)."""
    import xml.etree.ElementTree as ElementTree

    runs = []
    for _ in range(rounds):
        clone = Path(tempfile.mkdtemp(prefix="rig-bench-suite-")) / "rig"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "RIG_BASE_IMAGE"))}
        env["CI"] = "true"
        start = time.monotonic()
        with DiskPeak(tempfile.gettempdir()) as disk:
            done = subprocess.run(["make", "venv"], cwd=clone, env=env, capture_output=True, text=True, check=False)
            install = time.monotonic() - start
            done = done if done.returncode else subprocess.run(["bash", ".ci/run"], cwd=clone, env=env,
                                                               capture_output=True, text=True, check=False)
        total = time.monotonic() - start
        if done.returncode != 0:
            raise SystemExit(f"make test failed in {clone}:\n{done.stdout[-4000:]}{done.stderr[-2000:]}")
        phases, slowest = {}, []
        for name in ("quick", "boxes"):
            suite = ElementTree.parse(clone / "build" / f"junit-{name}.xml").getroot()
            suite = suite if suite.tag == "testsuite" else suite[0]
            phases[name] = (float(suite.get("time")), int(suite.get("tests")))
            (REPO / "build").mkdir(exist_ok=True)  # kept for a closer look at where the time went
            shutil.copyfile(clone / "build" / f"junit-{name}.xml", REPO / "build" / f"suite-junit-{name}.xml")
            slowest += [(float(c.get("time")), c.get("name")) for c in suite.iter("testcase")]
        runs.append({"install": install, "total": total, "phases": phases, "slowest": sorted(slowest)[-5:],
                     "disk": disk.peak})
        shutil.rmtree(clone.parent, ignore_errors=True)
    last = runs[-1]
    rest = statistics.median(r["total"] - r["install"] - sum(t for t, _ in r["phases"].values()) for r in runs)
    rows = ["| phase | median min | tests |", "| --- | --- | --- |",
            f"| install (make venv) | {statistics.median(r['install'] for r in runs) / 60:.1f} | |",
            *(f"| {name} tests (pytest -n WORKERS) | {statistics.median(r['phases'][name][0] for r in runs) / 60:.1f} "
              f"| {last['phases'][name][1]} |" for name in ("quick", "boxes")),
            f"| lint, Docker engine, base image | {rest / 60:.1f} | |",
            f"| **make test, wall** | **{statistics.median(r['total'] for r in runs) / 60:.1f}** | |"]
    disk = max(r["disk"] for r in runs) / 2**30
    slow = "\n".join(f"- {name}: {seconds / 60:.1f} min" for seconds, name in reversed(last["slowest"]))
    write_section("suite", f"""## The suite: `make test` on a fresh clone ({datetime.now(timezone.utc):%Y-%m-%d})

`python scripts/bench.py suite`: a fresh clone of HEAD, `make venv` then `bash .ci/run` with CI=true, as root,
this machine's caches (wheels, CUDA, the base image) warm; {rounds} round(s), {os.cpu_count()} cores.

{chr(10).join(rows)}

At most {disk:.1f} GiB of disk in use above the start (temporary trees, images, containers; sampled every 2 s).

The slowest tests of the last round (a test's time includes the fixtures it set up):

{slow}
""")
