"""One rank of `rig machine probe`: all-reduce timings through torch.distributed and NCCL (run in the stack venv's Python).

Standalone on purpose (torch only; never rig). rig starts one process per GPU with RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set; rank 0 prints one JSON line.
"""
import json
import os
import sys

import torch
import torch.distributed as dist


def main(spec: dict) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    rows = []
    for size in spec["sizes"]:
        x = torch.ones(size // 4, dtype=torch.float32, device="cuda")
        dist.all_reduce(x)  # correctness first: every element is now the number of ranks
        ok = bool((x == world).all().item())
        x.zero_()  # zeros stay zeros however often they are summed: no overflow in the timed loop
        iters = max(5, min(200, (1 << 30) // max(size, 1)))  # small messages repeat more: their time is tiny
        for _ in range(5):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dist.all_reduce(x)
        end.record()
        torch.cuda.synchronize()
        seconds = start.elapsed_time(end) / 1000 / iters
        # all ranks agree on the slowest rank's time, as nccl-tests reports it
        t = torch.tensor([seconds], device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        rows.append({"bytes": size, "iters": iters, "seconds": t.item(), "correct": ok})
        del x
    if rank == 0:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
        print(json.dumps({"world_size": world, "torch": torch.__version__, "nccl": nccl,
                          "device": torch.cuda.get_device_name(0), "rows": rows}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
