"""rig.cuda.agreement, the one judge of whether a stack's CUDA pieces agree, on constructed inputs: toolkit trees
whose nvcc (a script that answers as nvcc does), headers and libcudart say their releases, venvs whose packages'
metadata say their versions, and what rig doctor and rig validate make of them."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from harness.toolkits import toolkit

from rig.cuda import agreement
from rig.machine import doctor


def test_a_toolkit_of_one_release_agrees_and_one_whose_nvcc_and_headers_differ_by_minor_fails_doctor(tmp_path):
    whole = toolkit(tmp_path / "whole", "13.0", 13000, "13.0.96")
    assert agreement.toolkit_parts(whole) == {"nvcc": "13.0", "headers": "13.0", "cudart": "13.0"}
    checks = {c.name: c for c in doctor._toolkit("13.0", str(whole.parent))}
    assert checks["cuda-13.0-agreement"].status == "pass", checks
    mixed = toolkit(tmp_path / "mixed", "13.0", 13010, "13.0.96")
    checks = {c.name: c for c in doctor._toolkit("13.0", str(mixed.parent))}
    failed = checks["cuda-13.0-agreement"]
    assert failed.status == "fail" and failed.required
    assert "mixes CUDA releases (nvcc 13.0, headers 13.1, cudart 13.0)" in failed.detail
    assert "cuda_toolkit role" in failed.fix
    # an nvcc of another minor in the tree of 13.0: the release check fails, and the agreement says why
    newer = toolkit(tmp_path / "newer", "13.1", 13000, None)
    checks = {c.name: c for c in doctor._toolkit("13.0", str(newer.parent))}
    assert checks["cuda-13.0"].status == "fail" and checks["cuda-13.0-agreement"].status == "fail"
    assert "nvcc 13.1, headers 13.0" in checks["cuda-13.0-agreement"].detail


def test_a_header_that_is_not_a_regular_file_is_not_read(tmp_path):
    import os

    tree = toolkit(tmp_path, None, None, None)
    os.mkfifo(tree / "include" / "cuda_runtime_api.h")  # a reader of it would wait forever
    assert agreement.header_release(tree) is None


@pytest.mark.parametrize("packages, problem", [
    ({"flashinfer-python": "0.7.2", "flashinfer-cubin": "0.7.1"},
     "flashinfer-cubin 0.7.1 beside flashinfer-python 0.7.2"),
    ({"Flashinfer_Python": "0.7.2", "flashinfer-jit-cache": "0.7.1+cu130", "flashinfer-cubin": "0.7.2"},
     "flashinfer-jit-cache 0.7.1+cu130 beside flashinfer-python 0.7.2"),
    ({"flashinfer-python": "0.7.2", "flashinfer-cubin": "0.7.2", "flashinfer-jit-cache": "0.7.2+cu130"}, None),
    ({"torch": "2.14.1"}, None)])
def test_every_flashinfer_package_is_at_one_version(packages, problem):
    found = agreement.flashinfer_problems(packages)
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith(problem) and "flashinfer.version in the stack" in found[0]


@pytest.mark.parametrize("packages, seen", [
    ({"torch": "2.14.1", "nvidia-cuda-runtime": "13.0.96"}, ("13.0", "nvidia-cuda-runtime 13.0.96")),
    ({"torch": "2.9.1+cu128"}, ("12.8", "torch 2.9.1+cu128")),
    ({"torch": "2.11.0+cu130", "nvidia_cuda_runtime_cu12": "12.8.90"}, ("12.8", "nvidia-cuda-runtime-cu12 12.8.90")),
    ({"torch": "2.14.1"}, None)])
def test_torch_cuda_is_read_from_its_runtime_wheel_or_its_local_tag(packages, seen):
    assert agreement.torch_cuda(packages) == seen


def fake_venv(root: Path, packages: dict[str, str]) -> Path:
    """A real venv whose site-packages holds a dist-info (METADATA: name and version) for each of PACKAGES."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    for name, version in packages.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return venv


def test_a_venv_whose_cuda_home_is_a_cuda_12_tree_fails_doctor_naming_both(tmp_path):
    venv = fake_venv(tmp_path, {"torch": "2.14.1", "nvidia-cuda-runtime": "13.0.96", "flashinfer-python": "0.7.2"})
    old = toolkit(tmp_path / "old", "12.8", 12080, "12.8.90")
    check = doctor._agreement(str(venv), {"environ": {"CUDA_HOME": str(old)}})
    assert check.status == "fail" and check.layer == "python" and check.required
    assert f"torch runs CUDA 13.0 (nvidia-cuda-runtime 13.0.96) but CUDA_HOME {old} is CUDA 12.8" in check.detail
    assert "cuda.version" in check.detail
    good = toolkit(tmp_path / "good", "13.0", 13000, "13.0.96")
    check = doctor._agreement(str(venv), {"environ": {"CUDA_HOME": str(good)}})
    assert check.status == "pass" and check.detail == f"torch's CUDA 13.0, CUDA_HOME {good} (CUDA 13.0)"
    check = doctor._agreement(str(venv), {"environ": {"CUDA_HOME": str(tmp_path / "nothing")}})
    assert check.status == "fail" and "holds no toolkit that says its release" in check.detail


def test_a_venv_with_flashinfer_packages_of_two_versions_fails_doctor(tmp_path):
    venv = fake_venv(tmp_path, {"flashinfer-python": "0.7.2", "flashinfer-cubin": "0.7.1"})
    check = doctor._agreement(str(venv), {"environ": {}})
    assert check.status == "fail" and "flashinfer-cubin 0.7.1 beside flashinfer-python 0.7.2" in check.detail


def test_numbers_no_int_can_hold_and_nested_answers_are_not_versions(tmp_path):
    huge = "1" * 5000  # int() refuses more than 4300 digits with a ValueError, not an InvalidVersion
    assert agreement.release(huge) is None
    assert agreement.flashinfer_problems({"flashinfer-python": "0.7.2", "flashinfer-cubin": huge})[0].startswith(
        "flashinfer-cubin 1111")
    assert agreement.torch_cuda({"nvidia-cuda-runtime": huge, "torch": "2.9.1+cu00"}) is None
    tree = toolkit(tmp_path / "huge", None, None, None)
    (tree / "include" / "cuda_runtime_api.h").write_text(f"#define CUDART_VERSION {huge}\n")
    assert agreement.toolkit_parts(tree) == {"nvcc": None, "headers": None, "cudart": None}
    two = toolkit(tmp_path / "two", "13.0", 13000, "13.0.96")
    (two / "lib64" / "libcudart.so.9.2.148").write_bytes(b"\x7fELF")
    assert agreement.toolkit_parts(two)["cudart"] == "13.0, 9.2"
    assert "cudart 13.0, 9.2" in agreement.toolkit_problems(two, agreement.toolkit_parts(two))[0]


def test_a_venv_python_that_answers_nested_json_fails_the_check_not_doctor(tmp_path):
    venv = fake_venv(tmp_path, {})
    python = venv / "bin" / "python"
    python.unlink()
    python.write_text("#!/bin/sh\nprintf '%0100000d' 0 | tr 0 '['\n")
    python.chmod(0o755)
    check = doctor._agreement(str(venv), {"environ": {}})
    assert check.status == "fail" and "expected one JSON line" in check.detail


def test_a_hanging_nvcc_is_a_release_rig_cannot_read(tmp_path, monkeypatch):
    from rig.cuda import toolkit as tk

    tree = toolkit(tmp_path, None, 13000, None)
    nvcc = tree / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\nexec sleep 600\n")
    nvcc.chmod(0o755)
    calls = []
    real_run = tk.run
    monkeypatch.setattr(tk, "run", lambda *a, **kw: calls.append(kw.get("timeout")) or real_run(*a, **{**kw, "timeout": 1}))
    assert agreement.toolkit_parts(tree)["nvcc"] is None and calls == [60]  # bounded: 60 s in rig, 1 s here
