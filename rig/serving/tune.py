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

import difflib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rig.core import RigError, progress
from rig.core.documents import dump_json
from rig.core.escape import cell
from rig.core.fs import atomic_write
from rig.serving import adaptive, testmodel
from rig.serving.launch import Servers, make_logs, results_dir, with_server
from rig.serving.measure.plan import Plan, check_fits
from rig.serving.measure.record import recorded
from rig.serving.measure.stats import shown
from rig.serving.measure.sweep import Level, Server, count
from rig.serving.measure.verdict import (
    choose,
    closeness,
    confirm,
    for_load,
)
from rig.serving.server import graph_size, health_url, render
from rig.serving.session import measured, serving
from rig.serving.workload import Workload
from rig.stack.spec import unmeasured_profiles

SCHEMA_VERSION = 2
BASELINE = "baseline"
POLICY = "policy"
SKIP_EXTEND = "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND"
# rig's free-off patch (the stack's patches.opt_in: [free-off]): step 0 as a plain decode where applied, SGLang's own
# where a server's environment sets it to 0
FREE_OFF = "RIG_FREE_OFF"
# SGLang's step 0 as a server of its own: a server launches at one of its config's candidate steps (sglang refuses
# --speculative-num-steps outside them), so one request alone drafts 1 step and every batch of two or more runs at
# step 0; the step-0 servers are measured at those levels only
STEP0_FROM = 2
STEP0_SLOTS = {1: 1, STEP0_FROM: 0}
# what --check's estimate assumes: a server's start (60-130 s for an 8B shape on the H200) and one request's decode
START_S, TOKENS_PER_S = 120, 50


@dataclass(frozen=True)
class Variant:
    name: str
    steps: int  # drafted tokens per step; 0: the baseline or SGLang's step 0 (kind says which)
    stack: dict
    kind: str = "eagle"  # baseline | eagle | step0
    family: str = ""  # one server line's backend and cap: the variants an adaptive server can switch between
    env: dict = field(default_factory=dict)  # what the server's environment adds
    candidate: bool = True  # may the policy choose it (SGLang's adaptive mode: topk 1 only)
    # a server beside the comparison (an uncapped twin, a step-0 server, the policy's own): its failure is
    # recorded and the run goes on; the baseline's or a fixed EAGLE-3's ends the run
    optional: bool = False

    @property
    def baseline(self) -> bool:
        return self.kind == "baseline"



def eagle(stack: dict, steps: int, config: str = "", **server: list | int) -> dict:
    """The stack's server line with fixed EAGLE-3 at STEPS (or the adaptive CONFIG): topk 1, steps + 1 drafts."""
    return with_server(stack, speculative_num_steps=steps, speculative_eagle_topk=1,
                       speculative_num_draft_tokens=steps + 1, speculative_adaptive_config=config, **server)


# what each attention backend needs importable, beyond sglang: FA3 is sgl_kernel's flash_ops (a stripped
# sglang-kernel leaves it out), flashinfer and triton their packages: (module, a file in it or "", what it is)
BACKEND_NEEDS = {"fa3": ("sgl_kernel", "flash_ops*.so", "sgl_kernel's flash_ops (FlashAttention 3)"),
                 "flashinfer": ("flashinfer", "", "the flashinfer package"),
                 "triton": ("triton", "", "the triton package")}


def _imports(venv: str | Path) -> dict[str, list[Path]]:
    """Where the venv's own interpreter imports sglang and the backends' modules from (.pth directories included)."""
    from rig.core.proc import venv_python
    from rig.python.introspect import import_dirs

    return import_dirs(venv_python(venv), ("sglang", *sorted({m for m, _, _ in BACKEND_NEEDS.values()})),
                       regular=True)


def backend_problem(imports: dict[str, list[Path]], venv: str | Path, backend: str) -> str | None:
    """Why the venv (its IMPORTS) cannot run BACKEND, or None (a backend rig knows no needs of is left to SGLang's
    parser)."""
    if backend not in BACKEND_NEEDS:
        return None
    module, pattern, what = BACKEND_NEEDS[backend]
    dirs = imports.get(module, [])
    if dirs and (not pattern or any(p.is_file() for d in dirs for p in d.glob(pattern))):
        return None
    return (f"server.attention_backends lists {backend}, but the Python of {venv} cannot import {what}: install it "
            f"or drop {backend}")


def sglang_reads(imports: dict[str, list[Path]], name: str) -> bool:
    """Whether the venv's sglang (where its interpreter imports it from) reads the environment variable NAME: its
    environ module or a speculative worker names it (SGLang's own switches, and rig's free-off patch's)."""
    from rig.core.documents import read_text

    for package in imports.get("sglang", []):
        root = package / "srt"
        for path in [root / "environ.py", *sorted((root / "speculative").glob("*.py"))]:
            if path.is_file() and not path.is_symlink():
                try:
                    if name in read_text(path, "sglang source"):
                        return True
                except RigError:
                    continue
    return False


def variants(stack: dict, venv: str | Path, step0_config: str, imports: dict[str, list[Path]]) -> list[Variant]:
    """Every server tune measures, for the venv whose IMPORTS (_imports) say what it can run."""
    server = stack["server"]
    if not server["draft_model"]:
        raise RigError("rig tune compares EAGLE-3 with the baseline: the stack has no server.draft_model; set it")
    backends = server["attention_backends"] or [None]
    for backend in filter(None, backends):
        if problem := backend_problem(imports, venv, backend):
            raise RigError(problem)
    own = server["speculative_num_steps"]
    steps = sorted(set(stack["tune"]["steps"]) | ({own} if server["speculative_eagle_topk"] == 1 else set()))
    found = []
    tagged = [(backend, *((f"@{backend}", {"attention_backends": [backend]}) if backend and len(backends) > 1 else
                          ("", {}))) for backend in backends]
    for backend, tag, on in tagged:
        family = backend or ""
        found.append(Variant(BASELINE + tag, 0, with_server(stack, speculative_adaptive_config="", **on), "baseline",
                             family))
        found += [Variant(f"eagle3-{k}{tag}", k, eagle(stack, k, "", **on), "eagle", family) for k in steps]
        if server["speculative_eagle_topk"] != 1:  # measured, but SGLang's adaptive mode cannot serve it
            found.append(Variant("stack" + tag, own, with_server(stack, speculative_adaptive_config="", **on),
                                 "eagle", family, candidate=False))
    envs = step0_envs(stack, venv, imports)
    found += [Variant(which + tag, 0, eagle(stack, 1, step0_config, **on), "step0", backend or "", env, optional=True)
              for backend, tag, on in tagged  # a family's step-0 slots are priced by its own backend's step 0
              for which, env in envs.items()]
    return found


def step0_envs(stack: dict, venv: str | Path, imports: dict[str, list[Path]]) -> dict[str, dict]:
    """tune.step0's servers, each with what its environment adds: SGLang's own step 0 (with rig's free-off turned
    off where the venv has it), its draft extend skipped, and free-off's plain decode (where it is applied)."""
    asked = stack["tune"]["step0"]
    patched = sglang_reads(imports, FREE_OFF)
    if "step0-skip-extend" in asked and not sglang_reads(imports, SKIP_EXTEND):
        raise RigError(f"tune.step0 lists step0-skip-extend, but the sglang in {venv} does not read "
                       f"{SKIP_EXTEND}: drop it from tune.step0 (or install an sglang that has it)")
    if "step0-plain" in asked and not patched:
        raise RigError(f"tune.step0 lists step0-plain, but the sglang in {venv} does not have rig's free-off patch: "
                       "add free-off to the stack's patches.opt_in and run `rig patch apply --stack STACK` (sglang "
                       "0.5.17 or 0.5.23), or drop step0-plain from tune.step0")
    sglangs = {FREE_OFF: "0"} if patched else {}
    return {which: {"step0": sglangs, "step0-skip-extend": {**sglangs, SKIP_EXTEND: "1"}, "step0-plain": {}}[which]
            for which in asked}


def uncapped(variant: Variant, record: dict) -> Variant | None:
    """The variant again with its running-request cap lifted to its decode graph, when its server capped below it
    (SGLang under speculation sets 48 where max_running_requests is not given); the graph is the server's own
    (/server_info), else the one rig asked for."""
    cap, graphs = record.get("max_running_requests"), record.get("cuda_graph_bs")
    top = max(graphs) if graphs else graph_size(variant.stack)
    if variant.kind == "baseline" or not cap or cap >= top or variant.name.endswith("-uncapped"):
        return None
    return Variant(f"{variant.name}-uncapped", variant.steps, with_server(variant.stack, max_running_requests=top),
                   variant.kind, f"{variant.family}/uncapped", variant.env, variant.candidate, optional=True)


def levels(stack: dict) -> list[Level]:
    concurrency = stack["bench"]["concurrency"]
    # each given once: the stack's schema and the options' reader refuse a level listed twice (schema.once)
    found = [Level(c) for c in concurrency] + [Level(max(concurrency), r) for r in stack["tune"]["request_rates"]]
    if problem := unmeasured_profiles(stack):  # the options may have changed bench.concurrency since the stack was read
        raise RigError(problem)
    return found


# ------------------------------------------------------------------ measuring


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
              measured: dict[str, dict], plain: list[dict]) -> str:
    """What to serve, said from the confirmation: a single server (baseline, fixed) is held to the per-level best
    by its own rounds, an adaptive policy by its own server's. PLAIN: the choices with the baseline for step 0,
    what the fallback reads when nothing single holds."""
    if kind["kind"] == "none":
        return "nothing was measured: no recommendation"
    lost = [t for t in (confirmation or {}).get("levels", []) if t["verdict"] == "lost"]
    said = [f"at {t['level']} it ran {t['ratio_best']:.2f} of {t['best']}" for t in lost]
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
        return (f"serve with the adaptive policy (server.speculative_adaptive_config: {config_path}): confirmed within "
                f"noise of the per-level best at every level ({plan_text})")
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


# ------------------------------------------------------------------ the stack diff and the report


def proposed_stack(stack_path: str, kind: dict, config_path: str | None,
                   family: dict | None = None) -> tuple[str, str] | None:
    """The user's stack file with the policy in its server section, edited in place (rig.core.yaml_edit: every
    comment and other line kept), and the diff from the file on disk; the server keys of the family it came from
    (its attention backend, its running-request cap) go with it."""
    from rig.core.documents import read_text
    from rig.core.yaml_edit import with_keys

    if kind["kind"] not in ("adaptive", "fixed"):
        return None
    values: dict[str, Any] = {"speculative_num_steps": kind["steps"], "speculative_eagle_topk": 1,
                              "speculative_num_draft_tokens": kind["steps"] + 1}
    if kind["kind"] == "adaptive":
        values["speculative_adaptive_config"] = config_path
    values.update({key: family[key] for key in ("attention_backends", "max_running_requests")
                   if family and family.get(key)})
    before = read_text(stack_path, "stack file")
    after = with_keys(before, "server", values, stack_path)
    diff = "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), stack_path,
                                        f"{stack_path} (proposed)"))
    return after, diff


def report_markdown(result: dict) -> str:
    names = list(result["variants"])
    plan = result["plan"]
    lines = ["# rig tune", "", f"Stack `{cell(result['stack'])}`; {plan['rounds']} round(s) per level at temperature "
             f"{plan.get('temperature', 0)}, top_p {plan.get('top_p', 1)}; metric: {result['metric']} (median over "
             "rounds, the range over rounds in brackets; the server's own accept length under each, where it "
             "speculates).", "",
             "| level | " + " | ".join(cell(n) for n in names) + " | chosen |", "|---" * (len(names) + 2) + "|"]
    chosen = {r["level"]: r["chosen"] for r in result["choices"]}
    for level in result["levels"]:
        cells = []
        for name in names:
            lv = result["variants"][name].get("levels", {}).get(level)
            values = [v for v in (lv or {}).get("round_values", []) if v]
            accept = (lv or {}).get("server_accept_length")
            cells.append("-" if not lv or not lv.get("value") else
                         f"{lv['value']:.1f} ({min(values):.1f}-{max(values):.1f})" +
                         (f" acc {accept:.2f}" if accept else "") + (f" cap {lv['capped_at']}" if lv.get("capped_at")
                                                                     else ""))
        lines.append(f"| {level} | " + " | ".join(cells) + f" | {cell(chosen.get(level, '-'))} |")
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
        lines += ["", "## Confirmation", "", "| level | policy | per-level best | ratio to best (range) | verdict | "
                  "ratio to baseline |", "|---|---|---|---|---|---|"]
        for t in result["confirmation"]["levels"]:
            rng = t["ratio_best_range"]
            lines.append(f"| {t['level']} | {shown(t['policy'], 1)} | {cell(t['best'])} {shown(t['best_value'], 1)} | "
                         f"{shown(t['ratio_best'], 2)} ({shown(rng and rng[0], 2)}-{shown(rng and rng[1], 2)}) | "
                         f"{t['verdict']} | {shown(t['ratio_baseline'], 2)} |")
    if (mine := result.get("load_profile")) and mine.get("chosen"):
        lines += ["", f"## For the load in `{cell(mine['file'])}`", "", "Share of busy time at each measured level "
                  "(each running-request count at the level nearest it): " + ", ".join(
                      f"{level} {share:.2f}" for level, share in mine["weights"].items()), "",
                  "| server | expected |", "|---|---|",
                  *[f"| {cell(n)} | {v:.1f} |" for n, v in sorted(mine["expected"].items(), key=lambda x: -x[1])],
                  "", f"Chosen: {cell(mine['chosen'])}, {shown(mine['of_per_level_best'], 2)} of the per-level best's "
                  "expectation; its ratio to the best per level: " + ", ".join(
                      f"{level} {ratio:.2f}" for level, ratio in mine["ratios"].items())]
    profiled = [(n, level, lv["profile"]) for n, v in result["variants"].items()
                for level, lv in (v.get("levels") or {}).items() if (lv.get("profile") or {}).get("kernels")]
    if profiled:
        lines += ["", "## Where a decode step's time goes", "", "SGLang's torch profiler over the full batch's "
                  "steps (CUDA kernels, ms per step and rank; the largest three):", "",
                  "| server | level | kernel ms/step | largest kernels |", "|---|---|---|---|"]
        lines += [f"| {cell(n)} | {level} | {shown(p['kernel_ms_per_step'], 3)} | " + "; ".join(
                      f"{cell(k['name'][:60])} {shown(k['ms_per_step'], 3)}" for k in p["kernels"][:3]) + " |"
                  for n, level, p in profiled]
    if result.get("stack_diff"):
        lines += ["", "## Proposed stack change", "", "```diff", result["stack_diff"].replace("```", "'''").rstrip(),
                  "```"]
    lines += ["", f"**Recommendation:** {cell(result['recommendation'])}", ""]
    if result.get("stopped"):
        lines += [f"**Stopped early:** {cell(result['stopped'])}", ""]
    return "\n".join(lines)


def figures(result: dict) -> dict:
    """tune.png: each variant's median per level, its bars spanning the rounds (none when nothing was measured)."""
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
    if not ax.get_legend_handles_labels()[0]:
        return {}
    ax.set_xticks(xs, result["levels"])
    ax.set_xlabel("load (C: requests in flight, R: Poisson arrivals per second)")
    ax.set_ylabel(result["metric"])
    ax.set_title("rig tune: median over rounds, bars span the rounds")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return {"tune.png": fig}


# ------------------------------------------------------------------ the run


OUTPUTS = ("tune.json", "report.md", "tune.png", "adaptive.json", "step0.json", "proposed-stack.yml")


def prepare(stack: dict, venv: str, step0_config: str, imports: dict[str, list[Path]]
            ) -> tuple[list[Variant], list[Level], dict[str, list[str]]]:
    """The variants, the levels and every server line, rendered and parsed by the venv's sglang: all that can be
    refused is refused here, before anything is written."""
    if reason := adaptive.unsupported_reason({**stack["server"], "speculative_eagle_topk": 1}):
        raise RigError(f"rig tune derives SGLang's adaptive speculation, which SGLang refuses here: {reason}")
    found, wanted = variants(stack, venv, step0_config, imports), levels(stack)
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
    return {"ok": True, "changed": False, "variants": lines, "levels": [lv.name for lv in wanted],
            "estimate_s": [estimate_s(plan, least, wanted), estimate_s(plan, most, wanted)],
            "msg": "\n".join([
                f"would start, one at a time at {health_url(stack)}, and measure at "
                f"{', '.join(lv.name for lv in wanted)} in {plan.rounds} round(s) at temperature {plan.temperature:g} "
                f"(at least {sum(plan.requests_at(lv.concurrency) for lv in wanted)} requests a round"
                + (f", {plan.min_seconds:g} s a level" if plan.min_seconds else "") + "):",
                *(f"  {name}: {' '.join(argv)}" for name, argv in lines.items()),
                *([f"  and each of {', '.join(may_lift)} again with --max-running-requests at its decode graph size, "
                   "where its server caps running requests below it"] if may_lift else []),
                "  then the policy derived from them, against the baseline and the per-level best",
                f"estimated {estimate_s(plan, least, wanted) / 60:.0f}-{estimate_s(plan, most, wanted) / 60:.0f} min "
                f"({least}-{most} servers at about {START_S} s a start, {TOKENS_PER_S} tok/s a request: measure "
                "yours with a first run)"])}


def run(stack: dict, stack_path: str, venv: str, out: str | Path, plan: Plan, workload: Workload,
        api_key_env: str, check: bool = False, profile: tuple[str, dict[int, float]] | None = None) -> dict:
    out = results_dir(out, OUTPUTS)
    step0_config = str(out / "step0.json")
    # every line rendered from a scratch copy of the step-0 config first: nothing is written before all is checked
    with tempfile.TemporaryDirectory() as scratch:
        config = str(Path(scratch) / "step0.json")
        atomic_write(config, adaptive.render(STEP0_SLOTS))
        imports = _imports(venv)
        found, wanted, lines = prepare(stack, venv, config, imports)
        lines = {name: [step0_config if word == config else word for word in argv] for name, argv in lines.items()}
    model = testmodel.ensure(stack["server"], Path(venv) / "bin" / "python", check)
    if check:
        found_plan = _check(stack, found, wanted, lines, plan)
        if model:
            found_plan["msg"] = model["msg"] + "\n" + found_plan["msg"]
        return found_plan
    if stack["tune"]["step0"]:
        atomic_write(step0_config, adaptive.render(STEP0_SLOTS))
        found = variants(stack, venv, step0_config, imports)
    make_logs(out)
    result: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "stack": stack_path, "plan": {**plan.__dict__},
                              "metric": plan.metric, "levels": [lv.name for lv in wanted], "variants": {},
                              "choices": [], "policy": {"kind": "none", "notes": []}, "confirmation": None,
                              "recommendation": "not finished", "testmodel": model}
    extra: list[str] = []  # the policy's files, when it has them
    with recorded(out, result, "tune.json", report_markdown, figures) as written, \
            Servers(stack["tune"]["start_timeout"], api_key_env) as servers:
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
        result["recommendation"] = recommend(kind, rows, result["confirmation"], config_path, measured,
                                             chosen.get("plain") or rows)
        if profile:  # the one server that pays best for the user's own load
            measured = {n: v["levels"] for n, v in result["variants"].items()
                        if v.get("levels") and not v.get("stopped")}
            mine = for_load(measured, list(measured), wanted, profile[1])
            result["load_profile"] = {"file": profile[0], "histogram": profile[1], **mine}
            if mine["chosen"]:
                result["recommendation"] += (f". For the load in {profile[0]}: serve {mine['chosen']} (expected "
                                             f"{mine['expected'][mine['chosen']]:.0f} {plan.metric.replace('_', ' ')},"
                                             f" {mine['of_per_level_best']:.2f} of the per-level best's)")
        proposal = proposed_stack(stack_path, kind, config_path, chosen.get("server"))
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
