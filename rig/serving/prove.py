"""`rig prove`: a GPU box proves itself in one command, numerics included.

In order, each step with its verdict and time: the doctor's checks, the all-reduce probe, the
numerics test model (built in the stack's venv and checked there by transformers), then per TP
size (1 and the stack's, where the box has the GPUs) the baseline and the EAGLE-3 server from
the stack's own line with that model in place of the real one, one after the other: each is
health-gated by `rig smoke`, asked for the numerics prompts' greedy tokens, benchmarked briefly
and stopped. The numerics hold when the baseline generates the rule's tokens (rig/numerics.py)
and EAGLE-3 generates the baseline's. A step that cannot run here is skipped with its reason; the
run passes only when no step fails.
"""
from __future__ import annotations

import json
import math
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rig import RigError, numerics, progress
from rig.fs import atomic_write
from rig.proc import last_json
from rig.serve_bench import Plan, Server, ServerDown, _num, save_figure
from rig.server import health_url, render
from rig.serving.launch import Launched, Servers, results_dir
from rig.serving.tune import Level, measure
from rig.sglang_api import call

SCHEMA_VERSION = 1
OUTPUTS = ("prove.json", "report.md", "prove.png")
STEPS = ("doctor", "probe", "testmodel", "servers")
BASELINE, EAGLE = "baseline", "eagle3"
BENCH_LEVELS = [Level(1), Level(8)]

# what the venv holds, asked of the venv's own Python (its packages' metadata; never imported by rig)
VERSIONS = """
import importlib.metadata as m, json
def v(*names):
    for n in names:
        try:
            return m.version(n)
        except m.PackageNotFoundError:
            pass
out = {"torch": v("torch"), "sglang": v("sglang"), "kernel": v("sglang-kernel", "sgl-kernel"),
       "flashinfer": v("flashinfer-python"), "transformers": v("transformers")}
try:
    import torch
    out["torch_cuda"] = torch.version.cuda
    out["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
except Exception as exc:
    out["torch_error"] = str(exc)[:200]
print(json.dumps(out))
"""


@dataclass
class Step:
    name: str
    status: str = "skip"  # pass, fail or skip
    detail: str = ""
    seconds: float = 0.0
    data: dict = field(default_factory=dict)


class Report:
    """The steps so far; each runs through `step`, which times it and turns its failure into a verdict."""

    def __init__(self) -> None:
        self.steps: list[Step] = []

    def step(self, name: str, work: Callable[[Step], None]) -> Step:
        record = Step(name, "pass")
        self.steps.append(record)
        progress(f"prove: {name}")
        began = time.monotonic()
        try:
            work(record)
        except RigError as exc:
            record.status, record.detail = "fail", str(exc)
        finally:
            record.seconds = round(time.monotonic() - began, 1)
        progress(f"prove: {name}: {record.status.upper()} {record.detail.splitlines()[0] if record.detail else ''}")
        return record

    def skip(self, name: str, why: str) -> Step:
        self.steps.append(Step(name, "skip", why))
        progress(f"prove: {name}: skipped ({why})")
        return self.steps[-1]

    @property
    def ok(self) -> bool:
        return not any(s.status == "fail" for s in self.steps)


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
    if len(values) < 2 or not all(math.isfinite(v) for v in values):
        return None
    return values[0] - values[1]


def greedy_tokens(url: str, prompt: list[int], count: int, api_key_env: str, timeout: float = 120.0) -> dict:
    """PROMPT's COUNT greedy tokens from the server, with its top-2 logprob margins where it gives them."""
    body = {"input_ids": prompt, "return_logprob": True, "top_logprobs_num": 2,
            "sampling_params": {"max_new_tokens": count, "temperature": 0.0, "ignore_eos": True}}
    status, raw = call(url, "/generate", body, timeout, api_key_env)
    if status != 200:
        raise RigError(f"{url}/generate answered {status or 'nothing'} to a numerics prompt: {raw[:300]!r}")
    try:
        answer = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise RigError(f"{url}/generate answered a numerics prompt with something other than JSON: {raw[:200]!r}") from exc
    tokens = _ids(answer.get("output_ids")) if isinstance(answer, dict) else None
    if tokens is None:
        raise RigError(f"{url}/generate gave no output_ids (a list of token ids) for a numerics prompt")
    meta = answer.get("meta_info") if isinstance(answer.get("meta_info"), dict) else {}
    top = meta.get("output_top_logprobs")
    margins = [_margin(p) for p in top] if isinstance(top, list) else []
    return {"tokens": tokens, "margins": [m for m in margins if m is not None]}


def check_numerics(url: str, api_key_env: str, want: list[list[int]] | None = None) -> dict:
    """Every numerics prompt's tokens against WANT (default: the rule's), the first difference named."""
    asked = numerics.prompts()
    want = want if want is not None else [numerics.continuation(p) for p in asked]
    got, margins, first = [], [], None
    for n, (prompt, expected) in enumerate(zip(asked, want, strict=True)):
        answer = greedy_tokens(url, prompt, len(expected), api_key_env)
        got.append(answer["tokens"])
        margins += answer["margins"]
        if answer["tokens"] != expected and first is None:
            at = next((i for i, (g, w) in enumerate(zip(answer["tokens"], expected, strict=False)) if g != w),
                      min(len(answer["tokens"]), len(expected)))
            first = {"prompt": n, "position": at, "got": answer["tokens"][at:at + 4], "expected": expected[at:at + 4]}
    matched = sum(g == w for g, w in zip(got, want, strict=True))
    return {"matched": matched, "prompts": len(asked), "tokens": got, "first_difference": first,
            "min_margin": round(min(margins), 3) if margins else None}


def _difference(label: str, against: str, result: dict) -> str:
    first = result["first_difference"]
    return (f"{label}: {result['matched']} of {result['prompts']} prompts give {against}; prompt {first['prompt']} "
            f"differs at token {first['position']}: {first['got']} where {against} has {first['expected']} "
            "(a kernel computing wrong values: check the log, the wheels' archs with rig audit, the all-reduce "
            "with rig probe)")


# ------------------------------------------------------------------ the run


def _with_model(stack: dict, models: Path, tp: int) -> dict:
    server = {**stack["server"], "model": "testmodel", "draft_model": "testmodel", "testmodel_dir": str(models),
              "tp": tp}
    return {**stack, "server": server}


def tp_sizes(stack: dict, tp: int | None) -> list[int]:
    return sorted({1, tp or stack["server"]["tp"]})


def plan(stack: dict, venv: str, models: Path, tps: list[int]) -> dict[str, list[str]]:
    """Every server line prove would start, rendered and parsed by the venv's sglang."""
    lines = {}
    for tp in tps:
        served = _with_model(stack, models, tp)
        lines[f"{BASELINE} tp{tp}"] = render(served, venv, baseline=True)["argv"]
        lines[f"{EAGLE} tp{tp}"] = render(served, venv)["argv"]
    return lines


def versions(python: Path) -> dict:
    done = subprocess.run([str(python), "-c", VERSIONS], capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout).strip()[-300:]}
    try:
        return last_json(done.stdout, "the venv's versions")
    except RigError as exc:
        return {"error": str(exc)}


def _doctor(stack: dict, venv: str, record: Step) -> None:
    from rig import doctor

    checks = doctor.run(stack["cuda"]["version"], stack["archs"], venv=venv, default_gpus=stack["server"]["tp"],
                        pcie_only_env=stack["environment"]["nccl_pcie_only"])
    record.data = doctor.as_json(checks)
    failed = [f"{c.layer}/{c.name}: {c.detail}" for c in checks if c.status == "fail" and c.required]
    if failed:
        raise RigError("; ".join(failed))
    record.detail = f"{len(checks)} checks, none failed"


def _probe(python: Path, gpus: int, record: Step) -> None:
    from rig import probe

    record.data = probe.analyse(probe.measure(python, gpus))
    record.detail = f"all-reduce across {gpus} GPU(s): {record.data.get('link', '')} {record.data.get('advice', '')}".strip()


def _testmodel(python: Path, models: Path, tps: list[int], record: Step) -> None:
    from rig import testmodel

    made = testmodel.build(models, python, tp=max(tps), kind="numerics")
    record.data = {k: made[k] for k in ("reference", "heads", "torch", "changed")}
    record.detail = made["msg"]


def _serve(servers: Servers, report: Report, label: str, stack: dict, venv: str, baseline: bool, out: Path,
           api_key_env: str, want: list[list[int]] | None) -> dict | None:
    """One server: started and smoke-tested, asked the numerics prompts, benchmarked briefly, stopped.
    Returns its numerics answer (None when it never served)."""
    launched: list[Launched] = []
    url = health_url(stack)

    def start(record: Step) -> None:
        argv = render(stack, venv, baseline=baseline)["argv"]
        record.data = {"argv": argv, "log": str(out / "logs" / f"{label.replace(' ', '-')}.log")}
        launched.append(servers.start(label, argv, url, Path(record.data["log"])))
        record.data.update(smoke=launched[0].smoke["msg"], healthy_after_s=launched[0].started_s,
                           speculative_algorithm=launched[0].smoke.get("speculative_algorithm"))
        if not baseline and not record.data["speculative_algorithm"]:
            raise RigError(f"{label}: the server says it runs no speculative algorithm; its log is {record.data['log']}")
        record.detail = launched[0].smoke["msg"]

    answer: dict[str, Any] = {}

    def check(record: Step) -> None:
        result = check_numerics(url, api_key_env, want)
        answer.update(result)
        record.data = {k: v for k, v in result.items() if k != "tokens"}
        against = "the rule's tokens" if want is None else "the baseline's tokens"
        if result["matched"] != result["prompts"]:
            raise RigError(_difference(label, against, result))
        record.detail = (f"{result['prompts']} prompts x {len(result['tokens'][0])} greedy tokens = {against}"
                         + (f", smallest top-2 margin {result['min_margin']}" if result["min_margin"] is not None else ""))

    def bench(record: Step) -> None:
        bench_plan = Plan(concurrency=[lv.concurrency for lv in BENCH_LEVELS], max_tokens=64, rounds=1,
                          min_requests=8, serial_runs=1, serial_tokens=1)
        try:
            levels = measure(Server(url, label, bench_plan, api_key_env), bench_plan, BENCH_LEVELS)
        except ServerDown as exc:
            raise RigError(f"{label}: the server stopped answering during the bench ({exc})") from exc
        record.data = {name: {k: lv.get(k) for k in ("output_throughput", "median_ttft_ms", "median_itl_ms",
                                                     "server_accept_length", "failed")} for name, lv in levels.items()}
        record.detail = ", ".join(f"{name}: {_num(lv['output_throughput'], 1)} tok/s" for name, lv in record.data.items())

    try:
        if report.step(f"{label}: start and smoke", start).status != "pass":
            return None
        report.step(f"{label}: numerics", check)
        report.step(f"{label}: bench", bench)
    finally:
        for server in launched:
            if server in servers.running:
                servers.stop(server)
    return answer or None


def run(stack: dict, stack_path: str, venv: str, out: str | Path, tp: int | None, skip: tuple[str, ...] = (),
        models: str | Path | None = None, api_key_env: str = "SGLANG_API_KEY", check: bool = False) -> dict:
    out = results_dir(out, OUTPUTS)
    models = Path(models).absolute() if models else out / "models"
    python = Path(venv) / "bin" / "python"
    tps = tp_sizes(stack, tp)
    if unknown := [s for s in skip if s not in STEPS]:
        raise RigError(f"--skip {', '.join(unknown)}: choose from {', '.join(STEPS)}")
    lines = plan(stack, venv, models, tps)
    if check:
        steps = [s for s in STEPS if s not in skip]
        return {"ok": True, "changed": False, "steps": steps, "servers": lines,
                "msg": "\n".join([f"would run {', '.join(steps)}; the servers one at a time at {health_url(stack)}, "
                                  f"with the numerics test model in {models}:",
                                  *(f"  {name}: {' '.join(argv)}" for name, argv in lines.items())])}
    (out / "logs").mkdir(parents=True, exist_ok=True)
    from rig.doctor import visible_gpus

    listed = visible_gpus()[0]
    gpus = len(listed)
    report = Report()
    result: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "stack": stack_path, "started": time.time(),
                              "tp_sizes": tps, "gpus": gpus, "driver": listed[0]["driver"] if listed else None,
                              "versions": versions(python), "machine": _machine(),
                              "stopped": None}
    try:
        if "doctor" in skip:
            report.skip("doctor", "not asked for (--skip doctor)")
        else:
            report.step("doctor", lambda r: _doctor(stack, venv, r))
        if "probe" in skip:
            report.skip("probe", "not asked for (--skip probe)")
        elif gpus < 1:
            report.skip("probe", "no GPU is visible (nvidia-smi lists none)")
        else:
            report.step("probe", lambda r: _probe(python, gpus, r))
        built = "testmodel" not in skip and report.step("testmodel", lambda r: _testmodel(python, models, tps, r))
        if "testmodel" in skip:
            report.skip("testmodel", f"not asked for (--skip testmodel): the servers use {models} as it is")
        if "servers" in skip:
            report.skip("servers", "not asked for (--skip servers)")
        elif built and built.status == "fail":
            report.skip("servers", "the numerics test model was not built")
        else:
            with Servers(stack["tune"]["start_timeout"], api_key_env) as servers:
                for size in tps:
                    _serve_size(servers, report, stack, venv, models, size, gpus, out, api_key_env)
    except BaseException as exc:
        result["stopped"] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        _write_quietly(result, report, out)
        raise
    files = write(result, report, out)
    failed = [s.name for s in report.steps if s.status == "fail"]
    return {"ok": report.ok, "files": files, "steps": [s.__dict__ for s in report.steps],
            "msg": "\n".join([f"wrote {', '.join(files)}",
                              *(_line(s) for s in report.steps),
                              "every step passed or was skipped" if report.ok else f"FAILED: {', '.join(failed)}"])}


def _line(s: Step) -> str:
    first = s.detail.splitlines()[0] if s.detail else ""
    return f"{s.status.upper():4}  {s.name} ({s.seconds:g} s)" + (f": {first}" if first else "")


def _serve_size(servers: Servers, report: Report, stack: dict, venv: str, models: Path, size: int, gpus: int,
                out: Path, api_key_env: str) -> None:
    if size > 1 and gpus < size:
        report.skip(f"tp{size}", f"TP {size} needs {size} GPUs; {gpus} visible")
        return
    served = _with_model(stack, models, size)
    base = _serve(servers, report, f"{BASELINE} tp{size}", served, venv, True, out, api_key_env, None)
    if base is None or base["matched"] != base["prompts"]:
        report.skip(f"{EAGLE} tp{size}", "the baseline does not follow the rule, so it is no reference")
    else:
        _serve(servers, report, f"{EAGLE} tp{size}", served, venv, False, out, api_key_env, base["tokens"])


def _machine() -> dict:
    from rig import gpu_health

    try:
        return gpu_health.collect()
    except (OSError, RigError) as exc:
        return {"error": str(exc)}


# ------------------------------------------------------------------ the report


def report_markdown(result: dict) -> str:
    v = result.get("versions", {})
    lines = [f"# rig prove: {result['stack']}", "",
             f"{'PASSED' if result['ok'] else 'FAILED'}: {sum(s['status'] == 'pass' for s in result['steps'])} "
             f"passed, {sum(s['status'] == 'fail' for s in result['steps'])} failed, "
             f"{sum(s['status'] == 'skip' for s in result['steps'])} skipped; TP sizes {result['tp_sizes']}, "
             f"{result['gpus']} GPU(s) visible.", "",
             "| versions | |", "|---|---|",
             *(f"| {k} | {v.get(k) if v.get(k) is not None else '-'} |"
               for k in ("torch", "torch_cuda", "nccl", "sglang", "kernel", "flashinfer", "transformers")),
             f"| driver | {result.get('driver') or '-'} |",
             "", "| step | verdict | s | detail |", "|---|---|---|---|"]
    for s in result["steps"]:
        detail = s["detail"].replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {s['name']} | {s['status']} | {s['seconds']:g} | {detail[:400]} |")
    if result.get("stopped"):
        lines += ["", f"Stopped early: {result['stopped']}"]
    return "\n".join(lines) + "\n"


def plot(result: dict, out: Path) -> list[str]:
    benches = {s["name"].rsplit(":", 1)[0]: s["data"] for s in result["steps"]
               if s["name"].endswith(": bench") and s["status"] == "pass"}
    if not benches:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = [lv.name for lv in BENCH_LEVELS]
    width = 0.8 / len(benches)
    for i, (label, data) in enumerate(benches.items()):
        ax.bar([x + i * width for x in range(len(names))],
               [(data.get(n) or {}).get("output_throughput") or 0 for n in names], width, label=label)
    ax.set_xticks([x + width * (len(benches) - 1) / 2 for x in range(len(names))], names)
    ax.set_ylabel("output tok/s (numerics model)")
    ax.legend(fontsize=8)
    return [save_figure(fig, out / "prove.png")]


def write(result: dict, report: Report, out: Path) -> list[str]:
    result.update(ok=report.ok and not result.get("stopped"), steps=[s.__dict__ for s in report.steps],
                  finished=time.time())
    files = [str(atomic_write(out / "prove.json", json.dumps(result, indent=2, default=str) + "\n")),
             str(atomic_write(out / "report.md", report_markdown(result)))]
    return files + plot(result, out)


def _write_quietly(result: dict, report: Report, out: Path) -> None:
    try:  # what was proven is written; a failure to write it never hides why the run stopped
        write(result, report, out)
    except Exception as again:  # noqa: BLE001 - the first error is the one to report
        progress(f"could not write what was proven to {out}: {again}")
