"""Audit kernel wheels, installed packages and shared objects before anything loads them.

From the files alone: the CUDA sonames each object needs (major against the
stack's, and whether the host can resolve them), the torch symbols it expects
against those the torch in use exports, the torch its metadata pins, its
cubin/PTX archs against the stack's targets (those inside each object's fatbinary, and
the raw .cubin files a package such as flashinfer-cubin ships), and the C++ string ABI.
"""
from __future__ import annotations

import re
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rig.core import RigError, progress, wheelfile
from rig.core.check import Check
from rig.core.elf import SharedObject, cubin_arch, read_shared_object
from rig.core.escape import inline
from rig.core.fs import MAX_READ
from rig.core.proc import run, venv_python
from rig.cuda.ldconfig import cache as linker_cache
from rig.python.introspect import held

# toolkit libraries whose soname major is the CUDA major (the driver's libcuda.so.1 is not one)
CUDA_SONAME = re.compile(r"^lib(cudart|nvrtc|nvrtc-builtins|cublas|cublasLt|cufft|curand|cusolver|cusparse|"
                         r"nvJitLink|cupti|npp\w*|nvjpeg)\.so\.(\d+)")
# mangled names inside torch's namespaces: at::, c10::, torch::, caffe2::
TORCH_SYMBOL = re.compile(r"^_Z.*?(2at|3c10|5torch|6caffe2)[0-9A-Z]")
SYSTEM_LIBS = re.compile(r"^(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|ld-linux[-\w]*)\.so")


def object_notes(name: str, archs: list[str], cubins: list[str], ptx: list[str]) -> list[str]:
    """Each object loads its own kernels, so what the union of a package's objects hides is named per object:
    a target this one cannot run at all (sgl-kernel's FlashAttention-3 ops have no sm_120), and an
    arch-specific (a) target it serves only from another arch's SASS or from PTX (JIT at first load,
    without the a-only instructions). Notes, not errors: packages ship per-arch objects on purpose."""
    found = []
    for target in archs:
        how, own = covers(target, cubins, ptx), f"sm_{target.replace('.', '')}"
        if not how:
            found.append(f"{name}: no kernel image for {target} (it has "
                         f"{', '.join(['sm_' + a for a in cubins] + ['compute_' + a for a in ptx])})")
        elif target.endswith("a") and how != f"cubin {own}":
            found.append(f"{name}: {target} runs {how}, not {own} SASS")
    return found


CUBIN_LIMIT = 512 << 20  # bytes: far above any kernel image; a larger "cubin" is not one


def cubin_archs(images) -> list[tuple[str, str]]:
    """(name, arch) of each (name, bytes) in IMAGES, which may be a generator: one image is held at a time."""
    return [(name, cubin_arch(data, name)) for name, data in images]


def covers(target: str, cubins: list[str], ptx: list[str]) -> str | None:
    """How TARGET (e.g. 12.0a) can run this code: a cubin, PTX to JIT, or None (no kernel image).
    Arch-specific code (a) runs on its own arch only; family code (f) and plain code on their major at the
    same or a higher minor, plain PTX on any later arch."""
    major, minor_text = target.split(".")
    specific = minor_text.endswith("a")
    minor = int(minor_text.rstrip("a"))
    exact = target.replace(".", "")
    if exact in cubins:
        return f"cubin sm_{exact}"
    for arch in cubins:  # SASS runs on its own major at the same or a higher minor
        m = re.fullmatch(r"(\d+)(\d)([af]?)", arch)
        if m and int(m[1]) == int(major) and int(m[2]) <= minor and (
                m[3] != "a" or (specific and int(m[2]) == minor)):
            return f"cubin sm_{arch}"
    for arch in ptx:  # PTX JITs forward, except arch-specific (a) PTX, which is for its own arch only
        m = re.fullmatch(r"(\d+)(\d)([af]?)", arch)
        if m and (m[3] == "a" and f"{m[1]}.{m[2]}a" == target or
                  m[3] == "f" and int(m[1]) == int(major) and int(m[2]) <= minor or
                  not m[3] and (int(m[1]), int(m[2])) <= (int(major), minor)):
            return f"PTX compute_{arch}"
    return None


# ------------------------------------------------------------------ torch

@dataclass
class Torch:
    version: str
    exported: set[str]
    cxx11_abi: bool | None


def torch_from_dir(lib_dir: Path, version: str) -> Torch:
    exported: set[str] = set()
    for lib in sorted(lib_dir.glob("lib*.so*")):
        exported |= read_shared_object(lib, lib.name, device_code=False).defined
    if not exported:
        raise RigError(f"no torch libraries in {lib_dir}")
    return Torch(version, exported, abi_of(exported))


def torch_from_wheel(wheel: Path) -> Torch:
    """The torch a wheel file would install: its version and exported symbols."""
    with wheelfile.opened(wheel) as archive, tempfile.TemporaryDirectory() as tmp:
        version = (wheel.name.split("-") + ["unknown"])[1]
        for info in archive.infolist():
            if info.filename.startswith("torch/lib/lib") and ".so" in info.filename:
                wheelfile.unpack(archive, info, Path(tmp))
        return torch_from_dir(Path(tmp) / "torch" / "lib", version)


def abi_of(symbols: set[str]) -> bool | None:
    """True for the C++11 std::string ABI, False for the old one, None when the names do not say."""
    torchy = [s for s in symbols if TORCH_SYMBOL.match(s)]
    if any("St7__cxx1112basic_string" in s for s in torchy):
        return True
    if any("Ss" in s for s in torchy):  # "Ss": the pre-C++11 std::string, by its mangling abbreviation
        return False
    return None


# ------------------------------------------------------------------ the audit

def demangle(names: list[str]) -> list[str]:
    tool = shutil.which("c++filt")
    if not tool or not names:
        return names
    done = run([tool], "demangling symbols", input="\n".join(names), ok=None, timeout=120)
    return done.stdout.splitlines() if done.returncode == 0 else names


def _resolvable(soname: str, search: list[Path], loader_cache: set[str]) -> bool:
    return bool(SYSTEM_LIBS.match(soname)) or soname in loader_cache or any((d / soname).exists() for d in search)


def shared_objects(root: Path) -> list[tuple[Path, str]]:
    return [(p, str(p.relative_to(root))) for p in sorted(root.rglob("*.so*"))
            if p.is_file() and not p.is_symlink() and re.search(r"\.so(\.\d+)*$", p.name)]


def audit_files(files: list[tuple[Path, str]], label: str, metadata: str | None, *, cuda_major: int,
                archs: list[str], torch: Torch | None, extra_dirs: list[Path], resolve: bool,
                cubins: list[tuple[str, str]] | None = None) -> dict:
    """Audit shared objects (path, name to report) and raw kernel images (CUBINS: name, arch) that make up
    one artifact.

    RESOLVE: check that each needed soname is found where it will load (the venv's
    torch and NVIDIA wheel libraries, RUNPATH, this host's loader cache); the
    driver's libcuda.so.1 is left to `rig doctor`. The SASS and PTX archs are read from each object's fat
    binaries by rig itself (rig.core.elf), with no cuobjdump; what it could not read is UNREAD, with why.
    """
    errors, objects, notes, unread = [], [], [], []
    cubins = cubins or []
    cache = set(linker_cache()) if resolve else set()
    union_cubins, union_ptx = {arch for _, arch in cubins}, set()
    if not files and not cubins:
        errors.append(f"{label} holds no shared objects and no kernel images")
    for path, rel in files:
        so = read_shared_object(path, rel)
        unread += [f"{rel}: {why}" for why in so.unread]
        search = [Path(d.replace("$ORIGIN", str(path.parent))) for d in so.runpath] + extra_dirs
        row: dict[str, Any] = {"object": rel, "needed_cuda": [], "unresolved_sonames": [], "unresolved_torch": [],
                               "cubins": [], "ptx": []}
        errors += _needed(so, rel, row, cuda_major, search if resolve else None, cache, torch)
        if torch:
            errors += _against_torch(so, rel, row, torch)
        if so.has_fatbin:
            row["cubins"], row["ptx"] = so.cubins, so.ptx
            union_cubins |= set(row["cubins"])
            union_ptx |= set(row["ptx"])
            notes += object_notes(rel, archs, row["cubins"], row["ptx"])
        objects.append(row)
    pin = _torch_pin(metadata, label)
    if pin and torch and not pin.specifier.contains(torch.version.split("+")[0], prereleases=True):
        errors.append(f"{label} requires {pin}, the torch in use is {torch.version}")
    coverage = _coverage(label, archs, union_cubins, union_ptx, cubins, errors)
    per_arch = Counter(arch for _, arch in cubins)
    return {"artifact": label, "ok": not errors, "errors": errors, "torch_pin": str(pin) if pin else None,
            "torch": torch.version if torch else None, "cuda_major": cuda_major,
            "cubins": sorted(union_cubins), "ptx": sorted(union_ptx), "archs": coverage, "objects": objects,
            "cubin_files": dict(sorted(per_arch.items())), "notes": notes, "unread": unread}


def _needed(so: SharedObject, rel: str, row: dict, cuda_major: int, search: list[Path] | None, cache: set[str],
            torch: Torch | None) -> list[str]:
    """The errors of SO's needed sonames: another CUDA major's library, or (SEARCH given) one that resolves nowhere
    on this host (the driver's libcuda.so.1 and, with TORCH, torch's own libraries aside); ROW notes them."""
    errors = []
    for soname in so.needed:
        match = CUDA_SONAME.match(soname)
        if match:
            row["needed_cuda"].append(soname)
            if int(match[2]) != cuda_major:
                errors.append(f"{rel} needs {soname}, a CUDA {match[2]} library, in a CUDA {cuda_major} stack")
        if search is not None and not _resolvable(soname, search, cache) and not (
                soname == "libcuda.so.1" or torch and re.match(r"lib(torch|c10|shm)", soname)):
            row["unresolved_sonames"].append(soname)
            errors.append(f"{rel} needs {soname}, which resolves nowhere on this host")
    return errors


def _against_torch(so: SharedObject, rel: str, row: dict, torch: Torch) -> list[str]:
    """The errors of SO against TORCH: symbols it does not export, another C++11 ABI; ROW notes them."""
    errors = []
    missing = sorted(s for s in so.undefined if TORCH_SYMBOL.match(s) and s not in torch.exported)
    if missing:
        row["unresolved_torch"] = demangle(missing)
        errors.append(f"{rel}: {len(missing)} torch symbol(s) that torch {torch.version} does not export, "
                      f"e.g. {row['unresolved_torch'][0]}")
    mine = abi_of(so.undefined)
    if mine is not None and torch.cxx11_abi is not None and mine != torch.cxx11_abi:
        errors.append(f"{rel} uses _GLIBCXX_USE_CXX11_ABI={int(mine)}, torch {torch.version} "
                      f"uses {int(torch.cxx11_abi)}")
    row["cxx11_abi"] = mine
    return errors


def _coverage(label: str, archs: list[str], union_cubins: set[str], union_ptx: set[str],
              cubins: list[tuple[str, str]], errors: list[str]) -> dict:
    """Whether the artifact's SASS or PTX covers each of ARCHS (where it has any); an error into ERRORS for each
    it does not."""
    coverage: dict[str, str | None] = {}
    if not (union_cubins or union_ptx):
        return coverage
    for target in archs:
        coverage[target] = covers(target, sorted(union_cubins), sorted(union_ptx))
        if not coverage[target]:
            # prebuilt .cubin files are not rebuilt for another arch: the fix is to leave them out
            fix = (f" ({len(cubins)} .cubin files): leave the prebuilt kernels out (for flashinfer-cubin, "
                   f"flashinfer.cubin: false in the stack, and flashinfer JIT-compiles for {target}) or lock a "
                   f"version that ships SASS for {target}") if cubins else ""
            errors.append(f"no kernel image for {target}: {label} has cubins "
                          f"{', '.join('sm_' + a for a in sorted(union_cubins)) or 'none'} and PTX "
                          f"{', '.join('compute_' + a for a in sorted(union_ptx)) or 'none'}{fix}")
    return coverage


def _torch_pin(metadata: str | None, label: str):
    """The torch requirement of a wheel's METADATA (not an extra's), read by the one Requires-Dist reader."""
    if not metadata:
        return None
    for req in wheelfile.requires_dist(metadata, label):
        if req.name.lower() == "torch" and not (req.marker and "extra" in str(req.marker)):
            req.marker = None
            return req
    return None


def audit_wheel(wheel: Path, **kw) -> dict:
    """Unpack only the wheel's shared objects and metadata, read its .cubin files in place, then audit them."""
    with wheelfile.opened(wheel) as archive, tempfile.TemporaryDirectory() as tmp:
        metadata = None
        images = []
        for info in archive.infolist():
            if info.filename.endswith(".dist-info/METADATA"):
                metadata = wheelfile.read(archive, info, MAX_READ).decode()
            elif re.search(r"\.so(\.\d+)*$", info.filename):
                wheelfile.unpack(archive, info, Path(tmp))
            elif info.filename.endswith(".cubin"):
                if info.file_size > CUBIN_LIMIT:
                    raise RigError(f"{wheel.name}: {info.filename} is {info.file_size >> 20} MiB, larger than any "
                                   "kernel image; the wheel is not one rig audits")
                images.append(info)
        progress(f"auditing {wheel.name}" + (f" ({len(images)} .cubin files)" if images else ""))
        return audit_files(shared_objects(Path(tmp)), wheel.name, metadata,
                           cubins=cubin_archs((i.filename, wheelfile.read(archive, i, CUBIN_LIMIT)) for i in images),
                           **kw)


def venv_context(venv: Path, names: list[str]) -> tuple[Torch | None, list[Path], dict]:
    """The venv's torch, the library dirs its wheels bring (torch preloads them), and NAMES installed there
    (each with its version, METADATA and .so/.cubin files)."""
    found = held(venv_python(venv), ["torch", *names], files=True, metadata=True, modules=("nvidia",))
    wheel = found.packages.get("torch")
    lib = Path(wheel["root"]) / "torch" / "lib" if wheel else None
    torch = torch_from_dir(lib, wheel["version"]) if lib and wheel else None
    dirs = [lib] if lib else []
    # the nvidia-* wheels share the namespace package nvidia: wherever the venv's Python imports it from (a .pth
    # directory over a machine's site-packages too)
    dirs += sorted(p for root in found.modules["nvidia"] for p in root.glob("*/lib") if p.is_dir())
    return torch, dirs, {name: found.packages[name] for name in names if name in found.packages}


def context(stack: dict, venv: str | None, torch_path: str | None, names: list[str]) -> tuple[dict, dict]:
    """(what every artifact is held to: the stack's CUDA major and archs, the torch of VENV or TORCH_PATH, the
    library dirs VENV brings; the distributions NAMES installed in VENV)."""
    torch, installed = None, None
    extra_dirs: list[Path] = []
    if venv:
        torch, extra_dirs, installed = venv_context(Path(venv), names)
    if torch_path:
        path = Path(torch_path)
        torch = torch_from_wheel(path) if path.suffix == ".whl" else torch_from_dir(path, "unknown")
    common = {"cuda_major": int(stack["cuda"]["version"].split(".")[0]), "archs": stack["archs"], "torch": torch,
              "extra_dirs": extra_dirs, "resolve": bool(venv)}
    return common, installed or {}


def audit_path(target: str, installed: dict, common: dict) -> dict:
    """A wheel file, a shared object, a directory, or a distribution installed in --venv."""
    path = Path(target)
    if path.suffix == ".whl" and path.is_file():
        return audit_wheel(path, **common)
    if path.is_file():
        return audit_files([(path, path.name)], path.name, None, **common)
    if path.is_dir():
        found = sorted(path.rglob("*.cubin"))
        images = [(p, str(p.relative_to(path))) for p in found if not p.is_symlink() and not p.is_dir()]
        report = audit_files(shared_objects(path), str(path), None, cubins=_read_cubins(images), **common)
        report["notes"] += [f"{p.relative_to(path)}: a link, not followed and not audited"
                            for p in found if p.is_symlink()]
        return report
    if target in installed:
        dist = installed[target]
        files = [(Path(f), Path(f).name) for f in dist["files"] if re.search(r"\.so(\.\d+)*$", f)]
        images = [(Path(f), Path(f).name) for f in dist["files"] if f.endswith(".cubin")]
        return audit_files(files, f"{target} {dist['version']}", dist["metadata"], cubins=_read_cubins(images),
                           **common)
    raise RigError(f"{target}: no such wheel, shared object or directory, nor a distribution installed in "
                   "--venv; give a path, or --venv with the distribution's name")


def _read_cubins(images: list[tuple[Path, str]]) -> list[tuple[str, str]]:
    from rig.core.fs import read_bytes

    return cubin_archs((name, read_bytes(path, "CUDA kernel image", CUBIN_LIMIT)) for path, name in images)


def verdict(report: dict) -> str:
    """fail on any error; warn where nothing failed but part of the artifact could not be read; else pass."""
    return "fail" if not report["ok"] else "warn" if report.get("unread") else "pass"


def as_check(report: dict, layer: str = "kernels", name: str = "", fix: str = "") -> Check:
    """One artifact's verdict in the one report model: `rig audit --junit`, and doctor's audit of the venv."""
    coverage = ", ".join(f"{target}: {how or 'no kernel image'}" for target, how in report["archs"].items())
    unread = [f"not read: {why}" for why in report.get("unread", [])]
    coverage = coverage or ("no device code read" if unread else "no device code")  # not "none there"
    status = verdict(report)
    return Check(layer, name or report["artifact"], status,
                 f"{report['artifact']}: " + "; ".join([coverage, *report["notes"], *unread]),
                 fix if status != "warn" else "see the detail: what rig could not read of it is not judged",
                 question=f"does {report['artifact']} load and run for the stack's CUDA and archs?",
                 problems=[f"{report['artifact']}: {e}" for e in report["errors"]])


def render(reports: list[dict]) -> str:
    """The reports for a person, one line each thing: every name from the files (an artifact's path, a member's,
    what could not be read) shown within its line (escape.inline), so a name holding a newline forges no line."""
    lines = []
    for r in reports:
        lines.append(f"{verdict(r).upper()}  {inline(r['artifact'])}  (CUDA {r['cuda_major']} stack, "
                     f"torch {inline(r['torch'] or 'not given')}"
                     f"{', pins ' + inline(r['torch_pin']) if r['torch_pin'] else ''})")
        if r["cubins"] or r["ptx"]:
            lines.append(f"      cubins: {' '.join('sm_' + a for a in r['cubins']) or 'none'}; "
                         f"PTX: {' '.join('compute_' + a for a in r['ptx']) or 'none'}")
            if r["cubin_files"]:
                lines.append("      .cubin files: " + ", ".join(f"{inline(n)} sm_{a}" for a, n in r["cubin_files"].items()))
            lines += [f"      {target}: {how or 'NO KERNEL IMAGE'}" for target, how in r["archs"].items()]
        cuda = sorted({s for o in r["objects"] for s in o["needed_cuda"]})
        if cuda:
            lines.append(f"      CUDA libraries: {inline(' '.join(cuda))}")
        lines += [f"  note: {inline(n)}" for n in r["notes"]]
        lines += [f"  not read: {inline(u)}" for u in r.get("unread", [])]
        lines += [f"  error: {inline(e)}" for e in r["errors"]]
    return "\n".join(lines)
