"""Warm provisioning of a fresh box with a small stack, three ways: the lock's wheels, the lock's archive, the lock's
image (python_stack's three paths), each a fresh loop-capable box running playbooks/python.yml against a controller
cache that already holds the wheels, the archive and the image; the three interleaved in each round."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

from .common import REPO, write_section

sys.path.insert(0, str(REPO / "tests"))  # the suite's boxes and plays: the same Ansible and boxes as its tests

# numpy: a small real stack with a compiled wheel (2,000 files); click: a pure-Python one
STACK = {"name": "venv-take", "python": "3.11", "cuda": {"version": "13.0.2"},
         "extra_packages": ["click==8.1.7", "numpy==2.1.3"]}
TOOK = ("Mount the lock's venv image", "Unpack the archive into the venv", "Install the lock into the venv")
WAYS = {"wheels": {"python_stack_archive": False, "python_stack_venv_image": False},
        "archive": {"python_stack_venv_image": False},
        "image": {}}


def base_image() -> str:
    subprocess.run(["bash", str(REPO / "scripts" / "ensure-docker.sh")], check=True, capture_output=True)
    done = subprocess.run(["bash", str(REPO / "scripts" / "base-image.sh")], check=True, capture_output=True, text=True)
    return done.stdout.strip().splitlines()[-1]


def bench_venv_take(rounds: int) -> None:
    from harness.boxes import new_box, remove_boxes
    from harness.plays import play

    work = Path(tempfile.mkdtemp(prefix="rig-bench-take-"))
    os.environ["RIG_CACHE"] = str(work / "cache")  # the controller's cache of this run (the plays inherit it)
    stack = work / "venv-take.yml"
    stack.write_text(yaml.safe_dump(STACK))
    subprocess.run([sys.executable, "-m", "rig", "lock", "--stack", str(stack)], check=True, capture_output=True)
    settings = {"python_stack_lock": str(stack.with_suffix(".lock")), "python_stack_patches": {"opt_in": []}}
    image = base_image()
    packer = new_box(image)  # warms the controller: the wheels downloaded, the venv packed and imaged
    try:
        play([packer], "python.yml", **settings).expect_ok()
    finally:
        remove_boxes([packer])
    kept = next((work / "cache" / "venv-archive").glob("*/*.manifest.json"))
    entries = len(json.loads(kept.read_text())["entries"])
    sizes = {kind: next(kept.parent.glob(f"*{suffix}")).stat().st_size / 1e6 for kind, suffix in
             (("archive", ".tar.zst"), ("image", ".sqfs"))}
    seconds: dict[str, list[float]] = {way: [] for way in WAYS}
    for round_ in range(1, rounds + 1):
        for way, extra in WAYS.items():
            box = new_box(image, loop=True)
            try:
                started = time.monotonic()
                done = play([box], "python.yml", **settings, **extra).expect_ok()
                seconds[way].append(time.monotonic() - started)
                took = [step for step in TOOK if any(step in t for t in done.changed_tasks(box.name))]
            finally:
                remove_boxes([box])
            print(f"round {round_}: {way} {seconds[way][-1]:.1f} s ({'; '.join(took)})", flush=True)
    rows = ["| the venv from | median s | range s |", "| --- | --- | --- |"]
    rows += [f"| {way} | {statistics.median(s):.1f} | {min(s):.1f}-{max(s):.1f} |" for way, s in seconds.items()]
    today = datetime.now(timezone.utc).date().isoformat()
    write_section("venv-take", f"""
**Warm provisioning of a fresh box, three ways ({today}, `python scripts/bench.py venv-take`).** playbooks/python.yml
on a fresh loop-capable box (not systemd: no mount unit) with a small stack (click and numpy 2.1.3: {entries} entries
in the venv, a {sizes["archive"]:.0f} MB archive, a {sizes["image"]:.0f} MB image),
the controller's cache already holding the lock's wheels, archive and image; the three interleaved in each of
{rounds} rounds, medians. The play's whole wall time, Ansible's start and the engine's copy included:

{chr(10).join(rows)}
""")

