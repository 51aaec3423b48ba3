"""rig lock against real index metadata: exact, hashed, and refusals that name the problem.

These resolve with pip against the configured package index (metadata only, no
large downloads), so they need the index but no Docker engine.
"""
import json

import pytest
import yaml
from harness.commands import rig
from harness.paths import REPO

from rig.core import RigError
from rig.python.lock import build_lock, read, torch_cuda_major
from rig.stack.spec import load, validate

DEFAULT = REPO / "stacks" / "sm120-sglang-0.5.23.yml"


def variant(tmp_path, change: dict, base=DEFAULT) -> str:
    data = yaml.safe_load(base.read_text())
    for key, value in change.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / "variant.yml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_the_shipped_default_lock_is_current_and_complete():
    done = rig("lock", "--stack", str(DEFAULT), "--verify", "--json")
    assert done.returncode == 0, done.stderr
    old = rig("lock", "--stack", str(DEFAULT), "--check", "--json")  # the old spelling, until its release: the same
    assert old.returncode == 0 and old.stdout == done.stdout
    assert old.stderr == "rig: warning: `--check` is now `--verify`; the old spelling is removed in rig 0.2.0\n"
    lock = read(DEFAULT.with_suffix(".lock"))
    assert lock["complete"] and not lock["unresolved"]
    names = {w["name"]: w for w in lock["wheels"]}
    assert names["torch"]["version"] == "2.14.1" and names["sglang"]["version"] == "0.5.23"
    assert names["sglang-kernel"]["version"] == "0.4.10" and names["flashinfer-python"]["version"] == "0.7.2"
    assert all(len(w["sha256"]) == 64 and w["filename"].endswith(".whl") for w in lock["wheels"])
    assert "file://" not in DEFAULT.with_suffix(".lock").read_text()  # nothing of this machine


def test_an_extension_is_a_source_build_that_needs_no_index_entry():
    """rig's test extension is on no index: the lock lists it to build, beside torch's closure."""
    stack = REPO / "tests" / "data" / "stacks" / "torch-extension.yml"
    done = rig("lock", "--stack", str(stack), "--verify", "--json")
    assert done.returncode == 0, done.stderr
    lock = read(stack.with_suffix(".lock"))
    assert lock["complete"] and lock["source_builds"] == [
        {"name": "rig-scale-ext", "version": "0.1.0", "git": "", "ref": "", "path": "../rig_scale_ext",
         "subdirectory": ""}]
    assert "torch" in {w["name"] for w in lock["wheels"]} and "rig-scale-ext" not in {w["name"] for w in lock["wheels"]}


def test_a_stale_lock_is_detected(tmp_path):
    path = variant(tmp_path, {"description": "changed"})
    (tmp_path / "variant.lock").write_text(DEFAULT.with_suffix(".lock").read_text())
    done = rig("lock", "--stack", path, "--verify")
    assert done.returncode == 2 and "is stale" in done.stderr


def test_a_hand_edited_lock_is_refused(tmp_path):
    lock = json.loads(DEFAULT.with_suffix(".lock").read_text())
    lock["wheels"][0]["sha256"] = "0" * 64
    (tmp_path / "x.lock").write_text(json.dumps(lock))
    with pytest.raises(RigError, match="lock_hash does not match"):
        read(tmp_path / "x.lock")


def test_a_package_pin_that_contradicts_the_stack_names_both(tmp_path):
    path = variant(tmp_path, {"sglang": {"version": "0.5.9"}, "kernel": {"package": "sgl-kernel", "version": "0.3.21"},
                              "flashinfer": {"version": "0.6.3", "extras": []}})
    done = rig("lock", "--stack", path)
    assert done.returncode == 2
    assert "sglang 0.5.9 requires torch==2.9.1 but the stack pins torch 2.14.1 (torch.version)" in done.stderr
    assert not (tmp_path / "variant.lock").exists()


def test_torch_built_for_another_cuda_major_is_refused(tmp_path):
    stack = validate(yaml.safe_load(open(variant(tmp_path, {"torch": {"version": "2.9.1"}, "sglang": {"version": ""},
                                                            "kernel": {"version": ""}, "flashinfer": {"version": ""}}))))
    with pytest.raises(RigError, match=r"torch 2.9.1 is built for CUDA 12, but the stack's CUDA toolkit is 13.0.2"):
        build_lock(stack, "variant.yml")


def test_no_wheel_for_the_stacks_python_is_refused(tmp_path):
    path = variant(tmp_path, {"python": "3.10"})
    done = rig("lock", "--stack", path)
    assert done.returncode == 2
    assert "sglang: no wheel of sglang==0.5.23" in done.stderr and "for Python 3.10" in done.stderr


def test_the_0_5_9_stack_locks_what_it_can_and_says_what_it_cannot(tmp_path, monkeypatch):
    stack = load(REPO / "stacks" / "sm120-sglang-0.5.9.yml")
    monkeypatch.delenv("RIG_TORCH_CU130_INDEX", raising=False)
    unset = build_lock(stack, "sm120-sglang-0.5.9.yml")
    assert unset["complete"] is False
    assert "torch.index_url refers to ${RIG_TORCH_CU130_INDEX}, which is not set" in unset["unresolved"][0]["reason"]
    monkeypatch.setenv("RIG_TORCH_CU130_INDEX", "http://127.0.0.1:9/whl/cu130")  # nothing listens there
    lock = build_lock(stack, "sm120-sglang-0.5.9.yml")
    assert lock["complete"] is False
    assert "the index http://127.0.0.1:9/whl/cu130 does not answer" in lock["unresolved"][0]["reason"]
    assert [u["name"] for u in lock["unresolved"]] == ["torch"]
    assert {w["name"]: w["version"] for w in lock["wheels"]} == {"flashinfer-python": "0.6.3", "sglang": "0.5.9"}
    assert lock["source_builds"][0]["name"] == "sgl-kernel" and lock["source_builds"][0]["ref"] == "v0.5.9"
    assert lock["unresolved"][0]["index"] == "${RIG_TORCH_CU130_INDEX}"  # the lock names no site's mirror


def test_the_shipped_0_5_9_lock_is_partial_and_says_why():
    done = rig("lock", "--stack", str(REPO / "stacks" / "sm120-sglang-0.5.9.yml"), "--verify")
    assert done.returncode == 0, done.stderr
    lock = read(REPO / "stacks" / "sm120-sglang-0.5.9.lock")
    assert not lock["complete"] and lock["unresolved"][0]["name"] == "torch"


@pytest.mark.parametrize("version, requires, expected", [
    ("2.14.1", ["cuda-toolkit[cublas,cudart]==13.0.3; platform_system == 'Linux'"], 13),
    ("2.9.1", ["nvidia-cuda-runtime-cu12==12.8.90; platform_system == 'Linux'"], 12),
    ("2.9.1+cu130", [], 13),
    ("2.9.1+cu128", [], 12),
    ("2.13.0+cpu", [], None),
])
def test_torch_cuda_major_from_metadata(version, requires, expected):
    assert torch_cuda_major({"version": version, "requires_dist": requires}) == expected


def test_flashinfer_cubin_is_pinned_to_flashinfer_and_refused_where_none_exists(tmp_path):
    path = variant(tmp_path, {"flashinfer": {"cubin": True}})
    done = rig("lock", "--stack", path)
    assert done.returncode == 2
    assert "flashinfer: no wheel of flashinfer-cubin==0.7.2" in done.stderr


def test_flashinfer_jit_cache_is_recorded_as_a_source_build(tmp_path):
    stack = validate(yaml.safe_load(open(variant(tmp_path, {"flashinfer": {"version": "0.6.3", "jit_cache": True},
                                                            "torch": {"version": ""}, "sglang": {"version": ""},
                                                            "kernel": {"version": ""}}))))
    lock = build_lock(stack, "variant.yml")
    assert {"name": "flashinfer-jit-cache", "version": "0.6.3", "archs": ["12.0a", "9.0a"]} in lock["source_builds"]


def test_every_pin_conflict_is_named_in_one_run(tmp_path):
    """sglang 0.5.8 beside the default pins conflicts three ways; one answer names all of them."""
    path = variant(tmp_path, {"sglang": {"version": "0.5.8"}})
    done = rig("lock", "--stack", path)
    assert done.returncode == 2 and "3 conflicts; fix them all" in done.stderr, done.stderr
    for says in ("requires flashinfer_python==0.6.1 but the stack pins flashinfer-python 0.7.2 (flashinfer.version)",
                 "requires torch==2.9.1 but the stack pins torch 2.14.1 (torch.version)",
                 "requires sgl-kernel==0.3.21, but the stack's kernel.package is sglang-kernel"):
        assert says in done.stderr
    assert done.stderr.count("rig: error:") == 1 and not (tmp_path / "variant.lock").exists()
