"""Build a kernel package against a venv's own torch, audit it, keep it in the wheelhouse.

The build uses the venv's torch without build isolation (an isolated build would
fetch another torch and produce the ABI mismatch this exists to avoid), targets
the stack's archs through each build system's own switch, sizes MAX_JOBS so nvcc
does not run the machine out of memory, and goes through ccache when present.
A wheel is accepted only if `rig audit` passes it.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from rig.core import RigError, progress
from rig.core.documents import dump_json
from rig.core.fs import atomic_copy, atomic_write, copy_tree, open_regular, sha256_data, sha256_file, tree
from rig.core.proc import run
from rig.core.wheelfile import name_version
from rig.kernels.audit import audit_wheel, venv_context
from rig.python.runtime_env import arch_env
from rig.python.venv import BUILT_REQUIREMENTS
from rig.python.wheelhouse import exported, lay_out

GIB = 1 << 30
NVCC_JOB_MEMORY = 4 * GIB  # a heavy nvcc translation unit peaks around here
CCACHE_MASQUERADE = "/usr/lib/ccache"  # Debian/Ubuntu: gcc, g++, c++ links to ccache


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
        **arch_env(archs),
        "CUDAARCHS": ";".join(a.replace(".", "") for a in archs),  # CMake (sgl-kernel)
        "MAX_JOBS": str(jobs),
        "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs),
    }
    ccache = shutil.which("ccache")
    if ccache:
        # nvcc through PYTORCH_NVCC (torch's extension builder) and CMake's launcher; the host compiler
        # through ccache's masquerade dir, since torch reads the compiler's version from CXX
        env.update(PYTORCH_NVCC=f"{ccache} {cuda_home / 'bin' / 'nvcc'}",
                   CMAKE_CUDA_COMPILER_LAUNCHER=ccache, CMAKE_CXX_COMPILER_LAUNCHER=ccache)
        if Path(CCACHE_MASQUERADE).is_dir():
            env["PATH"] = f"{CCACHE_MASQUERADE}:{env['PATH']}"
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
    if not (path.is_dir() or path.is_file()):  # read only as a tree or a regular file: never a FIFO or a device
        raise RigError(f"{source} is neither a source dir nor an sdist file; give one")
    if path.is_dir() and not any((path / f).exists() for f in ("setup.py", "pyproject.toml")):
        raise RigError(f"{source} has neither setup.py nor pyproject.toml")
    return str(path.resolve())


def stack_source(stack: dict, package: str, stack_path: str) -> str:
    """The build source a stack's entry names (kernel, flashinfer, sglang, or an extension's package)."""
    if package in ("kernel", "flashinfer", "sglang"):
        source = stack[package].get("source") or {}
    else:
        found = [x["source"] for x in stack["extensions"] if x["package"] == package]
        if not found:
            raise RigError(f"{stack_path}: no kernel, flashinfer, sglang or extension named {package!r}")
        source = found[0]
    if not (source.get("git") or source.get("path")):
        raise RigError(f"{stack_path}: {package} has no source entry (source: {{git, ref}} or {{path}}); "
                       "it installs as a prebuilt wheel")
    return source_of(source, stack_path)


def source_of(source: dict, stack_path: str | Path) -> str:
    """git+URL@REF[#subdirectory=...], or a local path taken relative to the stack file."""
    if source.get("path"):
        path = Path(source["path"])
        path = path if path.is_absolute() else Path(stack_path).resolve().parent / path
        return os.path.normpath(path / source["subdirectory"] if source.get("subdirectory") else path)
    sub = f"#subdirectory={source['subdirectory']}" if source.get("subdirectory") else ""
    return f"git+{source['git']}@{source['ref']}{sub}"


def source_digest(spec: str) -> str:
    """What the source is: a git URL@REF as written, a file's bytes, or a tree's paths and bytes."""
    path = Path(spec)
    digest = hashlib.sha256()
    if not path.exists():
        digest.update(spec.encode())
    elif not path.is_dir():
        _digest_file(digest, path, "source")
    else:  # the entries the clean copy takes (a link out of the tree refused), in the order they sort
        for kind, relative, text in tree(path, f"source {spec}", _ignored):
            if kind == "file":
                digest.update(relative.encode() + b"\0")
                _digest_file(digest, path / relative, "source file")
            elif kind == "link":
                digest.update(relative.encode() + b"\0link\0" + text.encode())
    return digest.hexdigest()


def _digest_file(digest, path: Path, what: str) -> None:
    with open_regular(path, what) as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)


def _ignored(parts: tuple) -> bool:  # shared by the source digest and the clean copy
    return any(p in ("build", "dist", "__pycache__") or p.endswith(".egg-info") for p in parts)


def copy_source(src: str | Path, dest: Path) -> Path:
    """A clean copy of a source tree, without the build leftovers the source digest leaves out; a link that
    leads out of the tree is refused, never followed into the builder's copy."""
    return copy_tree(src, dest, f"source {src}", _ignored)


def wheelhouse_key(lock_hash: str, archs: list[str], source: str) -> str:
    """Where a build is kept: the stack lock it links against, the archs, and the source itself."""
    return sha256_data(f"{lock_hash}|{';'.join(archs)}|{source_digest(source)}")[:16]


def stack_lock_hash(stack_path: str | Path) -> str:
    """The hash of the stack's lock, which keys its builds; "unlocked" while it has none."""
    from rig.python.lock import lock_path, read

    lock = lock_path(stack_path)
    return read(lock)["lock_hash"] if lock.exists() else "unlocked"


def plan(source: str, archs: list[str], cache: Path, lock_hash: str) -> dict:
    """Whether the controller's wheelhouse already holds this build (nothing to compile)."""
    key = wheelhouse_key(lock_hash, archs, source_spec(source))
    kept = sorted((cache / "built" / key).glob("*.whl"))
    return {"changed": not kept, "key": key, "lock_hash": lock_hash, "wheels": [str(w) for w in kept],
            "msg": f"built/{key} holds {', '.join(w.name for w in kept)}" if kept else f"would build into built/{key}"}


def export(built_dirs: list[Path], dest: Path, check: bool = False) -> dict:
    """Lay kept wheels out with a hash-pinned requirements file, for `rig venv add`; with CHECK, say what would be
    placed and write nothing."""
    wheels = sorted(w for d in built_dirs for w in Path(d).glob("*.whl"))
    if not wheels:
        raise RigError(f"{', '.join(map(str, built_dirs))} holds no built wheels; run the wheel_build role "
                       "(or rig wheels build) first")
    entries = [(w, {"filename": w.name, "name": name, "version": version, "sha256": sha256_file(w)})
               for w in wheels for name, version in [name_version(w)]]
    laid = lay_out(entries, dest, dest / BUILT_REQUIREMENTS, check=check)
    return {**laid, "dest": str(dest), "msg": exported(laid, dest, check)}


def build(source: str, venv: Path, archs: list[str], cuda_major: int, cuda_home: Path, cache: Path,
          lock_hash: str, jobs: int | None = None) -> dict:
    spec = source_spec(source)
    key = wheelhouse_key(lock_hash, archs, spec)
    nvcc = cuda_home / "bin" / "nvcc"
    if not nvcc.exists():
        raise RigError(f"no nvcc in {cuda_home}; install CUDA {cuda_major} (rig cuda install) or pass --cuda-home")
    torch, extra_dirs, _ = venv_context(venv, [])
    if not torch:
        raise RigError(f"{venv} has no torch to build against; install the stack's venv first")
    jobs = jobs or max_jobs(os.cpu_count() or 1, available_memory())
    env = {**os.environ, **build_env(archs, cuda_home, jobs)}
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"  # the venv's ninja: parallel builds, and PYTORCH_NVCC honoured
    progress(f"building {source} against torch {torch.version} for {', '.join(archs)} "
             f"with {nvcc} ({jobs} jobs{', ccache' if 'PYTORCH_NVCC' in env else ''})")
    with tempfile.TemporaryDirectory() as out:
        if Path(spec).is_dir():  # build a clean copy: no stale objects in, no build/ left in the source
            spec = str(copy_source(spec, Path(out) / "src"))
        if "PYTORCH_NVCC" in env:  # paths relative to the fresh copy, so ccache hits across builds
            env.update(CCACHE_BASEDIR=out, CCACHE_NOHASHDIR="true")
        done = run([str(venv / "bin" / "python"), "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
                    "--no-index", "-w", out, spec], f"building {source}", env=env, stdout=sys.stderr, ok=None,
                   timeout=4 * 3600)  # a CUDA extension compiles for hours on few cores
        if done.returncode != 0:
            hint = "; an air-gapped builder gives a local checkout or sdist instead" if spec.startswith("git+") else ""
            raise RigError(f"building {source} failed (pip exit {done.returncode}); its output is above{hint}")
        built = next(Path(out).glob("*.whl"))  # -w OUT: the wheel lands beside the copied source
        report = audit_wheel(built, cuda_major=cuda_major, archs=archs, torch=torch, extra_dirs=extra_dirs,
                             resolve=True)
        if not report["ok"]:
            raise RigError(f"{built.name} failed the audit and was not kept: " + "; ".join(report["errors"]))
        dest = cache / "built" / key
        atomic_copy(built, dest / built.name)  # kept wheels are trusted by name: never a torn one
    atomic_write(dest / f"{built.name}.audit.json", dump_json(report, "the audit report", indent=2) + "\n")
    return {"changed": True, "wheel": str(dest / built.name), "key": key, "audit": report, "jobs": jobs,
            "msg": f"built and audited {dest / built.name}"}
