"""rig prove's acceptance steps: a serving test model whose draft agrees with its target (the stack's own test model
when its server serves one, else the tiny one), baseline and EAGLE-3 (ACCEPT_STEPS steps, topk 1) at one stream,
greedy. Its accept length, the server's own, must reach ACCEPT_FLOOR and EAGLE-3 must beat the baseline; an accept
length near 1 is never a pass for a step that claims speculation works.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rig.core import RigError
from rig.core.check import Check, Runner
from rig.serving import testmodel
from rig.serving.launch import Servers
from rig.serving.measure.plan import Level
from rig.serving.measure.stats import shown
from rig.stack.derive import with_server

# an agreeing draft, greedy, 3 steps: every drafted token is accepted (accept length 4); below the floor the server
# does not accept what it should
ACCEPT_STEPS, ACCEPT_FLOOR = 3, 3.5
AGREE = "agree"
BASELINE, EAGLE = "baseline", "eagle3"
# SERVE(servers, label, baseline): one server from prove's lines started, smoke-tested, benchmarked at one stream
# and stopped (prove's _serve); its answer, None when it never served
Serve = Callable[[Servers, str, bool], "dict | None"]


def agreeing(stack: dict, out: Path) -> dict:
    """The stack served with a serving test model whose draft agrees: the stack's own test model where its server
    serves one (its shape and acceptance), else the tiny one under OUT; EAGLE-3 at ACCEPT_STEPS, topk 1, TP 1."""
    server = stack["server"]
    own = server["model"] == "testmodel"
    model = {k: server[k] for k in ("testmodel_dir", "testmodel_shape", "testmodel_accept")} if own else \
        {"testmodel_dir": str(out / "models-agree"), "testmodel_shape": "tiny", "testmodel_accept": 1.0}
    return with_server(stack, model="testmodel", draft_model="testmodel", tp=1, speculative_num_steps=ACCEPT_STEPS,
                       speculative_eagle_topk=1, speculative_num_draft_tokens=ACCEPT_STEPS + 1,
                       speculative_adaptive_config="", **model)


def run_steps(stack: dict, python: Path, out: Path, report: Runner, api_key_env: str, serve: Serve) -> None:
    """The agreeing draft's model, its baseline and EAGLE-3 at one stream (each through SERVE), then the verdict on
    what they measured."""
    built = report.run(f"{AGREE} testmodel", lambda r: agree_model(stack, out, python, r))
    if built.status == "fail":
        report.skip(f"{AGREE}: acceptance", "no agreeing test model to serve")
        return
    with Servers(stack["server"]["start_timeout"], api_key_env) as servers:
        base = serve(servers, f"{BASELINE} {AGREE}", True)
        spec = serve(servers, f"{EAGLE} {AGREE}", False)
    report.run(f"{AGREE}: acceptance", lambda r: judge_acceptance(base, spec, r))


def agree_model(stack: dict, out: Path, python: Path, record: Check) -> None:
    # the stack's own test model is held to the stack's own record (its TP's heads), never rebuilt for TP 1
    own = stack["server"]["model"] == "testmodel"
    made = testmodel.ensure(stack["server"] if own else agreeing(stack, out)["server"], python)
    assert made is not None  # agreeing() serves the test model
    record.data = {k: made[k] for k in ("shape", "accept", "expected_accept_length") if k in made}
    record.detail = made["msg"]


def judge_acceptance(base: dict | None, spec: dict | None, record: Check) -> None:
    """EAGLE-3 with an agreeing draft must accept (its server's accept length at least ACCEPT_FLOOR) and beat the
    baseline at one stream; what was seen is said either way."""
    level = Level(1).name
    seen = {name: ((answer or {}).get("bench") or {}).get(level) or {} for name, answer in
            (("baseline", base), ("eagle3", spec))}
    accept = seen["eagle3"].get("server_accept_length")
    fast, slow = seen["eagle3"].get("output_throughput"), seen["baseline"].get("output_throughput")
    record.data = {"accept_length": accept, "floor": ACCEPT_FLOOR, "steps": ACCEPT_STEPS,
                   "eagle3_output_throughput": fast, "baseline_output_throughput": slow,
                   "ratio": round(fast / slow, 3) if fast and slow else None}
    said = (f"accept length {shown(accept, 2)} with {ACCEPT_STEPS} steps (at least {ACCEPT_FLOOR:g} wanted), "
            f"EAGLE-3 {shown(fast, 1)} tok/s against the baseline's {shown(slow, 1)} at {level}")
    if not fast or not slow:
        raise RigError(f"nothing to judge: {said} (a server did not serve or measure; see the steps above)")
    if accept is None or accept < ACCEPT_FLOOR:
        raise RigError(f"the agreeing draft is not accepted: {said}; speculation runs but accepts "
                       f"{'nothing rig could read' if accept is None else 'too little'} (check the draft model and the "
                       "server log)")
    if fast <= slow:
        raise RigError(f"speculation accepts but does not pay: {said}")
    record.detail = said + f": {fast / slow:.2f}x"
