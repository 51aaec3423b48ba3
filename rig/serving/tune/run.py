"""rig tune's run, its steps in order (rig.serving.tune says what each does): the variants' lines checked, then
measured, the policy chosen, confirmed and proposed, all of it recorded in tune.json however the run ends."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rig.core import RigError, progress
from rig.core.fs import atomic_write
from rig.serving import testmodel
from rig.serving.launch import Servers, inherited_said, inherited_switches, results_dir
from rig.serving.measure.plan import Plan
from rig.serving.measure.record import recorded
from rig.serving.tune import choose, confirm, measure, propose
from rig.serving.tune.report import TUNE, figures, report_markdown
from rig.serving.tune.variants import Variant
from rig.serving.workload import Workload
from rig.stack.derive import sized_for

SCHEMA_VERSION = 2
OUTPUTS = ("tune.json", "report.md", "tune.png", "adaptive.json", "step0.json", "proposed-stack.yml")


def run(stack: dict, stack_path: str, venv: str, out: str | Path, plan: Plan, workload: Workload,
        api_key_env: str, check: bool = False, profile: tuple[str, dict[int, float]] | None = None) -> dict:
    """`rig tune` on STACK as read from STACK_PATH, at PLAN's levels; CHECK: the dry run, which starts nothing.
    PROFILE: the user's load (its file, its histogram), for the one server that pays best for it."""
    sized = sized_for(stack, plan.concurrency)  # every server's graph given, and proposed with the policy
    out = results_dir(out, OUTPUTS)
    inherited = inherited_switches()  # what every server measured here runs with beyond its own line
    step0_config = out / "step0.json"
    found, lines = measure.prepare(sized, venv, plan, step0_config)
    model = testmodel.ensure(sized["server"], Path(venv) / "bin" / "python", check)
    if check:
        said = [*([model["msg"]] if model else []), *inherited_said(inherited)]
        return {**measure.dry_run(sized, found, lines, plan, said), "inherited_env": inherited}
    measure.lay_out(sized, out, step0_config)
    result: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "stack": stack_path, "plan": plan.record(),
                              "metric": plan.metric, "levels": [lv.name for lv in plan.levels], "variants": {},
                              "choices": [], "policy": {"kind": "none", "notes": []}, "confirmation": None,
                              "recommendation": "not finished", "testmodel": model, "inherited_env": inherited}
    for line in inherited_said(inherited):
        progress(line)
    with recorded(out, result, "tune.json", TUNE, report_markdown, figures) as written, \
            Servers(sized["server"]["start_timeout"], api_key_env) as servers:
        measuring = measure.Measuring(servers, venv, plan, out, workload, sized["tune"]["profile_levels"],
                                      sized["tune"]["profile_steps"], sized["tune"]["profile_host"],
                                      written.checkpoint)
        extra = _tuned(measuring, sized, stack_path, found, result, profile)
    return _said(result, written + extra)


def _tuned(measuring: measure.Measuring, stack: dict, stack_path: str, found: list[Variant], result: dict,
           profile: tuple[str, dict[int, float]] | None) -> list[str]:
    """The steps after the dry run, into RESULT (tune.json): measure, choose, confirm, propose. The files written
    beside the record (adaptive.json, proposed-stack.yml)."""
    records = result["variants"]
    found = measuring.every(found, records, stack["tune"]["uncapped"])
    metric = measuring.plan.metric
    choice = choose.family_choice(measure.usable(records), found, measuring.plan.levels, records, metric)
    kind = choose.policy(choice.rows, choice.graphs)
    result.update({"choices": choice.rows, "policy": kind, "family": choice.family, "family_scores": choice.scores,
                   "cuda_graph_bs": choice.graphs, "max_running_requests": choice.max_running_requests,
                   "step0_stand_in": choice.step0})
    config = confirm.serve_adaptive(measuring, stack, kind, choice, records) if kind["kind"] == "adaptive" else None
    result["confirmation"] = confirm.confirmation(records, choice, kind, metric)
    # the environment the policy server was confirmed with (its step-0 server's), proposed with it
    step0_env = choice.env if kind["kind"] == "adaptive" else {}
    result["recommendation"] = propose.recommend(kind, choice.rows, result["confirmation"], config,
                                                 measure.usable(records), choice.plain, metric, step0_env)
    if profile:  # the one server that pays best for the user's own load
        result["load_profile"] = confirm.for_the_load(records, measuring, profile)
        result["recommendation"] += propose.for_the_load(result["load_profile"], profile[0], measuring.plan.metric)
    proposed = _proposed(stack, stack_path, kind, config, choice, step0_env, measuring.out, result)
    return [*([config] if config else []), *proposed]


def _proposed(stack: dict, stack_path: str, kind: dict, config: str | None, choice: choose.FamilyChoice,
              step0_env: dict, out: Path, result: dict) -> list[str]:
    """proposed-stack.yml written and its diff in RESULT; what was measured stands however the stack file is laid
    out (a layout the edit does not take on is said in stack_diff)."""
    try:
        proposal = propose.proposed_stack(stack_path, kind, config, choice.server, stack["server"]["cuda_graph_max_bs"],
                                          {**stack["environment"]["vars"], **step0_env} if step0_env else None)
    except RigError as exc:
        result["stack_diff"] = f"no proposed stack: {exc}"
        progress(result["stack_diff"])
        return []
    if not proposal:
        return []
    result["stack_diff"] = proposal[1]
    return [str(atomic_write(out / "proposed-stack.yml", proposal[0]))]


def _said(result: dict, files: list[str]) -> dict:
    """What `rig tune` answers: whether the policy was confirmed, the files, the choices and the recommendation."""
    confirmed = bool(result["confirmation"] and result["confirmation"]["confirmed"])
    rows = result["choices"]
    return {"ok": confirmed and result["policy"]["kind"] != "none", "files": files, "policy": result["policy"],
            "recommendation": result["recommendation"], "confirmation": result["confirmation"], "choices": rows,
            "msg": "\n".join([f"wrote {', '.join(files)}", *(f"{r['level']}: {r['chosen']} (best {r['best']})"
                                                             for r in rows), result["recommendation"]])}
