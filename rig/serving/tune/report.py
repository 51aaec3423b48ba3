"""tune.json: its shape (the run record's levels in each variant), how an earlier one is read, and what is drawn
from it: report.md (one section a function, in the order they are read) and tune.png."""
from __future__ import annotations

from pathlib import Path

from rig.core.documents import dump_json
from rig.core.markdown import cell, table
from rig.core.schema import Field
from rig.serving.measure.record import FORMAT_FIELD, LEVEL, RUN, capped, judged, read, rounds_of, value_of
from rig.serving.measure.stats import shown

# one server measured (tune/measure.py writes it; session.py its start and its levels, keyed by level name)
VARIANT = Field(dict, open=True, fields={
    "steps": Field((int, type(None))), "kind": Field((str, type(None))), "stopped": RUN.fields["stopped"],
    "max_running_requests": RUN.fields["max_running_requests"], "levels": Field(dict, default={}, values=LEVEL)})
TUNE = Field(dict, open=True, fields={
    "format": FORMAT_FIELD, "metric": Field(default="output_throughput", choices=("output_throughput", "goodput")),
    "levels": Field(list, default=[], item=Field()), "variants": Field(dict, default={}, values=VARIANT),
    "max_running_requests": RUN.fields["max_running_requests"]})


def read_tune(path: str | Path) -> dict:
    """An earlier run's tune.json, read through TUNE (rig's older formats converted, and said)."""
    return read(path, "tune.json", TUNE)


def _measured(variant: dict, level_name: str, metric: str) -> str | None:
    """VARIANT's cell at a level: its METRIC, the range over rounds, the server's accept length, and its
    max_running_requests where that held the level below its concurrency."""
    level = (variant.get("levels") or {}).get(level_name)
    if not level or not (value := value_of(level, metric)):
        return None
    values = [v for v in rounds_of(level, metric) if v]
    accept = level.get("server_accept_length")
    most = capped(variant, level)
    return (f"{value:.1f} ({min(values):.1f}-{max(values):.1f})" + (f" acc {accept:.2f}" if accept else "")
            + (f" max_running_requests {most}" if most else ""))


def report_markdown(result: dict) -> str:
    """report.md: the measurements, the policy, its confirmation, the load's choice, the profiles, the proposed
    stack change and the recommendation, each section from tune.json (older files too: absent keys are left out)."""
    sections = (_measurements, _stopped, _policy, _confirmation, _for_the_load, _profiles, _stack_diff)
    lines = [line for section in sections for line in section(result)]
    lines += ["", f"**Recommendation:** {cell(result['recommendation'])}", ""]
    if result.get("stopped"):
        lines += [f"**Stopped early:** {cell(result['stopped'])}", ""]
    return "\n".join(lines)


def _measurements(result: dict) -> list[str]:
    names = list(result["variants"])
    plan = result["plan"]
    chosen = {r["level"]: r["chosen"] for r in result["choices"]}
    return ["# rig tune", "", f"Stack `{cell(result['stack'])}`; {plan['rounds']} round(s) per level at temperature "
            f"{plan.get('temperature', 0)}, top_p {plan.get('top_p', 1)}; metric: {result['metric']}"
            f"{_open_loop(result)} (median over rounds, the range over rounds in brackets; the server's own accept "
            "length under each, where it speculates).", "",
            *table(("level", *names, "chosen"),
                   ((level, *(_measured(result["variants"][n], level, result["metric"]) for n in names),
                     chosen.get(level)) for level in result["levels"]))]


def _open_loop(result: dict) -> str:
    """What the request-rate levels are judged by where it is not the run's metric (judged), else nothing."""
    other = {judged(lv, result["metric"]) for v in result["variants"].values() for lv in (v.get("levels") or {}).values()}
    other.discard(result["metric"])
    return (f", at each request rate {', '.join(sorted(other))}: the median request's output tokens/s (open loop, "
            "every server that keeps up makes the arrival rate's throughput)") if other else ""


def _stopped(result: dict) -> list[str]:
    stopped = [f"- {cell(n)}: {cell(v['stopped'])}" for n, v in result["variants"].items() if v.get("stopped")]
    return ["", "Variants that stopped:", *stopped] if stopped else []


def _policy(result: dict) -> list[str]:
    kind = result["policy"]
    slots = f", slots {cell(dump_json(kind['slots'], 'slots'))}" if kind.get("slots") else ""
    family = f", from the family `{cell(result.get('family') or 'default')}`" if result.get("family") is not None \
        else ""
    lines = ["", f"**Policy:** {kind['kind']}{slots}{family}", *[f"- {cell(n)}" for n in kind.get("notes", [])]]
    if result.get("family_scores"):
        lines += ["", "Families (one server line: backend and cap), their choices' geometric mean to the per-level "
                  "best: " + ", ".join(f"`{cell(k)}` {shown(v, 3)}" for k, v in result["family_scores"].items())]
    return lines


def _confirmation(result: dict) -> list[str]:
    if not result.get("confirmation"):
        return []
    said = ["", "Each level is judged as above: a request rate by the median request's speed."] \
        if _open_loop(result) else []
    return ["", "## Confirmation", *said, "",
            *table(("level", "policy", "per-level best", "ratio to best, median (range)", "verdict", "confirmed",
                    "rule", "ratio to baseline"),
                   ((t["level"], shown(t["policy"], 1), f"{t['best']} {shown(t['best_value'], 1)}",
                     f"{shown(t['ratio_best'], 2)} ({shown(rng and rng[0], 2)}-{shown(rng and rng[1], 2)})",
                     t["verdict"], "yes" if t.get("confirmed") else "no", t.get("rule", "-"),
                     shown(t["ratio_baseline"], 2))
                    for t in result["confirmation"]["levels"] for rng in [t["ratio_best_range"]]))]


def _for_the_load(result: dict) -> list[str]:
    mine = result.get("load_profile")
    if not mine or not mine.get("chosen"):
        return []
    return ["", f"## For the load in `{cell(mine['file'])}`", "", "Share of busy time at each measured level "
            "(each running-request count at the level nearest it): " + ", ".join(
                f"{level} {share:.2f}" for level, share in mine["weights"].items()), "",
            *table(("server", "expected"), ((n, f"{v:.1f}") for n, v in sorted(mine["expected"].items(),
                                                                                key=lambda x: -x[1]))),
            "", f"Chosen: {cell(mine['chosen'])}, {shown(mine['of_per_level_best'], 2)} of the per-level best's "
            "expectation; its ratio to the best per level: " + ", ".join(
                f"{level} {ratio:.2f}" for level, ratio in mine["ratios"].items())]


def _profiles(result: dict) -> list[str]:
    profiled = [(n, level, lv["profile"]) for n, v in result["variants"].items()
                for level, lv in (v.get("levels") or {}).items() if (lv.get("profile") or {}).get("kernels")]
    if not profiled:
        return []
    return ["", "## Where a decode step's time goes", "", "SGLang's torch profiler over the full batch's steps (CUDA "
            "kernels, ms per step and rank; the largest three). GPU idle is the share of the kernels' span in which "
            "no kernel ran: there the GPU waited on the host. The host's CUDA calls: the longest three, ms and calls "
            "per step (cudaLaunchKernel counts eager launches; a synchronize is the host waiting on the GPU). The "
            "host's own time, where tune.profile_host recorded it: the host functions with the most time of their own "
            "per step (their callees' left out); that profile slows the host, so its GPU idle reads high.", "",
            *table(("server", "level", "kernel ms/step", "GPU busy / span ms/step", "GPU idle", "largest kernels",
                    "host CUDA calls", "host own time"),
                   ((n, level, shown(p["kernel_ms_per_step"], 3), _busy(p),
                     shown(p.get("gpu_idle_share"), 2),
                     "; ".join(f"{k['name'][:60]} {shown(k['ms_per_step'], 3)}" for k in p["kernels"][:3]),
                     "; ".join(f"{c['name'][:40]} {shown(c['ms_per_step'], 3)} x{shown(c['calls_per_step'], 1)}"
                               for c in (p.get("host_calls") or [])[:3]) or "-",
                     "; ".join(f"{c['name'][-60:]} {shown(c['ms_per_step'], 3)}" for c in (p.get("host_own") or [])[:3])
                     or "-")
                    for n, level, p in profiled))]


def _busy(profile: dict) -> str:
    busy, span = profile.get("gpu_busy_ms_per_step"), profile.get("span_ms_per_step")
    return "-" if busy is None or span is None else f"{shown(busy, 3)} / {shown(span, 3)}"


def _stack_diff(result: dict) -> list[str]:
    if not result.get("stack_diff"):
        return []
    return ["", "## Proposed stack change", "", "```diff", result["stack_diff"].replace("```", "'''").rstrip(), "```"]


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
        if points := _against(variant, result["levels"], baseline, result["metric"]):
            ax.errorbar([x for x, _, _ in points], [r for _, r, _ in points],
                        yerr=[[r - min(rs) for _, r, rs in points], [max(rs) - r for _, r, rs in points]],
                        marker="o", capsize=3, label=name)
    if not ax.get_legend_handles_labels()[0]:
        return {}
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(xs, result["levels"])
    ax.set_xlabel("load (C: requests in flight, R: Poisson arrivals per second)")
    ax.set_ylabel(f"{result['metric']} / the baseline's" + (" (R: each request's speed)" if _open_loop(result) else ""))
    ax.set_title("rig tune: median over rounds against the baseline's median, bars span the rounds")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return {"tune.png": fig}


def _against(variant: dict, levels: list[str], baseline: dict, metric: str) -> list[tuple[int, float, list[float]]]:
    """VARIANT's points against BASELINE's levels: (x, its median METRIC over the baseline's, each round's over the
    baseline's median), where both measured."""
    return [(x, value / under, [v / under for v in rounds_of(mine, metric) if v])
            for x, level in enumerate(levels)
            if (value := value_of(mine := variant.get("levels", {}).get(level), metric))
            and (under := value_of(baseline.get(level), metric))]
