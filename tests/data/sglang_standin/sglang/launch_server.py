"""TEST STAND-IN for `python -m sglang.launch_server`: parses the line with the stand-in's
server_args, refuses a model path that is not a model directory (as sglang does, before it
listens), then serves SGLang's HTTP API with tests/sglang_api_server.py until SIGTERM drains it.

Faults and the performance model for a test come from /etc/sglang-standin.json, or the file that
SGLANG_STANDIN_FAULTS names ({"args": [stand-in server options]}, after those the flags imply).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

import sglang_api_server

from sglang.srt.arg_groups.speculative_hook import _init_adaptive_speculative_params
from sglang.srt.server_args import ServerArgs

FAULTS = Path("/etc/sglang-standin.json")


FREE_OFF_LINE = '_RIG_FREE_OFF = _rig_os.environ.get("RIG_FREE_OFF", "1") != "0"'


def free_off() -> bool:
    """Whether this sglang runs step 0 as rig's free-off patch makes it: its speculative/eagle_worker_v2.py (a real
    one rig patched, or a test's) holds the patch's switch, and the server's environment leaves it on. The module
    is read, never imported (a real one needs torch and the rest of sglang)."""
    import importlib.util

    spec = importlib.util.find_spec("sglang.srt.speculative.eagle_worker_v2")
    if spec is None or not spec.origin:
        return False
    return FREE_OFF_LINE in Path(spec.origin).read_text() and os.environ.get("RIG_FREE_OFF", "1") != "0"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    if not (Path(args.model_path) / "config.json").is_file():
        sys.exit(f"ValueError: --model-path must be a model directory with a config.json, got {args.model_path!r}")
    if args.speculative_adaptive:  # SGLang's start-up check, before it loads anything
        _init_adaptive_speculative_params(args)
    faults_file = Path(os.environ.get("SGLANG_STANDIN_FAULTS", FAULTS))
    faults = json.loads(faults_file.read_text())["args"] if faults_file.is_file() else []
    speculation = ["--accept-length", "2.5" if args.speculative_algorithm else "0"]
    if args.speculative_algorithm:  # what the batched scheduler (--step-ms in the faults) drafts
        speculation += ["--steps", str(args.speculative_num_steps or 1)]
    if args.speculative_adaptive:
        speculation += ["--adaptive-config", args.speculative_adaptive_config or ""]
    if args.cuda_graph_max_bs_decode:  # powers of two up to the largest, the stand-in's CUDA-graph sizes
        speculation += ["--cuda-graph-bs", ",".join(str(1 << i) for i in range(args.cuda_graph_max_bs_decode.bit_length())
                                                    if 1 << i <= args.cuda_graph_max_bs_decode)]
    if args.grammar_backend:
        speculation += ["--grammar-backend", args.grammar_backend]
    if args.max_running_requests:
        speculation += ["--max-running-requests", str(args.max_running_requests)]
    if free_off():
        hold = os.environ.get("RIG_FREE_OFF_HOLD", "64")  # the patch's reading: a whole number, else its default
        speculation += ["--free-off", "--free-off-hold", hold if hold.isascii() and hold.isdigit() else "64"]
    marker = Path(args.model_path).parent / "testmodel.json"  # rig testmodel's record of what it wrote
    made = json.loads(marker.read_text())["spec"] if marker.is_file() else {}
    if made.get("kind") == "numerics":
        speculation += ["--rule", str(marker)]
        if args.speculative_adaptive:  # steps a batch at a time, so the adaptive slots switch with the load
            speculation += ["--step-ms", "1"]
    elif made.get("draft") == "agree":
        # a tiny model's step is launch overhead: the batched scheduler with a step that costs little more for more
        # tokens, so drafting pays at one stream, as it does on a GPU (faults given after these replace them)
        speculation += ["--step-ms", "2", "--token-ms", "0.05", "--draft-ms", "0.3"]
        if args.speculative_algorithm:  # greedy, SGLang accepts every drafted token; sampled, with the target's
            speculation += ["--accept-length", str((args.speculative_num_steps or 1) + 1), "--accept-rate", "1",
                            "--sampled-accept", str(made.get("accept", 1.0))]
    options = sglang_api_server.parse(["--port", str(args.port), "--api-key", args.api_key or "", *speculation,
                                       *faults])
    print(f"stand-in serving {args.model_path} on {args.host}:{args.port}", flush=True)
    asyncio.run(sglang_api_server.serve(options, args.host))


if __name__ == "__main__":
    main()
