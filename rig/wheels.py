"""Build a kernel package against a venv's own torch, audit it, keep it in the wheelhouse.

The build uses the venv's torch without build isolation (an isolated build would
fetch another torch and produce the ABI mismatch this exists to avoid), targets
the stack's archs through each build system's own switch, sizes MAX_JOBS so nvcc
does not run the machine out of memory, and goes through ccache when present.
A wheel is accepted only if `rig audit` passes it.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rig import RigError, progress
from rig.audit import audit_wheel, venv_context

GIB = 1 << 30
NVCC_JOB_MEMORY = 4 * GIB  # a heavy nvcc translation unit peaks around here


def max_jobs(cores: int, available_memory: int) -> int:
    return max(1, min(cores, available_memory // NVCC_JOB_MEMORY))


def available_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return NVCC_JOB_MEMORY


def build_env(archs: list[str], cuda_home: Path, jobs: int) -> dict:
    """The environment every supported build system reads its arch list and parallelism from."""
    env = {
        "CUDA_HOME": str(cuda_home),
        "PATH": f"{cuda_home / 'bin'}:{os.environ.get('PATH', '')}",
        "TORCH_CUDA_ARCH_LIST": ";".join(archs),                  # torch.utils.cpp_extension
        "FLASHINFER_CUDA_ARCH_LIST": " ".join(archs),             # flashinfer JIT / AOT
        "CUDAARCHS": ";".join(a.replace(".", "") for a in archs),  # CMake (sgl-kernel)
        "MAX_JOBS": str(jobs),
        "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs),
    }
    ccache = shutil.which("ccache")
    if ccache:  # torch's extension builder honours PYTORCH_NVCC and CXX; CMake its launchers
        env.update(PYTORCH_NVCC=f"{ccache} {cuda_home / 'bin' / 'nvcc'}", CXX=f"{ccache} g++",
                   CMAKE_CUDA_COMPILER_LAUNCHER=ccache, CMAKE_CXX_COMPILER_LAUNCHER=ccache)
    return env


def source_spec(source: str) -> str:
    """What pip builds: a source dir, an sdist, or git+URL@REF (only where the remote is reachable)."""
    if source.startswith("git+"):
        if "@" not in source.split("://", 1)[-1]:
            raise RigError(f"{source}: pin a ref (git+URL@TAG or @COMMIT) so the build is reproducible")
        return source
    path = Path(source)
    if not path.exists():
        raise RigError(f"{source}: no such source dir or sdist; air-gapped builders give a local path")
    if path.is_dir() and not any((path / f).exists() for f in ("setup.py", "pyproject.toml")):
        raise RigError(f"{source} has neither setup.py nor pyproject.toml")
    return str(path.resolve())


def wheelhouse_key(lock_hash: str, archs: list[str]) -> str:
    return hashlib.sha256(f"{lock_hash}|{';'.join(archs)}".encode()).hexdigest()[:16]


def build(source: str, venv: Path, archs: list[str], cuda_major: int, cuda_home: Path, cache: Path,
          lock_hash: str, cuobjdump: Path, jobs: int | None = None) -> dict:
    spec = source_spec(source)
    nvcc = cuda_home / "bin" / "nvcc"
    if not nvcc.exists():
        raise RigError(f"no nvcc in {cuda_home}; install CUDA {cuda_major} (rig cuda install) or pass --cuda-home")
    torch, extra_dirs, _ = venv_context(venv, [])
    if not torch:
        raise RigError(f"{venv} has no torch to build against; install the stack's venv first")
    jobs = jobs or max_jobs(os.cpu_count() or 1, available_memory())
    env = {**os.environ, **build_env(archs, cuda_home, jobs)}
    progress(f"building {source} against torch {torch.version} for {', '.join(archs)} "
             f"with {nvcc} ({jobs} jobs{', ccache' if 'PYTORCH_NVCC' in env else ''})")
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "wheel", "--no-build-isolation",
                               "--no-deps", "--no-index", "-w", out, spec], env=env, stdout=sys.stderr)
        if done.returncode != 0:
            raise RigError(f"building {source} failed (pip exit {done.returncode}); its output is above")
        built = next(Path(out).glob("*.whl"))
        report = audit_wheel(built, cuda_major=cuda_major, archs=archs, torch=torch, extra_dirs=extra_dirs,
                             cuobjdump=cuobjdump, resolve=True)
        if not report["ok"]:
            raise RigError(f"{built.name} failed the audit and was not kept: " + "; ".join(report["errors"]))
        dest = cache / "built" / wheelhouse_key(lock_hash, archs)
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, dest / built.name)
    (dest / f"{built.name}.audit.json").write_text(json.dumps(report, indent=2) + "\n")
    return {"changed": True, "wheel": str(dest / built.name), "audit": report, "jobs": jobs,
            "msg": f"built and audited {dest / built.name}"}
