"""`rig validate`: one gate for a stack in CI, with no GPU and no installed venv.

Each check answers one question about the stack and reports every problem it
finds, not the first: the schema; its locks current and complete; every pin
conflict; each locked kernel wheel audited against the locked torch, the CUDA
major and the stack's archs, and the kernels of its attention backends held to
its archs (rig.kernels.backends); torch's CUDA against the toolkit and flashinfer's
packages at one version (rig.cuda.agreement); the patch plan for the locked sglang and flashinfer,
read from their wheels; the server command line (parsed by the sglang of a venv,
when one is given); the environment module rendered. A check that cannot run
because an earlier one failed is skipped, saying which.
"""
from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from packaging.utils import canonicalize_name

from rig.core import RigError, wheelfile
from rig.core.check import Check, Runner, Skip, as_json, failed, render

KERNELS = ("sglang-kernel", "sgl-kernel", "flashinfer-cubin")  # compiled kernels, audited from their files


def run(stack_path: str, cache: str | Path, venv: str | None = None, patch_dir: str | None = None) -> dict:
    from rig.core.documents import read_text
    from rig.python import lock as locking
    from rig.stack.spec import load

    read_text(stack_path, "stack file")  # one wording for a stack file that is not there, whichever command reads it
    state: dict = {}

    def schema():
        state["stack"] = load(stack_path)
        return [], f"{state['stack']['name']}: CUDA {state['stack']['cuda']['version']}, archs " \
                   f"{', '.join(state['stack']['archs'])}"

    def locks():
        from rig.stack.spec import pins_packages

        if not pins_packages(_need(state, "stack")):
            raise Skip("the stack pins no packages (CUDA only): there is no lock to check")
        current, problems = locking.stale(state["stack"], stack_path)
        problems += [f"the lock of {stack_path} is partial: " + "; ".join(u["reason"] for u in lock["unresolved"])
                     for lock in current if not lock["complete"]]
        if current and not problems:
            state["lock"] = current[0]
        return problems, f"{len(current)} lock(s) current"

    def conflicts():
        from rig.stack.spec import pins_packages

        if not pins_packages(_need(state, "stack")):
            raise Skip("the stack pins no packages")
        _, unresolved, problems = locking.pin_check(state["stack"], stack_path)
        return problems + [u["reason"] for u in unresolved], "the pins agree with each package's own requirements"

    def kernels():
        return _kernels(_need(state, "stack"), _need(state, "lock"), Path(cache))

    def toolchain():
        return _toolchain(_need(state, "stack"), _need(state, "lock"))

    def patches():
        return _patches(_need(state, "stack"), _need(state, "lock"), Path(cache), patch_dir)

    def server():
        from rig.serving.server import render, wants

        stack = _need(state, "stack")
        if not stack["server"]["model"]:
            raise Skip("the stack names no server.model (sites set it per inventory): nothing to parse")
        wants(stack, baseline=False)  # the stack's own mistakes, before any sglang is asked
        if not venv:
            raise Skip("the flags are checked by sglang's own parser, which loads with torch: give --venv "
                       "(the stack's venv, e.g. in its image)")
        return [], " ".join(render(stack, venv)["argv"][3:])

    def environment():
        from rig.python.runtime_env import environment as env_of
        from rig.python.runtime_env import render

        stack = _need(state, "stack")
        text = render(env_of(stack), stack["name"])
        compile(text, "rig_sitecustomize.py", "exec")
        return [], f"{len(text.splitlines())} lines"

    checks = [("schema", "Is the stack file valid?", schema),
              ("lock", "Are its locks current and complete?", locks),
              ("conflicts", "Do its pins agree with each package's own requirements?", conflicts),
              ("kernels", "Do the locked kernel wheels fit the locked torch, the CUDA major, the archs and the attention "
               "backends?", kernels),
              ("toolchain", "Do torch's CUDA and the toolkit agree, and flashinfer's packages with each other?",
               toolchain),
              ("patches", "Does every patch know the locked sglang and flashinfer, and still anchor?", patches),
              ("server", "Does the server command line parse?", server),
              ("environment", "Does the environment module render?", environment)]
    runner = Runner("validate")
    for name, question, body in checks:
        runner.run(name, _answering(body), question)
    results = runner.checks
    ok = not failed(results)
    return {**as_json(results), "stack": stack_path, "suite": f"rig validate {stack_path}",
            "msg": render(results, f"{'valid' if ok else 'NOT valid'}: {stack_path}")}


def _answering(body: Callable[[], tuple[list[str], str]]) -> Callable[[Check], None]:
    """A check's work from BODY, which answers (problems, detail)."""
    def work(check: Check) -> None:
        check.problems, check.detail = body()
    return work


def _need(state: dict, key: str):
    if key not in state:
        raise Skip({"stack": "the stack file is not valid", "lock": "the stack has no current, complete lock"}[key])
    return state[key]


def _wheels(lock: dict, cache: Path, names: set[str]) -> dict[str, tuple[dict, Path]]:
    """The locked wheels of NAMES, from the wheelhouse (fetched first where missing): name -> (entry, path)."""
    from rig.python.wheelhouse import cached_path, fetch

    wanted = [w for w in lock["wheels"] if w["name"] in names]
    fetch({**lock, "wheels": wanted, "complete": True}, cache)
    return {w["name"]: (w, cached_path(cache, w)) for w in wanted}


def _kernels(stack: dict, lock: dict, cache: Path) -> tuple[list[str], str]:
    from rig.core.cuda_releases import major
    from rig.kernels import audit
    from rig.kernels.backends import gaps as backends_gaps
    from rig.kernels.backends import said as backends_said

    found = _wheels(lock, cache, {*KERNELS, "torch"})
    if "torch" not in found:
        raise Skip("the lock has no torch wheel")
    torch = audit.torch_from_wheel(found["torch"][1])
    common = {"cuda_major": major(stack["cuda"]["version"]), "archs": stack["archs"], "torch": torch,
              "extra_dirs": [], "resolve": False}
    reports = [audit.audit_path(str(path), {}, common) for name, (_, path) in sorted(found.items())
               if name in KERNELS]
    if not reports:
        raise Skip("the lock has no kernel wheel (sglang-kernel, sgl-kernel or flashinfer-cubin)")
    problems = [f"{r['artifact']}: {error}" for r in reports for error in r["errors"]]
    backends = stack["server"]["attention_backends"]
    problems += backends_gaps(backends, stack["archs"], reports)
    return problems, "; ".join([*(f"{r['artifact']}: torch {torch.version}, CUDA {r['cuda_major']}, archs "
                                  f"{', '.join(f'{a} ({how})' for a, how in r['archs'].items())}" for r in reports),
                                backends_said(backends, stack["archs"])])


def _toolchain(stack: dict, lock: dict) -> tuple[list[str], str]:
    from rig.core.cuda_releases import series
    from rig.cuda.agreement import package_problems, torch_cuda

    packages = {w["name"]: w["version"] for w in lock["wheels"]}
    toolkit = series(stack["cuda"]["version"])
    problems = package_problems(packages, toolkit, f"the stack's toolkit (cuda.version {stack['cuda']['version']})")
    seen = torch_cuda(packages)
    flashinfer = sorted(f"{n} {v}" for n, v in packages.items() if canonicalize_name(n).startswith("flashinfer-"))
    return problems, (f"torch's CUDA {seen[0]} ({seen[1]}) and toolkit {toolkit}" if seen else
                      f"no CUDA runtime of torch's in the lock; toolkit {toolkit}") + \
        f"; {', '.join(flashinfer) or 'no flashinfer package'}"


def _patches(stack: dict, lock: dict, cache: Path, patch_dir: str | None) -> tuple[list[str], str]:
    """The patch plan as it would be on an installed venv (with the stack's opt-in features), from the patched files
    inside the locked wheels."""
    from rig.patches.env import Env
    from rig.patches.patchset import asked, load
    from rig.patches.plan import refuse_unknown_versions
    from rig.patches.report import status

    plan = load(patch_dir)
    opted = asked(plan, stack["patches"]["opt_in"])
    packages = {p.package for p in plan}
    locked = {w["name"]: w for w in lock["wheels"] if w["name"] in {canonicalize_name(n) for n in packages}}
    found = _wheels(lock, cache, set(locked))
    with tempfile.TemporaryDirectory(prefix="rig-validate-") as tmp:
        env = Env(python="", prefix=Path(tmp), packages={})
        for package in packages:
            if canonicalize_name(package) not in found:
                continue
            entry, wheel = found[canonicalize_name(package)]
            root = Path(tmp) / package
            with wheelfile.opened(wheel) as archive:
                members = {info.filename: info for info in archive.infolist()}
                for patch in (p for p in plan if p.package == package and p.file in members):
                    wheelfile.unpack(archive, members[patch.file], root)
            env.packages[package] = {"version": entry["version"], "root": str(root)}
        problems = []
        try:
            refuse_unknown_versions(env, plan, opted)
        except RigError as exc:
            problems.append(str(exc))
        rows = status(env, plan, opted)
    problems += [f"{r['id']}: drifted in {r['package']} {r['version']}: {r['detail']}" for r in rows
                 if r["status"] == "drifted"]
    return problems, tally(rows)


def tally(rows: list[dict]) -> str:
    """The patch plan's rows by status, every patch of the set counted (an opt-in one not asked for too), so the
    total is the set's: the number the README's layer table counts."""
    order = ("needed", "applied", "upstream", "not-applicable", "opt-in", "drifted")
    statuses = [*order, *sorted({r["status"] for r in rows} - set(order))]
    counts = {s: sum(r["status"] == s for r in rows) for s in statuses}
    return f"{len(rows)} patches: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
