"""rig tune's measuring: every variant's server (rig.serving.tune.variants) started from its own line, measured at
the plan's levels, stopped, one at a time (each may need every GPU); and the dry run, which says all that without
starting one."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rig.core import RigError, progress
from rig.core.fs import atomic_write
from rig.serving import adaptive
from rig.serving.launch import Servers, config_checked, make_logs
from rig.serving.measure.plan import Plan, check_fits
from rig.serving.measure.sweep import Server, count
from rig.serving.server import health_url, render
from rig.serving.session import measured, serving
from rig.serving.tune.variants import STEP0_FROM, STEP0_SLOTS, Variant, assignments, imports_of, uncapped, variants
from rig.serving.workload import Workload
from rig.stack.spec import unmeasured_profiles

# what the dry run's estimate assumes: a server's start (60-130 s for an 8B shape on the H200) and one request's decode
START_S, TOKENS_PER_S = 120, 50


def prepare(stack: dict, venv: str, plan: Plan, step0_config: Path) -> tuple[list[Variant], dict[str, list[str]]]:
    """The variants and every server line, rendered and parsed by the venv's sglang: all that can be refused is
    refused here, before anything is written. The lines are rendered against a scratch copy of STEP0_CONFIG (the
    step-0 servers' adaptive config), which lay_out writes where they read it."""
    # the stack's loader held profile_levels to bench.concurrency; the options may have changed the levels since
    if problem := unmeasured_profiles(stack["tune"]["profile_levels"], plan.concurrency):
        raise RigError(problem)
    if reason := adaptive.unsupported_reason({**stack["server"], "speculative_eagle_topk": 1}):
        raise RigError(f"rig tune derives SGLang's adaptive speculation, which SGLang refuses here: {reason}")
    imports = imports_of(venv)
    with config_checked(adaptive.render(STEP0_SLOTS), step0_config) as (scratch, as_run):
        lines = as_run({v.name: render(v.stack, venv, baseline=v.baseline)["argv"]
                        for v in variants(stack, venv, str(scratch), imports)})
    return variants(stack, venv, str(step0_config), imports), lines


def lay_out(stack: dict, out: Path, step0_config: Path) -> None:
    """OUT laid out as the servers need it: the step-0 servers' config where they read it, and logs/."""
    if stack["tune"]["step0"]:
        atomic_write(step0_config, adaptive.render(STEP0_SLOTS))
    make_logs(out)


@dataclass(frozen=True)
class Measuring:
    """What every server of one tune run is measured with: the servers' context, the venv, the plan (its levels),
    --out, the requests' workload, tune.profile_levels/profile_steps/profile_host (SGLang's torch profiler) and the
    record's checkpoint, written after each server (a machine taken back mid-run keeps the servers it finished)."""
    servers: Servers
    venv: str
    plan: Plan
    out: Path
    workload: Workload
    profile_levels: list[int]
    profile_steps: int
    profile_host: bool
    checkpoint: Callable[[], None]

    def every(self, found: list[Variant], records: dict, lift_caps: bool) -> list[Variant]:
        """FOUND measured in order, each into its record in RECORDS; where LIFT_CAPS, a speculative server capped
        below its decode graph is measured again uncapped, next, while the box is as it was for its capped twin.
        Returns every variant measured, the uncapped twins with them."""
        done, queue = list(found), list(found)
        while queue:
            variant = queue.pop(0)
            record = records.setdefault(variant.name, {})
            if self.tried(variant, record) and lift_caps and (lifted := uncapped(variant, record)):
                done.append(lifted)
                queue.insert(0, lifted)
        return done

    def tried(self, variant: Variant, record: dict) -> bool:
        """VARIANT measured into RECORD; an optional server's failure recorded there (its `stopped`, its log) and
        the run going on with the others: it costs its own numbers, not the rest. True when it measured."""
        try:
            self.measure(variant, record)
        except RigError as exc:
            if not variant.optional:
                raise
            record["stopped"] = record.get("stopped") or str(exc)
            progress(f"{variant.name}: {exc}; going on without it")
            return False
        finally:  # whatever this server came to, the record on disk has it
            self.checkpoint()
        return True

    def measure(self, variant: Variant, record: dict) -> None:
        """VARIANT's server under test (rig.serving.session): started, measured, stopped; RECORD holds what was
        measured even when it fails. A step-0 server is measured where batches run at step 0 (from STEP0_FROM)."""
        args = render(variant.stack, self.venv, baseline=variant.baseline)
        url = health_url(variant.stack)
        log = self.out / "logs" / f"{variant.name}.log"
        record.update({"steps": variant.steps, "kind": variant.kind, "family": variant.family, "levels": {}})
        with serving(self.servers, variant.name, args["argv"], url, log, record, not variant.baseline, variant.env):
            server = Server(url, variant.name, self.plan, self.servers.api_key_env, self.workload,
                            self._profile(variant))
            record.update({"cuda_graph_bs": graph_sizes(server.info),
                           **{k: server.run[k] for k in ("max_running_requests", "speculative_algorithm")}})
            if note := check_fits(self.plan, variant.name, server.info, self.workload, serial=False):
                progress(note)
            at = [lv for lv in self.plan.levels if variant.kind != "step0" or lv.concurrency >= STEP0_FROM]
            measured(server, at, variant.name, log, record)

    def _profile(self, variant: Variant) -> dict | None:
        """Where VARIANT's full batches are profiled (rig.serving.measure.sweep.Server's PROFILE), or None."""
        if not self.profile_levels:
            return None
        where = self.out / "profiles" / variant.name
        where.mkdir(parents=True, exist_ok=True)
        return {"levels": set(self.profile_levels), "steps": self.profile_steps, "host": self.profile_host,
                "dir": where}


def graph_sizes(info: dict) -> list[int] | None:
    """The decode CUDA-graph batch sizes a server captured, from /server_info: `cuda_graph_bs` (0.5.9), or
    `cuda_graph_config.decode.bs` (0.5.17); None when it says neither (then no padding is assumed)."""
    config = info.get("cuda_graph_config")
    decode = config.get("decode") if isinstance(config, dict) else None
    for sizes in (info.get("cuda_graph_bs"), decode.get("bs") if isinstance(decode, dict) else None):
        if isinstance(sizes, list) and sizes and all(count(g) for g in sizes):
            return sorted(sizes)
    return None


def usable(records: dict) -> dict[str, dict]:
    """Each variant's levels where it measured to the end: a server that stopped mid-way measured part of a level
    at most, nothing a choice builds on."""
    return {name: v["levels"] for name, v in records.items() if v.get("levels") and not v.get("stopped")}


# ------------------------------------------------------------------ the dry run (--check)


def estimate_s(plan: Plan, servers: int) -> float:
    """A rough duration: server starts, then each level's rounds at an assumed per-request decode speed."""
    one_request = plan.max_tokens / TOKENS_PER_S
    per_server = sum(max(plan.min_seconds, plan.requests_at(lv) / lv.concurrency * one_request if lv.rate is None
                         else plan.requests_at(lv) / lv.rate + one_request) for lv in plan.levels) * plan.rounds
    return servers * (START_S + per_server)


def dry_run(stack: dict, found: list[Variant], lines: dict[str, list[str]], plan: Plan, said: list[str]) -> dict:
    """What a run would start and measure, and about how long it would take, after SAID (what was found on the
    way); nothing starts."""
    may_lift = [v.name for v in found if v.kind != "baseline"] if stack["tune"]["uncapped"] else []
    least = len(found) + 1  # and the policy's server, when the choice changes with load
    most = least + len(may_lift)
    envs = {v.name: v.env for v in found}  # what each server's environment adds, said before its line
    shown = {name: " ".join([*assignments(envs.get(name, {})), *argv]) for name, argv in lines.items()}
    return {"ok": True, "changed": False, "variants": lines, "levels": [lv.name for lv in plan.levels],
            "estimate_s": [estimate_s(plan, least), estimate_s(plan, most)],
            "msg": "\n".join([*said, _would_start(stack, plan), *(f"  {name}: {line}" for name, line in shown.items()),
                              *([f"  and each of {', '.join(may_lift)} again with --max-running-requests at its "
                                 "decode graph size, where its server caps running requests below it"]
                                if may_lift else []),
                              "  then the policy derived from them, against the baseline and the per-level best",
                              f"estimated {estimate_s(plan, least) / 60:.0f}-{estimate_s(plan, most) / 60:.0f} min "
                              f"({least}-{most} servers at about {START_S} s a start, {TOKENS_PER_S} tok/s a request: "
                              "measure yours with a first run)"])}


def _would_start(stack: dict, plan: Plan) -> str:
    levels = plan.levels
    return (f"would start, one at a time at {health_url(stack)}, and measure at "
            f"{', '.join(lv.name for lv in levels)} in {plan.rounds} round(s) at temperature {plan.temperature:g} "
            f"(at least {sum(plan.requests_at(lv) for lv in levels)} requests a round"
            + (f", {plan.min_seconds:g} s a level" if plan.min_seconds else "") + "):")
