"""TEST STAND-IN for sglang.srt.server_args: the flags rig renders for the default stack.

They are sglang 0.5.23's spellings (rig's end-to-end test parses the same line with the real
0.5.23 wheel's parser); values are typed as sglang types them.
"""
from __future__ import annotations

import argparse


class ServerArgs:
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--model-path", "--model", required=True)
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=30000)
        parser.add_argument("--tp-size", "--tp", type=int, default=1)
        parser.add_argument("--api-key")
        parser.add_argument("--mem-fraction-static", type=float)
        parser.add_argument("--speculative-algorithm", choices=["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"])
        parser.add_argument("--speculative-draft-model-path")
        parser.add_argument("--speculative-num-steps", type=int)
        parser.add_argument("--speculative-eagle-topk", type=int)
        parser.add_argument("--speculative-num-draft-tokens", type=int)
        parser.add_argument("--speculative-adaptive", action="store_true")
        parser.add_argument("--speculative-adaptive-config")
        parser.add_argument("--max-running-requests", type=int)
        parser.add_argument("--attention-backend")
        parser.add_argument("--cuda-graph-max-bs-decode", type=int)
        parser.add_argument("--enable-flashinfer-allreduce-fusion", action="store_true")
        parser.add_argument("--enable-torch-symm-mem", action="store_true")
        # what the H200 validation stacks add (docs/validation): accepted, nothing the stand-in models
        parser.add_argument("--sampling-backend", choices=["flashinfer", "pytorch", "ascend"])
        parser.add_argument("--grammar-backend", choices=["xgrammar", "outlines", "llguidance", "none"])
        parser.add_argument("--skip-server-warmup", action="store_true")
        parser.add_argument("--decode-log-interval", type=int, default=40)  # a decode line every N steps
        # the draft's own attention backend (ServerArgs.speculative_draft_attention_backend; default: the target's)
        parser.add_argument("--speculative-draft-attention-backend")
