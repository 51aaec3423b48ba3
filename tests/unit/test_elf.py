"""rig's one ELF reader (rig.core.elf) on real objects: needed libraries from the program headers, with the
section table there or stripped as sstrip leaves it; the SASS and PTX archs of CUDA fat binaries, from
nvcc's own output where a CUDA toolkit is at hand, and from fat binaries laid out by their documented layout
around the suite's cubin everywhere; damaged input is a RigError, never a crash."""
from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_audit import cuda_elf

from rig.core import RigError
from rig.core.elf import fatbin_archs, parse_shared_object, read_shared_object
from rig.kernels.audit import as_check, audit_path

CC = shutil.which("cc") or shutil.which("gcc")
NVCC = shutil.which("nvcc")
COMMON = {"cuda_major": 13, "archs": ["12.0a"], "torch": None, "extra_dirs": [], "resolve": False}


def strip_sections(data: bytes) -> bytes:
    """What sstrip leaves: the section table gone (e_shoff, e_shnum, e_shstrndx 0), the file cut after the
    last byte a segment maps."""
    phoff, = struct.unpack_from("<Q", data, 32)
    phnum, = struct.unpack_from("<H", data, 56)
    end = max(offset + size for kind, _, offset, _, _, size, _, _ in
              (struct.unpack_from("<IIQQQQQQ", data, phoff + 56 * i) for i in range(phnum)))
    out = bytearray(data[:max(end, phoff + 56 * phnum)])
    struct.pack_into("<Q", out, 40, 0)
    struct.pack_into("<HHH", out, 58, 0, 0, 0)
    return bytes(out)


@pytest.fixture(scope="module")
def cuda12_object(tmp_path_factory) -> Path:
    """A shared object built here that needs libcudart.so.12 (a stub of that soname) and carries a RUNPATH."""
    if not CC:
        pytest.skip("no C compiler here")
    d = tmp_path_factory.mktemp("cc")
    (d / "stub.c").write_text("int cudaGetDeviceCount(int *n) { *n = 0; return 0; }\n")
    (d / "ops.c").write_text("int cudaGetDeviceCount(int *);\nint ops_count(void) { int n; "
                             "cudaGetDeviceCount(&n); return n; }\n")
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(d / "libcudart.so.12"), str(d / "stub.c"),
                    "-Wl,-soname,libcudart.so.12"], check=True)
    for style in ("gnu", "sysv"):  # the loader's two hash tables: each says how many dynamic symbols there are
        subprocess.run([CC, "-shared", "-fPIC", "-o", str(d / f"ops-{style}.so"), str(d / "ops.c"), f"-L{d}",
                        "-l:libcudart.so.12", "-Wl,-rpath,$ORIGIN/../lib", f"-Wl,--hash-style={style}"],
                       check=True)
    return d


@pytest.mark.parametrize("style", ["gnu", "sysv"])
def test_needed_libraries_are_read_from_the_program_headers_with_or_without_a_section_table(cuda12_object,
                                                                                           style, tmp_path):
    whole = (cuda12_object / f"ops-{style}.so").read_bytes()
    stripped = tmp_path / "ops.so"
    stripped.write_bytes(strip_sections(whole))
    seen = parse_shared_object(whole, "ops.so")
    bare = read_shared_object(stripped, "ops.so")
    assert "libcudart.so.12" in seen.needed and seen.runpath == ["$ORIGIN/../lib"]
    assert "ops_count" in seen.defined and "cudaGetDeviceCount" in seen.undefined
    assert (bare.needed, bare.runpath, bare.defined, bare.undefined) == \
        (seen.needed, seen.runpath, seen.defined, seen.undefined)
    assert not bare.unread and not bare.has_fatbin
    # and so the audit fails the stripped bytes in a CUDA 13 stack, as the loader would load CUDA 12's runtime
    report = audit_path(str(stripped), {}, COMMON)
    assert not report["ok"] and report["errors"] == [
        "ops.so needs libcudart.so.12, a CUDA 12 library, in a CUDA 13 stack"]


# ------------------------------------------------------------------ fat binaries by their documented layout

def entry(kind: int, sm: int, payload: bytes, flags: int = 0x11) -> bytes:
    """An entry: kind (1 PTX, 2 ELF), version, header size, payload size; the SM at byte 28, flags at 40."""
    header = bytearray(64)
    struct.pack_into("<HHIQ", header, 0, kind, 0x101, 64, len(payload))
    struct.pack_into("<I", header, 28, sm)
    struct.pack_into("<Q", header, 40, flags)
    return bytes(header) + payload


def fatbin(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


ZSTD = 0x8000
CUBIN_120A = cuda_elf(0x6007802)  # the suite's cubin: ptxas 13.0's flags and toolkit note for sm_120a
PTX = b"//\n.version 9.0\n.target sm_90\n"


@pytest.mark.parametrize("parts, sass, ptx", [
    ([entry(2, 120, CUBIN_120A)], ["120a"], []),                              # the cubin's own note says a
    ([entry(2, 120, cuda_elf(0x6007802, tkinfo=None), 0x100011)], ["120a"], []),  # no note: the entry's flag
    ([entry(2, 100, b"(\xb5/\xfd" + bytes(40), 0x100011 | ZSTD)], ["100a"], []),  # compressed: the entry says
    ([entry(2, 120, bytes(32), 0x200011 | 0x2000)], ["120f"], []),
    ([entry(1, 90, PTX)], [], ["90"]),
    ([entry(1, 120, b"(\xb5/\xfd" + bytes(20), 0x108011)], [], ["120a"]),
    ([entry(4, 120, b"lto ir")], [], []),                                     # another kind: neither
])
def test_a_fat_binarys_entries_say_their_kind_and_arch(parts, sass, ptx):
    assert fatbin_archs(fatbin(*parts), "ops.so") == (sass, ptx)
    # two fat binaries back to back with alignment padding, as a .nv_fatbin section holds them
    assert fatbin_archs(fatbin(*parts) + bytes(8) + fatbin(entry(1, 80, PTX)), "ops.so") == (sass, sorted([*ptx, "80"]))


@pytest.mark.parametrize("data, why", [
    (b"\x01" * 20, "no fat binary header at offset 0"),
    (fatbin(entry(1, 90, PTX))[:-3], "says it runs past its section"),
    (struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 20) + bytes(20), "an entry header at offset 16 runs past"),
    (fatbin(entry(2, 0, CUBIN_120A)), "names no SM"),
    (fatbin(entry(2, 90, CUBIN_120A)), "says sm_90, its cubin is sm_120a"),
    (fatbin(entry(2, 120, CUBIN_120A[:70])), "the cubin at offset 80 of its fat binary is not a CUDA kernel image"),
    (fatbin(entry(1, 90, PTX)) + b"\x07", "too few for a fat binary header"),
])
def test_a_damaged_fat_binary_is_named(data, why):
    with pytest.raises(RigError, match=why):
        fatbin_archs(data, "ops.so")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_damage_to_a_fat_binary_is_a_finding_or_a_reading_never_a_crash(data):
    good = bytearray(fatbin(entry(2, 120, CUBIN_120A), entry(1, 90, PTX), entry(2, 100, bytes(16), ZSTD)))
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, len(good) - 1))
        good[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(good)))
    try:
        sass, ptx = fatbin_archs(bytes(good[:cut]), "ops.so")
    except RigError as exc:
        assert str(exc).startswith("ops.so: ")
    else:
        assert all(isinstance(a, str) and a[:2].isdigit() for a in sass + ptx)


def with_section(data: bytes, name: bytes, body: bytes) -> bytes:
    """DATA (a real shared object) with one more section, NAME holding BODY, appended after everything: a new
    names table and a new section table at the end, the header pointed at them."""
    shoff, = struct.unpack_from("<Q", data, 40)
    shnum, shstrndx = struct.unpack_from("<H", data, 60)[0], struct.unpack_from("<H", data, 62)[0]
    table = [bytearray(data[shoff + 64 * i:shoff + 64 * (i + 1)]) for i in range(shnum)]
    names_at, names_size = struct.unpack_from("<QQ", table[shstrndx], 24)
    names = data[names_at:names_at + names_size] + name + b"\0"
    out = bytearray(data) + bytes(-len(data) % 8)
    body_at = len(out)
    out += body + bytes(-len(body) % 8)
    struct.pack_into("<QQ", table[shstrndx], 24, len(out), len(names))
    out += names + bytes(-len(names) % 8)
    table.append(bytearray(struct.pack("<IIQQQQIIQQ", names_size, 1, 2, 0, body_at, len(body), 0, 0, 8, 0)))
    struct.pack_into("<Q", out, 40, len(out))
    struct.pack_into("<H", out, 60, shnum + 1)
    return bytes(out + b"".join(table))


@pytest.fixture(scope="module")
def host_object() -> bytes:
    import _ctypes  # an extension module of this interpreter's: a real shared object on every build

    return Path(_ctypes.__file__).read_bytes()


def test_a_shared_objects_fat_binaries_are_read_by_section_and_without_one_by_magic(host_object, tmp_path):
    kernels = fatbin(entry(2, 120, CUBIN_120A)) + fatbin(entry(1, 90, PTX), entry(2, 100, bytes(16), ZSTD | 0x100000))
    ops = tmp_path / "ops.so"
    ops.write_bytes(with_section(host_object, b".nv_fatbin", kernels))
    seen = read_shared_object(ops, "ops.so")
    assert seen.has_fatbin and (seen.cubins, seen.ptx) == (["100a", "120a"], ["90"])
    assert seen.needed == parse_shared_object(host_object, "x").needed  # the object is whole around it
    bare = tmp_path / "bare.so"
    data = bytearray(ops.read_bytes())
    struct.pack_into("<Q", data, 40, 0)
    struct.pack_into("<HHH", data, 58, 0, 0, 0)
    bare.write_bytes(bytes(data))
    assert (lambda s: (s.has_fatbin, s.cubins, s.ptx))(read_shared_object(bare, "bare.so")) == \
        (True, ["100a", "120a"], ["90"])
    # the audit holds them to the stack's archs, and a 9.0a target has neither SASS nor usable PTX
    (tmp_path / "pkg").mkdir()
    ops.rename(tmp_path / "pkg" / "ops.so")
    report = audit_path(str(tmp_path / "pkg"), {}, {**COMMON, "archs": ["12.0a", "10.0a", "9.0a"]})
    assert report["archs"] == {"12.0a": "cubin sm_120a", "10.0a": "cubin sm_100a", "9.0a": "PTX compute_90"}
    report = audit_path(str(tmp_path / "pkg"), {}, {**COMMON, "archs": ["12.0", "8.9"]})
    assert report["archs"] == {"12.0": "PTX compute_90", "8.9": None} and not report["ok"]


def test_device_code_rig_cannot_read_is_a_warning_that_says_so_never_a_pass(host_object, tmp_path):
    (tmp_path / "lto.so").write_bytes(with_section(host_object, b".nv_fatbin", fatbin(entry(4, 120, b"ir"))))
    check = as_check(audit_path(str(tmp_path), {}, COMMON))
    assert check.status == "warn"
    assert "not read: lto.so: its fat binaries hold no SASS or PTX entry rig reads" in check.detail
    (tmp_path / "lto.so").write_bytes(with_section(host_object, b".nv_fatbin", fatbin(entry(1, 90, PTX))))
    assert as_check(audit_path(str(tmp_path), {}, COMMON)).status == "pass"


def test_a_damaged_fat_binary_in_an_object_is_named_with_the_object(host_object, tmp_path):
    (tmp_path / "ops.so").write_bytes(with_section(host_object, b".nv_fatbin", b"\x01" * 24))
    with pytest.raises(RigError, match="ops.so: its CUDA fat binary is not one rig can read: no fat binary header"):
        read_shared_object(tmp_path / "ops.so", "ops.so")


# ------------------------------------------------------------------ nvcc's own output, where there is one

@pytest.mark.skipif(not NVCC, reason="no nvcc here (tests/integration/test_wheels.py builds with one)")
def test_what_nvcc_13_writes_is_read_as_nvcc_was_asked(tmp_path):
    """Default compression (PTX compressed, SASS plain), everything compressed, and the a and f suffixes."""
    (tmp_path / "k.cu").write_text("__global__ void scale(float *x, float a) { x[threadIdx.x] *= a; }\n"
                                   "extern \"C\" void launch(float *x) { scale<<<1, 32>>>(x, 2.0f); }\n")
    jobs = [
        ([NVCC, "-shared", "-Xcompiler", "-fPIC", "-gencode", "arch=compute_120a,code=sm_120a",
          "-gencode", "arch=compute_90,code=compute_90", "k.cu", "-o", "libk.so"]),
        ([NVCC, "-fatbin", "-Xfatbin", "-compress-all", "-gencode", "arch=compute_120f,code=sm_120f",
          "-gencode", "arch=compute_100a,code=[sm_100a,compute_100a]", "k.cu", "-o", "k.fatbin"]),
    ]
    running = [subprocess.Popen(argv, cwd=tmp_path) for argv in jobs]
    assert [p.wait() for p in running] == [0, 0]
    so = read_shared_object(tmp_path / "libk.so", "libk.so")
    assert (so.cubins, so.ptx) == (["120a"], ["90"])
    (tmp_path / "bare.so").write_bytes(strip_sections((tmp_path / "libk.so").read_bytes()))
    bare = read_shared_object(tmp_path / "bare.so", "bare.so")
    assert (bare.cubins, bare.ptx, bare.needed) == (so.cubins, so.ptx, so.needed)
    assert fatbin_archs((tmp_path / "k.fatbin").read_bytes(), "k.fatbin") == (["100a", "120f"], ["100a"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_damage_to_a_shared_objects_headers_is_a_finding_or_a_reading_never_a_crash(host_object, data):
    """The ELF header, the program headers and the dynamic segment: every offset and count in them bounded."""
    damaged = bytearray(host_object)
    phoff, = struct.unpack_from("<Q", damaged, 32)
    dynamic = next(struct.unpack_from("<Q", damaged, phoff + 56 * i + 8)[0] for i in range(64)
                   if struct.unpack_from("<I", damaged, phoff + 56 * i)[0] == 2)
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.sampled_from([st.integers(0, 63), st.integers(phoff, phoff + 56 * 8),
                                        st.integers(dynamic, dynamic + 16 * 24)]))
        damaged[data.draw(at)] = data.draw(st.integers(0, 255))
    try:
        parse_shared_object(bytes(damaged), "ops.so")
    except RigError as exc:
        assert str(exc).startswith("ops.so")
