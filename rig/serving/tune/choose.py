"""rig tune's choice: per level the best variant within each family one server line can switch between (one
backend, one cap), the family closest to the per-level best, and the policy SGLang serves it with."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from rig.serving import adaptive
from rig.serving.measure.plan import Level
from rig.serving.measure.record import value_of
from rig.serving.measure.verdict import choose, closeness
from rig.serving.tune.variants import Variant


@dataclass(frozen=True)
class FamilyChoice:
    """One family's per-level choices (family_choice: the family closest to the per-level best)."""
    rows: list[dict] = field(default_factory=list)  # per level: the chosen variant, step 0 priced by its own server
    plain: list[dict] = field(default_factory=list)  # the same with the family's baseline for step 0 (the fallback's)
    family: str | None = None  # its backend ("" SGLang's default), "/uncapped" where its cap was lifted
    scores: dict[str, float] = field(default_factory=dict)  # every family's score, "default" for family ""
    score: float = 0.0  # its choices' closeness to the per-level best (geometric mean of the ratios)
    step0: str | None = None  # the step-0 server whose numbers priced step 0
    env: dict = field(default_factory=dict)  # what that server's environment added
    max_running_requests: int | None = None  # the least its EAGLE-3 servers ran with (SGLang's, or the line's)
    baseline: str | None = None  # its backend's baseline
    graphs: list[int] | None = None  # the decode CUDA-graph sizes its servers captured
    server: dict | None = None  # its EAGLE-3 line's server section (backend and cap)


def family_choice(measured: dict[str, dict], found: list[Variant], levels: list[Level], records: dict,
                  metric: str) -> FamilyChoice:
    """The family whose per-level choices (by METRIC) come closest to the per-level best of every variant (geometric
    mean), its rows and what its server line needs; ties go to the first family in name order."""
    candidates = [v for v in found if v.candidate and measured.get(v.name)]
    if not candidates:
        return FamilyChoice()
    overall = {r["level"]: r for r in choose(measured, candidates, levels, metric)}
    tried = [_one_family(family, candidates, measured, levels, records, overall, metric)
             for family in sorted({v.family for v in candidates if not v.baseline})]
    best = max((c for c in tried if c.rows), key=lambda c: c.score, default=FamilyChoice())
    return replace(best, scores={c.family or "default": c.score for c in tried})


def _one_family(family: str, candidates: list[Variant], measured: dict[str, dict], levels: list[Level],
                records: dict, overall: dict[str, dict], metric: str) -> FamilyChoice:
    """FAMILY's choices: its baseline (its backend's) and its EAGLE-3 variants, in order of simplicity; where the
    choice changes with load, a step-0 slot is what SGLang's step 0 costs, so the rows are chosen again with the
    family's best-measured step-0 server in the baseline's place (`plain` keeps the rows before that)."""
    base, spec, step0 = _members(family, candidates)
    running = [c for v in spec if (c := records[v.name].get("max_running_requests"))]
    most = min(running) if running else None
    top = {level: row["best_value"] for level, row in overall.items()}
    rows = plain = choose(measured, base + spec, levels, metric, most)
    # it switches with load: step 0 must be paid for as measured
    stand_in = _stand_in(step0, measured, top, metric) if step0 and len({r["steps"] for r in rows}) > 1 else None
    if stand_in:
        rows = choose(_priced(measured, base, stand_in), [stand_in, *base, *spec], levels, metric, most)
    _against_overall([*rows, *plain], candidates, overall)
    return FamilyChoice(rows=rows, plain=plain, family=family,
                        score=closeness({r["level"]: r["chosen_value"] for r in rows}, top), max_running_requests=most,
                        step0=stand_in.name if stand_in else None, env=stand_in.env if stand_in else {},
                        baseline=base[0].name if base else None, graphs=_graphs(spec, records),
                        server=spec[0].stack["server"] if spec else None)


def _members(family: str, candidates: list[Variant]) -> tuple[list[Variant], list[Variant], list[Variant]]:
    """FAMILY's baseline (its backend's), its EAGLE-3 variants in order of steps, and its step-0 servers."""
    ours = [v for v in candidates if v.family == family]
    return ([v for v in candidates if v.baseline and v.family == family.split("/")[0]],
            sorted((v for v in ours if v.kind == "eagle"), key=lambda v: v.steps),
            [v for v in ours if v.kind == "step0"])


def _against_overall(rows: list[dict], candidates: list[Variant], overall: dict[str, dict]) -> None:
    """Each row given its chosen variant's kind and the per-level best of every variant (OVERALL)."""
    kinds = {v.name: v.kind for v in candidates}
    for row in rows:
        row.update(kind=kinds[row["chosen"]], best=overall[row["level"]]["best"],
                   best_value=overall[row["level"]]["best_value"])


def _graphs(spec: list[Variant], records: dict) -> list[int] | None:
    """The decode CUDA-graph sizes the first of SPEC's servers that said them captured."""
    return next((g for v in spec if (g := records[v.name].get("cuda_graph_bs"))), None)


def _stand_in(step0: list[Variant], measured: dict[str, dict], top: dict[str, float], metric: str) -> Variant:
    """The step-0 server closest to the per-level best, compared where they ran (from STEP0_FROM up): below it each
    would count as serving nothing."""
    return max(step0, key=lambda v: closeness(values_of(measured[v.name], metric), {
        level: value for level, value in top.items() if level in measured[v.name]}))


def _priced(measured: dict[str, dict], base: list[Variant], stand_in: Variant) -> dict[str, dict]:
    """MEASURED with the baselines' levels where STAND_IN ran left out: there step 0 costs what it measured. Below
    STEP0_FROM no batch runs at step 0, so there the baseline is still what "no drafting" costs (the policy
    server's own run confirms it)."""
    return {**measured, **{b.name: {level: lv for level, lv in measured[b.name].items()
                                    if level not in measured[stand_in.name]} for b in base}}


def values_of(levels_of: dict, metric: str) -> dict[str, float | None]:
    """One server's METRIC per level, from its measured levels."""
    return {level: value_of(lv, metric) for level, lv in levels_of.items()}


# ------------------------------------------------------------------ the policy


def policy(rows: list[dict], graph_sizes: list[int] | None) -> dict:
    """What serves the chosen ROWS: none (nothing measured), the baseline (step 0 everywhere), fixed EAGLE-3 (one
    step count everywhere), or SGLang's adaptive config (slot_config), with notes where SGLang would route a level
    elsewhere than its choice."""
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
