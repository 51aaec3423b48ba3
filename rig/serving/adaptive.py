"""SGLang's load-aware speculation (`--speculative-adaptive --speculative-adaptive-config FILE`, 0.5.17+),
as rig writes, reads and routes it.

The file is a JSON object; its integer-string keys are running batch sizes, each
{"candidate_steps": [non-negative ints]} (0 = no drafting), beside optional knobs
(ema_alpha, update_interval, warmup_batches, up/down_hysteresis, ceiling_coeff).
SGLang pads the running batch size up to the next CUDA-graph batch size and uses
the slot of the largest key at or below it (the smallest key when none is). It
refuses the mode unless EAGLE/EAGLE3 with topk 1 and none of DP attention,
multi-layer EAGLE, two-batch overlap or pdmux
(sglang/srt/speculative/adaptive_spec_params.py, adaptive_unsupported_reason).
"""
from __future__ import annotations

import bisect

from rig.core import RigError, numbers
from rig.core.documents import dump_json

# SGLang's knobs and the values that make sense for each: (whole number?, lowest, highest)
KNOBS = {"ema_alpha": (False, 1e-6, 1.0), "update_interval": (True, 1, 1 << 20), "warmup_batches": (True, 0, 1 << 20),
         "up_hysteresis": (False, -32.0, 32.0), "down_hysteresis": (False, -32.0, 32.0),
         "ceiling_coeff": (False, 0.0, 32.0)}
# server flags with which SGLang refuses adaptive speculation, and its reason for each
REFUSING_FLAGS = {
    "--enable-dp-attention": "attention DP is not supported (adaptive tier decisions are not synchronized "
                             "across DP ranks)",
    "--enable-multi-layer-eagle": "enable_multi_layer_eagle=True is not supported",
    "--enable-two-batch-overlap": "enable_two_batch_overlap=True is not supported",
    "--enable-pdmux": "enable_pdmux=True is not supported",
}


def unsupported_reason(server: dict) -> str | None:
    """Why SGLang would refuse adaptive speculation for the stack's server section, in SGLang's words."""
    if server["speculative_eagle_topk"] != 1:
        return f"speculative_eagle_topk={server['speculative_eagle_topk']} (only topk=1 is supported)"
    for flag, reason in REFUSING_FLAGS.items():
        if any(arg == flag or arg.startswith(flag + "=") for arg in server["extra_args"]):
            return f"{flag} in server.extra_args: {reason}"
    return None


def _knob(key: str, value: object, where: str) -> None:
    whole, low, high = KNOBS[key]
    if wrong := numbers.problem(value, low, high, whole):
        raise RigError(f"{where}{key} must be a {'whole ' if whole else ''}number from {low} to {high} ({wrong})")


def slots(config: object, source: str) -> dict[int, list[int]]:
    """The batch-size slots of CONFIG (a parsed file), checked as SGLang's loader checks them, and its knobs'
    types: {batch size: sorted candidate steps}. Anything SGLang would refuse at start is refused here. SGLang
    gives each slot the top-level knobs with the slot's own over them ({**config, **slot}), so a knob is checked
    by the same rule wherever it stands."""
    if not isinstance(config, dict):
        raise RigError(f"{source}: an adaptive speculation config is a JSON object, got {type(config).__name__}")
    found: dict[int, list[int]] = {}
    for key, entry in config.items():
        if key in KNOBS:
            _knob(key, entry, f"{source}: ")
            continue
        if key == "strategy":
            if entry != "ema":
                raise RigError(f"{source}: strategy {entry!r}: rig writes and reads only \"ema\" (SGLang's default)")
            continue
        batch = _batch_size(key, source)  # the key first, then what it holds
        found[batch] = _slot_steps(key, entry, source)
    if not found:
        raise RigError(f'{source}: no batch-size key; give at least one, e.g. {{"1": {{"candidate_steps": [3]}}}}')
    return dict(sorted(found.items()))


def _batch_size(key: object, source: str) -> int:
    """A slot's key as SGLang reads it: a batch size from 1 to a server's running requests, as a canonical string."""
    most = numbers.MAX_RUNNING_REQUESTS  # a slot's batch size: at most a server's running requests
    if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= len(str(most)) \
            and key == str(int(key)) and 0 < int(key) <= most:
        return int(key)
    raise RigError(f"{source}: key {key!r} is neither a batch size (1-{most}, as a string without leading "
                   f"zeros) nor one of SGLang's knobs ({', '.join(KNOBS)})")


def _slot_steps(key: object, entry: object, source: str) -> list[int]:
    """A slot's sorted candidate steps, its knobs checked and no other key in it."""
    steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
    if not isinstance(steps, list) or not steps or \
            not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= 32 for s in steps):
        raise RigError(f"{source}: batch size {key}: candidate_steps must be a non-empty list of whole numbers "
                       f"from 0 to 32 (0 = no drafting), got {steps!r}")
    assert isinstance(entry, dict)  # its candidate_steps were read
    for name, value in entry.items():
        if name in KNOBS:
            _knob(name, value, f"{source}: batch size {key}: ")
        elif name != "candidate_steps":  # a typo would leave the top-level value in force, unsaid
            raise RigError(f"{source}: batch size {key}: {name!r} is neither candidate_steps nor one of SGLang's "
                           f"knobs ({', '.join(KNOBS)})")
    return sorted(set(steps))


def parse(text: str, source: str) -> dict[int, list[int]]:
    from rig.core.documents import parse_json

    return slots(parse_json(text, source), source)


def launch_problem(slots_of: dict[int, list[int]], steps: int) -> str | None:
    """Why SGLang refuses to start at STEPS with these slots (its start-up check: the launch's step count must be
    one of the candidates, which size its buffers), in its words; None where it starts."""
    candidates = sorted({s for steps_of in slots_of.values() for s in steps_of})
    if steps in candidates:
        return None
    return (f"--speculative-num-steps={steps} is not in the adaptive config candidate_steps {candidates}: launch "
            "at one of them (server.speculative_num_steps)")


def render(choice: dict[int, int]) -> str:
    """One fixed candidate per slot (deterministic: no EMA moves between candidates), as SGLang reads it."""
    return dump_json({str(bs): {"candidate_steps": [steps]} for bs, steps in sorted(choice.items())},
                     "the adaptive speculation config", indent=2) + "\n"


def pad(batch: int, graph_sizes: list[int] | None) -> int:
    """A running batch as SGLang pads it: up to the next CUDA-graph size; beyond the largest one, or without
    graphs, as it is."""
    sizes = sorted(graph_sizes or [])
    at = bisect.bisect_left(sizes, batch)
    return sizes[at] if at < len(sizes) else batch


def route(keys: list[int], batch: int, graph_sizes: list[int] | None) -> int:
    """The slot key SGLang uses for a running batch: padded (pad), then the largest key at or below it, else the
    smallest key."""
    padded = pad(batch, graph_sizes)
    below = [k for k in sorted(keys) if k <= padded]
    return below[-1] if below else min(keys)


def steps_needed(choice: dict[int, int]) -> int:
    """The server's --speculative-num-steps: the largest candidate (SGLang sizes its buffers by the union)."""
    return max(max(choice.values()), 1)
