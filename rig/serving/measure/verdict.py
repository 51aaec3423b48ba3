"""What measurements come to: ratios over rounds, noise, the crossover, the per-level choice and its
confirmation, and the failures of a measurement that measured nothing or not what it claims."""
from __future__ import annotations

import math
import statistics

from rig.serving.measure.record import rounds_of, value_of

# The policy's server runs after the others, not interleaved with them: the same line started twice differs by a
# few percent (the stand-in) or more (a tiny model on the H200), so confirmation calls a level lost only when every
# round is more than this below.
LIFETIMES = 0.05


def ratios(mine: list, theirs: list) -> list[float]:
    """Round-by-round ratios where both rounds measured something finite."""
    found = [a / b for a, b in zip(mine, theirs, strict=False) if a is not None and b]  # 0 of theirs: no ratio
    return [r for r in found if math.isfinite(r)]


def within_range(values: list[float], tolerance: float = 0.0) -> str:
    """won / lost only when every round agrees, by more than TOLERANCE; otherwise the difference is within noise."""
    if min(values) > 1 + tolerance:
        return "won"
    if max(values) < 1 - tolerance:
        return "lost"
    return "within noise"


def closeness(values: dict[str, float | None], best: dict[str, float]) -> float:
    """How close one server comes to the per-level BEST over every level: the geometric mean of its ratios; a level
    it has no value at counts as 0 (it cannot serve it), so it is never preferred for skipping one."""
    ratios_ = [(values.get(level) or 0) / top for level, top in best.items() if top]
    if not ratios_ or min(ratios_) <= 0:
        return 0.0
    return math.exp(statistics.fmean(math.log(r) for r in ratios_))


# ------------------------------------------------------------------ failures of measuring


def nothing_measured(label: str, levels: list[dict]) -> str | None:
    """Why a server's run measured nothing (every request of every level failed), or None."""
    if any(lv.get("output_throughput") for lv in levels):
        return None
    errors = sorted({e for lv in levels for e in lv.get("errors", [])})[:3]
    return f"{label}: nothing was measured (every request failed" + (f": {'; '.join(errors)}" if errors else "") + ")"


def not_speculating(label: str, claims_steps: int, algorithm: object) -> str | None:
    """A variant measured as speculative whose server says it runs no speculative algorithm."""
    if claims_steps > 0 and not algorithm:
        return (f"{label}: the server reports no speculative algorithm, so it did not measure EAGLE-3; its "
                "numbers are not used")
    return None


def margin_problem(margins: list[float]) -> str | None:
    """Numerics margins that are not numbers (NaN logprobs are a broken kernel, never "not given"); +inf is a sure
    top-1 beside a -inf runner-up, and is a number."""
    broken = [m for m in margins if not isinstance(m, (int, float)) or isinstance(m, bool) or math.isnan(m)]
    if broken:
        return (f"{len(broken)} of {len(margins)} top-2 logprob margins are not finite numbers (NaN logprobs): the "
                "server's logits are broken")
    return None


# ------------------------------------------------------------------ bench: EAGLE-3 against the baseline


def crossover(eagle: dict, baseline: dict) -> dict:
    """Where EAGLE-3 stops paying, by per-round throughput ratios.

    A level is won (lost) only when every round's EAGLE-3/baseline ratio is above
    (below) 1. The crossover is the highest concurrency up to which every level is
    won; a win above the first level that is not is reported apart.
    """
    rows = _compared_levels(eagle, baseline)
    first_other = next((i for i, r in enumerate(rows) if r["verdict"] != "won"), len(rows))
    highest = rows[first_other - 1]["max_concurrency"] if first_other else None
    noisy = [r["max_concurrency"] for r in rows if r["verdict"] == "within noise"]
    lost = [r["max_concurrency"] for r in rows if r["verdict"] == "lost"]
    again = [r["max_concurrency"] for r in rows[first_other:] if r["verdict"] == "won"]
    tail = (f"; within noise at C={', '.join(map(str, noisy))}" if noisy else "") + \
           (f"; it loses at C={', '.join(map(str, lost))}" if lost else "") + \
           (f"; it wins again at C={', '.join(map(str, again))}, above a level it did not win" if again else "")
    return {"highest_winning_concurrency": highest, "levels": rows,
            "recommendation": _crossover_advice(rows, highest, noisy, tail, won_all=first_other == len(rows)),
            "within_noise": noisy, "wins_after_a_loss": again}


def _compared_levels(eagle: dict, baseline: dict) -> list[dict]:
    """Each EAGLE-3 level that the baseline measured too: both throughputs and the per-round ratios' verdict."""
    base = {lv["max_concurrency"]: lv for lv in baseline["levels"]}
    rows = []
    for lv in eagle["levels"]:
        other = base.get(lv["max_concurrency"])
        found = ratios(*_paired_rounds(lv, other))
        if not found or other is None:  # no baseline level: theirs is [None], so no ratio either
            continue
        rows.append({"max_concurrency": lv["max_concurrency"], "eagle3": lv["output_throughput"],
                     "baseline": other["output_throughput"],
                     "ratio": statistics.median(found), "ratio_min": min(found), "ratio_max": max(found),
                     "rounds": len(found), "verdict": within_range(found)})
    return rows


def _paired_rounds(lv: dict, other: dict | None) -> tuple[list, list]:
    """LV's and OTHER's per-round output throughputs, as many of each: an earlier run's one value is held against
    every round of the other."""
    mine = lv.get("round_output_throughput") or [lv.get("output_throughput")]
    theirs = (other or {}).get("round_output_throughput") or [(other or {}).get("output_throughput")]
    if len(theirs) == 1:  # an earlier run of one value: hold every round against it
        theirs = theirs * len(mine)
    elif len(mine) == 1:
        mine = mine * len(theirs)
    return mine, theirs


def _crossover_advice(rows: list[dict], highest: int | None, noisy: list[int], tail: str, won_all: bool) -> str:
    if not rows:
        return "no level has results from both servers; nothing to compare"
    if highest is None and not noisy:
        return "EAGLE-3 loses at every measured concurrency: serve without speculation"
    if highest is None:
        return "EAGLE-3 wins clearly at no measured concurrency" + tail + \
               ": serve without speculation, or measure with more rounds"
    if won_all:
        return f"EAGLE-3 wins at every measured concurrency (up to {highest}), in every round: serve with it"
    return (f"EAGLE-3 wins in every round up to concurrency {highest}{tail}: serve with it where load "
            f"stays at or below {highest} request{'s' if highest > 1 else ''} in flight, without it above")


# ------------------------------------------------------------------ tune: the per-level choice, confirmed


def choose(measured: dict[str, dict], candidates: list, levels: list, metric: str,
           max_running_requests: int | None = None) -> list[dict]:
    """Per level: the best candidate by its median METRIC (judged: at an open-loop level, each request's speed), and
    the one chosen: the simplest not clearly below the best (CANDIDATES in order of simplicity, each with .name and
    .steps). A level's running batch is its
    concurrency (or, open-loop, its mean in flight), at most the policy server's MAX_RUNNING_REQUESTS."""
    rows = []
    for level in levels:
        have = [v for v in candidates if value_of(measured.get(v.name, {}).get(level.name), metric)]
        if not have:
            continue
        at = {v.name: measured[v.name][level.name] for v in have}
        best = max(have, key=lambda v: value_of(at[v.name], metric) or 0.0)
        chosen = next(v for v in have
                      # each variant is its own server run: lost only beyond the lifetimes' noise
                      if v is best or within_range(ratios(rounds_of(at[v.name], metric),
                                                          rounds_of(at[best.name], metric)) or [1.0],
                                                   LIFETIMES) != "lost")
        batch = level.concurrency if level.rate is None else max(1, round(at[chosen.name].get("concurrency") or 1))
        batch = min(batch, max_running_requests) if max_running_requests else batch
        rows.append({"level": level.name, "batch": batch, "best": best.name, "best_value": value_of(at[best.name], metric),
                     "chosen": chosen.name, "steps": chosen.steps, "chosen_value": value_of(at[chosen.name], metric)})
    return rows


# A level is confirmed when the policy's median round keeps this much of the per-level best (and no round-by-round
# loss): one lucky round cannot carry a level whose other rounds fell short (issue 71: 0.89, one round at 0.98).
CONFIRM_MEDIAN = 1 - LIFETIMES


def level_confirmation(vs_best: list[float]) -> tuple[str, bool, str]:
    """(verdict, confirmed, the rule that decided) for one level's per-round ratios to the per-level best."""
    if not vs_best:
        return "not measured", False, "no round of both servers measured"
    verdict = within_range(vs_best, LIFETIMES)
    median = statistics.median(vs_best)
    if verdict == "lost":
        return verdict, False, f"every round below {CONFIRM_MEDIAN:.2f} of the best"
    if median < CONFIRM_MEDIAN:
        return "median below", False, f"median {median:.2f} below {CONFIRM_MEDIAN:.2f} of the best"
    return verdict, True, f"median {median:.2f} at least {CONFIRM_MEDIAN:.2f} of the best, no round-by-round loss"


def confirm(measured: dict[str, dict], rows: list[dict], policy: str, baseline: str, metric: str) -> dict:
    """The POLICY's measurements against the BASELINE's and the per-level best, per level, by per-round ratios of
    METRIC: confirmed where level_confirmation says so at every chosen level."""
    mine = measured.get(policy, {})
    table = []
    for row in rows:
        own = mine.get(row["level"])
        if not own or not value_of(own, metric):
            continue
        best = measured[row["best"]][row["level"]]
        base = measured.get(baseline, {}).get(row["level"])
        vs_best = ratios(rounds_of(own, metric), rounds_of(best, metric))
        vs_base = ratios(rounds_of(own, metric), rounds_of(base, metric)) if base else []
        verdict, confirmed, rule = level_confirmation(vs_best)
        table.append({"level": row["level"], "policy": value_of(own, metric), "best": row["best"],
                      "best_value": row["best_value"],
                      "steps": row["steps"], "ratio_best": statistics.median(vs_best) if vs_best else None,
                      "ratio_best_range": [min(vs_best), max(vs_best)] if vs_best else None,
                      "verdict": verdict, "confirmed": confirmed, "rule": rule,
                      "ratio_baseline": statistics.median(vs_base) if vs_base else None,
                      "vs_baseline": within_range(vs_base, LIFETIMES) if vs_base else None})
    return {"levels": table, "confirmed": bool(table) and all(t["confirmed"] for t in table)
            and len(table) == len(rows)}


# ------------------------------------------------------------------ tune: the best single server for a load


def for_load(measured: dict[str, dict], candidates: list[str], levels: list, profile: dict[int, float],
             metric: str) -> dict:
    """The one server (of CANDIDATES) with the highest expected METRIC (output or goodput) over PROFILE ({running
    requests: share of time}), each share weighed at the measured closed-loop level nearest it; with each level's
    ratio to the per-level best, and its expectation's ratio to the per-level best's."""
    from rig.serving.load_profile import nearest

    closed = {lv.concurrency: lv.name for lv in levels if lv.rate is None}
    at = {running: closed[nearest(running, list(closed))] for running in profile} if closed else {}
    best_at = {name: max(_value(measured[v], name, metric) for v in candidates) for name in closed.values()}
    expected = _expected(measured, candidates, list(closed.values()), at, profile, metric)
    if not expected:
        return {"chosen": None, "expected": {}, "why": "no server was measured at every level the profile needs"}
    chosen = max(expected, key=lambda n: expected[n])
    ceiling = sum(share * best_at[at[r]] for r, share in profile.items())
    return {"chosen": chosen, "expected": expected, "weights": {closed_name: round(sum(
                share for r, share in profile.items() if at[r] == closed_name), 4) for closed_name in closed.values()},
            "of_per_level_best": expected[chosen] / ceiling if ceiling else None,
            "ratios": {level: _value(measured[chosen], level, metric) / best_at[level]
                       for level in closed.values() if best_at[level]}}


def _value(measured: dict, level: str, metric: str) -> float:
    """One server's METRIC at LEVEL, 0 where it has none."""
    return value_of(measured.get(level), metric) or 0.0


def _expected(measured: dict[str, dict], candidates: list[str], closed: list[str], at: dict[int, str],
              profile: dict[int, float], metric: str) -> dict[str, float]:
    """Each candidate's METRIC expected over PROFILE, each share at its level in AT; of those measured at every
    level the profile needs."""
    expected: dict[str, float] = {}
    for name in candidates:
        values = {level: _value(measured[name], level, metric) for level in closed}
        if all(values[at[r]] > 0 for r in profile):
            expected[name] = sum(share * values[at[r]] for r, share in profile.items())
    return expected
