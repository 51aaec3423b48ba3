"""TEST STAND-IN for `python -m sglang.launch_server`: parses the line with the stand-in's
server_args, refuses a model path that is not a model directory (as sglang does, before it
listens), then serves SGLang's HTTP API with tests/sglang_api_server.py until SIGTERM drains it.

Faults for a test come from /etc/sglang-standin.json ({"args": [stand-in server options]}).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import sglang_api_server
from sglang.srt.server_args import ServerArgs

FAULTS = Path("/etc/sglang-standin.json")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    if not (Path(args.model_path) / "config.json").is_file():
        sys.exit(f"ValueError: --model-path must be a model directory with a config.json, got {args.model_path!r}")
    faults = json.loads(FAULTS.read_text())["args"] if FAULTS.is_file() else []
    options = sglang_api_server.parse(["--port", str(args.port), "--api-key", args.api_key or "",
                                       "--accept-length", "2.5" if args.speculative_algorithm else "0", *faults])
    print(f"stand-in serving {args.model_path} on {args.host}:{args.port}", flush=True)
    asyncio.run(sglang_api_server.serve(options, args.host))


if __name__ == "__main__":
    main()
