"""The audit's rules and the build's settings, without wheels or a GPU."""
import pytest
from conftest import REPO

from rig.core import RigError
from rig.kernels.audit import _torch_pin, abi_of, covers
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
])
def test_which_code_runs_on_a_target(target, cubins, ptx, how):
    assert covers(target, cubins, ptx) == how


def test_the_torch_pin_is_read_from_metadata_but_not_from_extras():
    metadata = "Name: k\nRequires-Dist: torchvision\nRequires-Dist: torch==2.14.1\n" \
               "Requires-Dist: torch<3; extra == \"dev\"\n"
    assert _torch_pin(metadata) == "torch==2.14.1"
    assert _torch_pin("Name: k\nRequires-Dist: torchaudio\n") is None


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
