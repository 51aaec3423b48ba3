"""What rig tune proposes: what to serve, said from the confirmation (or, where nothing holds, what pays instead),
and the user's stack file with the policy in it."""
from __future__ import annotations

import difflib
from typing import Any

from rig.core.documents import read_text
from rig.serving.measure.verdict import closeness
from rig.serving.tune.choose import values_of
from rig.serving.tune.variants import POLICY, assignments
from rig.stack.edit import with_keys


def recommend(kind: dict, rows: list[dict], confirmation: dict | None, config_path: str | None,
              measured: dict[str, dict], plain: list[dict], metric: str, env: dict | None = None) -> str:
    """What to serve, said from the confirmation: a single server (baseline, fixed) is held to the per-level best
    by its own rounds, an adaptive policy by its own server's (ENV: what its environment added). PLAIN: the
    choices with the baseline for step 0, what the fallback reads (by METRIC) when nothing single holds."""
    if kind["kind"] == "none":
        return "nothing was measured: no recommendation"
    # a confirmation written before issue 71 has no `confirmed` per level: its verdict decides, as it did
    lost = [t for t in (confirmation or {}).get("levels", []) if not t.get("confirmed", t["verdict"] != "lost")]
    said = [f"at {t['level']} it ran {t['ratio_best']:.2f} of {t['best']} ({t.get('rule', t['verdict'])})"
            if t["ratio_best"] is not None else f"at {t['level']} it was not measured" for t in lost]
    if confirmation and confirmation["confirmed"]:
        return _confirmed(kind, rows, config_path, env)
    if kind["kind"] != "adaptive":
        return (f"no single server holds the per-level best ({kind['kind']}: " + "; ".join(said) + f"). What pays "
                f"instead: {fallback(plain, measured, metric)}")
    return "the adaptive policy was not confirmed: " + "; ".join(said + _step0_lost(lost, rows) or [
        "its levels were not all measured"]) + f". What pays instead: {fallback(plain, measured, metric)}"


def _confirmed(kind: dict, rows: list[dict], config_path: str | None, env: dict | None) -> str:
    """What to serve when the confirmation holds KIND (baseline, fixed or adaptive) at every level."""
    if kind["kind"] == "baseline":
        return ("speculation paid at no measured load on this box (the baseline was best or within noise of the best "
                "at every level): serve without it")
    if kind["kind"] == "fixed":
        return (f"EAGLE-3 with {kind['steps']} step(s) (topk 1) was best or within noise of the best at every measured "
                f"level: serve with it, server.speculative_num_steps: {kind['steps']} and speculative_eagle_topk: 1 "
                "(proposed-stack.yml)")
    with_env = f" and {', '.join(assignments(env))} in environment.vars" if env else ""
    plan_text = ", ".join(f"{r['chosen']} at {r['level']}" for r in rows)
    return (f"serve with the adaptive policy (server.speculative_adaptive_config: {config_path}{with_env}): "
            f"confirmed within noise of the per-level best at every level ({plan_text})")


def _step0_lost(lost: list[dict], rows: list[dict]) -> list[str]:
    """Where the adaptive policy's step-0 slots lost to the plain baseline: step 0 is not a free off there."""
    step0 = [t for t in lost if t["steps"] == 0 and t["vs_baseline"] == "lost"]
    if not step0:
        return []
    ratios = ", ".join(f"{t['ratio_baseline']:.2f}" for t in step0)
    measured_as = ", ".join(sorted({r["chosen"] for r in rows if r.get("kind") == "step0"}))
    return [(f"the step-0 state (as {measured_as})" if measured_as else "SGLang's step-0 state") +
            " lost to the plain baseline at " + ", ".join(t["level"] for t in step0) +
            f" ({ratios}): step 0 is not a free off"]
def fallback(rows: list[dict], measured: dict[str, dict], metric: str) -> str:
    """What to serve when no adaptive policy holds: a load threshold where speculation pays only below it, else
    the one fixed variant closest to the per-level best over all levels (geometric mean of its ratios)."""
    spec = [r for r in rows if r["steps"] > 0]
    if not spec:
        return "serve without speculation"
    last = max(spec, key=lambda r: r["batch"])
    if all(r["steps"] > 0 for r in rows if r["batch"] <= last["batch"]) and len(spec) < len(rows):
        return (f"run {last['chosen']} where load stays at or below {last['batch']} requests in flight "
                f"(--max-running-requests {last['batch']} caps it) and a server without speculation for more")
    where = ", ".join(f"{r['chosen']} at {r['level']}" for r in rows)
    top = {r["level"]: r["best_value"] for r in rows}
    near = {name: closeness(values_of(levels_of, metric), top) for name, levels_of in measured.items() if name != POLICY}
    name = max(near, key=lambda n: near[n], default=None)
    if name is None or not near[name]:
        return f"the per-level choice is {where}; no single load threshold separates them"
    return (f"the per-level choice is {where}; no single load threshold separates them, and of the fixed servers "
            f"{name} comes closest over all levels ({near[name]:.2f} of the per-level best, geometric mean)")


def for_the_load(mine: dict, file: str, metric: str) -> str:
    """The recommendation's word on the load in FILE (MINE: rig.serving.measure.verdict.for_load's choice)."""
    if not mine["chosen"]:
        return ""
    return (f". For the load in {file}: serve {mine['chosen']} (expected {mine['expected'][mine['chosen']]:.0f} "
            f"{metric.replace('_', ' ')}, {mine['of_per_level_best']:.2f} of the per-level best's)")


def proposed_stack(stack_path: str, kind: dict, config_path: str | None, family: dict | None = None, graph: int = 0,
                   env_vars: dict | None = None) -> tuple[str, str] | None:
    """The user's stack file with the policy in its server section, edited in place (rig.stack.edit: every
    comment and other line kept), and the diff from the file on disk; the server keys of the family it came from
    (its attention backend, its running-request cap) go with it, GRAPH, the decode graph it was measured with,
    and ENV_VARS as environment.vars where given (what the policy's server ran with)."""
    if kind["kind"] not in ("adaptive", "fixed"):
        return None
    values: dict[str, Any] = {"speculative_num_steps": kind["steps"], "speculative_eagle_topk": 1,
                              "speculative_num_draft_tokens": kind["steps"] + 1}
    if graph:
        values["cuda_graph_max_bs"] = graph
    if kind["kind"] == "adaptive":
        values["speculative_adaptive_config"] = config_path
    values.update({key: family[key] for key in ("attention_backends", "max_running_requests")
                   if family and family.get(key)})
    before = read_text(stack_path, "stack file")
    after = with_keys(before, "server", values, stack_path)
    if env_vars:
        after = with_keys(after, "environment", {"vars": env_vars}, stack_path)
    diff = "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), stack_path,
                                        f"{stack_path} (proposed)"))
    return after, diff
