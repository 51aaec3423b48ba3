"""rig audit and rig wheels build on real wheels: sgl-kernel 0.3.21, sglang-kernel 0.4.10,
torch 2.14.1 and 2.9.1, flashinfer-cubin 0.6.13, and a small torch CUDA extension built here without a GPU."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from harness.commands import ok, rig
from harness.paths import CACHE, DEFAULT_LOCK, REPO

from rig.python.lock import read
from rig.python.pip import download, target_args
from rig.python.wheelhouse import cached_path

pytestmark = pytest.mark.venv

EXTENSION = REPO / "tests" / "data" / "rig_scale_ext"


def index_wheel(requirement: str) -> Path:
    """A wheel from the configured index, cached under $RIG_CACHE/index-wheels."""
    dest = Path(CACHE) / "index-wheels" / requirement.replace("==", "-")
    if not list(dest.glob("*.whl")):
        download([requirement], dest, target_args("3.11"), [])
    return next(dest.glob("*.whl"))


def locked_wheel(name: str) -> Path:
    ok(rig("wheelhouse", "fetch", str(DEFAULT_LOCK), "--cache", CACHE))
    return cached_path(CACHE, next(w for w in read(DEFAULT_LOCK)["wheels"] if w["name"] == name))


def audit(*args: str) -> tuple[int, list[dict]]:
    done = rig("audit", "--json", *args)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)


@pytest.fixture(scope="session")
def cuda_home(tmp_path_factory) -> Path:
    """CUDA 13.0.2 from NVIDIA's wheels (rig's wheels method) in a temporary prefix."""
    prefix = tmp_path_factory.mktemp("cuda")
    fetched = json.loads(ok(rig("cuda", "fetch", "--version", "13.0.2", "--json", "--cache", CACHE)).stdout)
    ok(rig("cuda", "install", "--version", "13.0.2", "--prefix", str(prefix), "--source", fetched["dir"]))
    return prefix / "cuda-13.0"


@pytest.fixture(scope="session")
def built(lab, cuda_home, tmp_path_factory) -> Path:
    """The test extension built by rig against torch 2.14.1 (CUDA 13.0) for the default stack's archs."""
    cache = tmp_path_factory.mktemp("built-cache")
    (cache / "tools").symlink_to(Path(CACHE) / "tools")  # cuobjdump, fetched once
    result = json.loads(ok(rig("wheels", "build", str(EXTENSION), "--venv", str(lab["v23"]), "--cuda-home",
                               str(cuda_home), "--cache", str(cache), "--json")).stdout)
    return Path(result["wheel"])


def test_a_cubin_wheel_without_sm_120_sass_fails_a_12_0a_stack_and_fits_the_archs_it_carries(tmp_path):
    """flashinfer-cubin 0.6.13 ships its prebuilt kernels as .cubin files for Blackwell's datacenter
    parts only: the audit reads each file's arch and names the 12.0a target it leaves without a kernel."""
    stack = tmp_path / "archs.yml"
    data = yaml.safe_load((REPO / "stacks" / "default.yml").read_text())
    stack.write_text(yaml.safe_dump({**data, "archs": ["12.0a", "10.0a", "9.0a"]}))
    code, [report] = audit(str(index_wheel("flashinfer-cubin==0.6.13")), "--stack", str(stack))
    assert code == 1
    assert report["archs"] == {"12.0a": None, "10.0a": "cubin sm_100a", "9.0a": None}
    assert sum(report["cubin_files"].values()) > 10000 and {"100f", "103a"} <= set(report["cubin_files"])
    assert not [arch for arch in report["cubin_files"] if arch.startswith("12")]
    assert [e.split(":")[0] for e in report["errors"]] == ["no kernel image for 12.0a", "no kernel image for 9.0a"]
    assert "flashinfer_cubin-0.6.13-py3-none-any.whl has cubins sm_100, sm_100a, sm_100f" in report["errors"][0]
    assert "flashinfer.cubin: false in the stack, and flashinfer JIT-compiles for 12.0a" in report["errors"][0]


def test_sgl_kernel_0_3_21_fails_a_cuda_13_stack_naming_its_cuda_12_libraries():
    code, [report] = audit(str(index_wheel("sgl-kernel==0.3.21")))
    assert code == 1 and not report["ok"]
    text = "\n".join(report["errors"])
    assert "needs libcudart.so.12, a CUDA 12 library, in a CUDA 13 stack" in text
    assert "needs libnvrtc.so.12, a CUDA 12 library, in a CUDA 13 stack" in text
    assert "120a" in report["cubins"] and report["archs"]["12.0a"] == "cubin sm_120a"


def test_sglang_kernel_0_4_10_against_torch_2_14_1_passes(lab):
    """Recorded verdict: every torch symbol it needs is exported by torch 2.14.1, its CUDA
    libraries are CUDA 13 and resolve in the venv, and it has cubins for both archs."""
    code, [report, installed] = audit(str(locked_wheel("sglang-kernel")), "sglang-kernel", "--venv", str(lab["v23"]))
    assert code == 0 and report["ok"] and installed["ok"], report["errors"] + installed["errors"]
    assert report["torch"] == "2.14.1" and report["torch_pin"] == "torch==2.14.1"
    assert {"120a", "90a"} <= set(report["cubins"])
    # the union covers both archs; per object, FlashAttention-3's and FlashMLA's ops have no sm_120 kernel
    assert {n.split(":")[0] for n in report["notes"] if "no kernel image for 12.0a" in n} == \
        {"sgl_kernel/flash_ops.abi3.so", "sgl_kernel/flashmla_ops.abi3.so"}
    needed = {s for o in report["objects"] for s in o["needed_cuda"]}
    assert "libcudart.so.13" in needed and not any(s.endswith(".so.12") for s in needed)


def test_the_extension_built_without_a_gpu_carries_both_archs_and_passes(lab, built):
    assert built.parent.parent.name == "built"  # accepted into the wheelhouse under its key
    saved = json.loads(built.with_name(built.name + ".audit.json").read_text())
    code, [report] = audit(str(built), "--venv", str(lab["v23"]))
    assert code == 0 and report["ok"] and saved["ok"]
    assert report["cubins"] == ["120a", "90a"] and report["archs"] == {"12.0a": "cubin sm_120a",
                                                                       "9.0a": "cubin sm_90a"}
    assert report["torch_pin"] == "torch==2.14.1"


def test_the_same_wheel_against_another_torch_fails_naming_symbols_and_pin(built):
    code, [report] = audit(str(built), "--torch", str(index_wheel("torch==2.9.1")))
    assert code == 1
    text = "\n".join(report["errors"])
    assert "requires torch==2.14.1, the torch in use is 2.9.1" in text
    unresolved = [s for o in report["objects"] for s in o["unresolved_torch"]]
    assert unresolved and all("(" in s for s in unresolved)  # demangled C++ names


def test_a_stack_asking_for_an_arch_the_wheel_lacks_fails_naming_it(built, tmp_path):
    stack = tmp_path / "sm100.yml"
    stack.write_text(yaml.safe_dump({"name": "sm100", "cuda": {"version": "13.0.2"}, "archs": ["10.0a", "9.0a"]}))
    code, [report] = audit(str(built), "--stack", str(stack))
    assert code == 1 and report["archs"]["10.0a"] is None
    assert any(e.startswith("no kernel image for 10.0a") for e in report["errors"])


def test_a_build_that_fails_its_audit_is_not_kept(lab, cuda_home, tmp_path):
    """Built for a CUDA 12 stack with nvcc 13: the wheel links libcudart.so.13 and is refused."""
    stack = tmp_path / "cuda12.yml"
    stack.write_text(yaml.safe_dump({"name": "cuda12", "cuda": {"version": "12.9.1"}, "archs": ["9.0a"]}))
    (tmp_path / "cache" / "tools").parent.mkdir()
    (tmp_path / "cache" / "tools").symlink_to(Path(CACHE) / "tools")
    done = rig("wheels", "build", str(EXTENSION), "--venv", str(lab["v23"]), "--cuda-home", str(cuda_home),
               "--stack", str(stack), "--cache", str(tmp_path / "cache"))
    assert done.returncode == 2 and "failed the audit and was not kept" in done.stderr
    assert "needs libcudart.so.13, a CUDA 13 library, in a CUDA 12 stack" in done.stderr
    assert not (tmp_path / "cache" / "built").exists() or not list((tmp_path / "cache" / "built").rglob("*.whl"))
