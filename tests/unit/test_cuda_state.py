"""The CUDA default link's rollback record and the per-prefix lock, against hostile and concurrent use."""
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from rig.core import RigError
from rig.core.fs import sha256_file
from rig.cuda import toolkit as cuda


def _trees(prefix, *names):
    for name in names:
        (prefix / name / "bin").mkdir(parents=True)
        (prefix / name / "bin" / "nvcc").touch()


def test_a_rollback_of_one_prefix_never_reads_another_prefixes_record(tmp_path):
    a, b, state = tmp_path / "a", tmp_path / "b", tmp_path / "state"
    _trees(a, "cuda-12.9", "cuda-13.0")
    _trees(b, "cuda-13.0")
    (a / "cuda").symlink_to("cuda-12.9")
    cuda.set_default("13.0.2", a, state)
    cuda.set_default("13.0.2", b, state)
    assert cuda.rollback_default(b, state)["target"] is None
    assert not (b / "cuda").is_symlink()  # b had no link before: none now, not a dangling cuda-12.9
    assert cuda.rollback_default(a, state)["target"] == "cuda-12.9"
    assert os.readlink(a / "cuda") == "cuda-12.9"


@pytest.mark.parametrize("previous", ["/etc", "../../etc", "cuda-13.0/../../etc", "cuda-13.0/bin", 7, "cuda-13.0\n", ""])
def test_a_tampered_rollback_record_is_refused_and_the_link_kept(tmp_path, previous):
    state = tmp_path / "state"
    _trees(tmp_path, "cuda-13.0")
    cuda.set_default("13.0.2", tmp_path, state)
    record = next(state.iterdir())
    record.write_text(json.dumps({**json.loads(record.read_text()), "previous": previous}))
    with pytest.raises(RigError, match="is not a link target|does not lead to a CUDA toolkit|dangling"):
        cuda.rollback_default(tmp_path, state)
    assert os.readlink(tmp_path / "cuda") == "cuda-13.0"


@pytest.mark.parametrize("text", ["", "[]", "{\"previous\": null}", "\xff\xfe"])
def test_a_rollback_record_of_the_wrong_shape_names_the_file(tmp_path, text):
    state = tmp_path / "state"
    _trees(tmp_path, "cuda-13.0")
    cuda.set_default("13.0.2", tmp_path, state)
    next(state.iterdir()).write_text(text, errors="surrogateescape")
    with pytest.raises(RigError, match="remove it to start afresh"):
        cuda.rollback_default(tmp_path, state)


def test_a_rollback_that_would_leave_a_dangling_link_is_refused(tmp_path):
    state = tmp_path / "state"
    _trees(tmp_path, "cuda-12.9", "cuda-13.0")
    (tmp_path / "cuda").symlink_to("cuda-12.9")
    cuda.set_default("13.0.2", tmp_path, state)
    shutil.rmtree(tmp_path / "cuda-12.9")
    with pytest.raises(RigError, match="would leave .* dangling"):
        cuda.rollback_default(tmp_path, state, check=True)
    assert os.readlink(tmp_path / "cuda") == "cuda-13.0"


def test_a_dry_run_refuses_what_the_real_run_refuses(tmp_path):
    with pytest.raises(RigError, match="does not exist; install CUDA 13.0.2"):
        cuda.set_default("13.0.2", tmp_path, tmp_path / "state", check=True)
    # within a run that installs the toolkit first (the role's --check), the tree may be missing
    assert cuda.set_default("13.0.2", tmp_path, tmp_path / "state", check=True, installing=True)["changed"]
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_component_is_refused_before_anything(tmp_path):
    with pytest.raises(RigError, match="unknown CUDA component 'bogus'"):
        cuda.install("13.0.2", tmp_path / "p", "wheels", ["bogus"], source=str(tmp_path))
    assert not (tmp_path / "p").exists()


def test_two_installs_into_one_prefix_take_turns(tmp_path):
    """Without the prefix lock each run cleans the other's staging as leftovers of an interrupted run."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    name = "nvidia_cuda_runtime-13.0.96-py3-none-manylinux_2_27_x86_64.whl"
    with zipfile.ZipFile(wheels / name, "w") as archive:
        archive.writestr("nvidia/cu13/lib/libcudart.so.13", os.urandom(24 << 20))
    (wheels / cuda.MANIFEST).write_text(json.dumps({"wheels": {name: sha256_file(wheels / name)}}))
    prefix = tmp_path / "prefix"
    argv = [sys.executable, "-m", "rig", "cuda", "install", "--version", "13.0.2", "--component", "cudart",
            "--source", str(wheels), "--prefix", str(prefix), "--json"]
    runs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(run.wait(timeout=120), *run.communicate()) for run in runs]
    assert [rc for rc, _, _ in results] == [0, 0], results
    assert sorted(json.loads(out)["changed"] for _, out, _ in results) == [False, True]
    assert (prefix / "cuda-13.0" / "lib64" / "libcudart.so.13").stat().st_size == 24 << 20
    assert sorted(p.name for p in prefix.iterdir()) == [".rig-cuda.lock", "cuda-13.0"]


def test_a_link_nvidias_packages_made_rolls_back(tmp_path):
    """NVIDIA's .deb packages point /usr/local/cuda at /etc/alternatives/cuda: rollback restores that."""
    prefix, alternatives = tmp_path / "prefix", tmp_path / "alternatives"
    _trees(prefix, "cuda-12.8", "cuda-13.0")
    alternatives.mkdir()
    (alternatives / "cuda").symlink_to(prefix / "cuda-12.8")
    (prefix / "cuda").symlink_to(alternatives / "cuda")
    cuda.set_default("13.0.2", prefix, tmp_path / "state")
    assert cuda.rollback_default(prefix, tmp_path / "state")["target"] == str(alternatives / "cuda")
    assert os.readlink(prefix / "cuda") == str(alternatives / "cuda")
