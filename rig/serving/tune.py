"""`rig tune`: when does speculation pay on this box, and how to serve so that it always does.

On the box itself, one server at a time (each may need every GPU), each started from the stack's
own server line (`rig server args`), health-gated by `rig smoke`, measured, stopped, its log kept:

1. the variants: the baseline (no speculation), and fixed EAGLE-3 at each of tune.steps (topk 1,
   steps + 1 draft tokens: SGLang's adaptive mode takes topk 1 only), and the stack's own line when
   it is none of those;
2. every level (bench.concurrency closed-loop, tune.request_rates open-loop Poisson), in rounds,
   each round at least bench.min_requests requests and bench.min_seconds long;
3. the choice per level: the variant with the best median (output tok/s, or goodput under the
   SLOs), ties going to the simpler one (baseline < fewer steps < more): the simplest variant whose
   per-round ratios to the best are not all below 1;
4. the policy: one choice everywhere is served as it is (no speculation, or fixed EAGLE-3); choices
   that change with load become SGLang's adaptive config, one candidate per slot (deterministic: no
   EMA flapping), each level's slot keyed at the CUDA-graph batch its running batch pads to;
5. confirmation: the policy's own server at every level, in rounds, against the baseline and the
   per-level best. Where the policy is not within noise of the best, the report says so with the
   ratio, and names what does pay.
"""
from __future__ import annotations

import copy
import difflib
import json
import math
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rig.core import RigError, outdir, progress
from rig.core.fs import atomic_write
from rig.serving import adaptive
from rig.serving.bench import Plan, Server, ServerDown, _num, aggregate, check_fits, summarize, within_range
from rig.serving.launch import Servers, make_logs, results_dir, with_server
from rig.serving.server import health_url, render
from rig.serving.sglang_api import server_accept_length, server_info
from rig.serving.workload import Workload

SCHEMA_VERSION = 1
BASELINE = "baseline"
POLICY = "policy"
# The policy's server runs after the others, not interleaved with them: the same line started twice differs by a
# few percent (the stand-in) or more (a tiny model on the H200), so confirmation calls a level lost only when every
# round is more than this below.
LIFETIMES = 0.05


@dataclass(frozen=True)
class Variant:
    name: str
    steps: int  # 0: no speculation
    stack: dict
    candidate: bool = True  # may the policy choose it (SGLang's adaptive mode: topk 1 only)

    @property
    def baseline(self) -> bool:
        return self.steps == 0


@dataclass(frozen=True)
class Level:
    concurrency: int
    rate: float | None = None

    @property
    def name(self) -> str:
        return f"C={self.concurrency}" if self.rate is None else f"R={self.rate:g}/s"


def eagle(stack: dict, steps: int, config: str = "") -> dict:
    """The stack's server line with fixed EAGLE-3 at STEPS (or the adaptive CONFIG): topk 1, steps + 1 drafts."""
    return with_server(stack, speculative_num_steps=steps, speculative_eagle_topk=1,
                        speculative_num_draft_tokens=steps + 1, speculative_adaptive_config=config)


def variants(stack: dict) -> list[Variant]:
    server = stack["server"]
    if not server["draft_model"]:
        raise RigError("rig tune compares EAGLE-3 with the baseline: the stack has no server.draft_model; set it")
    found = [Variant(BASELINE, 0, with_server(stack, speculative_adaptive_config=""))]
    own = server["speculative_num_steps"]
    steps = sorted(set(stack["tune"]["steps"]) | ({own} if server["speculative_eagle_topk"] == 1 else set()))
    found += [Variant(f"eagle3-{k}", k, eagle(stack, k)) for k in steps]
    if server["speculative_eagle_topk"] != 1:  # measured, but SGLang's adaptive mode cannot serve it
        found.append(Variant("stack", own, with_server(stack, speculative_adaptive_config=""), candidate=False))
    return found


def levels(stack: dict) -> list[Level]:
    concurrency = stack["bench"]["concurrency"]
    found = [Level(c) for c in concurrency] + [Level(max(concurrency), r) for r in stack["tune"]["request_rates"]]
    names = [lv.name for lv in found]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise RigError(f"the levels {', '.join(twice)} are given twice (bench.concurrency, tune.request_rates or the "
                       "options): give each level once")
    return found


def _metric(plan: Plan) -> str:
    return "goodput" if plan.slo_ttft_ms or plan.slo_tpot_ms else "output_throughput"


def _ratios(mine: list[float | None], theirs: list[float | None]) -> list[float]:
    return [a / b for a, b in zip(mine, theirs, strict=False) if a and b]


# ------------------------------------------------------------------ measuring


def measure(server: Server, plan: Plan, wanted: list[Level]) -> dict[str, dict]:
    """Every level in rounds on one running server; a server that stops answering ends it (ServerDown)."""
    server.warmup()
    measured: dict[str, dict] = {}
    for level in wanted:
        rounds, counters = [], []
        for round_no in range(plan.rounds):
            rounds.append(server.level(level.concurrency, round_no, level.rate))
            counters.append(server_accept_length(server_info(server.url, server.key)))  # this round's: flushed before
        result = aggregate(rounds, level.concurrency, server)
        values = [summarize(r, level.concurrency, plan).get(_metric(plan)) for r in rounds]
        known = [c for c in counters if c]
        result.update({"level": level.name, "rate": level.rate, "round_values": values,
                       "value": statistics.median([v for v in values if v]) if any(values) else None,
                       "server_accept_length": statistics.fmean(known) if known else None})
        measured[level.name] = result
    return measured


def run_variant(servers: Servers, name: str, stack: dict, baseline: bool, venv: str, plan: Plan, wanted: list[Level],
                out: Path, workload: Workload, record: dict) -> None:
    """Start one variant's server, measure it, stop it; RECORD holds what was measured even when it fails."""
    args = render(stack, venv, baseline=baseline)
    url = health_url(stack)
    record.update({"argv": args["argv"], "log": str(out / "logs" / f"{name}.log"), "levels": {}, "stopped": None})
    launched = servers.start(name, args["argv"], url, out / "logs" / f"{name}.log")
    record.update({"healthy_after_s": launched.started_s, "smoke": launched.smoke["msg"],
                   "speculative_algorithm": launched.smoke.get("speculative_algorithm")})
    try:
        server = Server(url, name, plan, servers.api_key_env, workload)
        record.update({"cuda_graph_bs": graph_sizes(server.info),
                       "max_running_requests": _count(server.info.get("max_running_requests"))})
        if note := check_fits(plan, name, server.info, workload):
            progress(note)
        record["levels"] = measure(server, plan, wanted)
    except ServerDown as exc:
        record["stopped"] = f"the server stopped answering: {exc}"
        raise RigError(f"{name}: the server stopped answering during the measurement ({exc}); its log is "
                       f"{record['log']}; what was measured is in {out}/tune.json") from exc
    finally:
        servers.stop(launched)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 1 << 20 else None


def graph_sizes(info: dict) -> list[int] | None:
    """The decode CUDA-graph batch sizes a server captured, from /server_info: `cuda_graph_bs` (0.5.9), or
    `cuda_graph_config.decode.bs` (0.5.17); None when it says neither (then no padding is assumed)."""
    config = info.get("cuda_graph_config")
    decode = config.get("decode") if isinstance(config, dict) else None
    for sizes in (info.get("cuda_graph_bs"), decode.get("bs") if isinstance(decode, dict) else None):
        if isinstance(sizes, list) and sizes and all(_count(g) for g in sizes):
            return sorted(sizes)
    return None


# ------------------------------------------------------------------ choosing


def choose(measured: dict[str, dict], candidates: list[Variant], wanted: list[Level], cap: int | None = None) -> list[dict]:
    """Per level: the best variant by median, and the one chosen: the simplest not clearly below the best.
    A level's running batch is its concurrency (or, open-loop, its mean in flight), at most CAP: a speculative
    server's max_running_requests (SGLang lowers it under speculation: 48 on the H200), which the policy's
    server has too."""
    rows = []
    for level in wanted:
        have = [v for v in candidates if (measured.get(v.name, {}).get(level.name) or {}).get("value")]
        if not have:
            continue
        at = {v.name: measured[v.name][level.name] for v in have}
        best = max(have, key=lambda v: at[v.name]["value"])
        chosen = next(v for v in have  # candidates are in order of simplicity
                      if v is best or within_range(_ratios(at[v.name]["round_values"],
                                                           at[best.name]["round_values"]) or [1.0]) != "lost")
        batch = level.concurrency if level.rate is None else max(1, round(at[chosen.name].get("in_flight") or 1))
        batch = min(batch, cap) if cap else batch
        rows.append({"level": level.name, "batch": batch, "best": best.name, "best_value": at[best.name]["value"],
                     "chosen": chosen.name, "steps": chosen.steps, "chosen_value": at[chosen.name]["value"]})
    return rows


def slot_config(rows: list[dict], graph_sizes: list[int] | None) -> tuple[dict[int, int], list[str]]:
    """{slot key: steps} for the choices: each level keyed at the CUDA-graph size its batch pads to (the first at
    1, so smaller batches are covered), equal neighbours merged; notes where two levels share one slot."""
    notes: list[str] = []
    keys: dict[int, int] = {}
    for row in sorted(rows, key=lambda r: r["batch"]):
        key = 1 if not keys else adaptive_pad(row["batch"], graph_sizes)
        if key in keys:
            if keys[key] != row["steps"]:
                notes.append(f"{row['level']} (batch {row['batch']}) shares the slot of batch size {key} with a lower "
                             f"level, which chose {keys[key]} steps; it gets those too")
            continue
        keys[key] = row["steps"]
    merged: dict[int, int] = {}
    for key, steps in sorted(keys.items()):
        if not merged or merged[max(merged)] != steps:
            merged[key] = steps
    return merged, notes


def adaptive_pad(batch: int, graph_sizes: list[int] | None) -> int:
    return next((g for g in sorted(graph_sizes or []) if g >= batch), batch)


def policy(rows: list[dict], graph_sizes: list[int] | None) -> dict:
    steps = {r["steps"] for r in rows}
    if not rows:
        return {"kind": "none", "notes": ["no level has measurements"]}
    if steps == {0}:
        return {"kind": "baseline", "notes": []}
    if len(steps) == 1:
        return {"kind": "fixed", "steps": steps.pop(), "notes": []}
    config, notes = slot_config(rows, graph_sizes)
    for row in rows:  # the config must send each measured level where it was chosen to go
        routed = config[adaptive.route(list(config), row["batch"], graph_sizes)]
        if routed != row["steps"]:
            notes.append(f"{row['level']}: SGLang routes batch {row['batch']} to {routed} steps, not the chosen "
                         f"{row['steps']}")
    return {"kind": "adaptive", "slots": {str(k): v for k, v in config.items()},
            "steps": adaptive.steps_needed(config), "notes": notes}


# ------------------------------------------------------------------ confirming


def confirm(measured: dict[str, dict], rows: list[dict]) -> dict:
    """The policy against the baseline and the per-level best, per level, by per-round ratios."""
    mine = measured.get(POLICY, {})
    table = []
    for row in rows:
        own = mine.get(row["level"])
        if not own or not own.get("value"):
            continue
        best = measured[row["best"]][row["level"]]
        base = measured.get(BASELINE, {}).get(row["level"])
        vs_best = _ratios(own["round_values"], best["round_values"])
        vs_base = _ratios(own["round_values"], base["round_values"]) if base else []
        table.append({"level": row["level"], "policy": own["value"], "best": row["best"], "best_value": row["best_value"],
                      "steps": row["steps"], "ratio_best": statistics.median(vs_best) if vs_best else None,
                      "ratio_best_range": [min(vs_best), max(vs_best)] if vs_best else None,
                      "verdict": within_range(vs_best, LIFETIMES) if vs_best else "not measured",
                      "ratio_baseline": statistics.median(vs_base) if vs_base else None,
                      "vs_baseline": within_range(vs_base, LIFETIMES) if vs_base else None})
    return {"levels": table, "confirmed": bool(table) and all(t["verdict"] != "lost" for t in table)
            and len(table) == len(rows)}


def recommend(kind: dict, rows: list[dict], confirmation: dict | None, config_path: str | None,
              measured: dict[str, dict]) -> str:
    if kind["kind"] == "none":
        return "nothing was measured: no recommendation"
    if kind["kind"] == "baseline":
        return ("speculation paid at no measured load on this box (the baseline was best or within noise of the best "
                "at every level): serve without it")
    if kind["kind"] == "fixed":
        return (f"EAGLE-3 with {kind['steps']} step(s) (topk 1) was best or within noise of the best at every measured "
                f"level: serve with it, server.speculative_num_steps: {kind['steps']}")
    plan_text = ", ".join(f"{r['chosen']} at {r['level']}" for r in rows)
    if confirmation and confirmation["confirmed"]:
        return (f"serve with the adaptive policy (server.speculative_adaptive_config: {config_path}): confirmed within "
                f"noise of the per-level best at every level ({plan_text})")
    lost = [t for t in (confirmation or {}).get("levels", []) if t["verdict"] == "lost"]
    said = [f"at {t['level']} it ran {t['ratio_best']:.2f} of {t['best']}" for t in lost]
    step0 = [t for t in lost if t["steps"] == 0 and t["vs_baseline"] == "lost"]
    if step0:
        ratios = ", ".join(f"{t['ratio_baseline']:.2f}" for t in step0)
        said.append("SGLang's step-0 state lost to the plain baseline at " + ", ".join(t["level"] for t in step0) +
                    f" ({ratios}): step 0 is not a free off")
    return "the adaptive policy was not confirmed: " + "; ".join(said or ["its levels were not all measured"]) + \
        f". What pays instead: {fallback(rows, measured)}"


def fallback(rows: list[dict], measured: dict[str, dict]) -> str:
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
    closeness = {}
    for name, levels_of in measured.items():
        ratios = [(levels_of.get(r["level"]) or {}).get("value") or 0 for r in rows]
        if name != POLICY and all(ratios):
            closeness[name] = math.exp(statistics.fmean(math.log(v / r["best_value"]) for v, r in zip(ratios, rows,
                                                                                                      strict=True)))
    if not closeness:
        return f"the per-level choice is {where}; no single load threshold separates them"
    name = max(closeness, key=lambda n: closeness[n])
    return (f"the per-level choice is {where}; no single load threshold separates them, and of the fixed servers "
            f"{name} comes closest over all levels ({closeness[name]:.2f} of the per-level best, geometric mean)")


# ------------------------------------------------------------------ the stack diff and the report


def proposed_stack(stack_path: str, kind: dict, config_path: str | None) -> tuple[str, str] | None:
    """The stack file with the policy in its server section (as YAML rig serializes), and the diff from it."""
    from rig.core.documents import load_yaml, yaml_dump

    if kind["kind"] not in ("adaptive", "fixed"):
        return None
    raw = load_yaml(stack_path, "stack file")
    new = copy.deepcopy(raw)
    server = new.setdefault("server", {})
    server.update({"speculative_num_steps": kind["steps"], "speculative_eagle_topk": 1,
                   "speculative_num_draft_tokens": kind["steps"] + 1})
    if kind["kind"] == "adaptive":
        server["speculative_adaptive_config"] = config_path
    before, after = yaml_dump(raw) + "\n", yaml_dump(new) + "\n"
    diff = "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), stack_path,
                                        f"{stack_path} (proposed)"))
    return after, diff


def report_markdown(result: dict) -> str:
    names = [n for n in result["variants"]]
    lines = ["# rig tune", "", f"Stack `{result['stack']}`; {result['plan']['rounds']} round(s) per level; metric: "
             f"{result['metric']} (median over rounds, the range over rounds in brackets).", "",
             "| level | " + " | ".join(names) + " | chosen |", "|---" * (len(names) + 2) + "|"]
    chosen = {r["level"]: r["chosen"] for r in result["choices"]}
    for level in result["levels"]:
        cells = []
        for name in names:
            lv = result["variants"][name].get("levels", {}).get(level)
            values = [v for v in (lv or {}).get("round_values", []) if v]
            cells.append("-" if not lv or not lv.get("value") else
                         f"{lv['value']:.1f} ({min(values):.1f}-{max(values):.1f})")
        lines.append(f"| {level} | " + " | ".join(cells) + f" | {chosen.get(level, '-')} |")
    kind = result["policy"]
    lines += ["", f"**Policy:** {kind['kind']}" + (f", slots {json.dumps(kind['slots'])}" if kind.get("slots") else ""),
              *[f"- {n}" for n in kind.get("notes", [])]]
    if result.get("confirmation"):
        lines += ["", "## Confirmation", "", "| level | policy | per-level best | ratio to best (range) | verdict | "
                  "ratio to baseline |", "|---|---|---|---|---|---|"]
        for t in result["confirmation"]["levels"]:
            rng = t["ratio_best_range"]
            lines.append(f"| {t['level']} | {_num(t['policy'], 1)} | {t['best']} {_num(t['best_value'], 1)} | "
                         f"{_num(t['ratio_best'], 2)} ({_num(rng and rng[0], 2)}-{_num(rng and rng[1], 2)}) | "
                         f"{t['verdict']} | {_num(t['ratio_baseline'], 2)} |")
    if result.get("stack_diff"):
        lines += ["", "## Proposed stack change", "", "```diff", result["stack_diff"].rstrip(), "```"]
    lines += ["", f"**Recommendation:** {result['recommendation']}", ""]
    if result.get("stopped"):
        lines += [f"**Stopped early:** {result['stopped']}", ""]
    return "\n".join(lines)


def figures(result: dict) -> dict:
    """tune.png: each variant's median per level, its bars spanning the rounds."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.8))
    ax = fig.subplots()
    xs = list(range(len(result["levels"])))
    for name, variant in result["variants"].items():
        points = [(x, lv) for x, level in zip(xs, result["levels"], strict=True)
                  if (lv := variant.get("levels", {}).get(level)) and lv.get("value")]
        if not points:
            continue
        low = [lv["value"] - min(v for v in lv["round_values"] if v) for _, lv in points]
        high = [max(v for v in lv["round_values"] if v) - lv["value"] for _, lv in points]
        ax.errorbar([x for x, _ in points], [lv["value"] for _, lv in points], yerr=[low, high], marker="o",
                    capsize=3, label=name)
    ax.set_xticks(xs, result["levels"])
    ax.set_xlabel("load (C: requests in flight, R: Poisson arrivals per second)")
    ax.set_ylabel(result["metric"])
    ax.set_title("rig tune: median over rounds, bars span the rounds")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    return {"tune.png": fig}


def write(result: dict, out: Path) -> list[str]:
    return outdir.write(out, {"tune.json": outdir.record(result), "report.md": report_markdown(result)},
                         lambda: figures(result))


# ------------------------------------------------------------------ the run


def prepare(stack: dict, plan: Plan) -> tuple[list[Variant], list[Level]]:
    if reason := adaptive.unsupported_reason({**stack["server"], "speculative_eagle_topk": 1}):
        raise RigError(f"rig tune derives SGLang's adaptive speculation, which SGLang refuses here: {reason}")
    return variants(stack), levels(stack)


OUTPUTS = ("tune.json", "report.md", "tune.png", "adaptive.json", "proposed-stack.yml")


def run(stack: dict, stack_path: str, venv: str, out: str | Path, plan: Plan, workload: Workload,
        api_key_env: str, check: bool = False) -> dict:
    out = results_dir(out, OUTPUTS)
    found, wanted = prepare(stack, plan)
    if check:  # every server line rendered and parsed by the venv's sglang; nothing starts
        lines = {v.name: render(v.stack, venv, baseline=v.baseline)["argv"] for v in found}
        per_round = sum(max(plan.min_requests, 2 * lv.concurrency) for lv in wanted)
        return {"ok": True, "changed": False, "variants": lines, "levels": [lv.name for lv in wanted],
                "msg": "\n".join([f"would start, one at a time at {health_url(stack)}, and measure at "
                                  f"{', '.join(lv.name for lv in wanted)} in {plan.rounds} round(s) "
                                  f"(at least {per_round} requests a round"
                                  + (f", {plan.min_seconds:g} s a level" if plan.min_seconds else "") + "):",
                                  *(f"  {name}: {' '.join(argv)}" for name, argv in lines.items()),
                                  "  then the policy derived from them, against the baseline and the per-level best"])}
    make_logs(out)
    result: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "stack": stack_path, "started": time.time(),
                              "plan": {**plan.__dict__}, "metric": _metric(plan),
                              "levels": [lv.name for lv in wanted], "variants": {}, "choices": [],
                              "policy": {"kind": "none", "notes": []}, "confirmation": None,
                              "recommendation": "not finished", "stopped": None}
    written: list[str] = []  # the policy's files, when it has them
    try:
        with Servers(stack["tune"]["start_timeout"], api_key_env) as servers:
            for variant in found:
                record = result["variants"].setdefault(variant.name, {"steps": variant.steps})
                run_variant(servers, variant.name, variant.stack, variant.baseline, venv, plan, wanted, out, workload,
                            record)
            measured = {name: v["levels"] for name, v in result["variants"].items()}
            speculative = [v for k, v in result["variants"].items() if k != BASELINE]
            cap = min((v["max_running_requests"] for v in speculative if v.get("max_running_requests")), default=None)
            rows = choose(measured, [v for v in found if v.candidate], wanted, cap)
            graphs = next((v["cuda_graph_bs"] for v in speculative if v.get("cuda_graph_bs")), None)
            kind = policy(rows, graphs)
            result.update({"choices": rows, "policy": kind, "cuda_graph_bs": graphs, "running_cap": cap})
            config_path = None
            if kind["kind"] == "adaptive":
                config_path = str(out / "adaptive.json")
                atomic_write(config_path, adaptive.render({int(k): v for k, v in kind["slots"].items()}))
                written.append(config_path)
                record = result["variants"].setdefault(POLICY, {"steps": kind["steps"], "adaptive": kind["slots"]})
                run_variant(servers, POLICY, eagle(stack, kind["steps"], config_path), False, venv, plan, wanted,
                            out, workload, record)
                result["confirmation"] = confirm({n: v["levels"] for n, v in result["variants"].items()}, rows)
            result["recommendation"] = recommend(kind, rows, result["confirmation"], config_path,
                                                 {n: v["levels"] for n, v in result["variants"].items()})
            proposal = proposed_stack(stack_path, kind, config_path)
            if proposal:
                written.append(str(atomic_write(out / "proposed-stack.yml", proposal[0])))
                result["stack_diff"] = proposal[1]
    except BaseException as exc:
        result["stopped"] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        try:  # what was measured is written; a failure to write it never hides why the run stopped
            result["finished"] = time.time()
            write(result, out)
        except Exception as again:  # noqa: BLE001 - the first error is the one to report
            progress(f"could not write what was measured to {out}: {again}")
        raise
    result["finished"] = time.time()
    files = write(result, out) + written
    confirmed = kind["kind"] != "adaptive" or bool(result["confirmation"] and result["confirmation"]["confirmed"])
    return {"ok": confirmed, "files": files, "policy": kind, "recommendation": result["recommendation"],
            "confirmation": result["confirmation"], "choices": rows,
            "msg": "\n".join([f"wrote {', '.join(files)}", *(f"{r['level']}: {r['chosen']} (best {r['best']})"
                                                            for r in rows), result["recommendation"]])}


def plan_of(stack: dict, **given: Any) -> Plan:
    """The measurement plan: the stack's bench section, each option given instead where it is given."""
    bench = stack["bench"]
    wanted = {k: (bench[k] if given.get(k) is None else given[k]) for k in ("max_tokens", "rounds", "min_seconds")}
    extra = {k: v for k, v in given.items() if k not in wanted and v is not None}
    return replace(Plan(concurrency=bench["concurrency"], serial_runs=1, serial_tokens=1, **wanted), **extra)
