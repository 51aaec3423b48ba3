"""rig tune's confirmation: an adaptive policy started as a server of its own and measured at every level; what
is served (that server, or the one variant chosen everywhere, by its own rounds) held to its family's baseline
and the per-level best; and the one measured server that pays best for the user's own load."""
from __future__ import annotations

from rig.core.fs import atomic_write
from rig.serving import adaptive
from rig.serving.measure.verdict import confirm, for_load
from rig.serving.tune.choose import FamilyChoice
from rig.serving.tune.measure import Measuring, usable
from rig.serving.tune.variants import BASELINE, POLICY, Variant, eagle
from rig.stack.derive import with_server


def serve_adaptive(measuring: Measuring, stack: dict, kind: dict, choice: FamilyChoice, records: dict) -> str:
    """The adaptive KIND's config written to --out/adaptive.json and its own server measured (into RECORDS[POLICY]):
    STACK's line with the chosen family's backend and cap, and its step-0 server's environment. The config's
    path."""
    config = str(atomic_write(measuring.out / "adaptive.json",
                              adaptive.render({int(k): v for k, v in kind["slots"].items()})))
    assert choice.server is not None  # a policy that switches with load chose EAGLE-3 somewhere: its family has one
    line = with_server(stack, **{k: choice.server[k] for k in ("attention_backends", "max_running_requests")})
    own = Variant(POLICY, kind["steps"], eagle(line, kind["steps"], config), "eagle", choice.family or "",
                  choice.env, optional=True)
    measuring.tried(own, records.setdefault(POLICY, {"adaptive": kind["slots"]}))
    return config


def confirmation(records: dict, choice: FamilyChoice, kind: dict, metric: str) -> dict | None:
    """What is served (the policy's own server, the family's baseline, or the one fixed variant chosen everywhere)
    held to the per-level best and the baseline at each chosen level; None where nothing was chosen."""
    if not choice.rows:
        return None
    served = {"adaptive": POLICY, "baseline": choice.baseline}.get(kind["kind"]) or choice.rows[0]["chosen"]
    return confirm({n: v.get("levels") or {} for n, v in records.items()}, choice.rows, served,
                   choice.baseline or BASELINE, metric)


def for_the_load(records: dict, measuring: Measuring, profile: tuple[str, dict[int, float]]) -> dict:
    """PROFILE's load (its file, its histogram of running requests) and the one measured server, the policy's
    included, with the highest expected output over it."""
    measured = usable(records)
    return {"file": profile[0], "histogram": profile[1],
            **for_load(measured, list(measured), measuring.plan.levels, profile[1], measuring.plan.metric)}

