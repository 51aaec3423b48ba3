"""TEST STAND-IN for sglang.srt.arg_groups.speculative_hook (0.5.17+): the start-up check of an adaptive line, as
SGLang words it (`_init_adaptive_speculative_params`: the launch's --speculative-num-steps must be one of the
config's candidate steps, and the draft tokens follow it). Nothing here is SGLang's code."""
from __future__ import annotations

from sglang.srt.speculative.adaptive_spec_params import resolve_candidate_steps_from_config


def _init_adaptive_speculative_params(server_args) -> None:
    candidates = resolve_candidate_steps_from_config(cfg_path=server_args.speculative_adaptive_config)
    if server_args.speculative_eagle_topk is None:
        server_args.speculative_eagle_topk = 1
    if server_args.speculative_num_steps is None:
        server_args.speculative_num_steps = candidates[len(candidates) // 2]
    if server_args.speculative_num_steps not in candidates:
        raise ValueError(f"--speculative-num-steps={server_args.speculative_num_steps} is not in the adaptive config "
                         f"candidate_steps {candidates}. Pass one of those values.")
    server_args.speculative_num_draft_tokens = server_args.speculative_num_steps + 1
