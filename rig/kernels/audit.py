"""Audit kernel wheels, installed packages and shared objects before anything loads them.

From the files alone: the CUDA sonames each object needs (major against the
stack's, and whether the host can resolve them), the torch symbols it expects
against those the torch in use exports, the torch its metadata pins, its
cubin/PTX archs against the stack's targets (those inside each object's fatbinary, and
the raw .cubin files a package such as flashinfer-cubin ships), and the C++ string ABI.
"""
from __future__ import annotations

import email.parser
import mmap
import re
import shutil
import struct
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rig.core import RigError, progress, wheelfile
from rig.core.check import Check
from rig.core.fs import MAX_READ, open_regular
from rig.core.proc import run, venv_python
from rig.cuda.ldconfig import cache as linker_cache
from rig.python.introspect import held

# toolkit libraries whose soname major is the CUDA major (the driver's libcuda.so.1 is not one)
CUDA_SONAME = re.compile(r"^lib(cudart|nvrtc|nvrtc-builtins|cublas|cublasLt|cufft|curand|cusolver|cusparse|"
                         r"nvJitLink|cupti|npp\w*|nvjpeg)\.so\.(\d+)")
# mangled names inside torch's namespaces: at::, c10::, torch::, caffe2::
TORCH_SYMBOL = re.compile(r"^_Z.*?(2at|3c10|5torch|6caffe2)[0-9A-Z]")
SYSTEM_LIBS = re.compile(r"^(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|ld-linux[-\w]*)\.so")


@dataclass
class SharedObject:
    name: str
    needed: list[str]
    runpath: list[str]
    undefined: set[str]
    defined: set[str]
    has_fatbin: bool
    cubins: list[str] = field(default_factory=list)
    ptx: list[str] = field(default_factory=list)


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


# ELF64, little-endian: the header's fields up to the section table, a section header, a dynamic symbol, a
# dynamic entry. Read with struct over a read-only map, not pyelftools: torch's libraries export ~130,000
# symbols, which pyelftools parses one by one in Python about as slowly as it reads cubins.
ELF_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
SECTION = struct.Struct("<IIQQQQIIQQ")  # name, type, flags, addr, offset, size, link, info, addralign, entsize
SYMBOL = struct.Struct("<IBBHQQ")  # name, info, other, shndx, value, size
DYNAMIC = struct.Struct("<qQ")  # tag, value
SHT_DYNAMIC, SHT_NOBITS, SHT_DYNSYM = 6, 8, 11
DT_NULL, DT_NEEDED, DT_RPATH, DT_RUNPATH = 0, 1, 15, 29


def read_elf(path: Path, name: str) -> SharedObject:
    """What the dynamic linker sees of a shared object: DT_NEEDED, the run paths, the dynamic symbols it
    needs and defines, and whether it carries a CUDA fat binary."""
    with open_regular(path, "shared object") as handle:  # never a FIFO or a device a RECORD names
        try:
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:  # an empty file cannot be mapped
            raise RigError(f"{name} is not an ELF shared object: {exc}") from exc
        with data:
            return _parse_elf(data, name)


def _parse_elf(data: mmap.mmap, name: str) -> SharedObject:
    def bad(why: str) -> RigError:
        return RigError(f"{name} is not an ELF shared object rig can read: {why}")

    def blob(section: tuple) -> bytes:
        offset, size = section[4], section[5]
        if section[1] == SHT_NOBITS:
            return b""
        if offset + size > len(data):
            raise bad("a section runs past the end of the file")
        return data[offset:offset + size]

    def text(table: bytes, at: int) -> str:
        end = table.find(b"\0", at)
        if at >= len(table) or end < 0:
            raise bad("a name points outside its string table")
        return table[at:end].decode("utf-8", "replace")

    if len(data) < ELF_HEADER.size or data[:4] != b"\x7fELF":
        raise bad("no ELF header")
    if data[4:6] != b"\x02\x01":
        raise bad("not a 64-bit little-endian ELF file")
    *_, shoff, _, _, _, _, shentsize, shnum, shstrndx = ELF_HEADER.unpack_from(data)
    if shnum and (shentsize != SECTION.size or shoff + shnum * SECTION.size > len(data) or shstrndx >= shnum):
        raise bad("its section table is malformed")
    sections = [SECTION.unpack_from(data, shoff + i * SECTION.size) for i in range(shnum)]

    def linked(section: tuple) -> bytes:
        if section[6] >= shnum:
            raise bad("a section links to one that does not exist")
        return blob(sections[section[6]])

    names = blob(sections[shstrndx]) if shnum else b""
    needed: list[str] = []
    runpath: list[str] = []
    undefined: set[str] = set()
    defined: set[str] = set()
    for section in sections:
        if section[1] == SHT_DYNAMIC:
            strings, entries = linked(section), blob(section)
            for tag, value in DYNAMIC.iter_unpack(entries[:len(entries) - len(entries) % DYNAMIC.size]):
                if tag == DT_NULL:
                    break
                if tag == DT_NEEDED:
                    needed.append(text(strings, value))
                elif tag in (DT_RPATH, DT_RUNPATH):
                    runpath += text(strings, value).split(":")
        elif section[1] == SHT_DYNSYM:
            strings, entries = linked(section), blob(section)
            for at, _, _, shndx, _, _ in SYMBOL.iter_unpack(entries[:len(entries) - len(entries) % SYMBOL.size]):
                if at:
                    (defined if shndx else undefined).add(text(strings, at))
    fatbin = any(text(names, section[0]) == ".nv_fatbin" for section in sections)
    return SharedObject(name, needed, runpath, undefined, defined, fatbin)


def cuda_archs(path: Path, cuobjdump: Path) -> tuple[list[str], list[str]]:
    """(cubin archs, PTX archs) embedded in PATH."""
    found = []
    for flag in ("--list-elf", "--list-ptx"):
        done = run([str(cuobjdump), flag, str(path)], f"listing the CUDA archs in {path}", ok=None)
        if done.returncode != 0 and "does not contain" not in done.stderr:
            raise RigError(f"cuobjdump cannot read {path}: {done.stderr.strip()}")
        found.append(sorted(set(re.findall(r"\b(?:sm|compute)_(\d+[a-z]?)\b", done.stdout))))
    return found[0], found[1]


CUBIN_LIMIT = 512 << 20  # bytes: far above any kernel image; a larger "cubin" is not one
CUDA_ARCH_OPTION = re.compile(rb"-arch sm_(\d{2,3})([af]?)\b")
MAX_NOTE = 64 << 10  # bytes: ptxas's toolkit note is a few hundred
TKINFO = b".note.nv.tkinfo\0"
EM_CUDA, SHT_NOTE = 190, 7


def cubin_arch(data: bytes, name: str) -> str:
    """The SM a raw CUDA ELF (a .cubin file) holds SASS for, spelt as cuobjdump does after sm_ (120, 120a,
    100f). The number is in e_flags: bits 8-15 from ELF ABI 8 (CUDA 12.8 on), bits 0-7 before. The arch-specific
    (a) or family (f) suffix is only in the -arch that ptxas records in .note.nv.tkinfo; without it, the plain SM.
    Read with struct, not pyelftools: a cubin wheel holds thousands, and pyelftools reads them ~100x slower
    (`python scripts/bench.py cubins`)."""
    def bad(why: str) -> RigError:
        return RigError(f"{name} is not a CUDA kernel image (cubin) rig can read: {why}")

    if len(data) < 64 or data[:6] != b"\x7fELF\x02\x01":
        raise bad("not a 64-bit little-endian ELF file")
    machine, = struct.unpack_from("<H", data, 18)
    if machine != EM_CUDA:
        raise bad(f"its ELF machine is {machine}, not CUDA's {EM_CUDA}")
    flags, = struct.unpack_from("<I", data, 48)
    sm = (flags >> 8) & 0xFF if data[8] >= 8 else flags & 0xFF
    if sm < 20:  # sm_20 is the oldest SASS there was
        raise bad(f"its e_flags {flags:#x} name no SM (sm_{sm})")
    section_table, = struct.unpack_from("<Q", data, 40)
    entry_size, count, names_index = struct.unpack_from("<HHH", data, 58)
    if entry_size != 64 or names_index >= count or section_table + count * 64 > len(data):
        raise bad("its section table lies outside the file")
    sections = [struct.unpack_from("<II16xQQ", data, section_table + i * 64) for i in range(count)]
    names_at, names_size = sections[names_index][2:4]

    def body(offset: int, size: int) -> bytes:
        if offset + size > len(data):
            raise bad("a section lies outside the file")
        return data[offset:offset + size]

    names = body(names_at, names_size)
    option = None
    for name_at, kind, offset, size in sections:
        if kind == SHT_NOTE and names[name_at:name_at + len(TKINFO)] == TKINFO:
            if size > MAX_NOTE:
                raise bad(f"its toolkit note is {size} bytes, far more than ptxas writes")
            option = CUDA_ARCH_OPTION.search(body(offset, size))
            break  # the first is ptxas's: a crafted file may carry thousands
    return f"{sm}{option[2].decode()}" if option and int(option[1]) == sm else str(sm)


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
        exported |= read_elf(lib, lib.name).defined
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
    done = run([tool], "demangling symbols", input="\n".join(names), ok=None)
    return done.stdout.splitlines() if done.returncode == 0 else names


def _resolvable(soname: str, search: list[Path], loader_cache: set[str]) -> bool:
    return bool(SYSTEM_LIBS.match(soname)) or soname in loader_cache or any((d / soname).exists() for d in search)


def shared_objects(root: Path) -> list[tuple[Path, str]]:
    return [(p, str(p.relative_to(root))) for p in sorted(root.rglob("*.so*"))
            if p.is_file() and not p.is_symlink() and re.search(r"\.so(\.\d+)*$", p.name)]


def audit_files(files: list[tuple[Path, str]], label: str, metadata: str | None, *, cuda_major: int,
                archs: list[str], torch: Torch | None, extra_dirs: list[Path], cuobjdump: Path | None,
                resolve: bool, cubins: list[tuple[str, str]] | None = None) -> dict:
    """Audit shared objects (path, name to report) and raw kernel images (CUBINS: name, arch) that make up
    one artifact.

    RESOLVE: check that each needed soname is found where it will load (the venv's
    torch and NVIDIA wheel libraries, RUNPATH, this host's loader cache); the
    driver's libcuda.so.1 is left to `rig doctor`. Without CUOBJDUMP (no cuobjdump
    at hand) archs are not read.
    """
    errors, objects, notes = [], [], []
    cubins = cubins or []
    cache = set(linker_cache()) if resolve else set()
    union_cubins, union_ptx = {arch for _, arch in cubins}, set()
    if not files and not cubins:
        errors.append(f"{label} holds no shared objects and no kernel images")
    for path, rel in files:
        so = read_elf(path, rel)
        search = [Path(d.replace("$ORIGIN", str(path.parent))) for d in so.runpath] + extra_dirs
        row: dict[str, Any] = {"object": rel, "needed_cuda": [], "unresolved_sonames": [], "unresolved_torch": [],
                               "cubins": [], "ptx": []}
        for soname in so.needed:
            match = CUDA_SONAME.match(soname)
            if match:
                row["needed_cuda"].append(soname)
                if int(match[2]) != cuda_major:
                    errors.append(f"{rel} needs {soname}, a CUDA {match[2]} library, in a CUDA {cuda_major} stack")
            if resolve and not _resolvable(soname, search, cache) and not (
                    soname == "libcuda.so.1" or torch and re.match(r"lib(torch|c10|shm)", soname)):
                row["unresolved_sonames"].append(soname)
                errors.append(f"{rel} needs {soname}, which resolves nowhere on this host")
        if torch:
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
        if so.has_fatbin and cuobjdump:
            row["cubins"], row["ptx"] = cuda_archs(path, cuobjdump)
            union_cubins |= set(row["cubins"])
            union_ptx |= set(row["ptx"])
            notes += object_notes(rel, archs, row["cubins"], row["ptx"])
        objects.append(row)
    pin = _torch_pin(metadata)
    if pin and torch:
        from packaging.requirements import Requirement

        if not Requirement(pin).specifier.contains(torch.version.split("+")[0], prereleases=True):
            errors.append(f"{label} requires {pin}, the torch in use is {torch.version}")
    coverage = {}
    if union_cubins or union_ptx:
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
    per_arch = Counter(arch for _, arch in cubins)
    return {"artifact": label, "ok": not errors, "errors": errors, "torch_pin": pin,
            "torch": torch.version if torch else None, "cuda_major": cuda_major,
            "cubins": sorted(union_cubins), "ptx": sorted(union_ptx), "archs": coverage, "objects": objects,
            "cubin_files": dict(sorted(per_arch.items())), "notes": notes}


def _torch_pin(metadata: str | None) -> str | None:
    if not metadata:
        return None
    for req in email.parser.Parser().parsestr(metadata).get_all("Requires-Dist") or []:
        if re.match(r"torch\b(?![-_.\w])", req) and "extra ==" not in req:
            return req.split(";")[0].strip()
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
    found = held(venv_python(venv), ["torch", *names], files=True, metadata=True)
    wheel = found.packages.get("torch")
    lib = Path(wheel["root"]) / "torch" / "lib" if wheel else None
    torch = torch_from_dir(lib, wheel["version"]) if lib and wheel else None
    dirs = [lib] if lib else []
    dirs += sorted(p for p in found.site.glob("nvidia/*/lib") if p.is_dir())
    return torch, dirs, {name: found.packages[name] for name in names if name in found.packages}


def context(stack: dict, venv: str | None, torch_path: str | None, names: list[str],
            cache: str | Path) -> tuple[dict, dict]:
    """(what every artifact is held to: the stack's CUDA major and archs, the torch of VENV or TORCH_PATH, the
    library dirs VENV brings, cuobjdump; the distributions NAMES installed in VENV)."""
    from rig.python.tools import fetch_tool

    torch, installed = None, None
    extra_dirs: list[Path] = []
    if venv:
        torch, extra_dirs, installed = venv_context(Path(venv), names)
    if torch_path:
        path = Path(torch_path)
        torch = torch_from_wheel(path) if path.suffix == ".whl" else torch_from_dir(path, "unknown")
    common = {"cuda_major": int(stack["cuda"]["version"].split(".")[0]), "archs": stack["archs"], "torch": torch,
              "extra_dirs": extra_dirs, "cuobjdump": fetch_tool("cuobjdump", cache), "resolve": bool(venv)}
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


def as_check(report: dict, layer: str = "kernels", name: str = "", fix: str = "",
             uncovered: str = "no device code") -> Check:
    """One artifact's verdict in the one report model: `rig audit --junit`, and doctor's audit of the venv.
    UNCOVERED: what to say where no arch was read."""
    coverage = ", ".join(f"{target}: {how or 'no kernel image'}" for target, how in report["archs"].items())
    coverage = coverage or uncovered
    return Check(layer, name or report["artifact"], "pass" if report["ok"] else "fail",
                 f"{report['artifact']}: " + "; ".join([coverage, *report["notes"]]), fix,
                 question=f"does {report['artifact']} load and run for the stack's CUDA and archs?",
                 problems=[f"{report['artifact']}: {e}" for e in report["errors"]])


def render(reports: list[dict]) -> str:
    lines = []
    for r in reports:
        lines.append(f"{'PASS' if r['ok'] else 'FAIL'}  {r['artifact']}  (CUDA {r['cuda_major']} stack, "
                     f"torch {r['torch'] or 'not given'}{', pins ' + r['torch_pin'] if r['torch_pin'] else ''})")
        if r["cubins"] or r["ptx"]:
            lines.append(f"      cubins: {' '.join('sm_' + a for a in r['cubins']) or 'none'}; "
                         f"PTX: {' '.join('compute_' + a for a in r['ptx']) or 'none'}")
            if r["cubin_files"]:
                lines.append("      .cubin files: " + ", ".join(f"{n} sm_{a}" for a, n in r["cubin_files"].items()))
            lines += [f"      {target}: {how or 'NO KERNEL IMAGE'}" for target, how in r["archs"].items()]
        cuda = sorted({s for o in r["objects"] for s in o["needed_cuda"]})
        if cuda:
            lines.append(f"      CUDA libraries: {' '.join(cuda)}")
        lines += [f"  note: {n}" for n in r["notes"]]
        lines += [f"  error: {e}" for e in r["errors"]]
    return "\n".join(lines)
