"""rig.python.introspect: one question to a venv's own Python (rig/foreign/distributions.py), asked by audit,
patches, the SBOM, venv verify, doctor and prove; its answer is checked in one place."""
from __future__ import annotations

import json
import sys

import pytest

from rig.core import RigError
from rig.python.introspect import held
from rig.python.venv import installed
from rig.serving.prove import versions


def venv_with(tmp_path, version: str = "1.0"):
    """A venv over this interpreter holding fakepkg (a .so and a .cubin in its RECORD)."""
    venv = tmp_path / "v"
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    info = site / "fakepkg-1.0.dist-info"
    (site / "fakepkg").mkdir(parents=True)
    info.mkdir()
    (venv / "bin").mkdir()
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / "pyvenv.cfg").write_text("include-system-site-packages = false\n")
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: FakePkg\nVersion: {version}\n"
                                   "Requires-Dist: torch==2.14.1\n")
    (info / "RECORD").write_text("fakepkg/_ops.abi3.so,,\nfakepkg/k.cubin,,\nfakepkg/mod.py,,\n")
    return venv


def test_one_answer_carries_versions_roots_files_metadata_and_every_distribution(tmp_path):
    venv = venv_with(tmp_path)
    found = held(venv / "bin" / "python", ["fakepkg", "absent"], files=True, metadata=True, every=True)
    assert set(found.packages) == {"fakepkg"} and found.packages["fakepkg"]["version"] == "1.0"
    assert found.site.name == "site-packages" and found.packages["fakepkg"]["root"] == str(found.site)
    assert [f.rsplit("/", 1)[-1] for f in found.packages["fakepkg"]["files"]] == ["_ops.abi3.so", "k.cubin"]
    assert "Requires-Dist: torch==2.14.1" in found.packages["fakepkg"]["metadata"]
    assert ("FakePkg", "1.0") in found.every
    assert installed(venv)["fakepkg"] == "1.0"  # venv verify reads the same answer, by canonical name
    # prove's record: the names it reports, None where the venv lacks one, and torch's build or why not
    record = versions(venv / "bin" / "python")
    assert record["sglang"] is None and record["kernel"] is None and ("torch_error" in record or "torch_cuda" in record)


def test_an_answer_in_another_shape_is_one_error_naming_the_python(tmp_path):
    liar = tmp_path / "python"
    answer = {"python": "/x", "prefix": "/x", "site": "/x", "packages": {"fakepkg": {"version": 1, "root": "/x"}}}
    liar.write_text(f"#!/bin/sh\necho '{json.dumps(answer)}'\n")
    liar.chmod(0o755)
    with pytest.raises(RigError, match=r"reported its environment in a shape rig did not write \(fakepkg's version"):
        held(liar, ["fakepkg"])
    answer["packages"] = {}
    answer["every"] = [["fakepkg", None]]
    liar.write_text(f"#!/bin/sh\necho '{json.dumps(answer)}'\n")
    with pytest.raises(RigError, match="a distribution listed as"):
        held(liar, every=True)


def test_a_directory_without_a_python_is_not_a_venv(tmp_path):
    with pytest.raises(RigError, match="is not a virtualenv"):
        installed(tmp_path)


def test_a_broken_distribution_an_answer_missing_what_was_asked_and_a_silent_python_are_named(tmp_path):
    venv = venv_with(tmp_path)
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "nameless-1.0.dist-info").mkdir()
    (site / "nameless-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nVersion: 1.0\n")
    with pytest.raises(RigError, match=r"a distribution whose metadata cannot be read: .*nameless-1.0.dist-info"):
        installed(venv)
    liar = tmp_path / "python"
    answer = {"python": "/x", "prefix": "/x", "site": "/x", "packages": {"k": {"version": "1", "root": "/x"}}}
    liar.write_text(f"#!/bin/sh\necho '{json.dumps(answer)}'\n")
    liar.chmod(0o755)
    with pytest.raises(RigError, match="k without its files"):
        held(liar, ["k"], files=True)
    with pytest.raises(RigError, match="an answer that was asked for"):
        held(liar, every=True)
    liar.write_text("#!/bin/sh\nsleep 30\n")
    with pytest.raises(RigError, match="did not finish within 1 s"):
        held(liar, timeout=1)


def pth_venv(tmp_path):
    """The H200's layout: a venv whose own site-packages is nearly empty, the packages in another directory that a
    .pth file adds, and a second copy of a distribution further down sys.path (which Python does not import)."""
    venv = venv_with(tmp_path)
    machine = tmp_path / "machine-site"
    for name in ("triton", "sgl_kernel", "sglang", "sglang/srt", "sglang/srt/speculative"):
        (machine / name).mkdir(parents=True, exist_ok=True)
        (machine / name / "__init__.py").write_text("")
    (machine / "flashinfer" / "data").mkdir(parents=True)  # a leftover of an uninstall: no __init__.py
    (machine / "sgl_kernel" / "flash_ops.abi3.so").write_bytes(b"\x7fELF")
    (machine / "sglang" / "srt" / "environ.py").write_text('SKIP = "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND"\n')
    for where, version in ((machine, "2.9.1"), (tmp_path / "older-site", "2.8.0")):
        info = where / f"torch-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "zz-machine.pth").write_text(f"{machine}\n{tmp_path / 'older-site'}\n")
    return venv, machine


def test_what_a_venv_imports_through_a_pth_is_found_as_python_finds_it(tmp_path):
    """tune's backend checks and venv verify ask the venv's interpreter: a .pth-added directory counts (the H200 run
    refused triton, "has no the triton package"), and the first torch on sys.path is the one reported."""
    from rig.serving.tune.variants import SKIP_EXTEND, backend_problem, imports_of, sglang_reads

    venv, machine = pth_venv(tmp_path)
    imports = imports_of(venv)
    assert imports["triton"] == [machine / "triton"] and imports["sglang"] == [machine / "sglang"]
    assert backend_problem(imports, venv, "triton") is None and backend_problem(imports, venv, "fa3") is None
    said = backend_problem(imports, venv, "flashinfer")  # a namespace package is no flashinfer
    assert said and "cannot import the flashinfer package" in said and "has no the" not in said
    assert sglang_reads(imports, SKIP_EXTEND)
    assert installed(venv)["torch"] == "2.9.1"  # Python imports the first; the shadowed 2.8.0 is not it
