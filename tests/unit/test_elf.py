"""rig's one ELF reader (rig.core.elf) on real objects: needed libraries from the program headers, with the
section table there or stripped as sstrip leaves it; the SASS and PTX archs of CUDA fat binaries, from
nvcc's own output where a CUDA toolkit is at hand, and from fat binaries laid out by their documented layout
around the suite's cubin everywhere; damaged input is a RigError, never a crash."""
from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from harness.elf import PTX, cuda_elf, entry, fatbin, with_section
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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

ZSTD = 0x8000
CUBIN_120A = cuda_elf(0x6007802)  # the suite's cubin: ptxas 13.0's flags and toolkit note for sm_120a


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


# ------------------------------------------------------------------ crafted objects: every read bounded (issue 56)

DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_RPATH, DT_RUNPATH = 1, 5, 10, 15, 29


def crafted(dynamic=(), strings: bytes = b"\0", tail: bytes = b"", sections=()) -> bytes:
    """A shared object laid out by hand: the ELF header, a PT_LOAD mapping the whole file at address 0, a
    PT_DYNAMIC holding DYNAMIC (tag, value) and the string table's two entries, STRINGS, then TAIL; with
    SECTIONS ((name, type, offset, size, link), after a null one), a section table naming them at the end."""
    strings_at = 64 + 2 * 56 + 16 * (len(dynamic) + 3)
    entries = [*dynamic, (DT_STRTAB, strings_at), (DT_STRSZ, len(strings)), (0, 0)]
    body = b"".join(struct.pack("<qQ", t, v) for t, v in entries) + strings + tail
    shoff = shnum = shstrndx = 0
    table = b""
    if sections:
        names = b"\0" + b"".join(s[0] + b"\0" for s in sections) + b".shstrtab\0"
        names_at = 64 + 2 * 56 + len(body)
        body += names + bytes(-len(names) % 8)
        shoff = 64 + 2 * 56 + len(body)
        rows, at = [bytes(64)], 1
        for name, kind, offset, size, link in sections:
            rows.append(struct.pack("<IIQQQQIIQQ", at, kind, 0, 0, offset, size, link, 0, 8, 0))
            at += len(name) + 1
        rows.append(struct.pack("<IIQQQQIIQQ", at, 3, 0, 0, names_at, len(names), 0, 0, 1, 0))
        table, shnum, shstrndx = b"".join(rows), len(rows), len(rows) - 1
    size = 64 + 2 * 56 + len(body) + len(table)
    header = b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack(
        "<HHIQQQIHHHHHH", 3, 62, 1, 0, 64, shoff, 0, 64, 56, 2, 64, shnum, shstrndx)
    segments = struct.pack("<IIQQQQQQ", 1, 5, 0, 0, 0, size, size, 0x1000) + \
        struct.pack("<IIQQQQQQ", 2, 6, 176, 176, 176, 16 * len(entries), 16 * len(entries), 8)
    return header + segments + body + table


def test_a_crafted_object_reads_as_the_loader_reads_it():
    """The builder the cases below use makes an object rig reads whole: its needed library and run paths."""
    seen = parse_shared_object(crafted([(DT_NEEDED, 1), (DT_RUNPATH, 17)], b"\0libcudart.so.13\0$ORIGIN:/opt\0"),
                               "x.so")
    assert (seen.needed, seen.runpath, seen.unread, seen.has_fatbin) == (["libcudart.so.13"], ["$ORIGIN", "/opt"],
                                                                         [], False)


def test_needed_entries_are_bounded_in_number_and_the_names_they_read_in_total():
    """16384 DT_NEEDED at one 256 KB name asked 4 GB of a 512 KB object (MemoryError, exit 70): the entries
    are counted, and the names read together may come to a few times the string table, no more."""
    with pytest.raises(RigError, match=r"x.so is not an ELF shared object rig can read: its dynamic segment has "
                                       r"2000 DT_NEEDED and 0 run path entries, more than the 1024 rig reads"):
        parse_shared_object(crafted([(DT_NEEDED, 1)] * 2000, b"\0libcudart.so.13\0"), "x.so")
    long = b"\0" + b"x" * (64 << 10) + b"\0"  # each entry one byte further into one name: 64 MB of names
    with pytest.raises(RigError, match=r"its dynamic entries name more than 1310728 bytes from a string table of "
                                       r"65538: they point into one another's names"):
        parse_shared_object(crafted([(DT_NEEDED, 1 + i) for i in range(1000)], long), "x.so")
    # one name read by every entry is read once, whatever its length
    assert parse_shared_object(crafted([(DT_NEEDED, 1)] * 1000, long), "x.so").needed == ["x" * (64 << 10)] * 1000


TAGS = st.sampled_from([DT_NEEDED, DT_RUNPATH, DT_RPATH, 12, 0x6FFFFFFB])  # and DT_INIT, DT_FLAGS_1: not names


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.lists(st.tuples(TAGS, st.integers(0, 80) | st.just(2 ** 64 - 1)), max_size=12))
def test_a_dynamic_tables_names_are_read_as_the_loader_reads_them_or_refused(strings, dynamic):
    """Any string table and any entries into it: each name is the bytes from its offset to the next NUL, and an
    entry whose name runs out of the table is named, never an IndexError."""
    def oracle(at: int) -> str | None:
        end = strings.find(b"\0", at)
        return None if at >= len(strings) or end < 0 else strings[at:end].decode("utf-8", "replace")

    names = [(tag, oracle(value)) for tag, value in dynamic if tag in (DT_NEEDED, DT_RUNPATH, DT_RPATH)]
    try:
        seen = parse_shared_object(crafted(dynamic, strings), "x.so")
    except RigError as exc:
        assert any(name is None for _, name in names)
        assert str(exc) == "x.so is not an ELF shared object rig can read: a name points outside its string table"
    else:
        assert seen.needed == [name for tag, name in names if tag == DT_NEEDED]
        assert seen.runpath == [p for tag, name in names if tag != DT_NEEDED for p in (name or "").split(":")]


SECTION_ROW = st.tuples(st.sampled_from([b".nv_fatbin", b".dynamic", b".text"]), st.sampled_from([1, 6, 8]),
                        st.integers(0, 600), st.sampled_from([0, 8, 64, 400, 1 << 20, 1 << 62]), st.integers(0, 8))


@settings(max_examples=300, deadline=None)
@given(st.lists(SECTION_ROW, min_size=1, max_size=5))
def test_a_section_table_is_held_to_the_file_or_the_object_refused(rows):
    """A section past the end of the file (a .dynamic of 4 EiB) or linked to no section (sh_link out of range)
    was passed over, and `rig audit` said the object was fine: each is named, as readelf names it."""
    data = crafted(sections=rows)
    count = len(rows) + 2
    # a NOBITS section (8) has no bytes in the file: it is held to an address space (2**48) instead
    outside = [i + 1 for i, (_, kind, offset, size, _) in enumerate(rows)
               if (size > 1 << 48 if kind == 8 else offset + size > len(data))]
    unlinked = [i + 1 for i, row in enumerate(rows) if row[4] >= count]
    try:
        seen = parse_shared_object(data, "x.so", device_code=False)
    except RigError as exc:
        why = str(exc).removeprefix("x.so is not an ELF shared object rig can read: ")
        if why.startswith("a section"):  # the first damaged section is named
            assert not unlinked or outside[0] <= unlinked[0]
            assert re.match(rf"a section (lies outside the file|is larger than any address space) "
                            rf"\(section {outside[0]}: ", why)
        elif why.startswith("its section "):
            assert not outside or outside[0] > unlinked[0]
            assert why == f"its section {unlinked[0]} links to section {rows[unlinked[0] - 1][4]}, and it has " \
                          f"{count} sections"
        else:  # fat binary sections, all inside the file, over one another
            spans = sorted((o, s) for n, k, o, s, _ in rows if n == b".nv_fatbin" and k != 8)
            assert why.startswith("its fat binary sections overlap") and any(
                b < a + s for (a, s), (b, _) in zip(spans, spans[1:], strict=False))
    else:
        assert not outside and not unlinked
        assert seen.has_fatbin == any(n == b".nv_fatbin" and k != 8 for n, k, *_ in rows)


@pytest.mark.parametrize("row, why", [
    ((b".dynamic", 6, 64, 1 << 62, 0), "a section lies outside the file (section 1: 4611686018427387904 bytes at "
                                       "offset 64"),
    ((b".text", 1, 64, 8, 900), "its section 1 links to section 900, and it has 3 sections"),
    ((b".dynamic", 8, 64, 1 << 62, 0), "a section is larger than any address space (section 1: "
                                       "4611686018427387904 bytes of memory"),
])
def test_rig_audit_names_a_damaged_section_table_with_one_error_never_a_pass(tmp_path, row, why):
    import contextlib
    import io

    from rig.cli import main

    (tmp_path / "x.so").write_bytes(crafted([(DT_NEEDED, 1)], b"\0libc.so.6\0", sections=[row]))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), \
            pytest.raises(SystemExit) as done:
        main(["audit", "--stack", str(Path(__file__).parents[2] / "stacks" / "default.yml"),
              str(tmp_path / "x.so")])
    assert done.value.code == 2, err.getvalue()
    [line] = err.getvalue().splitlines()
    assert line.startswith("rig: error: x.so is not an ELF shared object rig can read: ") and why in line


def test_fat_binary_sections_over_one_another_are_refused_not_read_over_and_over():
    body = fatbin(entry(1, 90, PTX))
    at = 64 + 2 * 56 + 16 * 3 + 1  # where crafted() lays TAIL: after the dynamic entries and a 1-byte table
    sections = [(b".nv_fatbin", 1, at, len(body), 0)] * 2
    with pytest.raises(RigError, match=f"its fat binary sections overlap \\(at offsets {at} and {at}\\)"):
        parse_shared_object(crafted(tail=body, sections=sections), "x.so")
    assert parse_shared_object(crafted(tail=body, sections=sections[:1]), "x.so").ptx == ["90"]


def overlapping_headers(count: int) -> bytes:
    """COUNT entries of 48 bytes (an kind no arch is read from), each holding at byte 16 a fat binary header
    whose entries are the ones after it and whose size runs 8 bytes past the last: every header found walks
    the rest of them, then fails."""
    out = bytearray()
    for i in range(count):
        row = bytearray(48)
        struct.pack_into("<HHIQ", row, 0, 4, 0x101, 48, 0)
        struct.pack_into("<IHHQ", row, 16, 0xBA55ED50, 1, 32, (count - i - 1) * 48 + 8)
        out += row
    return bytes(out + bytes(8))


def test_a_search_by_magic_walks_a_file_of_overlapping_headers_in_linear_time(monkeypatch, tmp_path):
    """A 672 KB sectionless object of 14000 overlapping fat binary headers took quadratic time (killed at 20 s).
    The entry headers read are counted: twice the file's worth at most, then the search stops and says so."""
    import rig.core.elf as elf

    data = crafted(tail=fatbin(entry(2, 120, CUBIN_120A)) + overlapping_headers(14000))
    most = 2 * len(data) // 48 + 100

    class Counted:
        size, read = elf.ENTRY.size, 0

        def unpack_from(self, buffer, offset=0):
            self.read += 1
            assert self.read <= most, "the search walked more than twice the file: quadratic"
            return ENTRY.unpack_from(buffer, offset)

    ENTRY, counted = elf.ENTRY, Counted()
    monkeypatch.setattr(elf, "ENTRY", counted)
    seen = parse_shared_object(data, "x.so")
    assert seen.cubins == ["120a"]  # what came before is read
    [why] = seen.unread
    assert why.startswith("the search for its fat binaries by their magic stopped at offset ") and \
        why.endswith(f"walked {2 * len(data)} bytes, twice the file; what follows was not read")
    (tmp_path / "x.so").write_bytes(data)
    counted.read = 0
    check = as_check(audit_path(str(tmp_path / "x.so"), {}, COMMON))
    assert check.status == "warn" and "not read: x.so: the search for its fat binaries" in check.detail


def test_an_arch_whose_cubin_rig_could_not_read_is_not_counted_and_says_why(tmp_path):
    """A sectionless object whose sm_90 cubin rig could not read was passed as if the magic headed no fat
    binary: a plain PASS. The fat binary is read; the arch is left out, with the reason, and the audit warns."""
    broken = fatbin(entry(2, 90, b"\x7fELF" + bytes(60)))
    data = crafted(tail=fatbin(entry(2, 120, CUBIN_120A)) + bytes(8) + broken)
    seen = parse_shared_object(data, "x.so")
    assert (seen.has_fatbin, seen.cubins, seen.ptx) == (True, ["120a"], [])
    body = data.index(b"\x7fELF" + bytes(60))
    assert seen.unread == [f"sm_90 is not counted: the cubin at offset {body} of its fat binary is not a CUDA kernel "
                           "image (cubin) rig can read: not a 64-bit little-endian ELF file"]
    (tmp_path / "x.so").write_bytes(data)
    check = as_check(audit_path(str(tmp_path / "x.so"), {}, COMMON))
    assert check.status == "warn" and "not read: x.so: sm_90 is not counted" in check.detail
    check = as_check(audit_path(str(tmp_path / "x.so"), {}, {**COMMON, "archs": ["12.0a", "9.0"]}))
    assert check.status == "fail" and any("no kernel image for 9.0" in p for p in check.problems)
    (tmp_path / "x.so").write_bytes(crafted(tail=broken))  # nothing read: not said to hold no device code
    assert [u.split(":")[0] for u in read_shared_object(tmp_path / "x.so", "x.so").unread] == ["sm_90 is not counted"]
    check = as_check(audit_path(str(tmp_path / "x.so"), {}, COMMON))
    assert check.status == "warn" and check.detail.startswith("x.so: no device code read; ")
    # the same fat binary in a section is one error that names the cubin, as before
    with pytest.raises(RigError, match="x.so: the cubin at offset .* is not a CUDA kernel image"):
        fatbin_archs(broken, "x.so")


PIECES = st.one_of(st.integers(20, 130).map(lambda sm: ("ptx", sm)), st.integers(1, 60).map(lambda n: ("over", n)),
                   st.binary(max_size=40).map(lambda b: ("bytes", b)), st.just(("magic", 0)))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.lists(PIECES, max_size=12))
def test_a_search_by_magic_reads_every_fat_binary_or_says_where_it_stopped_in_linear_work(monkeypatch, pieces):
    """Any sequence of fat binaries, runs of overlapping headers, stray magic and other bytes in a sectionless
    object: the entry headers read stay linear in its size, and each fat binary is read unless the search says
    it stopped."""
    import rig.core.elf as elf

    parts = {"ptx": lambda sm: fatbin(entry(1, sm, PTX)), "over": overlapping_headers, "bytes": lambda b: b,
             "magic": lambda _: struct.pack("<I", 0xBA55ED50)}
    data = crafted(tail=b"".join(parts[kind](value) + bytes(8) for kind, value in pieces))
    read, real = [0], elf.ENTRY

    class Counted:
        size = real.size

        def unpack_from(self, buffer, offset=0):
            read[0] += 1
            return real.unpack_from(buffer, offset)

    with monkeypatch.context() as patch:  # undone after each example
        patch.setattr(elf, "ENTRY", Counted())
        seen = parse_shared_object(data, "x.so")
    # charged entries walk at most twice the file; one more, uncharged, where each candidate fails
    assert read[0] <= 2 * len(data) // 48 + len(data) // 4 + 1
    if not any(u.startswith("the search for its fat binaries") for u in seen.unread):
        assert set(seen.ptx) >= {str(v) for kind, v in pieces if kind == "ptx"}
