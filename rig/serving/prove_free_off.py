"""rig prove's free-off steps: the served tokens stay lossless, and the draft stays in step, across the adaptive
policy's switches between drafting and step 0.

They run where the stack opts into free-off (patches.opt_in), each on an adaptive server whose slots switch
within a short load, SLOTS: EAGLE-3 at 3 steps below 4 running, step 0 from 4 up, with
RIG_FREE_OFF_HOLD=0 so the routing follows the batch at once and every switch the load makes is taken:

1. switches, at the largest TP size prove covers that the box has the GPUs for: the numerics test model and a
   burst of its prompts at once, each asking for more tokens than the one before, so the batch trails off from all
   of them to one through both states. Every prompt's greedy tokens must be the rule's, and the server's own log
   must show a switch each way (the patch logs `rig free-off: steps A -> B`), else the load proved nothing.
   Then, on the same server, the fallbacks (rig.serving.prove_fallbacks): grammar, logprobs, penalties, stop
   strings and n > 1 served from a step-0 batch as they are from a drafting one.
2. accept after off: the agreeing test model at one stream (fresh), then at OFF_BATCH (the off window: step 0,
   its accept length 1), then at one stream again: drafting has resumed, and its accept length, the server's own
   counters, must be within ACCEPT_TOLERANCE of the fresh one's.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import re
from pathlib import Path
from typing import Any

from rig.core import RigError
from rig.core.check import Check, Runner
from rig.core.documents import dump_json
from rig.core.fs import atomic_write
from rig.serving import numerics, prove_fallbacks
from rig.serving.launch import Servers
from rig.serving.measure.plan import Level, plan_from
from rig.serving.measure.stats import shown
from rig.serving.measure.sweep import Server
from rig.serving.session import measured, serving
from rig.stack.derive import with_server

FEATURE = "free-off"
# SGLang's adaptive config for both steps, written where the run's servers read it (slots_file)
SLOTS = {"1": {"candidate_steps": [3]}, "4": {"candidate_steps": [0]}}
SLOTS_NAME = "free-off-slots.json"
STEPS = 3
ENV = {"RIG_FREE_OFF": "1", "RIG_FREE_OFF_HOLD": "0"}
OFF_BATCH = 8
ACCEPT_TOLERANCE = 0.1
SWITCH = re.compile(r"rig free-off: steps ([0-9]{1,3}) -> ([0-9]{1,3}) at batch")
SWITCHES, AFTER_OFF = "free-off: switches", "free-off: accept after off"


def opted_in(stack: dict) -> bool:
    return FEATURE in stack["patches"]["opt_in"]


def slots_text() -> str:
    return dump_json(SLOTS, "the free-off slots", indent=1) + "\n"


def slots_file(directory: Path) -> Path:
    """SLOTS, serialized into DIRECTORY (replacing what stood there in one rename, a link included): the path."""
    return atomic_write(directory / SLOTS_NAME, slots_text())


def switches_label(tp: int) -> str:
    return f"{SWITCHES} tp{tp}"


def switching(stack: dict, slots: Path) -> dict:
    """STACK's server adaptive over the SLOTS file at STEPS, topk 1, at its TP (the caller puts its model and TP
    in)."""
    return with_server(stack, speculative_num_steps=STEPS, speculative_eagle_topk=1,
                       speculative_num_draft_tokens=STEPS + 1, speculative_adaptive_config=str(slots))


def switches_seen(log: Path) -> list[tuple[int, int]]:
    """The (before, after) of each switch the server logged."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    return [(int(a), int(b)) for a, b in SWITCH.findall(text)]


def both_ways(seen: list[tuple[int, int]]) -> bool:
    return any(b == 0 < a for a, b in seen) and any(a == 0 < b for a, b in seen)


def burst(url: str, api_key_env: str, ask) -> list[dict]:
    """Every numerics prompt at once, prompt i asking for (i + 1) x NEW_TOKENS / 2 tokens: the batch trails off as
    they finish. ASK(url, prompt, count) is prove's greedy request; its answers in the prompts' order."""
    prompts = numerics.prompts()
    counts = [(i + 1) * numerics.NEW_TOKENS // 2 for i in range(len(prompts))]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(lambda pc: ask(url, pc[0], pc[1]), zip(prompts, counts, strict=True)))
    return [{"prompt": n, "tokens": a["tokens"], "expected": numerics.continuation(p, c)}
            for n, (p, c, a) in enumerate(zip(prompts, counts, answers, strict=True))]


def judge_switches(answers: list[dict], seen: list[tuple[int, int]], record: Check) -> None:
    record.data = {"prompts": len(answers), "tokens": sum(len(a["expected"]) for a in answers),
                   "switches": [f"{a} -> {b}" for a, b in seen]}
    wrong = [numerics.first_difference(a["prompt"], a["tokens"], a["expected"]) for a in answers
             if a["tokens"] != a["expected"]]
    if wrong:
        first = wrong[0]
        record.data["first_difference"] = first
        raise RigError(f"{len(wrong)} of {len(answers)} prompts lost tokens across the switches: prompt "
                       f"{first['prompt']} differs at token {first['position']}: {first['got']} where the rule has "
                       f"{first['expected']} (switches logged: {', '.join(record.data['switches']) or 'none'})")
    if not both_ways(seen):
        raise RigError("the tokens are the rule's, but the server logged no switch both ways (`rig free-off: steps "
                       f"A -> B` lines: {', '.join(record.data['switches']) or 'none'}): the load proved nothing "
                       "about switches; is the free-off patch applied to this venv (rig patch status)?")
    record.detail = (f"{len(answers)} prompts, {record.data['tokens']} greedy tokens = the rule's across "
                     f"{len(seen)} logged switch(es) ({', '.join(record.data['switches'])})")


def judge_after_off(phases: dict[str, float | None], record: Check) -> None:
    fresh, off, again = phases["fresh"], phases["off"], phases["resumed"]
    record.data = {**phases, "tolerance": ACCEPT_TOLERANCE}
    said = (f"accept length fresh {shown(fresh, 2)}, in the off window at C={OFF_BATCH} {shown(off, 2)}, "
            f"resumed {shown(again, 2)}")
    if fresh is None or off is None or again is None:
        raise RigError(f"the server's accept length was not read in every phase: {said}")
    if off > 1 + ACCEPT_TOLERANCE:
        raise RigError(f"the off window drafted: {said} (step 0 accepts exactly one token a step); the slots "
                       f"{dump_json(SLOTS, 'slots')} did not reach step 0 at {OFF_BATCH} running")
    if abs(again - fresh) > ACCEPT_TOLERANCE:
        raise RigError(f"the draft came back out of step: {said}, {abs(again - fresh):.2f} apart (at most "
                       f"{ACCEPT_TOLERANCE:g}): what step 0 kept of the draft's KV is not what drafting reads")
    record.detail = said


def accept_phases(url: str, bench: dict | None, api_key_env: str, log: Path) -> dict[str, float | None]:
    """The server's own accept length at one stream (fresh), at OFF_BATCH (the off window) and at one stream again,
    greedy, each phase a round of its own after SGLang's /flush_cache resets the counters."""
    phases = {}
    for name, level in (("fresh", Level(1)), ("off", Level(OFF_BATCH)), ("resumed", Level(1))):
        plan = plan_from(bench, concurrency=[level.concurrency], max_tokens=64, rounds=1, min_requests=8,
                         min_seconds=0, warmup=2, temperature=0.0)
        label, record = f"{AFTER_OFF} ({name})", dict[str, Any]()
        measured(Server(url, label, plan, api_key_env), [level], label, log, record)
        phases[name] = (record["levels"].get(level.name) or {}).get("server_accept_length")
    return phases


def run_steps(lines: dict[str, list[str]], tp: int, url: str, out: Path, report: Runner, api_key_env: str,
              bench: dict, start_timeout: float, ask) -> None:
    """The two steps, each on its own server from LINES (rendered by prove's plan), the switches at TP (every rank
    must take the same state at every step, so it runs where the box serves); ASK is prove's greedy request."""
    logs = out / "logs"

    def switches(log: Path, record: Check) -> None:
        judge_switches(burst(url, api_key_env, ask), switches_seen(log), record)

    def after_off(log: Path, record: Check) -> None:
        judge_after_off(accept_phases(url, bench, api_key_env, log), record)

    def fallbacks(log: Path) -> None:
        prove_fallbacks.run_step(url, api_key_env, log, report)

    with Servers(start_timeout, api_key_env) as servers:
        for label, step, name, then in ((switches_label(tp), switches, f"free-off-switches-tp{tp}", fallbacks),
                                        (AFTER_OFF, after_off, "free-off-after", None)):
            _on_its_server(servers, report, label, lines[label], url, logs / f"{name}.log", step, then)


def _on_its_server(servers: Servers, report: Runner, label: str, argv: list[str], url: str, log: Path, step,
                   then=None) -> None:
    """LABEL's server started and smoke-tested with ENV, STEP(log, record) run on it, then THEN(log) where given,
    the server stopped after."""
    held = contextlib.ExitStack()

    def start(record: Check) -> None:
        record.data = {}
        held.enter_context(serving(servers, label, argv, url, log, record.data, True, ENV))
        record.detail = record.data["smoke"]

    with held:
        if report.run(f"{label}: start and smoke", start).status == "pass":
            report.run(label, lambda record: step(log, record))
            if then is not None:
                then(log)
