"""Layered health checks, run in order: machine (rig.machine.gpu_health) -> driver -> toolkit -> libraries -> nvrtc -> python
(the venv, its sitecustomize environment and Triton's ptxas, then `rig audit` of its
compiled kernel packages).

Each check is pass, fail or skip with a one-line detail and, on failure, the
fix. Every layer runs even when an earlier one failed, so one report shows all
that is wrong; the exit status is non-zero when a required check fails.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

from rig.core import RigError, check, proc
from rig.core.check import Check, failed
from rig.core.cuda_releases import major, series
from rig.core.hints import CREATE_VENV
from rig.cuda.ldconfig import cache
from rig.cuda.nvrtc import sm_name
from rig.cuda.toolkit import tool_release, toolkits

LDCONFIG_FIX = ("install the toolkit under the prefix (cuda_toolkit role), then run the cuda_ldconfig role (one "
                "/etc/ld.so.conf.d file per toolkit, then ldconfig)")


def visible_gpus() -> tuple[list[dict], Check]:
    """The GPUs nvidia-smi lists, and the check that says so."""
    if not shutil.which("nvidia-smi"):
        return [], Check("driver", "nvidia-smi", "skip", "no NVIDIA driver here (nvidia-smi not found)")
    try:  # a wedged GPU can hang nvidia-smi: bounded, as the machine layer's calls are
        done = proc.run(["nvidia-smi", "--query-gpu=index,name,compute_cap,driver_version", "--format=csv,noheader"],
                        "listing the GPUs", timeout=60, ok=None)
    except RigError as exc:
        return [], Check("driver", "nvidia-smi", "fail", str(exc), "check the NVIDIA driver and the GPUs: "
                         "nvidia-smi did not answer")
    if done.returncode != 0:
        return [], Check("driver", "nvidia-smi", "fail", (done.stdout + done.stderr).strip()[:300],
                         "check the NVIDIA driver install: nvidia-smi fails")
    gpus = [dict(zip(("index", "name", "cc", "driver"), (f.strip() for f in line.split(",")), strict=False))
            for line in done.stdout.strip().splitlines() if line.strip()]
    if not gpus:
        return [], Check("driver", "nvidia-smi", "skip", "driver present, no GPUs visible")
    names = sorted({g["name"] for g in gpus})
    return gpus, Check("driver", "nvidia-smi", "pass",
                       f"{len(gpus)} GPU(s): {', '.join(names)}; driver {gpus[0]['driver']}")


def _driver_cuda(cuda_major: int) -> Check:
    try:
        out = proc.run(["nvidia-smi"], "reading the driver's CUDA version", timeout=60, ok=None).stdout
    except RigError as exc:
        return Check("driver", "driver-cuda", "fail", str(exc), "check the NVIDIA driver: nvidia-smi did not answer")
    match = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", out)
    if not match:
        return Check("driver", "driver-cuda", "skip", "nvidia-smi does not report a CUDA version",
                     required=False)
    supported = int(match.group(1))
    if supported < cuda_major:
        return Check("driver", "driver-cuda", "fail",
                     f"driver supports CUDA {match.group(1)}.{match.group(2)}, stack needs {cuda_major}",
                     f"install an NVIDIA driver that supports CUDA {cuda_major}")
    return Check("driver", "driver-cuda", "pass", f"driver supports CUDA {match.group(1)}.{match.group(2)}")


def _compute_capability(gpus: list[dict], archs: list[str]) -> Check:
    if not gpus:
        return Check("driver", "compute-capability", "skip", "no GPUs to check")
    covered = {a.rstrip("a") for a in archs}
    missing = sorted({g["cc"] for g in gpus} - covered)
    seen = ", ".join(sorted({f"{g['cc']} ({g['name']})" for g in gpus}))
    if missing:
        return Check("driver", "compute-capability", "fail",
                     f"GPU compute capability {', '.join(missing)} not among target archs {archs}",
                     f"add '{missing[0]}a' to archs in the stack file")
    return Check("driver", "compute-capability", "pass", f"{seen}; covered by {', '.join(archs)}")


def _toolkit(cuda_series: str, prefix: str) -> list[Check]:
    found = toolkits(prefix)
    detail = ", ".join(f"{Path(t['tree']).name} (nvcc {t['nvcc'] or 'absent'})" for t in found)
    wanted = [t for t in found if t["nvcc"] == cuda_series]
    checks = [Check("toolkit", f"cuda-{cuda_series}", "pass" if wanted else "fail",
                    detail or f"no CUDA toolkit under {prefix}",
                    "" if wanted else f"install CUDA {cuda_series}: the cuda_toolkit role or `rig cuda install`")]
    for tree in found:  # the tree of the stack's release, whatever its nvcc says
        if Path(tree["tree"]).name == f"cuda-{cuda_series}":
            checks.append(_toolkit_agreement(Path(tree["tree"])))
    link = Path(prefix) / "cuda"
    checks.append(Check("toolkit", "default-link", "pass" if link.is_symlink() else "skip",
                        f"{link} -> {os.readlink(link)}" if link.is_symlink() else f"{link} is not a link",
                        required=False))
    return checks


def _toolkit_agreement(tree: Path) -> Check:
    from rig.cuda.agreement import UNREAD, toolkit_parts, toolkit_problems

    parts = toolkit_parts(tree)
    problems = toolkit_problems(tree, parts)
    if problems:
        return Check("toolkit", f"{tree.name}-agreement", "fail", "; ".join(problems),
                     "reinstall that release (cuda_toolkit role)")
    said = ", ".join(f"{k} {v}" for k, v in parts.items() if v) or "no part says its release"
    unread = [f"{k} not read: {UNREAD[k]}" for k, v in parts.items() if not v]
    return Check("toolkit", f"{tree.name}-agreement", "warn" if unread else "pass",
                 "; ".join([f"{tree}: {said}", *unread]),
                 "reinstall that release (cuda_toolkit role): what is not read is not compared" if unread else "")


def _libraries(cuda_version: str) -> list[Check]:
    try:
        known = cache()
    except RigError as exc:  # a check that fails, not a doctor that crashes
        return [Check("libraries", "ldconfig", "fail", str(exc), LDCONFIG_FIX)]
    checks = []
    for soname in (f"libcudart.so.{major(cuda_version)}", f"libnvrtc.so.{major(cuda_version)}",
                   f"libnvrtc-builtins.so.{series(cuda_version)}"):
        # CUDA 11 spells its sonames with a minor (libcudart.so.11.0, libnvrtc.so.11.2): the major's is the same
        path = known.get(soname) or next((p for n, p in sorted(known.items()) if n.startswith(f"{soname}.")), None)
        checks.append(Check("libraries", soname, "pass" if path else "fail",
                            f"-> {path}" if path else f"{soname} is not in the ldconfig cache",
                            "" if path else LDCONFIG_FIX))
    return checks


def _nvrtc(cuda_version: str, archs: list[str]) -> list[Check]:
    soname = f"libnvrtc.so.{major(cuda_version)}"
    # A clean environment: the loader must find NVRTC through ldconfig alone.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a dir, or the rig.pyz
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": root}
    done = proc.run([sys.executable, "-m", "rig.cuda.nvrtc", soname, *archs], "compiling with NVRTC", env=env, ok=None,
                    timeout=300)
    try:
        report = proc.last_json(done.stdout, "NVRTC's compile check")
    except RigError:
        report = {"ok": False, "error": (done.stdout + done.stderr).strip()[-300:]}
    if "results" not in report:
        return [Check("nvrtc", f"compile-{sm_name(a)}", "fail", report["error"], LDCONFIG_FIX)
                for a in archs]
    return [Check("nvrtc", f"compile-{sm_name(r['arch'])}", "pass" if r["ok"] else "fail",
                  f"NVRTC {r['nvrtc']} via {soname}: {r['cubin_bytes']} byte cubin" if r["ok"] else r["error"],
                  "" if r["ok"] else f"NVRTC {r['nvrtc']} cannot target {sm_name(r['arch'])}: use a newer CUDA")
            for r in report["results"]]


def _venv(venv: str, lock: dict | None = None) -> Check:
    """PASS: rig installed the venv from its lock and it still holds it. WARN "adopted": rig did not install it
    (no marker: a venv built over a machine's own torch, as an NGC-style container's is) but every distribution
    LOCK pins is there at its version. FAIL: it differs, naming each difference. With no marker and no LOCK
    there is nothing to hold it to: WARN, not judged."""
    from rig.python.venv import MARKER, differences, read_marker, verify

    if not (Path(venv) / "bin" / "python").exists():
        return Check("python", "venv", "fail", f"{venv} holds no venv (no bin/python)", VENV_FIX)
    try:
        if read_marker(venv) is None and lock is None:
            return Check("python", "venv", "warn", f"{venv} was not installed by rig (no {MARKER}) and no lock was "
                         "given to hold it to: its distributions are not judged",
                         "give --stack whose lock the venv should match (rig lock writes it)")
        result = verify(venv, lock)
    except RigError as exc:  # a marker rig did not write, or a Python that cannot start: a failed check
        return Check("python", "venv", "fail", str(exc), "run the python_stack role again")
    by_rig = "" if result["installed_by_rig"] else " (not installed by rig)"
    if not result["ok"]:
        problems = differences(result)
        return Check("python", "venv", "fail", f"{venv}{by_rig} differs from lock {result['lock_hash'][:12]}: "
                     f"{'; '.join(problems)}", "run the python_stack role again" if by_rig == "" else
                     "install the lock's versions of these into the venv, or let the python_stack role install "
                     "the lock into a venv of its own", problems=[f"{venv}: {p}" for p in problems])
    if by_rig:
        return Check("python", "venv", "warn", f"{venv}: adopted: not installed by rig, its {result['packages']} "
                     f"distributions match lock {result['lock_hash'][:12]}'s pins",
                     "nothing to do if this is meant: rig holds it to the lock, but did not install it")
    return Check("python", "venv", "pass", f"{venv}: {result['packages']} packages as locked "
                 f"({result['lock_hash'][:12]})")


def _venv_image(venv: str) -> Check | None:
    """Where the venv is a link rig made to a mounted image: PASS when that image's file is what is mounted and its
    sha256 is its manifest's (the copy the store keeps), saying whether fs-verity keeps it checked while mounted;
    FAIL where either is not; WARN where a file could not be read (not root). None for a venv that is no such link
    (a directory: nothing to say about an image)."""
    from rig.python.venv_archive.mount import looked_at

    try:
        seen = looked_at(venv)
    except RigError as exc:  # the mount table could not be read
        return Check("python", "venv image", "warn", f"{venv}: could not look at its image: {exc}", IMAGE_FIX)
    if not seen["image"]:
        return None
    if not seen["looked"]:
        return Check("python", "venv image", "warn", f"{venv} links to image {seen['name']}, which could not be "
                     f"checked: {'; '.join(seen['problems'])}", "run rig doctor as root to read the image's store")
    if not seen["ok"]:
        return Check("python", "venv image", "fail", f"{venv} links to image {seen['name']}: "
                     f"{'; '.join(seen['problems'])}", IMAGE_FIX, problems=[f"{venv}: {p}" for p in seen["problems"]])
    return Check("python", "venv image", "pass", f"{venv} is the mounted image {seen['name']} (sha256 "
                 f"{seen['sha256'][:12]}, as its manifest says), mounted read-only at {seen['mount']}; "
                 f"{seen['kept_checked']}")


IMAGE_FIX = "run the python_stack role again (rig venv mount puts the image back, or the role unpacks the archive)"
ENV_FIX = "run `rig env install --venv VENV --stack STACK` (the python_stack role does)"
VENV_FIX = f"give --venv where the stack's venv is, or {CREATE_VENV}"


def _environment(venv: str, seen: dict, cuda_version: str, archs: list[str], prefix: str) -> list[Check]:
    """A fresh interpreter of the venv, started with an empty environment, must carry the stack's."""
    from rig.python.runtime_env import MODULE, cuda_env

    if not seen["loaded"]:
        return [Check("python", "sitecustomize", "fail", f"{MODULE} is not loaded when {venv}'s Python starts", ENV_FIX)]
    wanted = {**seen["declared"], **cuda_env(cuda_version, archs, prefix)}
    wrong = [f"{k}={seen['environ'].get(k)!r} (want {v!r})" for k, v in wanted.items() if seen["environ"].get(k) != v]
    checks = [Check("python", "sitecustomize", "fail" if wrong else "pass",
                    "; ".join(wrong) if wrong else f"a fresh interpreter has {len(wanted)} variables set, "
                    f"CUDA_HOME={wanted['CUDA_HOME']}", ENV_FIX if wrong else "")]
    ptxas = seen["environ"].get("TRITON_PTXAS_PATH", "")
    runs = os.access(ptxas, os.X_OK)
    release = tool_release(ptxas) if runs else None
    good = release == series(cuda_version)
    checks.append(Check("python", "triton-ptxas", "pass" if good else "fail",
                        f"{ptxas}: CUDA {release or 'unknown'} ptxas" if runs else
                        f"TRITON_PTXAS_PATH {ptxas!r} is not an executable",
                        "" if good else f"install CUDA {series(cuda_version)} with ptxas (cuda_toolkit role)"))
    return checks


def _agreement(venv: str, seen: dict) -> Check:
    """torch's CUDA against the toolkit at the CUDA_HOME a fresh interpreter has; flashinfer at one version."""
    from rig.cuda.agreement import flashinfer_problems, package_problems, toolkit_parts, torch_cuda
    from rig.python.venv import installed

    try:
        packages = installed(venv)
    except RigError as exc:
        return Check("python", "cuda-agreement", "fail", str(exc), VENV_FIX)
    home = seen["environ"].get("CUDA_HOME")
    parts = toolkit_parts(Path(home)) if home else {}
    toolkit = parts.get("nvcc") or parts.get("headers")
    if toolkit:
        problems = package_problems(packages, toolkit, f"CUDA_HOME {home}")
    else:  # flashinfer's versions are judged whatever CUDA_HOME holds
        problems = flashinfer_problems(packages) + ([
            f"CUDA_HOME {home} holds no toolkit that says its release (no bin/nvcc, no "
            "include/cuda_runtime_api.h): install the stack's CUDA there or fix CUDA_HOME"] if home else [])
    if problems:
        return Check("python", "cuda-agreement", "fail", "; ".join(problems),
                     "see the detail: each problem names its fix")
    seen_cuda = torch_cuda(packages)
    unread = ([] if seen_cuda else ["torch's CUDA not read: no CUDA runtime wheel (nvidia-cuda-runtime) and no "
                                    f"+cuXY tag on torch {packages.get('torch', '(not installed)')}"]) + \
        ([] if toolkit else ["nothing to compare torch's CUDA with: CUDA_HOME is unset"])
    said = f"torch's CUDA {seen_cuda[0]}" if seen_cuda else ""
    said += f"{', ' if said else ''}CUDA_HOME {home} (CUDA {toolkit})" if toolkit else ""
    return Check("python", "cuda-agreement", "warn" if unread else "pass", "; ".join(filter(None, [said, *unread])),
                 "see the detail: what is not read is not compared" if unread else "")


KERNEL_PACKAGES = ("sglang-kernel", "sgl-kernel", "flashinfer-jit-cache", "flashinfer-cubin")


def _kernels(venv: str, cuda_version: str, archs: list[str], backends: list[str]) -> list[Check]:
    """rig audit of the venv's compiled kernel packages, from their files, and the attention BACKENDS the stack
    serves with held to its archs."""
    from rig.core import RigError
    from rig.kernels import backends as held_to_archs
    from rig.kernels.audit import as_check, audit_path, venv_context

    try:
        torch, dirs, installed = venv_context(Path(venv), list(KERNEL_PACKAGES))
    except RigError as exc:
        return [Check("python", "kernels", "fail", str(exc), VENV_FIX)]
    # the archs are read by rig itself from each object's fat binaries: no cuobjdump, here or anywhere
    common = {"cuda_major": major(cuda_version), "archs": archs, "torch": torch, "extra_dirs": dirs, "resolve": True}
    checks, reports = [], []
    for name in sorted(installed):
        try:
            report = audit_path(name, installed, common)
            reports.append(report)
        except RigError as exc:  # an object rig cannot read is a finding, not a doctor that crashes
            checks.append(Check("python", f"audit-{name}", "fail", str(exc),
                                f"reinstall {name} (the python_stack role): one of its files is not what a wheel "
                                "installs"))
            continue
        fix = ("see the detail: prebuilt .cubin files are left out, not rebuilt" if report["cubin_files"] else
               f"rebuild {name} against this venv's torch {report['torch']} for CUDA {major(cuda_version)} and "
               f"{', '.join(archs)} (rig wheels build), or pin a wheel built so")
        checks.append(as_check(report, "python", f"audit-{name}", fix))
    gaps = held_to_archs.gaps(backends, archs, reports)
    # no backend named: SGLang picks one when it starts, so there is nothing here to hold to the archs
    checks.append(Check("python", "attention-backends", "fail" if gaps else "pass" if backends else "skip",
                        "; ".join(gaps) or held_to_archs.said(backends, archs),
                        "see the detail: each problem names the backends that run there" if gaps else "",
                        question="do the kernels of the stack's attention backends run on its archs?",
                        problems=gaps))
    return checks


def _machine(expect_gpus: int | None, default_gpus: int | None, pcie_only_env: bool | None) -> list[Check]:
    """The layer under the driver's API: module, persistence, fabric, links, memory, runtime, topology."""
    from rig.machine import gpu_health

    raw = gpu_health.collect()
    if raw["module"] is None and raw["query"]["rc"] is None and not expect_gpus:
        return [Check("machine", "driver-module", "skip", "no NVIDIA driver here", required=False)]
    # an explicit --expect-gpus is exact; the stack's tp only says how many the server needs at least
    return gpu_health.checks(raw, expect_gpus or default_gpus, pcie_only_env=pcie_only_env,
                             at_least=not expect_gpus)


# The layers a role asks for alone (cuda_ldconfig: do the sonames resolve?), the same judgement doctor makes
ALONE = {"toolkit": lambda version, archs, prefix: _toolkit(series(version), prefix),
         "libraries": lambda version, archs, prefix: _libraries(version),
         "nvrtc": lambda version, archs, prefix: _nvrtc(version, archs)}


def run(cuda_version: str, archs: list[str], prefix: str = "/usr/local", venv: str | None = None,
        expect_gpus: int | None = None, default_gpus: int | None = None,
        pcie_only_env: bool | None = None, lock: dict | None = None, backends: list[str] | None = None) -> list[Check]:
    """Every layer's checks; LOCK (the stack's) is what a venv rig did not install is held to, BACKENDS (its
    server.attention_backends) what the venv's kernels must run on ARCHS."""
    gpus, smi = visible_gpus()
    checks = _machine(expect_gpus, default_gpus, pcie_only_env) + [smi]
    if gpus:
        checks.append(_driver_cuda(major(cuda_version)))
    checks.append(_compute_capability(gpus, archs))
    checks += _toolkit(series(cuda_version), prefix)
    checks += _libraries(cuda_version)
    checks += _nvrtc(cuda_version, archs)
    if venv:
        checks += [image] if (image := _venv_image(venv)) is not None else []
        checks.append(_venv(venv, lock))
        if checks[-1].status in ("pass", "warn"):  # the kernels are audited in a venv known to be whole or adopted
            from rig.python.runtime_env import seen_by

            try:  # what a fresh interpreter of the venv, started with an empty environment, has
                seen = seen_by(Path(venv) / "bin" / "python")
            except RigError as exc:
                checks.append(Check("python", "sitecustomize", "fail", str(exc), ENV_FIX))
            else:
                checks += _environment(venv, seen, cuda_version, archs, prefix)
                checks.append(_agreement(venv, seen))
            checks += _kernels(venv, cuda_version, archs, backends or [])
    return checks


def run_in_container(container: str, bundle: str | Path, cuda_version: str, archs: list[str], prefix: str,
                     venv: str | None = None, expect_gpus: int | None = None, layer: str | None = None,
                     backends: list[str] | None = None) -> list[Check]:
    """The same checks inside a running container, by the engine BUNDLE copied in (`rig doctor --container`)."""
    from rig.engine.container import report, run_engine

    args = ["doctor", "--json", "--cuda", cuda_version, "--prefix", prefix, *(["--layer", layer] if layer else [])]
    args += [f"--arch={a}" for a in archs] + (["--venv", venv] if venv else [])
    args += [f"--attention-backend={b}" for b in backends or []]
    args += ["--expect-gpus", str(expect_gpus)] if expect_gpus else []
    found = report(run_engine(container, args, bundle), f"doctor in {container}")
    return [Check(**c) for c in found["checks"]]


BOX = "rig-box"  # the container `make provision` provisions (the Makefile's BOX)


def render(checks: list[Check], missing_venv: str | None = None) -> str:
    """The report; MISSING_VENV, the stack's venv where it is not, says where a failed doctor should have run."""
    verdict = "FAILED" if failed(checks) else "all required checks passed"
    if failed(checks) and missing_venv:
        verdict += (f": this machine is not provisioned (no venv at {missing_venv}); the box `make provision` "
                    f"provisioned is: `rig doctor --container {BOX}`")
    return check.render(checks, "doctor: " + verdict)
