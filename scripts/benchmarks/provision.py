"""`make provision` with the default stack, cold, warm and no-op, then `playbooks/site.yml` on one fresh box
against three: the time a user waits for a box, and whether a fleet costs more than one host (the bytes each box
received and the controller sent over Docker's bridge say where the transfer goes)."""
from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from .common import BIN, REPO, fresh_caches, median, timed, write_section


def box_received(name: str) -> int:
    """Bytes BOX received on its network interface since it started (its own network namespace)."""
    done = subprocess.run(["docker", "exec", name, "cat", "/sys/class/net/eth0/statistics/rx_bytes"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def bridge_sent() -> int:
    """Bytes this machine sent to its containers over Docker's bridge."""
    return int(Path("/sys/class/net/docker0/statistics/tx_bytes").read_text())


def bench_provision(rounds: int) -> None:
    """make provision with the default stack: cold, warm, no-op; then site.yml on one fresh box against three."""
    results: dict[str, list] = {"cold": [], "warm": [], "no-op": []}
    fleet: dict[str, list] = {"1 box": [], "3 boxes": []}
    bytes_seen: dict[str, list] = {"1 box": [], "3 boxes": []}
    for round_ in range(1, rounds + 1):
        cache, env = fresh_caches()
        images = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", "rig-base"],
                                capture_output=True, text=True, check=False).stdout.split()
        for tag in images:
            subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)
        for kind, fresh in (("cold", 1), ("warm", 1), ("no-op", 0)):
            results[kind].append(timed(["make", "provision", f"FRESH={fresh}", "BOX=rig-bench-box"], env))
            print(f"round {round_}: {kind} {results[kind][-1]}", flush=True)
        subprocess.run(["docker", "rm", "-f", "rig-bench-box"], capture_output=True, check=False)
        for kind, count in (("1 box", 1), ("3 boxes", 3)):
            seconds, received, sent = site_on_boxes(count, env)
            fleet[kind].append((seconds, 0))
            bytes_seen[kind].append((received, sent))
            print(f"round {round_}: {kind} {seconds:.1f} s, boxes received {received}, controller sent {sent}",
                  flush=True)
        shutil.rmtree(cache, ignore_errors=True)
    rows = ["| run | median s | range s |", "| --- | --- | --- |"]
    for kind, runs in {**results, **fleet}.items():
        seconds = [s for s, _ in runs]
        rows.append(f"| {kind} | {statistics.median(seconds):.1f} | {min(seconds):.1f}–{max(seconds):.1f} |")
    byte_rows = ["| run | each box received, MB | the controller sent over the bridge, MB |", "| --- | --- | --- |"]
    for kind, seen in bytes_seen.items():
        received, sent = seen[-1]
        byte_rows.append(f"| {kind} | {', '.join(f'{r / 1e6:.0f}' for r in received)} | {sent / 1e6:.0f} |")
    goals = [("cold", 240), ("warm", 60), ("no-op", 15)]
    write_section("provision", f"""
## `make provision` with the default stack: cold, warm, no-op; one box against three

Measured {datetime.now(timezone.utc):%Y-%m-%d} with `python scripts/bench.py provision` (`make bench`)
on the development machine (2 cores, 24 GiB), {rounds} round(s), stack `default`
(sm120-sglang-0.5.23: the CUDA toolkit, its ldconfig, the 208-wheel venv, the SM120 patches,
then `rig doctor`). Each round: **cold** (a new, empty RIG_CACHE and pip cache, the base image
removed, a fresh box: the box installs the wheels and packs the venv archive the controller keeps),
**warm** (caches and the archive kept, a fresh box: it unpacks the archive), **no-op** (`FRESH=0`: the
same, already converged box); then `playbooks/site.yml` on **1** and on **3** fresh boxes at once
(warm caches: each unpacks the archive). Seconds are wall-clock.

{chr(10).join(rows)}

Goals: {', '.join(f'{k} at most {g} s (measured {median(results, k):.0f} s)' for k, g in goals)};
three boxes at most 1.3x one box (measured **{median(fleet, '3 boxes') / median(fleet, '1 box'):.2f}x**).

Bytes of the last round's fleet runs: what each box's network interface received (its own
counter, from when it started), and what this machine sent to its containers over Docker's
bridge (the venv archive the boxes pulled from the controller's server). Files Ansible
copies through the Docker API (the CUDA wheels, the lock, the engine) do not cross the bridge.

{chr(10).join(byte_rows)}
{READING_PROVISION}""")


READING_PROVISION = """
Reading the numbers (written with the 2026-11-30 run). Before hosts pulled, cold was 591 s; most of
the gain is that the box pulls the 4.4 GB over HTTP instead of receiving a Docker API copy through the
controller (about 10 MB/s), and that uv installs in about half pip's time (the installer section). The
venv alone is about 117 s of unpacking and byte-compiling 10 GB on two cores, so warm cannot reach 90 s
on this machine; cold adds the download and the base image; the no-op is Ansible's per-task overhead
over about 90 tasks and `rig doctor`, with nothing fetched or copied. Three boxes on one 2-core machine
unpack three venvs on the same cores and disk, so their ratio is bounded by the CPU, not the transfer:
the controller sent each box its wheels once, in parallel. On a fleet each host unpacks on its own
cores. The CUDA wheels (190 MB) are still copied through the connection. For comparison, on 2026-11-29,
when the controller copied the wheelhouse to each box, `playbooks/python.yml` alone took 493.6 s on one
box and 804.3 s on three.
"""


def site_on_boxes(count: int, env: dict) -> tuple[float, list[int], int]:
    image = subprocess.run(["bash", "scripts/base-image.sh"], cwd=REPO, env=env, capture_output=True,
                           text=True, check=True).stdout.split()[-1]
    names = [f"rig-bench-{i}" for i in range(count)]
    for name in names:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
        subprocess.run(["docker", "run", "-d", "--name", name, image, "sleep", "infinity"], check=True,
                       capture_output=True)
    inventory = Path(tempfile.mkstemp(suffix=".yml")[1])
    inventory.write_text("all:\n  children:\n    gpu_hosts:\n      hosts:\n" + "".join(
        f"        {n}:\n          ansible_connection: community.docker.docker_api\n"
        "          ansible_python_interpreter: /usr/bin/python3\n" for n in names))
    try:
        sent = bridge_sent()
        seconds, _ = timed([str(BIN / "ansible-playbook"), "-i", str(inventory), "playbooks/site.yml"],
                           {**env, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")})
        return seconds, [box_received(n) for n in names], bridge_sent() - sent
    finally:
        subprocess.run(["docker", "rm", "-f", *names], capture_output=True, check=False)
        inventory.unlink()
