"""The CUDA install engine's local rules, on temporary prefixes (no toolkit needed)."""
import json
import os

import pytest

from rig.core import RigError
from rig.core.fs import sha256_file
from rig.cuda import toolkit as cuda
from rig.cuda.toolkit import _wheel_target


@pytest.mark.parametrize("member, target", [
    ("nvidia/cu13/bin/nvcc", "bin/nvcc"),
    ("nvidia/cu13/lib/libnvrtc.so.13", "lib64/libnvrtc.so.13"),
    ("nvidia/cu13/nvvm/bin/cicc", "nvvm/bin/cicc"),
    ("nvidia/cuda_runtime/lib/libcudart.so.12", "lib64/libcudart.so.12"),
    ("nvidia/cuda_nvcc/nvvm/lib64/libnvvm.so", "nvvm/lib64/libnvvm.so"),
    ("nvidia/cu13/.metadata/provenance.txt", None),
    ("nvidia/cuda_runtime/__init__.py", None),
    ("nvidia_cuda_nvcc-13.0.88.dist-info/RECORD", None),
])
def test_wheel_members_map_onto_a_cuda_tree(member, target):
    assert _wheel_target(member) == target


def _fake_tree(prefix, name, marker=None):
    tree = prefix / name
    (tree / "bin").mkdir(parents=True)
    (tree / "bin" / "ptxas").touch()
    if marker:
        (tree / cuda.MARKER).write_text(json.dumps(marker))
    return tree


def test_a_tree_rig_did_not_install_is_refused_untouched(tmp_path):
    tree = _fake_tree(tmp_path, "cuda-13.0")
    (tree / "bin" / "mine").write_text("x")
    with pytest.raises(RigError, match="was not installed by rig; refusing"):
        cuda.install("13.0.2", tmp_path, "wheels", ["nvcc"], source=str(tmp_path), check=False)
    assert (tree / "bin" / "mine").read_text() == "x"


def test_install_is_a_no_op_when_the_marker_matches(tmp_path):
    _fake_tree(tmp_path, "cuda-13.0", {"version": "13.0.2", "method": "wheels", "components": ["nvcc"]})
    assert cuda.install("13.0.2", tmp_path, "wheels", ["nvcc"], check=True)["changed"] is False
    assert cuda.install("13.0.1", tmp_path, "wheels", ["nvcc"], check=True)["changed"] is True


def test_unknown_release_is_refused_before_anything(tmp_path):
    with pytest.raises(RigError, match="unknown CUDA version '12.4.0'"):
        cuda.install("12.4.0", tmp_path, "wheels", ["nvcc"], source=str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_default_link_switches_atomically_and_rolls_back(tmp_path):
    for name in ("cuda-12.9", "cuda-13.0"):
        _fake_tree(tmp_path, name)
    (tmp_path / "cuda").symlink_to("cuda-12.9")
    state = tmp_path / "state"
    assert cuda.set_default("13.0.2", tmp_path, state, check=True)["changed"] is True
    assert os.readlink(tmp_path / "cuda") == "cuda-12.9"  # --check changed nothing
    assert cuda.set_default("13.0.2", tmp_path, state)["previous"] == "cuda-12.9"
    assert os.readlink(tmp_path / "cuda") == "cuda-13.0"
    assert cuda.set_default("13.0.2", tmp_path, state)["changed"] is False
    assert cuda.rollback_default(tmp_path, state)["changed"] is True
    assert os.readlink(tmp_path / "cuda") == "cuda-12.9"
    assert cuda.rollback_default(tmp_path, state)["changed"] is False


def test_a_real_cuda_directory_is_never_replaced_by_a_link(tmp_path):
    _fake_tree(tmp_path, "cuda-13.0")
    (tmp_path / "cuda").mkdir()
    with pytest.raises(RigError, match="is a real directory"):
        cuda.set_default("13.0.2", tmp_path, tmp_path / "state")


def test_leftovers_of_an_interrupted_run_are_cleaned(tmp_path):
    stale = tmp_path / ".cuda-13.0.rig-staging-abc"
    (stale / "bin").mkdir(parents=True)
    cuda._clean_leftovers(tmp_path / "cuda-13.0")
    assert not stale.exists()


def test_a_runfile_with_the_wrong_hash_is_refused_and_not_kept(tmp_path):
    runfile = tmp_path / "cuda.run"
    runfile.write_bytes(b"#!/bin/sh\nexit 1\n")
    cache = tmp_path / "cache"
    with pytest.raises(RigError, match=f"expected {'1' * 64}"):
        cuda.fetch_runfile(f"file://{runfile}", "1" * 64, cache)
    assert list((cache / "runfile").iterdir()) == []
    good = sha256_file(runfile)
    assert cuda.fetch_runfile(f"file://{runfile}", good, cache)["changed"] is True
    assert cuda.fetch_runfile(f"file://{runfile}", good, cache)["changed"] is False


def test_a_tampered_wheel_fails_the_manifest(tmp_path):
    (tmp_path / "a.whl").write_bytes(b"real")
    (tmp_path / cuda.MANIFEST).write_text(json.dumps({"wheels": {"a.whl": sha256_file(tmp_path / "a.whl")}}))
    cuda.verify_manifest(tmp_path)
    (tmp_path / "a.whl").write_bytes(b"evil")
    with pytest.raises(RigError, match="sha256 differs"):
        cuda.verify_manifest(tmp_path)
