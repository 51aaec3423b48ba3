"""A stack's attention backends held to its archs, in rig validate and rig doctor: fa3 on 12.0a fails, naming the
backends that run there; triton on the same kernels passes."""
from pathlib import Path

import pytest

from rig.ci import validate
from rig.kernels import audit
from rig.kernels.backends import gaps
from rig.machine import doctor


def _report(*objects: tuple[str, list[str]]) -> dict:
    """An audit report of sglang-kernel as 0.4.x ships it: FA3 and FlashMLA for Hopper only, the rest for both."""
    rows = [{"object": name, "cubins": cubins, "ptx": []} for name, cubins in objects]
    return {"artifact": "sglang-kernel 0.4.10", "ok": True, "errors": [], "torch_pin": None, "torch": "2.14.1",
            "cuda_major": 13, "cubins": sorted({c for _, cs in objects for c in cs}), "ptx": [],
            "archs": {"12.0a": "cubin sm_120a", "9.0a": "cubin sm_90a"}, "objects": rows, "cubin_files": {},
            "notes": [], "unread": []}


KERNEL = _report(("sgl_kernel/common_ops.abi3.so", ["90a", "120a"]), ("sgl_kernel/flash_ops.abi3.so", ["90a"]),
                 ("sgl_kernel/flashmla_ops.abi3.so", ["90a"]))
ARCHS = ["12.0a", "9.0a"]


def test_fa3_on_12_0a_is_a_gap_that_names_the_backends_that_run_there():
    found = gaps(["fa3", "triton"], ARCHS, [KERNEL])
    assert found == ["server.attention_backends lists fa3, whose kernels (flash_ops.abi3.so) have no image for 12.0a: "
                     "serve with a backend that has them (triton, flashinfer), or drop 12.0a"]


@pytest.mark.parametrize("backends", [["triton"], ["flashinfer", "triton"], []])
def test_backends_compiled_at_start_run_on_every_arch(backends):
    assert gaps(backends, ARCHS, [KERNEL]) == []


def test_fa3_runs_where_its_kernels_have_the_arch_and_fails_where_the_package_lacks_them():
    assert gaps(["fa3"], ["9.0a"], [KERNEL]) == []
    stripped = _report(("sgl_kernel/common_ops.abi3.so", ["90a", "120a"]))
    assert gaps(["fa3"], ["9.0a"], [stripped]) == [
        "server.attention_backends lists fa3, but no kernel package here holds its kernels (flash_ops*.so*): "
        "install a kernel wheel that has them, or drop fa3"]


def _stack(backends: list[str]) -> dict:
    return {"cuda": {"version": "13.0.2"}, "archs": ARCHS, "server": {"attention_backends": backends}}


def test_validate_fails_a_stack_that_serves_fa3_on_12_0a(monkeypatch, tmp_path):
    wheel = tmp_path / "sglang_kernel-0.4.10-cp310-abi3-manylinux2014_x86_64.whl"
    monkeypatch.setattr(validate, "_wheels", lambda lock, cache, names: {
        "torch": ({}, tmp_path / "torch.whl"), "sglang-kernel": ({}, wheel)})
    monkeypatch.setattr(audit, "torch_from_wheel", lambda path: audit.Torch("2.14.1", set(), None))
    monkeypatch.setattr(audit, "audit_path", lambda target, installed, common: KERNEL)
    problems, detail = validate._kernels(_stack(["fa3"]), {"wheels": []}, tmp_path)
    assert [p for p in problems if "fa3" in p] and "(triton, flashinfer)" in problems[0]
    problems, detail = validate._kernels(_stack(["triton"]), {"wheels": []}, tmp_path)
    assert problems == [] and "attention backends triton run on 12.0a, 9.0a" in detail


def test_doctor_fails_a_venv_whose_fa3_kernels_lack_an_arch_the_stack_serves(monkeypatch):
    installed = {"sglang-kernel": {"version": "0.4.10", "files": [], "metadata": None}}
    monkeypatch.setattr(audit, "venv_context", lambda venv, names: (None, [], installed))
    monkeypatch.setattr(audit, "audit_path", lambda target, installed, common: KERNEL)
    checks = {c.name: c for c in doctor._kernels(str(Path("/nonexistent")), "13.0.2", ARCHS, ["fa3"])}
    assert checks["attention-backends"].status == "fail"
    assert "flash_ops.abi3.so" in checks["attention-backends"].detail
    assert checks["audit-sglang-kernel"].status == "pass"  # the wheel fits; it is the backend that does not
    checks = {c.name: c for c in doctor._kernels("/nonexistent", "13.0.2", ARCHS, ["triton"])}
    assert checks["attention-backends"].status == "pass"
    # no backend named: SGLang chooses at start, so the check could not look: a skip with its reason, never a pass
    checks = {c.name: c for c in doctor._kernels("/nonexistent", "13.0.2", ARCHS, [])}
    assert checks["attention-backends"].status == "skip" and "names no attention backend" in \
        checks["attention-backends"].detail
