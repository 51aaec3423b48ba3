"""Do the CUDA pieces a stack runs with agree? Failures users of CUDA 13 boxes report show up only at run
time, often as wrong output: a toolkit whose nvcc, headers and runtime come from different releases; torch
built for one CUDA major while its extensions JIT-compile with another toolkit; flashinfer's packages at
different versions. One judge for a lock (rig validate) and for a box (rig doctor): each problem names both
versions and the fix.
"""
from __future__ import annotations

import re
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from rig.core import RigError
from rig.core.documents import read_text
from rig.cuda.toolkit import tool_release

# the CUDA runtime wheels torch requires (through cuda-toolkit[cudart]); torch's own local tag (+cu130) otherwise
RUNTIME_WHEELS = ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12")
FLASHINFER_FIX = ("pin every flashinfer package at one version (flashinfer.version in the stack, then "
                  "`rig lock`), or remove the odd one out of the venv")


def release(version: str) -> str | None:
    """'13.0.96' -> '13.0'; None for what is not a version."""
    try:
        parts = Version(version).release
    except (InvalidVersion, ValueError):  # ValueError: a number int() refuses (thousands of digits)
        return None
    return f"{parts[0]}.{parts[1] if len(parts) > 1 else 0}"


def flashinfer_problems(packages: dict[str, str]) -> list[str]:
    """Every flashinfer-* package must be at one version: flashinfer refuses a flashinfer-cubin of another
    ("flashinfer-cubin version (...) does not match flashinfer version"), and a jit-cache of another holds
    kernels built from other sources."""
    found = {n: v for n, v in _named(packages).items() if n.startswith("flashinfer-")}
    public = {n: _public(v) for n, v in found.items()}
    anchor = "flashinfer-python" if "flashinfer-python" in public else min(public, default=None)
    if anchor is None:
        return []
    return [f"{name} {found[name]} beside {anchor} {found[anchor]}: {FLASHINFER_FIX}"
            for name in sorted(public) if public[name] != public[anchor]]


def _named(packages: dict[str, str]) -> dict[str, str]:
    return {str(canonicalize_name(n)): v for n, v in packages.items()}


def _public(version: str) -> str:
    try:
        return Version(version).public  # flashinfer-jit-cache carries a local tag (+cu130)
    except (InvalidVersion, ValueError):
        return version


def torch_cuda(packages: dict[str, str]) -> tuple[str, str] | None:
    """The CUDA release (X.Y) torch runs with, and what says so; None when neither is there."""
    named = _named(packages)
    for wheel in RUNTIME_WHEELS:
        if wheel in named and release(named[wheel]):
            return str(release(named[wheel])), f"{wheel} {named[wheel]}"
    tag = re.search(r"\+cu([1-9]\d?)(\d)\Z", named.get("torch", ""))
    if tag:
        return f"{int(tag.group(1))}.{tag.group(2)}", f"torch {named['torch']}"
    return None


def runtime_problems(packages: dict[str, str], toolkit: str, where: str) -> list[str]:
    """torch's CUDA major against the toolkit (X.Y) at WHERE: extensions JIT-built there (flashinfer's, a
    source-built kernel's) link against torch's CUDA runtime."""
    seen = torch_cuda(packages)
    if seen is None or seen[0].split(".")[0] == toolkit.split(".")[0]:
        return []
    return [f"torch runs CUDA {seen[0]} ({seen[1]}) but {where} is CUDA {toolkit}: what JIT-compiles there "
            f"targets another CUDA major; lock torch for CUDA {toolkit.split('.')[0]} (the stack's torch "
            f"index) or set cuda.version to a {seen[0].split('.')[0]}.x release"]


def package_problems(packages: dict[str, str], toolkit: str, where: str) -> list[str]:
    """What a lock's or a venv's packages get wrong together: flashinfer's versions, torch's CUDA against WHERE."""
    return flashinfer_problems(packages) + runtime_problems(packages, toolkit, where)


def header_release(tree: Path) -> str | None:
    """The release a toolkit's headers are (CUDART_VERSION in cuda_runtime_api.h: 13000 -> '13.0')."""
    try:
        text = read_text(tree / "include" / "cuda_runtime_api.h", "CUDA header")
    except RigError:
        return None
    match = re.search(r"^#define\s+CUDART_VERSION\s+(\d{4,6})\s*$", text, re.M)
    return f"{int(match.group(1)) // 1000}.{int(match.group(1)) % 1000 // 10}" if match else None


def runtime_release(tree: Path) -> str | None:
    """The release of the toolkit's own libcudart, from the name of its file: libcudart.so.13.0.96 -> '13.0' (the
    runfile's and the apt packages' layout); where the file is its soname alone, libcudart.so.13 (NVIDIA's wheels
    ship it so), the major it says: '13'. Two releases are both named, and never agree."""
    found: set[str] = set()
    for path in (tree / "lib64").glob("libcudart.so.*"):
        if path.is_symlink() or not path.is_file():  # the links name what they lead to: the file says it once
            continue
        suffix = path.name.split(".so.", 1)[1]
        said = suffix if SONAME_MAJOR.fullmatch(suffix) else release(suffix)
        if said:
            found.add(said)
    found -= {r for r in found if "." not in r and any(f.startswith(f"{r}.") for f in found)}
    return ", ".join(sorted(found)) or None


SONAME_MAJOR = re.compile(r"[1-9]\d{0,2}")
# why a part of a toolkit says no release, for a check that could not read it
UNREAD = {"nvcc": "bin/nvcc is missing or does not say its release",
          "headers": "include/cuda_runtime_api.h is missing or defines no CUDART_VERSION",
          "cudart": "lib64 holds no libcudart.so.* file (libcudart.so.13, or .so.13.0.96)"}


def toolkit_parts(tree: Path) -> dict[str, str | None]:
    nvcc = tree / "bin" / "nvcc"
    return {"nvcc": tool_release(nvcc) if nvcc.is_file() else None, "headers": header_release(tree),
            "cudart": runtime_release(tree)}


def toolkit_problems(tree: Path, parts: dict[str, str | None]) -> list[str]:
    """nvcc, the headers and libcudart of one tree at one release ("compiler and toolkit headers are
    incompatible" otherwise, or kernels built against one runtime loading another). A part that says only its
    major (libcudart.so.13) agrees with the releases of that major."""
    known = {k: v for k, v in parts.items() if v}
    releases = {r for v in known.values() for r in v.split(", ")}
    if len({r for r in releases if "." in r}) <= 1 and len({r.split(".")[0] for r in releases}) <= 1:
        return []
    said = ", ".join(f"{k} {v}" for k, v in known.items())
    return [f"{tree} mixes CUDA releases ({said}): reinstall one release there (the cuda_toolkit role, "
            "or `rig cuda install`), and put no other release's files into it"]
