"""rig tune's written results (rig.serving.tune): the report, its figures and the stack file with the policy in it."""
from __future__ import annotations

import difflib
from typing import Any

from rig.core.documents import dump_json
from rig.core.markdown import cell, table
from rig.serving.measure.stats import shown


def proposed_stack(stack_path: str, kind: dict, config_path: str | None, family: dict | None = None, graph: int = 0,
                   env_vars: dict | None = None) -> tuple[str, str] | None:
    """The user's stack file with the policy in its server section, edited in place (rig.stack.edit: every
    comment and other line kept), and the diff from the file on disk; the server keys of the family it came from
    (its attention backend, its running-request cap) go with it, GRAPH, the decode graph it was measured with,
    and ENV_VARS as environment.vars where given (what the policy's server ran with)."""
    from rig.core.documents import read_text
    from rig.stack.edit import with_keys

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


def _measured(level: dict | None) -> str | None:
    """A variant's cell at a level: its value, the range over rounds, the server's accept length and cap."""
    if not level or not level.get("value"):
        return None
    values = [v for v in level.get("round_values", []) if v]
    accept = level.get("server_accept_length")
    return (f"{level['value']:.1f} ({min(values):.1f}-{max(values):.1f})" + (f" acc {accept:.2f}" if accept else "")
            + (f" cap {level['capped_at']}" if level.get("capped_at") else ""))


def report_markdown(result: dict) -> str:
    names = list(result["variants"])
    plan = result["plan"]
    lines = ["# rig tune", "", f"Stack `{cell(result['stack'])}`; {plan['rounds']} round(s) per level at temperature "
             f"{plan.get('temperature', 0)}, top_p {plan.get('top_p', 1)}; metric: {result['metric']} (median over "
             "rounds, the range over rounds in brackets; the server's own accept length under each, where it "
             "speculates).", ""]
    chosen = {r["level"]: r["chosen"] for r in result["choices"]}
    lines += table(("level", *names, "chosen"),
                   ((level, *(_measured(result["variants"][n].get("levels", {}).get(level)) for n in names),
                     chosen.get(level)) for level in result["levels"]))
    stopped = [f"- {cell(n)}: {cell(v['stopped'])}" for n, v in result["variants"].items() if v.get("stopped")]
    if stopped:
        lines += ["", "Variants that stopped:", *stopped]
    kind = result["policy"]
    lines += ["", f"**Policy:** {kind['kind']}" + (f", slots {cell(dump_json(kind['slots'], 'slots'))}"
                                                   if kind.get("slots") else "")
              + (f", from the family `{cell(result.get('family') or 'default')}`" if result.get("family") is not None
                 else ""),
              *[f"- {cell(n)}" for n in kind.get("notes", [])]]
    if result.get("family_scores"):
        lines += ["", "Families (one server line: backend and cap), their choices' geometric mean to the per-level "
                  "best: " + ", ".join(f"`{cell(k)}` {shown(v, 3)}" for k, v in result["family_scores"].items())]
    if result.get("confirmation"):
        lines += ["", "## Confirmation", ""]
        lines += table(("level", "policy", "per-level best", "ratio to best, median (range)", "verdict", "confirmed",
                        "rule", "ratio to baseline"),
                       ((t["level"], shown(t["policy"], 1), f"{t['best']} {shown(t['best_value'], 1)}",
                         f"{shown(t['ratio_best'], 2)} ({shown(rng and rng[0], 2)}-{shown(rng and rng[1], 2)})",
                         t["verdict"], "yes" if t.get("confirmed") else "no", t.get("rule", "-"),
                         shown(t["ratio_baseline"], 2))
                        for t in result["confirmation"]["levels"] for rng in [t["ratio_best_range"]]))
    if (mine := result.get("load_profile")) and mine.get("chosen"):
        lines += ["", f"## For the load in `{cell(mine['file'])}`", "", "Share of busy time at each measured level "
                  "(each running-request count at the level nearest it): " + ", ".join(
                      f"{level} {share:.2f}" for level, share in mine["weights"].items()), "",
                  *table(("server", "expected"), ((n, f"{v:.1f}") for n, v in sorted(mine["expected"].items(),
                                                                                       key=lambda x: -x[1]))),
                  "", f"Chosen: {cell(mine['chosen'])}, {shown(mine['of_per_level_best'], 2)} of the per-level best's "
                  "expectation; its ratio to the best per level: " + ", ".join(
                      f"{level} {ratio:.2f}" for level, ratio in mine["ratios"].items())]
    profiled = [(n, level, lv["profile"]) for n, v in result["variants"].items()
                for level, lv in (v.get("levels") or {}).items() if (lv.get("profile") or {}).get("kernels")]
    if profiled:
        lines += ["", "## Where a decode step's time goes", "", "SGLang's torch profiler over the full batch's "
                  "steps (CUDA kernels, ms per step and rank; the largest three):", ""]
        lines += table(("server", "level", "kernel ms/step", "largest kernels"),
                       ((n, level, shown(p["kernel_ms_per_step"], 3),
                         "; ".join(f"{k['name'][:60]} {shown(k['ms_per_step'], 3)}" for k in p["kernels"][:3]))
                        for n, level, p in profiled))
    if result.get("stack_diff"):
        lines += ["", "## Proposed stack change", "", "```diff", result["stack_diff"].replace("```", "'''").rstrip(),
                  "```"]
    lines += ["", f"**Recommendation:** {cell(result['recommendation'])}", ""]
    if result.get("stopped"):
        lines += [f"**Stopped early:** {cell(result['stopped'])}", ""]
    return "\n".join(lines)


def figures(result: dict) -> dict:
    """tune.png: each variant's median per level as a ratio to the baseline's median there, its bars spanning the
    rounds' ratios (on one axis C=1's 300 tok/s and C=256's 16,000 would leave the low levels flat lines). None when
    the baseline measured no level."""
    from matplotlib.figure import Figure

    baseline: dict = next((v.get("levels", {}) for v in result["variants"].values() if v.get("kind") == "baseline"), {})
    fig = Figure(figsize=(8, 4.8))
    ax = fig.subplots()
    xs = list(range(len(result["levels"])))
    for name, variant in result["variants"].items():
        # (x, the variant's median over the baseline's, each round's over the baseline's median)
        points = [(x, mine["value"] / under, [v / under for v in mine["round_values"] if v])
                  for x, level in zip(xs, result["levels"], strict=True)
                  if (mine := variant.get("levels", {}).get(level)) and mine.get("value")
                  and (under := (baseline.get(level) or {}).get("value"))]
        if not points:
            continue
        ax.errorbar([x for x, _, _ in points], [r for _, r, _ in points],
                    yerr=[[r - min(rs) for _, r, rs in points], [max(rs) - r for _, r, rs in points]],
                    marker="o", capsize=3, label=name)
    if not ax.get_legend_handles_labels()[0]:
        return {}
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(xs, result["levels"])
    ax.set_xlabel("load (C: requests in flight, R: Poisson arrivals per second)")
    ax.set_ylabel(f"{result['metric']} / the baseline's")
    ax.set_title("rig tune: median over rounds against the baseline's median, bars span the rounds")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return {"tune.png": fig}
