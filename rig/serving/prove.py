"""`rig prove`: a GPU box proves itself in one command, numerics included.

In order, each step with its verdict and time: the doctor's checks, the all-reduce probe, the
numerics test model (built in the stack's venv and checked there by transformers), then per TP
size (1 and the stack's, where the box has the GPUs) the baseline and the EAGLE-3 server from
the stack's own line with that model in place of the real one, one after the other: each is
health-gated by `rig smoke`, asked for the numerics prompts' greedy tokens, benchmarked briefly
and stopped. The numerics hold when the baseline generates the rule's tokens (rig/serving/numerics.py)
and EAGLE-3 generates the baseline's: the numerics draft proposes what the target rejects, so that
proves the rejection path lossless, not that speculation accepts anything.

Then acceptance (rig/serving/prove_acceptance.py): a serving test model whose draft agrees with its target,
baseline and EAGLE-3 at one stream, greedy; its accept length must reach a floor and EAGLE-3 must beat the
baseline. Then free-off, where the stack opts in (rig/serving/prove_free_off.py). The report and figure are
rig/serving/prove_report.py's.

A step that cannot run here is skipped with its reason; the run passes only when no step fails.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rig.core import RigError, progress
from rig.core.check import Check, Runner
from rig.core.schema import Field
from rig.python.introspect import held
from rig.serving import numerics, prove_acceptance, testmodel
from rig.serving import prove_free_off as free_off
from rig.serving.launch import (
    Servers,
    config_checked,
    inherited_said,
    inherited_switches,
    make_logs,
    results_dir,
)
from rig.serving.measure.plan import Level, plan_from
from rig.serving.measure.record import FORMAT_FIELD, recorded
from rig.serving.measure.stats import shown
from rig.serving.measure.sweep import Server
from rig.serving.measure.verdict import margin_problem
from rig.serving.prove_acceptance import AGREE, BASELINE, EAGLE, agree_model, agreeing
from rig.serving.prove_report import BENCH_LEVELS, figures, report_markdown
from rig.serving.server import close_parsers, health_url, render
from rig.serving.session import measured, serving
from rig.serving.sglang_api import call, expect_json
from rig.stack.derive import with_server

SCHEMA_VERSION = 1
PROVE = Field(dict, open=True, fields={"format": FORMAT_FIELD})  # its bench steps' data: the run record's levels
OUTPUTS = ("prove.json", "report.md", "prove.png", free_off.SLOTS_NAME)
STEPS = ("doctor", "probe", "testmodel", "servers", "acceptance", "free-off")


# ------------------------------------------------------------------ numerics against a server


def _ids(value: object) -> list[int] | None:
    ok = isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    return value if ok else None  # type: ignore[return-value]


def _margin(position: object) -> float | None:
    """Top-1 minus top-2 logprob at one position of SGLang's output_top_logprobs ([[logprob, id, text], ...])."""
    if not isinstance(position, list) or len(position) < 2:
        return None
    values = [p[0] for p in position[:2]
              if isinstance(p, list) and p and isinstance(p[0], (int, float)) and not isinstance(p[0], bool)]
    if len(values) < 2:
        return None
    if any(math.isnan(v) for v in values) or not math.isfinite(max(values)):
        return math.nan  # NaN (or +inf) logprobs: broken logits, never "not given"
    return max(values) - min(values) if math.isfinite(min(values)) else float("inf")


def greedy_tokens(url: str, prompt: list[int], count: int, api_key_env: str, logprobs: bool = True,
                  timeout: float = 120.0) -> dict:
    """PROMPT's COUNT greedy tokens from the server, with its top-2 logprob margins where asked and given."""
    body: dict[str, Any] = {"input_ids": prompt,
                            "sampling_params": {"max_new_tokens": count, "temperature": 0.0, "ignore_eos": True}}
    if logprobs:
        body.update(return_logprob=True, top_logprobs_num=2)
    answer = expect_json(*call(url, "/generate", body, timeout, api_key_env), f"{url}/generate, a numerics prompt")
    tokens = _ids(answer.get("output_ids"))
    if tokens is None:
        raise RigError(f"{url}/generate gave no output_ids (a list of token ids) for a numerics prompt")
    meta = answer.get("meta_info")
    top = meta.get("output_top_logprobs") if isinstance(meta, dict) else None
    margins = [_margin(p) for p in top] if isinstance(top, list) else []
    return {"tokens": tokens, "margins": [m for m in margins if m is not None]}


def check_numerics(url: str, api_key_env: str, want: list[list[int]] | None = None) -> dict:
    """Every numerics prompt's tokens against WANT (default: the rule's, with the margins), the first difference
    named. Against the baseline's tokens (an EAGLE-3 server) no logprobs are asked: some SGLang releases
    cannot return them under speculation, which says nothing about its kernels."""
    asked = numerics.prompts()
    logprobs = want is None
    want = want if want is not None else [numerics.continuation(p) for p in asked]
    got, margins, first = [], [], None
    for n, (prompt, expected) in enumerate(zip(asked, want, strict=True)):
        answer = greedy_tokens(url, prompt, len(expected), api_key_env, logprobs)
        got.append(answer["tokens"])
        margins += answer["margins"]
        if answer["tokens"] != expected and first is None:
            first = numerics.first_difference(n, answer["tokens"], expected)
    matched = sum(g == w for g, w in zip(got, want, strict=True))
    finite = [m for m in margins if math.isfinite(m)]
    return {"matched": matched, "prompts": len(asked), "tokens": got, "first_difference": first,
            "min_margin": round(min(finite), 3) if finite else None, "margin_problem": margin_problem(margins)}


def _difference(label: str, against: str, result: dict) -> str:
    first = result["first_difference"]
    return (f"{label}: {result['matched']} of {result['prompts']} prompts give {against}; prompt {first['prompt']} "
            f"differs at token {first['position']}: {first['got']} where {against} has {first['expected']} "
            "(a kernel computing wrong values: check the log, the wheels' archs with rig audit, the all-reduce "
            "with rig machine probe)")


# ------------------------------------------------------------------ the run


def _with_model(stack: dict, models: Path, tp: int) -> dict:
    return with_server(stack, model="testmodel", draft_model="testmodel", testmodel_dir=str(models), tp=tp)


def tp_sizes(stack: dict, tp: int | None) -> list[int]:
    return sorted({1, tp or stack["server"]["tp"]})


def plan(stack: dict, venv: str, models: Path, tps: list[int], out: Path) -> dict[str, list[str]]:
    """Every server line prove would start, rendered and parsed by the venv's sglang (one parser, stopped once
    they are: it holds sglang and torch in memory)."""
    lines = {}
    try:
        for tp in tps:
            served = _with_model(stack, models, tp)
            lines[f"{BASELINE} tp{tp}"] = render(served, venv, baseline=True)["argv"]
            lines[f"{EAGLE} tp{tp}"] = render(served, venv)["argv"]
        agree = agreeing(stack, out)
        lines[f"{BASELINE} {AGREE}"] = render(agree, venv, baseline=True)["argv"]
        lines[f"{EAGLE} {AGREE}"] = render(agree, venv)["argv"]
        if free_off.opted_in(stack):  # the numerics model and the agreeing one, each on a switching server
            lines.update(_free_off_lines(stack, venv, models, tps, out, agree))
    finally:
        close_parsers()
    return lines


def _free_off_lines(stack: dict, venv: str, models: Path, tps: list[int], out: Path, agree: dict) -> dict:
    """The free-off servers' lines, naming the slots file the run writes under OUT (_free_off)."""
    with config_checked(free_off.slots_text(), out / free_off.SLOTS_NAME) as (slots, as_run):
        lines = {free_off.switches_label(tp): render(free_off.switching(_with_model(stack, models, tp), slots),
                                                     venv)["argv"] for tp in tps}
        lines[free_off.AFTER_OFF] = render(free_off.switching(agree, slots), venv)["argv"]
        return as_run(lines)


# the packages a result names, each under one key whatever it was published as
NAMED = {"torch": ("torch",), "sglang": ("sglang",), "kernel": ("sglang-kernel", "sgl-kernel"),
         "flashinfer": ("flashinfer-python",), "transformers": ("transformers",)}


def versions(python: Path) -> dict:
    """What the venv holds of NAMED, and the CUDA and NCCL its torch was built with (its metadata and torch,
    read by the venv's own Python; never imported by rig)."""
    try:
        found = held(python, [n for names in NAMED.values() for n in names], torch=True, timeout=120)
    except RigError as exc:
        return {"error": str(exc)[:300]}
    out = {key: next((found.packages[n]["version"] for n in names if n in found.packages), None)
           for key, names in NAMED.items()}
    runtime = found.torch
    return {**out, **({"torch_error": runtime["error"]} if "error" in runtime else
                      {"torch_cuda": runtime.get("cuda"), "nccl": runtime.get("nccl")})}  # torch_cuda: its build


def _doctor(stack: dict, stack_path: str, venv: str, record: Check) -> None:
    from rig.core.check import as_json
    from rig.machine import doctor
    from rig.python.lock import lock_path, read

    # the stack's lock is what a venv rig did not install is held to: matching it, the venv is "adopted" (WARN)
    held_to = lock_path(stack_path)
    checks = doctor.run(stack["cuda"]["version"], stack["archs"], venv=venv, default_gpus=stack["server"]["tp"],
                        pcie_only_env=stack["environment"]["nccl_pcie_only"],
                        lock=read(held_to) if held_to.is_file() else None)
    record.data = as_json(checks)
    failed = [f"{c.layer}/{c.name}: {c.detail}" for c in checks if c.status == "fail" and c.required]
    if failed:
        raise RigError("; ".join(failed))
    record.detail = f"{len(checks)} checks, none failed"


def _probe(python: Path, gpus: int, record: Check) -> None:
    from rig.machine import probe

    record.data = {**probe.analyse(probe.measure(python, gpus)), "peers": probe.measure_peers(python, gpus)}
    record.detail = (f"all-reduce across {gpus} GPU(s): {record.data['link_class']}; {'; '.join(record.data['advice'])}"
                     f"; peer-to-peer: {'; '.join(record.data['peers']['advice'])}")
    if not record.data["correct"]:
        raise RigError(f"the all-reduce across {gpus} GPU(s) returned wrong sums (rig machine probe): {record.detail}")
    if not record.data["peers"]["ok"]:
        raise RigError(f"peer-to-peer failed (rig machine probe): {record.detail}")


def given_model(models: Path, tps: list[int]) -> str:
    """--skip testmodel: the model in MODELS must be rig's numerics test model, split for every TP size (the run's
    step and --check's precondition alike)."""
    spec = testmodel.made_by_rig(models) or {}
    if spec.get("kind") != "numerics":
        said = f"its {testmodel.MARKER} says kind {spec.get('kind')!r}" if spec else f"no {testmodel.MARKER} of rig's"
        raise RigError(f"{models} holds no numerics test model ({said}); write one with rig testmodel --kind "
                       f"numerics --out {models}, or leave out --skip testmodel")
    heads = spec.get("heads")
    if isinstance(heads, int) and not isinstance(heads, bool) and any(heads % tp for tp in tps):
        raise RigError(f"{models}: the model's {heads} heads do not split over TP {max(tps)}; rebuild it with --tp")
    return f"{models}: rig's numerics test model, as it is (--skip testmodel)"


def _given_step(models: Path, tps: list[int], record: Check) -> None:
    record.detail = given_model(models, tps)


def _testmodel(python: Path, models: Path, tps: list[int], record: Check) -> None:
    made = testmodel.build(models, python, tp=max(tps), kind="numerics")
    record.data = {k: made[k] for k in ("reference", "heads", "torch", "changed")}
    record.detail = made["msg"]


def _serve(servers: Servers, report: Runner, label: str, argv: list[str], url: str, baseline: bool, out: Path,
           api_key_env: str, want: list[list[int]] | None, bench: dict, numerics_check: bool = True,
           levels: list[Level] = BENCH_LEVELS) -> dict | None:
    """One server, from ARGV (rendered by plan()): started and smoke-tested, asked the numerics prompts (unless
    NUMERICS_CHECK is off), benchmarked briefly at LEVELS, stopped. Returns its numerics answer and its bench
    ({"bench": {level: ...}}; None when it never served)."""
    log = out / "logs" / f"{label.replace(' ', '-')}.log"
    held = contextlib.ExitStack()

    def start(record: Check) -> None:
        record.data = {}
        held.enter_context(serving(servers, label, argv, url, log, record.data, not baseline))
        record.detail = record.data["smoke"]

    answer: dict[str, Any] = {}

    def check(record: Check) -> None:
        result = check_numerics(url, api_key_env, want)
        answer.update(result)
        record.data = {k: v for k, v in result.items() if k != "tokens"}
        against = "the rule's tokens" if want is None else "the baseline's tokens"
        if result["matched"] != result["prompts"]:
            raise RigError(_difference(label, against, result))
        if result["margin_problem"]:
            raise RigError(f"{label}: {result['margin_problem']}")
        if result["min_margin"] is not None and result["min_margin"] < testmodel.MIN_MARGIN:
            raise RigError(f"{label}: the tokens are the rule's, but the smallest top-2 logprob margin is "
                           f"{result['min_margin']} (designed 8, at least {testmodel.MIN_MARGIN:g}): the numbers drift")
        record.detail = (f"{result['prompts']} prompts x {len(result['tokens'][0])} greedy tokens = {against}"
                         + (f", smallest top-2 margin {result['min_margin']}" if result["min_margin"] is not None else ""))

    def bench_step(record: Check) -> None:
        bench_plan = plan_from(bench, concurrency=[lv.concurrency for lv in levels], max_tokens=64, rounds=1,
                               min_requests=8, min_seconds=0, warmup=2, temperature=0.0)
        server = Server(url, label, bench_plan, api_key_env)
        measured(server, levels, label, log, {})
        record.data = {lv["level"]: lv for lv in server.run["levels"]}  # the run record's levels
        record.detail = ", ".join(f"{name}: {shown(lv['output_throughput'], 1)} tok/s" +
                                  (f", accept length {shown(lv['server_accept_length'], 2)}"
                                   if lv["server_accept_length"] else "") for name, lv in record.data.items())
        answer["bench"] = record.data
        if bad := [name for name, lv in record.data.items() if lv["failed"] or not lv["output_throughput"]]:
            raise RigError(f"{label}: requests failed at {', '.join(bad)} ({record.detail}); its log is "
                           f"{out / 'logs'}")

    with held:  # the server, once started, stops when its steps are done, however they end
        if report.run(f"{label}: start and smoke", start).status != "pass":
            return None
        if numerics_check:
            report.run(f"{label}: numerics", check)
        report.run(f"{label}: bench", bench_step)
    return answer or None


def run(stack: dict, stack_path: str, venv: str, out: str | Path, tp: int | None, skip: tuple[str, ...] = (),
        models: str | Path | None = None, api_key_env: str = "SGLANG_API_KEY", check: bool = False) -> dict:
    out = results_dir(out, OUTPUTS)
    models = Path(models).absolute() if models else out / "models"
    tps = tp_sizes(stack, tp)
    if unknown := [s for s in skip if s not in STEPS]:
        raise RigError(f"--skip {', '.join(unknown)}: choose from {', '.join(STEPS)}")
    inherited = inherited_switches()  # what every server proved here runs with beyond its own line
    # a model the run would refuse fails --check too, before the servers' lines are asked of the venv's sglang
    given = [given_model(models, tps)] if check and "testmodel" in skip else []
    lines = plan(stack, venv, models, tps, out)
    if check:
        return _would_run(stack, skip, models, lines, inherited, given)
    proving = _Proving(stack, stack_path, venv, out, models, tps, skip, lines, api_key_env)
    make_logs(out)
    result: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "stack": stack_path, "tp_sizes": tps, "gpus": 0,
                              "driver": None, "ok": False, "steps": [], "inherited_env": inherited}
    for line in inherited_said(inherited):
        progress(line)
    report = proving.report

    def settle(result: dict) -> None:
        result.update(ok=report.ok and not result.get("stopped"), steps=[asdict(s) for s in report.checks])

    with recorded(out, result, "prove.json", PROVE, report_markdown, figures, settle) as written:
        proving.steps(result)
    failed = [s.name for s in report.checks if s.status == "fail"]
    return {"ok": report.ok, "files": written, "steps": [asdict(s) for s in report.checks],
            "msg": "\n".join([f"wrote {', '.join(written)}",
                              *(_line(s) for s in report.checks),
                              "every step passed or was skipped" if report.ok else f"FAILED: {', '.join(failed)}"])}


def _would_run(stack: dict, skip: tuple[str, ...], models: Path, lines: dict[str, list[str]], inherited: dict,
               given: list[str]) -> dict:
    """--check's answer: the steps that would run and every server's line."""
    steps = [s for s in STEPS if s not in skip]
    return {"ok": True, "changed": False, "steps": steps, "servers": lines, "inherited_env": inherited,
            "msg": "\n".join([*given, *inherited_said(inherited),
                              f"would run {', '.join(steps)}; the servers one at a time at {health_url(stack)}, "
                              f"with the numerics test model in {models}:",
                              *(f"  {name}: {' '.join(argv)}" for name, argv in lines.items())])}


@dataclass
class _Proving:
    """One run's inputs, and its steps in order into REPORT, each skipped with its reason where it cannot run."""
    stack: dict
    stack_path: str
    venv: str
    out: Path
    models: Path
    tps: list[int]
    skip: tuple[str, ...]
    lines: dict[str, list[str]]
    api_key_env: str
    report: Runner = field(default_factory=lambda: Runner("prove"))
    gpus: int = 0

    @property
    def python(self) -> Path:
        return Path(self.venv) / "bin" / "python"

    def steps(self, result: dict) -> None:
        """Every step, the machine's facts into RESULT first."""
        from rig.machine.doctor import visible_gpus

        listed = visible_gpus()[0]
        self.gpus = len(listed)
        result.update(gpus=self.gpus, driver=listed[0].get("driver") if listed else None,
                      versions=versions(self.python), machine=_machine())
        self.doctor()
        self.probe()
        built = self.testmodel()
        self.servers(built)
        self.acceptance()
        _free_off(self.stack, self.python, self.lines, self.out, self.report, self.api_key_env, self.skip, built,
                  max(size for size in self.tps if size == 1 or self.gpus >= size))

    def doctor(self) -> None:
        if "doctor" in self.skip:
            self.report.skip("doctor", "not asked for (--skip doctor)")
        else:
            self.report.run("doctor", lambda r: _doctor(self.stack, self.stack_path, self.venv, r))

    def probe(self) -> None:
        if "probe" in self.skip:
            self.report.skip("probe", "not asked for (--skip probe)")
        elif self.gpus < 1:
            self.report.skip("probe", "no GPU is visible (nvidia-smi lists none)")
        else:
            self.report.run("probe", lambda r: _probe(self.python, self.gpus, r))

    def testmodel(self) -> str:
        """The numerics test model, built or given; the step's status."""
        if "testmodel" in self.skip:
            return self.report.run("testmodel (given)", lambda r: _given_step(self.models, self.tps, r)).status
        return self.report.run("testmodel", lambda r: _testmodel(self.python, self.models, self.tps, r)).status

    def servers(self, numerics_model: str) -> None:
        if "servers" in self.skip:
            self.report.skip("servers", "not asked for (--skip servers)")
        elif numerics_model == "fail":
            self.report.skip("servers", "no numerics test model to serve")
        else:
            with Servers(self.stack["server"]["start_timeout"], self.api_key_env) as servers:
                for size in self.tps:
                    _serve_size(servers, self.report, self.lines, health_url(self.stack), size, self.gpus, self.out,
                                self.api_key_env, self.stack["bench"])

    def acceptance(self) -> None:
        if "acceptance" in self.skip:
            self.report.skip("acceptance", "not asked for (--skip acceptance)")
            return

        def serve(servers: Servers, label: str, baseline: bool) -> dict | None:
            return _serve(servers, self.report, label, self.lines[label], health_url(self.stack), baseline,
                          self.out, self.api_key_env, None, self.stack["bench"], numerics_check=False,
                          levels=[Level(1)])

        prove_acceptance.run_steps(self.stack, self.python, self.out, self.report, self.api_key_env, serve)


def _line(s: Check) -> str:
    first = s.detail.splitlines()[0] if s.detail else ""
    return f"{s.status.upper():4}  {s.name} ({s.seconds:g} s)" + (f": {first}" if first else "")


def _serve_size(servers: Servers, report: Runner, lines: dict[str, list[str]], url: str, size: int, gpus: int,
                out: Path, api_key_env: str, bench: dict) -> None:
    if size > 1 and gpus < size:
        report.skip(f"tp{size}", f"TP {size} needs {size} GPUs; {gpus} visible")
        return
    base_label, eagle_label = f"{BASELINE} tp{size}", f"{EAGLE} tp{size}"
    base = _serve(servers, report, base_label, lines[base_label], url, True, out, api_key_env, None, bench)
    if base is None:
        report.skip(f"{EAGLE} tp{size}", "the baseline did not serve, so there is no reference")
    elif "matched" not in base:  # its numerics check failed before it had tokens (HTML, float ids)
        report.skip(f"{EAGLE} tp{size}", "the baseline's numerics gave no answer, so there is no reference")
    elif base["matched"] != base["prompts"]:
        report.skip(f"{EAGLE} tp{size}", "the baseline does not follow the rule, so it is no reference")
    else:
        _serve(servers, report, eagle_label, lines[eagle_label], url, False, out, api_key_env, base["tokens"], bench)


def _free_off(stack: dict, python: Path, lines: dict[str, list[str]], out: Path, report: Runner, api_key_env: str,
              skip: tuple[str, ...], numerics_model: str, tp: int) -> None:
    """rig.serving.prove_free_off's steps, where the stack opts into free-off and both test models are there; the
    switches at TP."""
    if "free-off" in skip:
        report.skip("free-off", "not asked for (--skip free-off)")
    elif not free_off.opted_in(stack):
        report.skip("free-off", "the stack does not opt into free-off (patches.opt_in)")
    elif numerics_model == "fail":
        report.skip("free-off", "no numerics test model to serve")
    elif report.run(f"{free_off.AFTER_OFF}: {AGREE} testmodel",
                    lambda r: agree_model(stack, out, python, r)).status != "fail":
        free_off.slots_file(out)  # where _free_off_lines named it
        free_off.run_steps(lines, tp, health_url(stack), out, report, api_key_env, stack["bench"],
                           stack["server"]["start_timeout"],
                           lambda url, prompt, count: greedy_tokens(url, prompt, count, api_key_env, logprobs=False))


def _machine() -> dict:
    from rig.machine import gpu_health

    try:
        return gpu_health.collect()
    except (OSError, RigError) as exc:
        return {"error": str(exc)}
