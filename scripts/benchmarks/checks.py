"""What each agreement and peer check costs (validate's toolchain, doctor's toolkit and venv agreement,
pcie-p2p, one probed GPU pair) on constructed inputs: the checks run on every validate and doctor, so they must be
cheap."""
from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from .common import REPO, STACK, write_section


def bench_checks(rounds: int) -> None:
    """The cost of issue 27's checks, each timed on its own (median of ROUNDS x 5 calls), on constructed inputs
    shaped like a real box: a CUDA 13.0 tree whose nvcc is a script, a venv with a torch and flashinfer's
    metadata, the recorded 8-GPU PCIe shape, a peer worker that answers at once (the child start is the cost)."""
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "tests"))
    from unit.test_cuda_agreement import fake_venv, toolkit
    from unit.test_gpu_health import PCIE8, PLAIN, peer_path
    from unit.test_probe import ANSWER

    from rig.ci.validate import _toolchain
    from rig.machine import doctor, gpu_health, probe
    from rig.python.lock import read
    from rig.stack.spec import load

    root = Path(tempfile.mkdtemp(prefix="rig-bench-checks-"))
    tree = toolkit(root / "tk", "13.0", 13000, "13.0.96")
    venv = fake_venv(root, {"torch": "2.14.1", "nvidia-cuda-runtime": "13.0.96", "flashinfer-python": "0.7.2"})
    stack, lock = load(STACK), read(STACK.with_suffix(".lock"))
    raw = {"topology": {"rc": 0, "out": PCIE8}, "peer_path": peer_path("identity", PLAIN)}
    cases = {
        "validate: toolchain (the default lock, 208 wheels)": lambda: _toolchain(stack, lock),
        "doctor: cuda-13.0-agreement (runs nvcc --version)": lambda: doctor._toolkit_agreement(tree),
        "doctor: cuda-agreement (starts the venv's Python)":
            lambda: doctor._agreement(str(venv), {"environ": {"CUDA_HOME": str(tree)}}),
        "doctor: pcie-p2p judged (8 GPUs, 6 bridges)": lambda: gpu_health.peer_check(raw),
        "probe: one GPU pair (a child per pair)":
            lambda: probe.measure_peers(Path(sys.executable), 2, worker=ANSWER.format(bad="set()", unoffered=-1)),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, call in cases.items():  # interleaved: noise hits every check alike
            start = time.perf_counter()
            for _ in range(5):
                call()
            times[name].append((time.perf_counter() - start) / 5)
    shutil.rmtree(root, ignore_errors=True)
    rows = ["| check | median ms | range ms |", "| --- | --- | --- |"]
    rows += [f"| {name} | {statistics.median(t) * 1e3:.2f} | {min(t) * 1e3:.2f}-{max(t) * 1e3:.2f} |"
             for name, t in times.items()]
    write_section("checks", f"""## What the agreement and peer checks cost ({datetime.now(timezone.utc):%Y-%m-%d})

`python scripts/bench.py checks`: each check timed on its own, 5 calls a round, {rounds} rounds interleaved,
{os.cpu_count()} cores; constructed inputs shaped like a real box (tests/unit's trees, venv and PCIe record).
On a real box the doctor's agreement adds one `nvcc --version` and one start of the venv's Python; the probe
adds one child per GPU pair (28 on 8 GPUs) plus the copies themselves (64 MB each way).

{chr(10).join(rows)}
""")
