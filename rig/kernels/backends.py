"""A stack's attention backends held to its archs: the prebuilt kernels each backend loads must have an image for
every arch the stack serves on.

The audit (rig.kernels.audit) reads each kernel object's cubins and PTX. A wheel may cover an arch as a whole while
one of its objects does not (sgl-kernel's FlashAttention-3 ops have no sm_120): that is harmless for a stack that
serves with triton, and a failure at the first request for one that serves with fa3. `rig validate` and
`rig doctor` both ask `gaps`.
"""
from __future__ import annotations

from fnmatch import fnmatch
from pathlib import PurePath

from rig.kernels.audit import covers

# backend -> the file names of the prebuilt kernel objects it loads (sgl-kernel's)
PREBUILT = {"fa3": "flash_ops*.so*", "flashmla": "flashmla_ops*.so*"}
# backends whose kernels are compiled for the GPU in use when the server starts: every arch has them
COMPILED_AT_START = ("triton", "flashinfer")


def _objects(reports: list[dict], backend: str) -> list[dict]:
    """The audited objects (of any kernel package in REPORTS) that BACKEND loads."""
    return [row for report in reports for row in report["objects"]
            if fnmatch(PurePath(row["object"]).name, PREBUILT[backend])]


def runs_on(reports: list[dict], backend: str, arch: str) -> bool:
    """Whether BACKEND's kernels have an image for ARCH in the audited REPORTS."""
    if backend not in PREBUILT:
        return True
    found = _objects(reports, backend)
    return bool(found) and all(covers(arch, row["cubins"], row["ptx"]) for row in found)


def gaps(backends: list[str], archs: list[str], reports: list[dict]) -> list[str]:
    """One problem per backend of BACKENDS (server.attention_backends) and arch of ARCHS that its kernels in
    REPORTS (audit reports) cannot run, naming the backends that can."""
    problems = []
    for backend in (b for b in backends if b in PREBUILT):
        found = _objects(reports, backend)
        if not found:
            problems.append(f"server.attention_backends lists {backend}, but no kernel package here holds its "
                            f"kernels ({PREBUILT[backend]}): install a kernel wheel that has them, or drop {backend}")
            continue
        for arch in archs:
            if runs_on(reports, backend, arch):
                continue
            named = ", ".join(PurePath(row["object"]).name for row in found)
            able = [b for b in PREBUILT if b != backend and runs_on(reports, b, arch)] + list(COMPILED_AT_START)
            problems.append(f"server.attention_backends lists {backend}, whose kernels ({named}) have no image "
                            f"for {arch}: serve with a backend that has them ({', '.join(able)}), or drop {arch}")
    return problems


def said(backends: list[str], archs: list[str]) -> str:
    """What a passing cross-check held: the stack's backends and archs."""
    return f"attention backends {', '.join(backends)} run on {', '.join(archs)}" if backends else \
        "not checked: the stack names no attention backend (server.attention_backends), and SGLang picks one at start"
