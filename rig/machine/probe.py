"""`rig machine probe`: how fast the box's GPUs all-reduce, and what that means for the stack.

One process per GPU runs rig/foreign/probe_worker.py in the stack venv's Python (torch.distributed,
NCCL), message sizes from 8 KB to 256 MB. Reported per size, as nccl-tests defines them:
algbw = bytes / time and busbw = algbw x 2(n-1)/n (the bytes each link carries in a ring);
small messages tell the latency a decode step's all-reduce pays, large ones the bandwidth.
The link class follows from the bandwidth, and the advice from the class (the seeds' box, 8
GPUs on PCIe, was bound by its all-reduce: speculation paid only at low concurrency).
"""
from __future__ import annotations

import os
import socket
import statistics
import tempfile
from pathlib import Path

from rig.core import RigError, numbers, outdir, progress
from rig.core.documents import dump_json
from rig.core.markdown import cell, table
from rig.core.proc import PIPE, TimeoutExpired, interpreter, last_json, script, spawn

SIZES = [8 << 10, 32 << 10, 128 << 10, 512 << 10, 2 << 20, 8 << 20, 32 << 20, 128 << 20, 256 << 20]
# bus bandwidth at 256 MB: PCIe gen5 x16 moves at most ~50 GB/s each way, NVLink 4 several hundred
NVLINK_GBPS = 100.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(python: Path, gpus: int, sizes: list[int] = SIZES, timeout: float = 600) -> dict:
    interpreter(python)
    if gpus < 1:
        raise RigError(f"--gpus {gpus}: give the number of GPUs to all-reduce across (1 or more)")
    worker = script("probe_worker")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(gpus)}
    progress(f"all-reduce across {gpus} GPU(s), {len(sizes)} sizes from {sizes[0] >> 10} KB to {sizes[-1] >> 20} MB")
    with tempfile.TemporaryDirectory(prefix="rig-probe-") as tmp:
        procs = []
        for rank in range(gpus):
            log = open(Path(tmp) / f"rank{rank}.log", "w+")
            request = dump_json({"sizes": sizes}, "the probe's sizes")
            procs.append((spawn([str(python), "-c", worker, request], f"probe rank {rank}",
                                env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                                stdout=PIPE if rank == 0 else log, stderr=log, text=True), log))
        codes: list[int | None] = [None] * gpus
        try:
            out, _ = procs[0][0].communicate(timeout=timeout)
            codes[0] = procs[0][0].returncode
            if codes[0] == 0:  # rank 0 done: the others finish with it; a failed rank 0 leaves them waiting
                codes = [p.wait(timeout=60) for p, _ in procs]
        except TimeoutExpired as exc:
            raise RigError(f"the all-reduce probe did not finish within {timeout:.0f} s (a hung NCCL "
                           "communicator: check the GPUs' links and NCCL_DEBUG=INFO)") from exc
        finally:
            for p, log in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                log.seek(0)
        logs = [log.read()[-1500:] for _, log in procs]
        for _, log in procs:
            log.close()
    if any(codes):
        bad = next(i for i, c in enumerate(codes) if c)
        raise RigError(f"the all-reduce probe failed on rank {bad} (exit {codes[bad]}): {logs[bad].strip()[-800:]}")
    return last_json(out, "the all-reduce probe")


PEER_BYTES = 64 << 20
PEER_DEADLINE = 60.0  # a 64 MB copy takes milliseconds; a minute is a hang
PEER_FIX = ("set NCCL_P2P_DISABLE: '1' in the stack's environment.vars and add --disable-custom-all-reduce to "
            "server.extra_args (both cost speed), or fix what breaks peer traffic (rig doctor's pcie-p2p check: "
            "iommu=pt, ACS off)")


def measure_peers(python: Path, gpus: int, deadline: float = PEER_DEADLINE, worker: str | None = None) -> dict:
    """Every GPU pair's peer-to-peer (rig/foreign/peer_worker.py), each pair a child of its own under DEADLINE."""
    if gpus < 2:
        return {"pairs": [], "ok": True, "advice": ["one GPU: nothing to pair"]}
    code = worker or script("peer_worker")
    pairs = []
    for a in range(gpus):
        for b in range(a + 1, gpus):
            progress(f"peer-to-peer: GPU {a} <-> GPU {b}")
            pairs.append(_pair(python, code, a, b, deadline))
    bad = [f"{p['a']}<->{p['b']}" for p in pairs if not p["ok"]]
    unoffered = [f"{p['a']}<->{p['b']}" for p in pairs if p["ok"] and not p["offered"]]
    advice = [f"peer-to-peer failed between GPUs {', '.join(bad)}: {PEER_FIX}"] if bad else []
    if unoffered:
        advice.append(f"CUDA offers no peer access between GPUs {', '.join(unoffered)}: their copies go through host "
                      "memory (NCCL does the same); expect a slower all-reduce there")
    return {"pairs": pairs, "ok": not bad, "advice": advice or [f"all {len(pairs)} pair(s) copy correctly both ways"]}


def _pair(python: Path, code: str, a: int, b: int, deadline: float) -> dict:
    spec = {"a": a, "b": b, "bytes": PEER_BYTES, "iters": 5}
    request = dump_json(spec, "the peer probe's request")
    child = spawn([str(python), "-c", code, request], f"peer probe GPU {a} <-> GPU {b}", stdout=PIPE,
                  stderr=PIPE, text=True, start_new_session=True)
    try:
        out, err = child.communicate(timeout=deadline)
    except TimeoutExpired:
        _kill_session(child)
        return {"a": a, "b": b, "ok": False, "offered": None,
                "error": f"the copy did not complete within {deadline:.0f} s (a hung peer-to-peer transfer)"}
    if child.returncode != 0:
        return {"a": a, "b": b, "ok": False, "offered": None,
                "error": f"exited {child.returncode}: {(err or out).strip()[-400:]}"}
    try:
        got = last_json(out, f"the peer probe of GPU {a} <-> GPU {b}")
        directions = [_direction(d) for d in got["directions"]]
        if sorted((d["from"], d["to"]) for d in directions) != sorted([(a, b), (b, a)]) or \
                not isinstance(got["offered"], bool):
            raise ValueError(f"it reports {[(d['from'], d['to']) for d in directions]}, not {a}->{b} and {b}->{a}")
    except (RigError, KeyError, TypeError, ValueError) as exc:
        return {"a": a, "b": b, "ok": False, "offered": None, "error": f"an answer rig cannot read: {exc}"}
    wrong = [f"{d['from']}->{d['to']}" for d in directions if not d["correct"]]
    return {"a": a, "b": b, "offered": got["offered"], "directions": directions, "ok": not wrong,
            **({"error": f"the copy {', '.join(wrong)} arrived with wrong values"} if wrong else {})}


def _direction(d: object) -> dict:
    """One way of a pair as the worker reports it: GPU indexes (ints, not bools), whether the copy arrived
    intact (a bool) and its speed (a finite, positive number)."""
    if not isinstance(d, dict):
        raise TypeError(f"a direction is {type(d).__name__}, not an object")
    ends, speed = (d.get("from"), d.get("to")), d.get("gbps")
    if not all(isinstance(e, int) and not isinstance(e, bool) for e in ends) or not isinstance(d.get("correct"), bool):
        raise TypeError(f"a direction of {ends} with correct={d.get('correct')!r}")
    if not numbers.answer(speed, low=0):  # None, or 0
        raise ValueError(f"a speed of {speed!r} GB/s")
    return {"from": ends[0], "to": ends[1], "correct": d["correct"], "gbps": speed}


def _kill_session(child) -> None:
    """The child and whatever it started (its own session): a hung copy may sit in a grandchild."""
    import signal

    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        child.communicate(timeout=10)
    except TimeoutExpired:  # a pipe held open by what survived: rig stops waiting for it
        pass


def analyse(raw: dict) -> dict:
    n = raw["world_size"]
    rows = []
    for r in raw["rows"]:
        alg = r["bytes"] / r["seconds"] / 1e9
        rows.append({**r, "latency_us": r["seconds"] * 1e6, "algbw_gbps": alg,
                     "busbw_gbps": alg * 2 * (n - 1) / n if n > 1 else 0.0})
    small = [r["latency_us"] for r in rows if r["bytes"] <= 512 << 10]
    peak = max((r["busbw_gbps"] for r in rows), default=0.0)
    if n == 1:
        link, advice = "single GPU", ["one GPU: nothing to all-reduce; tensor parallelism needs more than one"]
    elif peak >= NVLINK_GBPS:
        link = "NVLink"
        advice = ["keep environment.nccl_pcie_only false: NCCL should use the NVLink paths",
                  "tensor parallelism is cheap here: speculation pays while decode is latency-bound"]
    else:
        link = "PCIe"
        advice = ["set environment.nccl_pcie_only: true (NCCL_P2P_LEVEL=SYS, no NVLS, no IB)",
                  "flashinfer all-reduce fusion and torch symmetric memory: opt in and measure (server section)",
                  "the all-reduce bounds the server under load: serve EAGLE-3 for low concurrency only, "
                  "and let `rig bench` find the crossover"]
    return {**raw, "rows": rows, "link_class": link, "peak_busbw_gbps": peak,
            "small_message_latency_us": statistics.median(small) if small else None,
            "correct": all(r["correct"] for r in rows), "advice": advice}


def report_markdown(result: dict) -> str:
    """The probe as markdown; what the workers reported (device, versions, errors) escaped as cells."""
    lines = ["# rig machine probe", "", f"{cell(result['world_size'])} x {cell(result['device'])}, torch "
             f"{cell(result['torch'])}, NCCL {cell(result['nccl'])}: **{result['link_class']}**, peak bus bandwidth "
             f"{result['peak_busbw_gbps']:.1f} GB/s, small-message latency "
             f"{(result['small_message_latency_us'] or 0):.1f} us (median, 8-512 KB)", "",
             "busbw = algbw x 2(n-1)/n, algbw = bytes / time (the slowest rank's), as nccl-tests reports them.", "",
             *table(("size", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "correct"),
                    ((f"{r['bytes'] >> 20} MB" if r["bytes"] >= 1 << 20 else f"{r['bytes'] >> 10} KB",
                      f"{r['latency_us']:.1f}", f"{r['algbw_gbps']:.2f}", f"{r['busbw_gbps']:.2f}",
                      "yes" if r["correct"] else "NO") for r in result["rows"]))]
    peers = result.get("peers")
    if peers:
        pairs = table(("pair", "offered", "each way (GB/s)", "verdict"),
                      ((f"{p['a']}<->{p['b']}", p["offered"],
                        ", ".join(f"{d['from']}->{d['to']} {d['gbps']:.1f}{'' if d['correct'] else ' WRONG'}"
                                  for d in p.get("directions", [])) or None,
                        "ok" if p["ok"] else f"FAILED: {p['error']}") for p in peers["pairs"]))
        lines += ["", "## Peer-to-peer", "", *(pairs + [""] if peers["pairs"] else []),
                  *(f"- {a}" for a in peers["advice"])]
    lines += ["", "## Advice for the stack", ""] + [f"- {a}" for a in result["advice"]]
    return "\n".join(lines) + "\n"


def write(result: dict, out: str | Path) -> list[str]:
    return outdir.write(out, {"probe.json": outdir.record(result, "probe.json"), "probe.md": report_markdown(result)},
                         lambda: figures(result))


def figures(result: dict) -> dict:
    """probe.png: bus bandwidth and time per all-reduce against the message size."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2))
    bw, lat = fig.subplots(1, 2)
    sizes = [r["bytes"] for r in result["rows"]]
    bw.plot(sizes, [r["busbw_gbps"] for r in result["rows"]], marker="o")
    bw.set_ylabel("bus bandwidth (GB/s)")
    lat.plot(sizes, [r["latency_us"] for r in result["rows"]], marker="o", color="tab:red")
    lat.set_ylabel("time per all-reduce (us)")
    lat.set_yscale("log")
    for ax in (bw, lat):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"all-reduce, {result['world_size']} x {result['device']}: {result['link_class']}")
    fig.tight_layout()
    return {"probe.png": fig}
