"""TEST STAND-IN for sglang.srt.speculative.adaptive_spec_params: the config loader's checks, as SGLang 0.5.17+
words them (integer-string keys are batch sizes; each needs a non-empty candidate_steps of ints >= 0; at least
one such key). Nothing here is SGLang's code."""
from __future__ import annotations

import json


def _load_adaptive_config(path):
    with open(path) as handle:
        config = json.load(handle)
    slots = {}
    for key, entry in config.items():
        if not key.isdigit():
            continue
        steps = entry.get("candidate_steps")
        if not isinstance(steps, list) or not steps or not all(isinstance(s, int) and s >= 0 for s in steps):
            raise ValueError(f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}")
        slots[int(key)] = entry
    if not slots:
        raise ValueError("speculative_adaptive_config must contain at least one integer-string BS key")
    return config, slots


def resolve_candidate_steps_from_config(cfg_path=None):
    """The union of every slot's candidate steps, sorted (what SGLang sizes its buffers by)."""
    _, slots = _load_adaptive_config(cfg_path)
    return sorted({s for entry in slots.values() for s in entry["candidate_steps"]})
