"""The audit's rules and the build's settings, without wheels or a GPU."""
import os
import struct
from pathlib import Path

import pytest
from harness.elf import cuda_elf
from harness.paths import REPO

from rig.core import RigError
from rig.core.elf import cubin_arch
from rig.core.elf import read_shared_object as read_elf
from rig.kernels.audit import _torch_pin, abi_of, covers, object_notes
from rig.kernels.wheels import GIB, build_env, max_jobs, source_spec, stack_source, wheelhouse_key
from rig.stack.spec import load


@pytest.mark.parametrize("target, cubins, ptx, how", [
    ("12.0a", ["120a"], [], "cubin sm_120a"),
    ("12.0a", ["120"], [], "cubin sm_120"),          # plain SASS runs on the arch-specific target
    ("12.0", ["120a"], [], None),                    # arch-specific SASS does not cover a generic target
    ("12.0a", ["90a", "100a"], [], None),            # SASS never crosses majors
    ("12.0a", [], ["90"], "PTX compute_90"),         # PTX JITs forward
    ("9.0a", [], ["120"], None),                     # but never backward
    ("12.0a", [], ["90a"], None),                    # arch-specific PTX is for its own arch only
    ("9.0a", ["90", "90a"], [], "cubin sm_90a"),     # the exact cubin is named first
    ("10.0a", ["100f"], [], "cubin sm_100f"),        # family SASS runs on its family
    ("12.0a", ["100f", "103a"], [], None),           # but not on another major
    ("12.0a", [], ["100f"], None),                   # nor does family PTX
    ("12.0a", [], ["120f"], "PTX compute_120f"),
])
def test_which_code_runs_on_a_target(target, cubins, ptx, how):
    assert covers(target, cubins, ptx) == how


def test_what_one_object_cannot_run_well_or_at_all_is_named_for_that_object():
    archs = ["12.0a", "9.0a", "12.0"]
    assert object_notes("sm120/ops.so", archs, ["120a", "90a"], []) == \
        ["sm120/ops.so: no kernel image for 12.0 (it has sm_120a, sm_90a)"]
    assert object_notes("ops.so", archs[:2], ["90a"], ["90"]) == ["ops.so: 12.0a runs PTX compute_90, not sm_120a SASS"]
    assert object_notes("ops.so", archs[:2], ["120", "90a"], []) == ["ops.so: 12.0a runs cubin sm_120, not sm_120a SASS"]
    assert object_notes("flash_ops.so", archs[:2], ["80", "90a"], []) == \
        ["flash_ops.so: no kernel image for 12.0a (it has sm_80, sm_90a)"]


@pytest.mark.parametrize("flags, abi, tkinfo, arch", [
    (0x6007802, 8, b"ptxas\0-arch sm_120a -m 64 \0", "120a"),   # ptxas 13.0's flags for sm_120a
    (0x6006402, 8, b"ptxas\0-arch sm_100f -m 64 \0", "100f"),
    (0x6005a04, 8, None, "90"),                                  # no note: the plain SM
    (0x6005a04, 8, b"ptxas\0-arch sm_120a -m 64 \0", "90"),     # a note that disagrees with e_flags is not used
    (0x0005a, 7, None, "90"),                                    # ABI 7 and older: the SM in the low byte
])
def test_a_cubins_arch_is_read_from_its_flags_and_its_toolkit_note(flags, abi, tkinfo, arch):
    assert cubin_arch(cuda_elf(flags, abi, tkinfo), "k.cubin") == arch


@pytest.mark.parametrize("data, why", [
    (b"\x7fELF", "no ELF header"),
    (cuda_elf(0x6007802, machine=62), "its ELF machine is 62, not CUDA's 190"),
    (cuda_elf(0x6007802)[:-10], "its section table lies outside the file"),
    (b"#!/bin/sh\n" + bytes(80), "no ELF header"),
    (cuda_elf(0x6000002), "its e_flags 0x6000002 name no SM"),
    (cuda_elf(0x6007802, tkinfo=b"-arch sm_" + b"9" * 5000), None),  # digits no int() takes: not an -arch
])
def test_what_is_not_a_cubin_is_named_and_refused(data, why):
    if why is None:
        assert cubin_arch(data, "k.cubin") == "120"
        return
    with pytest.raises(RigError, match=f"k.cubin is not a CUDA kernel image \\(cubin\\) rig can read: {why}"):
        cubin_arch(data, "k.cubin")


def test_only_the_first_toolkit_note_is_read_and_a_huge_one_is_refused():
    """A crafted file may carry thousands of notes (each would be searched) or one of megabytes."""
    one = cuda_elf(0x6007802)
    table, = struct.unpack_from("<Q", one, 40)
    many = 60000
    other = b"ptxas\0-arch sm_120f -m 64 \0"  # what the later notes would say, were they read
    at = table + (3 + many) * 64
    later = struct.pack("<IIQQQQIIQQ", 11, 7, 0, 0, at, len(other), 0, 0, 4, 0)
    crafted = bytearray(one[:table] + one[table:table + 192] + later * many + other)
    struct.pack_into("<H", crafted, 60, 3 + many)
    assert cubin_arch(bytes(crafted), "k.cubin") == "120a"
    huge = bytearray(one) + bytes(1 << 20)  # inside the file: a section past its end is refused before
    struct.pack_into("<Q", huge, table + 128 + 32, 1 << 20)  # the note section's size
    with pytest.raises(RigError, match="its toolkit note is 1048576 bytes"):
        cubin_arch(bytes(huge), "k.cubin")


def test_the_torch_pin_is_read_from_metadata_but_not_from_extras():
    metadata = "Name: k\nRequires-Dist: torchvision\nRequires-Dist: torch==2.14.1\n" \
               "Requires-Dist: torch<3; extra == \"dev\"\n"
    assert str(_torch_pin(metadata, "k")) == "torch==2.14.1"
    assert _torch_pin("Name: k\nRequires-Dist: torchaudio\n", "k") is None


def test_a_wheel_whose_requires_dist_is_not_a_requirement_is_one_clear_error():
    """rig audit --torch WHEEL read the pin with packaging directly and ended in exit 70 (issue 49, round two)."""
    from rig.core import RigError

    with pytest.raises(RigError, match=r"k 1.0 declares a dependency rig cannot read \(Requires-Dist 'torch=="):
        _torch_pin("Name: k\nRequires-Dist: torch===\n", "k 1.0")


def test_the_cxx11_abi_is_told_from_mangled_torch_names():
    new = "_ZN3c106detail23torchInternalAssertFailEPKcS2_jS2_RKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"
    old = "_ZN3c106detail23torchInternalAssertFailEPKcS2_jS2_RKSs"
    assert abi_of({new}) is True and abi_of({old}) is False and abi_of({"_ZN3c104freeEv"}) is None


def test_jobs_are_capped_by_memory_as_well_as_cores():
    assert max_jobs(16, 64 * GIB) == 16
    assert max_jobs(16, 10 * GIB) == 2
    assert max_jobs(2, 1 * GIB) == 1


def test_every_build_system_gets_the_stacks_archs(tmp_path):
    env = build_env(["12.0a", "9.0a"], tmp_path, 3)
    assert env["TORCH_CUDA_ARCH_LIST"] == "12.0a;9.0a" and env["FLASHINFER_CUDA_ARCH_LIST"] == "12.0a 9.0a"
    assert env["CUDAARCHS"] == "120a;90a" and env["MAX_JOBS"] == "3" and env["CUDA_HOME"] == str(tmp_path)


def test_a_source_must_be_buildable_and_a_git_source_pinned(tmp_path):
    with pytest.raises(RigError, match="pin a ref"):
        source_spec("git+https://example.invalid/repo.git")
    with pytest.raises(RigError, match="no such source dir or sdist"):
        source_spec(str(tmp_path / "nothing"))
    with pytest.raises(RigError, match="neither setup.py nor pyproject.toml"):
        source_spec(str(tmp_path))
    assert source_spec("git+https://example.invalid/repo.git@v1") == "git+https://example.invalid/repo.git@v1"


def test_the_wheelhouse_key_changes_with_the_lock_the_archs_and_the_source(tmp_path):
    (tmp_path / "setup.py").write_text("# v1\n")
    keys = {wheelhouse_key("a", ["12.0a"], str(tmp_path)), wheelhouse_key("b", ["12.0a"], str(tmp_path)),
            wheelhouse_key("b", ["9.0a"], str(tmp_path))}
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "leftover.o").write_text("x")  # build output is not the source
    assert wheelhouse_key("b", ["9.0a"], str(tmp_path)) in keys
    (tmp_path / "setup.py").write_text("# v2\n")
    keys.add(wheelhouse_key("b", ["9.0a"], str(tmp_path)))
    assert len(keys) == 4


def test_a_stacks_source_entry_is_its_build_recipe(tmp_path):
    stack_059 = REPO / "stacks" / "sm120-sglang-0.5.9.yml"
    assert stack_source(load(stack_059), "kernel", str(stack_059)).endswith("@v0.5.9#subdirectory=sgl-kernel")
    with pytest.raises(RigError, match="kernel has no source entry"):
        stack_source(load(REPO / "stacks" / "default.yml"), "kernel", "stacks/default.yml")
    local = tmp_path / "local.yml"
    local.write_text("name: l\ncuda: {version: 13.0.2}\nkernel: {source: {path: src, subdirectory: sgl-kernel}}\n")
    assert stack_source(load(local), "kernel", str(local)) == str(tmp_path / "src" / "sgl-kernel")
    extension = REPO / "tests" / "data" / "stacks" / "torch-extension.yml"
    assert stack_source(load(extension), "rig-scale-ext", str(extension)) == str(REPO / "tests" / "data" / "rig_scale_ext")
    with pytest.raises(RigError, match="no kernel, flashinfer, sglang or extension named 'deep-gemm'"):
        stack_source(load(extension), "deep-gemm", str(extension))


def test_a_directory_of_cubins_is_audited_file_by_file_and_a_fifo_among_them_is_refused(tmp_path):
    from rig.kernels.audit import audit_path

    (tmp_path / "gemm_sm120a.cubin").write_bytes(cuda_elf(0x6007802))
    common = {"cuda_major": 13, "archs": ["12.0a", "9.0a"], "torch": None, "extra_dirs": [], "resolve": False}
    report = audit_path(str(tmp_path), {}, common)
    assert report["cubin_files"] == {"120a": 1} and report["archs"] == {"12.0a": "cubin sm_120a", "9.0a": None}
    assert [e.split(":")[0] for e in report["errors"]] == ["no kernel image for 9.0a"]
    (tmp_path / "kernels.cubin").mkdir()  # a directory of that name is no kernel image
    (tmp_path / "elsewhere.cubin").symlink_to("/dev/zero")  # nor is a link followed: it is named
    report = audit_path(str(tmp_path), {}, common)
    assert report["cubin_files"] == {"120a": 1}
    assert report["notes"] == ["elsewhere.cubin: a link, not followed and not audited"]
    os.mkfifo(tmp_path / "stuck.cubin")  # read, it would block the audit for ever
    with pytest.raises(RigError, match="stuck.cubin is not a regular file"):
        audit_path(str(tmp_path), {}, common)


def test_a_wheel_whose_cubin_member_is_damaged_is_named_with_the_member(tmp_path):
    import zipfile

    from rig.kernels.audit import audit_wheel

    wheel = tmp_path / "crafted-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("crafted/k.cubin", cuda_elf(0x6007802))
    data = bytearray(wheel.read_bytes())
    at = data.index(b"\x7fELF")  # stored, not deflated: flip a byte of the member's body
    data[at + 100] ^= 0xFF
    wheel.write_bytes(bytes(data))
    with pytest.raises(RigError, match="crafted-1.0-py3-none-any.whl: its member crafted/k.cubin cannot be read"):
        audit_wheel(wheel, cuda_major=13, archs=["12.0a"], torch=None, extra_dirs=[], resolve=False)


def test_an_audit_is_a_check_of_the_one_report_model_and_its_junit_names_each_problem(tmp_path):
    """`rig audit --junit` and doctor's audit of a venv both read an artifact's verdict through as_check."""
    import xml.etree.ElementTree as ET

    from rig.cli.common import write_junit
    from rig.kernels.audit import as_check, audit_path

    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "gemm_sm120a.cubin").write_bytes(cuda_elf(0x6007802))
    common = {"cuda_major": 13, "archs": ["12.0a", "9.0a"], "torch": None, "extra_dirs": [], "resolve": False}
    check = as_check(audit_path(str(tmp_path / "k"), {}, common), fix="rebuild it")
    assert check.status == "fail" and check.layer == "kernels" and check.name == str(tmp_path / "k")
    assert "12.0a: cubin sm_120a, 9.0a: no kernel image" in check.detail
    assert [p.split(": ", 1)[1].split(":")[0] for p in check.problems] == ["no kernel image for 9.0a"]
    write_junit(str(tmp_path / "audit.xml"), [check], "rig audit")
    [case] = ET.parse(tmp_path / "audit.xml").getroot().iter("testcase")
    failure = case.find("failure")
    assert failure is not None and "no kernel image for 9.0a" in failure.get("message")
    assert failure.text.endswith("fix: rebuild it")
    write_junit(None, [check], "rig audit")  # no --junit: nothing written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.xml", "k"]


def _extension() -> Path:
    import _ctypes  # an extension module of this interpreter's: a shared object on every build

    return Path(_ctypes.__file__)


def test_a_shared_objects_dynamic_section_and_symbols_are_read():
    """An extension module defines its init function and takes the C API and libc's from the process."""
    ext = read_elf(_extension(), "_ctypes")
    assert "PyInit__ctypes" in ext.defined and "PyInit__ctypes" not in ext.undefined
    assert {"PyLong_FromLong", "memcpy"} <= ext.undefined
    assert any(n.startswith("libc.so.") for n in ext.needed) and not ext.has_fatbin


def _python_elf() -> bytes:
    return _extension().read_bytes()


@pytest.mark.parametrize("mangle, why", [
    (lambda b: b"", ""),
    (lambda b: b"#!/bin/sh\n" + b"x" * 100, "no ELF header"),
    (lambda b: b[:4] + b"\x01" + b[5:], "not a 64-bit little-endian ELF file"),
    (lambda b: b[:40] + struct.pack("<Q", len(b)) + b[48:], "its section table lies outside the file"),  # e_shoff past EOF
    (lambda b: b[:62] + struct.pack("<H", 0xFFFF) + b[64:], "its section table is malformed"),  # e_shstrndx
])
def test_a_damaged_shared_object_is_named_never_a_crash(tmp_path, mangle, why):
    damaged = tmp_path / "libdamaged.so"
    damaged.write_bytes(mangle(_python_elf()))
    with pytest.raises(RigError, match=f"libdamaged.so is not an ELF shared object.*{why}"):
        read_elf(damaged, "libdamaged.so")


def test_a_section_past_the_end_of_the_file_is_named(tmp_path):
    data = bytearray(_python_elf())
    shoff, = struct.unpack_from("<Q", data, 40)
    shnum, = struct.unpack_from("<H", data, 60)
    for i in range(1, shnum):  # every section's offset beyond the end (the table itself stays)
        struct.pack_into("<Q", data, shoff + i * 64 + 24, len(data) + 1)
    damaged = tmp_path / "libdamaged.so"
    damaged.write_bytes(bytes(data))
    with pytest.raises(RigError, match="a section lies outside the file"):
        read_elf(damaged, "libdamaged.so")


def test_an_audit_with_a_torch_pin_is_written_as_json_and_judges_the_pin():
    """The pin is read as a Requirement (the one Requires-Dist reader) and reported as text: the audit's JSON
    (rig audit --json, the wheel builder's audit.json) must hold it (a defect once: exit 70)."""
    from rig.core.documents import dump_json
    from rig.kernels.audit import Torch, audit_files

    metadata = "Name: k\nRequires-Dist: torch==2.14.1\n"
    common = {"cuda_major": 13, "archs": ["12.0a"], "extra_dirs": [], "resolve": False,
              "cubins": [("k/ops.cubin", "120a")]}
    same = audit_files([], "k", metadata, torch=Torch("2.14.1+cu130", set(), None), **common)
    assert same["torch_pin"] == "torch==2.14.1" and same["ok"], same["errors"]
    assert '"torch_pin": "torch==2.14.1"' in dump_json(same, "the audit")
    other = audit_files([], "k", metadata, torch=Torch("2.9.1", set(), None), **common)
    assert not other["ok"] and "k requires torch==2.14.1, the torch in use is 2.9.1" in other["errors"]


def test_a_name_from_the_files_forges_no_line_of_the_audits_report():
    """rig audit prints what the files are called: a path, a member or an error holding a newline and an escape
    sequence stays within its line, visible, and no line of the report starts with `rig:`."""
    from rig.kernels.audit import render

    forged = "x\nrig: error: forged\x1b[2J"
    report = {"ok": False, "artifact": f"/tmp/{forged}", "cuda_major": 13, "torch": None, "torch_pin": None,
              "cubins": ["90a"], "ptx": [], "cubin_files": {"90a": f"k{forged}.cubin"}, "archs": {"9.0a": "cubin sm_90a"},
              "objects": [{"needed_cuda": [f"libcudart{forged}.so.13"]}], "notes": [forged],
              "unread": [f"a{forged}.so"], "errors": [forged]}
    text = render([report])
    assert len(text.splitlines()) == 8 and "\x1b" not in text
    assert not [line for line in text.splitlines() if line.startswith("rig:")]
    assert "x\\nrig: error: forged\\x1b[2J" in text.splitlines()[-1]
