"""The servers rig tune measures: per attention backend the baseline, fixed EAGLE-3 at each step count, the stack's
own line, SGLang's step 0 as servers of their own, each speculative one again uncapped; and what the venv can run,
asked of its own interpreter. Each is a stack derived from the one read (rig.stack.derive)."""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from rig.core import RigError
from rig.kernels.backends import PREBUILT
from rig.stack.derive import with_server

BASELINE = "baseline"
POLICY = "policy"
SKIP_EXTEND = "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND"
# rig's free-off patch (the stack's patches.opt_in: [free-off]): step 0 as a plain decode where applied, SGLang's own
# where a server's environment sets it to 0
FREE_OFF = "RIG_FREE_OFF"
# how the patch keeps the draft in step at a step-0 batch: the draft layer's KV alone (ingest, its default) or
# SGLang's one-token draft extend; the variants name theirs
FREE_OFF_DRAFT = "RIG_FREE_OFF_DRAFT"
# SGLang's step 0 as a server of its own: a server launches at one of its config's candidate steps (sglang refuses
# --speculative-num-steps outside them), so one request alone drafts 1 step and every batch of two or more runs at
# step 0; the step-0 servers are measured at those levels only
STEP0_FROM = 2
STEP0_SLOTS = {1: 1, STEP0_FROM: 0}


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
# sglang-kernel leaves it out; its file as rig.kernels.backends names it), flashinfer and triton their packages:
# (module, a file in it or "", what it is)
BACKEND_NEEDS = {"fa3": ("sgl_kernel", PREBUILT["fa3"], "sgl_kernel's flash_ops (FlashAttention 3)"),
                 "flashinfer": ("flashinfer", "", "the flashinfer package"),
                 "triton": ("triton", "", "the triton package")}


def imports_of(venv: str | Path) -> dict[str, list[Path]]:
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
                    # the whole name: RIG_FREE_OFF_DRAFT is not RIG_FREE_OFF
                    if re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", read_text(path, "sglang source")):
                        return True
                except RigError:
                    continue
    return False


def variants(stack: dict, venv: str | Path, step0_config: str, imports: dict[str, list[Path]]) -> list[Variant]:
    """Every server tune measures, for the venv whose IMPORTS (imports_of) say what it can run; the step-0 servers
    read STEP0_CONFIG."""
    server = stack["server"]
    if not server["draft_model"]:
        raise RigError("rig tune compares EAGLE-3 with the baseline: the stack has no server.draft_model; set it")
    backends = server["attention_backends"] or [None]
    for backend in filter(None, backends):
        if problem := backend_problem(imports, venv, backend):
            raise RigError(problem)
    # each backend's variants are tagged with it where the stack names several: (family, tag, server keys)
    tagged = [(backend or "", *((f"@{backend}", {"attention_backends": [backend]}) if backend and len(backends) > 1
                                else ("", {}))) for backend in backends]
    fixed = [v for family, tag, on in tagged for v in _fixed(stack, family, tag, on)]
    envs = step0_envs(stack, venv, imports)
    step0 = [Variant(which + tag, 0, eagle(stack, 1, step0_config, **on), "step0", family, env, optional=True)
             for family, tag, on in tagged  # a family's step-0 slots are priced by its own backend's step 0
             for which, env in envs.items()]
    # measured in this order: the baselines, step 0, then EAGLE-3, so that a run cut short (a lent GPU taken back)
    # still holds step 0 against the baseline, the comparison the free off stands on
    return [v for v in fixed if v.baseline] + step0 + [v for v in fixed if not v.baseline]


def _fixed(stack: dict, family: str, tag: str, on: dict) -> list[Variant]:
    """One backend's fixed servers (ON: its server keys): the baseline, EAGLE-3 at each of tune.steps (and the
    stack's own step count where it is topk 1), and the stack's own line where it is not."""
    server = stack["server"]
    own = server["speculative_num_steps"]
    steps = sorted(set(stack["tune"]["steps"]) | ({own} if server["speculative_eagle_topk"] == 1 else set()))
    found = [Variant(BASELINE + tag, 0, with_server(stack, speculative_adaptive_config="", **on), "baseline", family),
             *(Variant(f"eagle3-{k}{tag}", k, eagle(stack, k, "", **on), "eagle", family) for k in steps)]
    if server["speculative_eagle_topk"] != 1:  # measured, but SGLang's adaptive mode cannot serve it
        found.append(Variant("stack" + tag, own, with_server(stack, speculative_adaptive_config="", **on), "eagle",
                             family, candidate=False))
    return found


def assignments(env: dict) -> list[str]:
    """ENV as the words a shell reads before a command: NAME=value, each value quoted where it needs it."""
    return [f"{k}={shlex.quote(v)}" for k, v in env.items()]


def step0_envs(stack: dict, venv: str | Path, imports: dict[str, list[Path]]) -> dict[str, dict]:
    """tune.step0's servers, each with what its environment adds: SGLang's own step 0 (with rig's free-off turned
    off where the venv has it), its draft extend skipped, and free-off's plain decode (where it is applied) with
    the draft kept in step by its one-token extend or by its KV alone."""
    asked = stack["tune"]["step0"]
    patched = sglang_reads(imports, FREE_OFF)
    if "step0-skip-extend" in asked and not sglang_reads(imports, SKIP_EXTEND):
        raise RigError(f"tune.step0 lists step0-skip-extend, but the sglang in {venv} does not read "
                       f"{SKIP_EXTEND}: drop it from tune.step0 (or install an sglang that has it)")
    for which in ("step0-plain", "step0-plain-ingest"):
        if which in asked and not patched:
            raise RigError(f"tune.step0 lists {which}, but the sglang in {venv} does not have rig's free-off patch: "
                           "add free-off to the stack's patches.opt_in and run `rig patch apply --stack STACK` "
                           f"(sglang 0.5.17 or 0.5.23), or drop {which} from tune.step0")
    if "step0-plain-ingest" in asked and not sglang_reads(imports, FREE_OFF_DRAFT):
        raise RigError(f"tune.step0 lists step0-plain-ingest, but the patched sglang in {venv} does not read "
                       f"{FREE_OFF_DRAFT}: apply rig's free-off patch again (`rig patch revert --stack STACK`, then "
                       "`rig patch apply --stack STACK`), or drop step0-plain-ingest from tune.step0")
    sglangs = {FREE_OFF: "0"} if patched else {}
    # each free-off server says its switches itself: one exported in rig's own environment would reach both
    plain = {FREE_OFF: "1", FREE_OFF_DRAFT: "extend"}
    return {which: {"step0": sglangs, "step0-skip-extend": {**sglangs, SKIP_EXTEND: "1"}, "step0-plain": plain,
                    "step0-plain-ingest": {**plain, FREE_OFF_DRAFT: "ingest"}}[which]
            for which in asked}


def uncapped(variant: Variant, record: dict) -> Variant | None:
    """The variant again with its running-request cap lifted to its decode graph, when its server capped below it
    (SGLang under speculation sets 48 where max_running_requests is not given); the graph is the server's own
    (/server_info), else the one rig asked for."""
    cap, graphs = record.get("max_running_requests"), record.get("cuda_graph_bs")
    top = max(graphs) if graphs else variant.stack["server"]["cuda_graph_max_bs"]
    if variant.kind == "baseline" or not cap or cap >= top or variant.name.endswith("-uncapped"):
        return None
    return Variant(f"{variant.name}-uncapped", variant.steps, with_server(variant.stack, max_running_requests=top),
                   variant.kind, f"{variant.family}/uncapped", variant.env, variant.candidate, optional=True)
