"""rig tune's choice (rig.serving.tune): per level the best variant within each family one server line can switch
between, the family closest to the per-level best, the policy SGLang serves it with, and what to recommend."""
from __future__ import annotations

from rig.serving import adaptive
from rig.serving.measure.plan import Level
from rig.serving.measure.sweep import count
from rig.serving.measure.verdict import (
    choose,
    closeness,
)
from rig.serving.tune_variants import POLICY, Variant, assignments


def graph_sizes(info: dict) -> list[int] | None:
    """The decode CUDA-graph batch sizes a server captured, from /server_info: `cuda_graph_bs` (0.5.9), or
    `cuda_graph_config.decode.bs` (0.5.17); None when it says neither (then no padding is assumed)."""
    config = info.get("cuda_graph_config")
    decode = config.get("decode") if isinstance(config, dict) else None
    for sizes in (info.get("cuda_graph_bs"), decode.get("bs") if isinstance(decode, dict) else None):
        if isinstance(sizes, list) and sizes and all(count(g) for g in sizes):
            return sorted(sizes)
    return None


# ------------------------------------------------------------------ choosing


def slot_config(rows: list[dict], graph_sizes: list[int] | None) -> tuple[dict[int, int], list[str]]:
    """{slot key: steps} for the choices: each level keyed at the CUDA-graph size its batch pads to (the first at
    1, so smaller batches are covered), equal neighbours merged; notes where two levels share one slot."""
    notes: list[str] = []
    keys: dict[int, int] = {}
    for row in sorted(rows, key=lambda r: r["batch"]):
        key = 1 if not keys else adaptive.pad(row["batch"], graph_sizes)
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


def policy(rows: list[dict], graph_sizes: list[int] | None) -> dict:
    steps = {r["steps"] for r in rows}
    if not rows:
        return {"kind": "none", "notes": ["no level has measurements"]}
    if steps == {0}:  # SGLang's step 0 everywhere is a baseline that pays speculation's costs
        return {"kind": "baseline", "notes": []}
    if len(steps) == 1 and 0 not in steps:
        return {"kind": "fixed", "steps": steps.pop(), "notes": []}
    config, notes = slot_config(rows, graph_sizes)
    for row in rows:  # the config must send each measured level where it was chosen to go
        routed = config[adaptive.route(list(config), row["batch"], graph_sizes)]
        if routed != row["steps"]:
            notes.append(f"{row['level']}: SGLang routes batch {row['batch']} to {routed} steps, not the chosen "
                         f"{row['steps']}")
    return {"kind": "adaptive", "slots": {str(k): v for k, v in config.items()},
            "steps": adaptive.steps_needed(config), "notes": notes}


def family_choice(measured: dict[str, dict], found: list[Variant], wanted: list[Level], records: dict) -> dict:
    """The family whose per-level choices come closest to the per-level best of every variant, its rows and policy.

    Within a family the candidates are its baseline (its backend's) and its EAGLE-3 variants, in order of
    simplicity; where the choice changes with load, a step-0 slot is what SGLang's step 0 costs, so the rows
    are chosen again with the family's best-measured step-0 server in the baseline's place (`plain` keeps the
    rows before that, for the fallback)."""
    candidates = [v for v in found if v.candidate and measured.get(v.name)]
    if not candidates:
        return {"rows": [], "family": None, "scores": {}}
    overall = {r["level"]: r for r in choose(measured, candidates, wanted)}
    top = {level: row["best_value"] for level, row in overall.items()}
    kinds = {v.name: v.kind for v in found}
    best: dict = {"rows": [], "family": None, "scores": {}, "score": None}
    for family in sorted({v.family for v in candidates if not v.baseline}):
        backend = family.split("/")[0]
        base = [v for v in candidates if v.baseline and v.family == backend]
        spec = sorted((v for v in candidates if v.family == family and v.kind == "eagle"), key=lambda v: v.steps)
        caps = [c for v in spec if (c := records[v.name].get("max_running_requests"))]
        cap = min(caps) if caps else None
        rows = plain = choose(measured, base + spec, wanted, cap)
        stand_in = None
        if len({r["steps"] for r in rows}) > 1:  # it switches with load: step 0 must be paid for as measured
            step0 = [v for v in candidates if v.family == family and v.kind == "step0"]
            if step0:
                # compared where they ran (from STEP0_FROM up): below it each would count as serving nothing
                stand_in = max(step0, key=lambda v: closeness(_values(measured[v.name]), {
                    level: value for level, value in top.items() if level in measured[v.name]}))
                # below STEP0_FROM no batch runs at step 0: there the family's baseline is still what "no
                # drafting" costs (the policy server's own run confirms it)
                priced = {**measured, **{b.name: {level: lv for level, lv in measured[b.name].items()
                                                  if level not in measured[stand_in.name]} for b in base}}
                rows = choose(priced, [stand_in, *base, *spec], wanted, cap)
        for row in [*rows, *plain]:
            row.update(kind=kinds[row["chosen"]], best=overall[row["level"]]["best"],
                       best_value=overall[row["level"]]["best_value"])
        score = closeness({r["level"]: r["chosen_value"] for r in rows}, top)
        best["scores"][family or "default"] = score
        if rows and (best["family"] is None or score > best["score"]):
            best.update(rows=rows, plain=plain, family=family, score=score, step0=stand_in.name if stand_in else None,
                        env=stand_in.env if stand_in else {}, cap=cap, baseline=base[0].name if base else None,
                        graphs=next((records[v.name].get("cuda_graph_bs") for v in spec
                                     if records[v.name].get("cuda_graph_bs")), None),
                        server=spec[0].stack["server"] if spec else None)
    return best


def _values(levels_of: dict) -> dict[str, float | None]:
    return {level: lv.get("value") for level, lv in levels_of.items()}


# ------------------------------------------------------------------ the recommendation


def recommend(kind: dict, rows: list[dict], confirmation: dict | None, config_path: str | None,
              measured: dict[str, dict], plain: list[dict], env: dict | None = None) -> str:
    """What to serve, said from the confirmation: a single server (baseline, fixed) is held to the per-level best
    by its own rounds, an adaptive policy by its own server's (ENV: what its environment added). PLAIN: the
    choices with the baseline for step 0, what the fallback reads when nothing single holds."""
    if kind["kind"] == "none":
        return "nothing was measured: no recommendation"
    lost = [t for t in (confirmation or {}).get("levels", []) if not t.get("confirmed", t["verdict"] != "lost")]
    said = [f"at {t['level']} it ran {t['ratio_best']:.2f} of {t['best']} ({t.get('rule', t['verdict'])})"
            if t["ratio_best"] is not None else f"at {t['level']} it was not measured" for t in lost]
    holds = bool(confirmation and confirmation["confirmed"])
    if kind["kind"] == "baseline" and holds:
        return ("speculation paid at no measured load on this box (the baseline was best or within noise of the best "
                "at every level): serve without it")
    if kind["kind"] == "fixed" and holds:
        return (f"EAGLE-3 with {kind['steps']} step(s) (topk 1) was best or within noise of the best at every measured "
                f"level: serve with it, server.speculative_num_steps: {kind['steps']} and speculative_eagle_topk: 1 "
                "(proposed-stack.yml)")
    if kind["kind"] != "adaptive":
        return (f"no single server holds the per-level best ({kind['kind']}: " + "; ".join(said) + f"). What pays "
                f"instead: {fallback(plain, measured)}")
    plan_text = ", ".join(f"{r['chosen']} at {r['level']}" for r in rows)
    if holds:
        with_env = f" and {', '.join(assignments(env))} in environment.vars" if env else ""
        return (f"serve with the adaptive policy (server.speculative_adaptive_config: {config_path}{with_env}): "
                f"confirmed within noise of the per-level best at every level ({plan_text})")
    step0 = [t for t in lost if t["steps"] == 0 and t["vs_baseline"] == "lost"]
    if step0:
        ratios_ = ", ".join(f"{t['ratio_baseline']:.2f}" for t in step0)
        measured_as = ", ".join(sorted({r["chosen"] for r in rows if r.get("kind") == "step0"}))
        said.append((f"the step-0 state (as {measured_as})" if measured_as else "SGLang's step-0 state") +
                    " lost to the plain baseline at " +
                    ", ".join(t["level"] for t in step0) + f" ({ratios_}): step 0 is not a free off")
    return "the adaptive policy was not confirmed: " + "; ".join(said or ["its levels were not all measured"]) + \
        f". What pays instead: {fallback(plain, measured)}"


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
    top = {r["level"]: r["best_value"] for r in rows}
    near = {name: closeness(_values(levels_of), top) for name, levels_of in measured.items() if name != POLICY}
    name = max(near, key=lambda n: near[n], default=None)
    if name is None or not near[name]:
        return f"the per-level choice is {where}; no single load threshold separates them"
    return (f"the per-level choice is {where}; no single load threshold separates them, and of the fixed servers "
            f"{name} comes closest over all levels ({near[name]:.2f} of the per-level best, geometric mean)")
