"""`rig tune`: when does speculation pay on this box, and how to serve so that it always does.

On the box itself, one server at a time (each may need every GPU), each started from the stack's
own server line (`rig server args`), health-gated by `rig smoke`, measured, stopped, its log kept:

1. the variants: per attention backend (server.attention_backends), the baseline and fixed EAGLE-3 at
   each of tune.steps (topk 1, steps + 1 draft tokens: SGLang's adaptive mode takes topk 1 only), the
   stack's own line when it is none of those, and SGLang's step 0 as servers of their own (tune.step0:
   as shipped, with the draft extend skipped where the installed sglang reads that variable, and as
   rig's free-off patch makes it, a plain decode, where the venv has it applied);
   a speculative server that caps its running requests below its decode graph (SGLang sets 48 when
   unset) is measured again with the cap lifted to the graph size;
2. every level (bench.concurrency closed-loop, tune.request_rates open-loop Poisson), in rounds at the
   plan's temperature, each round at least bench.min_requests requests and bench.min_seconds long,
   each round's server-side accept length read after it (rig.serving.measure);
3. the choice per level, within each family of variants one server line can switch between (one
   backend, one cap): the variant with the best median (output tok/s, or goodput under the SLOs), ties
   going to the simpler one (baseline < fewer steps < more); where choices change with load, the
   step-0 slots take the family's measured step-0 server's numbers when there is one. The family whose
   choices come closest to the per-level best of every variant (geometric mean) gives the policy;
4. the policy: one choice everywhere is served as it is (no speculation, or fixed EAGLE-3); choices
   that change with load become SGLang's adaptive config, one candidate per slot (deterministic: no
   EMA flapping), each level's slot keyed at the CUDA-graph batch its running batch pads to;
5. confirmation: the policy's own server at every level, in rounds, against the baseline and the
   per-level best. Where the policy is not within noise of the best, the report says so with the
   ratio, and names what does pay.

A variant whose every request failed, or that claims EAGLE-3 while its server runs no speculation, is
a failure with its reason, never a measurement the policy builds on.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rig.core import RigError, progress
from rig.core.fs import atomic_write
from rig.serving import adaptive, testmodel
from rig.serving.launch import (
    Servers,
    config_checked,
    inherited_said,
    inherited_switches,
    make_logs,
    results_dir,
)
from rig.serving.measure.plan import Level, Plan, check_fits
from rig.serving.measure.record import recorded
from rig.serving.measure.sweep import Server
from rig.serving.measure.verdict import (
    confirm,
    for_load,
)
from rig.serving.server import health_url, render
from rig.serving.session import measured, serving
from rig.serving.tune_policy import family_choice, graph_sizes, policy, recommend
from rig.serving.tune_report import figures, proposed_stack, report_markdown
from rig.serving.tune_variants import (
    BASELINE,
    POLICY,
    STEP0_FROM,
    STEP0_SLOTS,
    Variant,
    _imports,
    assignments,
    eagle,
    uncapped,
    variants,
)
from rig.serving.workload import Workload
from rig.stack.derive import sized_for, with_server
from rig.stack.spec import unmeasured_profiles

SCHEMA_VERSION = 2
# what --check's estimate assumes: a server's start (60-130 s for an 8B shape on the H200) and one request's decode
START_S, TOKENS_PER_S = 120, 50


def run_variant(servers: Servers, variant: Variant, venv: str, plan: Plan, wanted: list[Level], out: Path,
                workload: Workload, record: dict, profiling: dict) -> None:
    """One variant's server under test (rig.serving.session): started, measured, stopped; RECORD holds what was
    measured even when it fails."""
    args = render(variant.stack, venv, baseline=variant.baseline)
    url = health_url(variant.stack)
    log = out / "logs" / f"{variant.name}.log"
    record.update({"steps": variant.steps, "kind": variant.kind, "family": variant.family, "levels": {}})
    with serving(servers, variant.name, args["argv"], url, log, record, not variant.baseline, variant.env):
        profile = {"levels": set(profiling["levels"]), "steps": profiling["steps"],
                   "dir": out / "profiles" / variant.name} if profiling["levels"] else None
        if profile:
            profile["dir"].mkdir(parents=True, exist_ok=True)
        server = Server(url, variant.name, plan, servers.api_key_env, workload, profile)
        record.update({"cuda_graph_bs": graph_sizes(server.info),
                       **{k: server.run[k] for k in ("max_running_requests", "speculative_algorithm")}})
        if note := check_fits(plan, variant.name, server.info, workload, serial=False):
            progress(note)
        measured(server, wanted, variant.name, log, record)


def _tried(servers: Servers, variant: Variant, venv: str, plan: Plan, wanted: list[Level], out: Path,
           workload: Workload, record: dict, profiling: dict) -> bool:
    """run_variant; an optional server's failure recorded in RECORD (its `stopped`, its log) and the run going on
    with the others: it costs its own numbers, not the rest. True when it measured."""
    try:
        at = [lv for lv in wanted if variant.kind != "step0" or lv.concurrency >= STEP0_FROM]
        run_variant(servers, variant, venv, plan, at, out, workload, record, profiling)
    except RigError as exc:
        if not variant.optional:
            raise
        record["stopped"] = record.get("stopped") or str(exc)
        progress(f"{variant.name}: {exc}; going on without it")
        return False
    return True


OUTPUTS = ("tune.json", "report.md", "tune.png", "adaptive.json", "step0.json", "proposed-stack.yml")


def prepare(stack: dict, venv: str, plan: Plan, step0_config: str, imports: dict[str, list[Path]]
            ) -> tuple[list[Variant], list[Level], dict[str, list[str]]]:
    """The variants, the plan's levels and every server line, rendered and parsed by the venv's sglang: all that can
    be refused is refused here, before anything is written."""
    # the stack's loader held profile_levels to bench.concurrency; the options may have changed the levels since
    if problem := unmeasured_profiles(stack["tune"]["profile_levels"], plan.concurrency):
        raise RigError(problem)
    if reason := adaptive.unsupported_reason({**stack["server"], "speculative_eagle_topk": 1}):
        raise RigError(f"rig tune derives SGLang's adaptive speculation, which SGLang refuses here: {reason}")
    found, wanted = variants(stack, venv, step0_config, imports), plan.levels
    lines = {v.name: render(v.stack, venv, baseline=v.baseline)["argv"] for v in found}
    return found, wanted, lines


def estimate_s(plan: Plan, servers: int, wanted: list[Level]) -> float:
    """A rough duration: server starts, then each level's rounds at an assumed per-request decode speed."""
    per_server = sum(max(plan.min_seconds, plan.requests_at(lv.concurrency) / lv.concurrency * plan.max_tokens
                         / TOKENS_PER_S) for lv in wanted) * plan.rounds
    return servers * (START_S + per_server)


def _check(stack: dict, found: list[Variant], wanted: list[Level], lines: dict, plan: Plan) -> dict:
    may_lift = [v.name for v in found if v.kind != "baseline"] if stack["tune"]["uncapped"] else []
    least = len(found) + 1  # and the policy's server, when the choice changes with load
    most = least + len(may_lift)
    envs = {v.name: v.env for v in found}  # what each server's environment adds, said before its line
    shown = {name: " ".join([*assignments(envs.get(name, {})), *argv]) for name, argv in lines.items()}
    return {"ok": True, "changed": False, "variants": lines, "levels": [lv.name for lv in wanted],
            "estimate_s": [estimate_s(plan, least, wanted), estimate_s(plan, most, wanted)],
            "msg": "\n".join([
                f"would start, one at a time at {health_url(stack)}, and measure at "
                f"{', '.join(lv.name for lv in wanted)} in {plan.rounds} round(s) at temperature {plan.temperature:g} "
                f"(at least {sum(plan.requests_at(lv.concurrency) for lv in wanted)} requests a round"
                + (f", {plan.min_seconds:g} s a level" if plan.min_seconds else "") + "):",
                *(f"  {name}: {line}" for name, line in shown.items()),
                *([f"  and each of {', '.join(may_lift)} again with --max-running-requests at its decode graph size, "
                   "where its server caps running requests below it"] if may_lift else []),
                "  then the policy derived from them, against the baseline and the per-level best",
                f"estimated {estimate_s(plan, least, wanted) / 60:.0f}-{estimate_s(plan, most, wanted) / 60:.0f} min "
                f"({least}-{most} servers at about {START_S} s a start, {TOKENS_PER_S} tok/s a request: measure "
                "yours with a first run)"])}


def run(stack: dict, stack_path: str, venv: str, out: str | Path, plan: Plan, workload: Workload,
        api_key_env: str, check: bool = False, profile: tuple[str, dict[int, float]] | None = None) -> dict:
    stack = sized_for(stack, plan.concurrency)  # every server's graph given, and proposed with the policy
    out = results_dir(out, OUTPUTS)
    inherited = inherited_switches()  # what every server measured here runs with beyond its own line
    step0_config = str(out / "step0.json")
    # every line rendered from a scratch copy of the step-0 config first: nothing is written before all is checked
    with config_checked(adaptive.render(STEP0_SLOTS), Path(step0_config)) as (config, as_run):
        imports = _imports(venv)
        found, wanted, lines = prepare(stack, venv, plan, str(config), imports)
        lines = as_run(lines)
    model = testmodel.ensure(stack["server"], Path(venv) / "bin" / "python", check)
    if check:
        found_plan = _check(stack, found, wanted, lines, plan)
        found_plan["msg"] = "\n".join([*([model["msg"]] if model else []), *inherited_said(inherited),
                                       found_plan["msg"]])
        return {**found_plan, "inherited_env": inherited}
    if stack["tune"]["step0"]:
        atomic_write(step0_config, adaptive.render(STEP0_SLOTS))
        found = variants(stack, venv, step0_config, imports)
    make_logs(out)
    result: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "stack": stack_path, "plan": plan.record(),
                              "metric": plan.metric, "levels": [lv.name for lv in wanted], "variants": {},
                              "choices": [], "policy": {"kind": "none", "notes": []}, "confirmation": None,
                              "recommendation": "not finished", "testmodel": model, "inherited_env": inherited}
    for line in inherited_said(inherited):
        progress(line)
    extra: list[str] = []  # the policy's files, when it has them
    with recorded(out, result, "tune.json", report_markdown, figures) as written, \
            Servers(stack["server"]["start_timeout"], api_key_env) as servers:
        profiling = {"levels": stack["tune"]["profile_levels"], "steps": stack["tune"]["profile_steps"]}
        queue = list(found)
        while queue:
            variant = queue.pop(0)
            record = result["variants"].setdefault(variant.name, {})
            if _tried(servers, variant, venv, plan, wanted, out, workload, record, profiling) and \
                    stack["tune"]["uncapped"] and \
                    (lifted := uncapped(variant, record)):
                found.append(lifted)
                queue.insert(0, lifted)  # measured next, while the box is as it was for its capped twin
        # a server that stopped mid-way measured part of a level at most: nothing the choice builds on
        measured = {name: v["levels"] for name, v in result["variants"].items()
                    if v.get("levels") and not v.get("stopped")}
        chosen = family_choice(measured, found, wanted, result["variants"])
        rows = chosen["rows"]
        kind = policy(rows, chosen.get("graphs"))
        result.update({"choices": rows, "policy": kind, "family": chosen["family"],
                       "family_scores": chosen["scores"], "cuda_graph_bs": chosen.get("graphs"),
                       "running_cap": chosen.get("cap"), "step0_stand_in": chosen.get("step0")})
        config_path = None
        # what is served: the policy's own server, the family's baseline, or the one fixed variant chosen everywhere
        judged_by = {"adaptive": POLICY, "baseline": chosen.get("baseline")}.get(kind["kind"]) or \
            (rows[0]["chosen"] if rows else POLICY)
        if kind["kind"] == "adaptive":
            config_path = str(out / "adaptive.json")
            atomic_write(config_path, adaptive.render({int(k): v for k, v in kind["slots"].items()}))
            extra.append(config_path)
            family_line = with_server(stack, **{k: chosen["server"][k] for k in ("attention_backends",
                                                                                  "max_running_requests")})
            own = Variant(POLICY, kind["steps"], eagle(family_line, kind["steps"], config_path), "eagle",
                          chosen["family"], chosen.get("env") or {}, optional=True)
            _tried(servers, own, venv, plan, wanted, out, workload,
                   result["variants"].setdefault(POLICY, {"adaptive": kind["slots"]}), profiling)
        if rows:  # a single server is held to the per-level best by its own rounds; the policy by its own run
            result["confirmation"] = confirm({n: v.get("levels") or {} for n, v in result["variants"].items()}, rows,
                                             judged_by, chosen.get("baseline") or BASELINE)
        # the environment the policy server was confirmed with (its step-0 server's), proposed with it
        step0_env = (chosen.get("env") or {}) if kind["kind"] == "adaptive" else {}
        result["recommendation"] = recommend(kind, rows, result["confirmation"], config_path, measured,
                                             chosen.get("plain") or rows, step0_env)
        if profile:  # the one server that pays best for the user's own load
            measured = {n: v["levels"] for n, v in result["variants"].items()
                        if v.get("levels") and not v.get("stopped")}
            mine = for_load(measured, list(measured), wanted, profile[1])
            result["load_profile"] = {"file": profile[0], "histogram": profile[1], **mine}
            if mine["chosen"]:
                result["recommendation"] += (f". For the load in {profile[0]}: serve {mine['chosen']} (expected "
                                             f"{mine['expected'][mine['chosen']]:.0f} {plan.metric.replace('_', ' ')},"
                                             f" {mine['of_per_level_best']:.2f} of the per-level best's)")
        try:  # what was measured stands however the stack file is laid out
            proposal = proposed_stack(stack_path, kind, config_path, chosen.get("server"),
                                      stack["server"]["cuda_graph_max_bs"],
                                      {**stack["environment"]["vars"], **step0_env} if step0_env else None)
        except RigError as exc:
            proposal, result["stack_diff"] = None, f"no proposed stack: {exc}"
            progress(result["stack_diff"])
        if proposal:
            extra.append(str(atomic_write(out / "proposed-stack.yml", proposal[0])))
            result["stack_diff"] = proposal[1]
    files_written = written + extra
    confirmed = bool(result["confirmation"] and result["confirmation"]["confirmed"])
    return {"ok": confirmed and kind["kind"] != "none", "files": files_written, "policy": kind,
            "recommendation": result["recommendation"], "confirmation": result["confirmation"], "choices": rows,
            "msg": "\n".join([f"wrote {', '.join(files_written)}",
                              *(f"{r['level']}: {r['chosen']} (best {r['best']})" for r in rows),
                              result["recommendation"]])}
