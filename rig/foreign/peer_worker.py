"""One GPU pair of `rig machine probe`'s peer-to-peer section, run in the stack venv's Python (torch only; never
rig): whether CUDA offers peer access both ways, then a patterned copy each way, checked element by element and
timed. rig runs each pair in a process of its own under a deadline, so a copy that hangs fails its pair only.
Prints one JSON line.
"""
import json
import sys
import time

import torch


def main(spec: dict) -> None:
    a, b, count, iters = spec["a"], spec["b"], spec["bytes"] // 4, spec["iters"]
    offered = torch.cuda.can_device_access_peer(a, b) and torch.cuda.can_device_access_peer(b, a)
    directions = []
    for src, dst in ((a, b), (b, a)):
        sent = torch.arange(count, dtype=torch.int32, device=f"cuda:{src}") * 7 + src  # a torn copy shows
        got = torch.empty(count, dtype=torch.int32, device=f"cuda:{dst}")
        got.copy_(sent)
        torch.cuda.synchronize(dst)
        correct = bool(torch.equal(got.cpu(), sent.cpu()))
        start = time.perf_counter()
        for _ in range(iters):
            got.copy_(sent, non_blocking=True)
        torch.cuda.synchronize(src)
        torch.cuda.synchronize(dst)
        seconds = (time.perf_counter() - start) / iters
        directions.append({"from": src, "to": dst, "correct": correct, "gbps": spec["bytes"] / seconds / 1e9})
    print(json.dumps({"a": a, "b": b, "offered": bool(offered), "directions": directions}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
