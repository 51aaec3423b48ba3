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


def _wheel_dir(root):
    root.mkdir()
    for name, data in (("nvidia_cuda_nvcc-13.0.88-py3-none-any.whl", b"nvcc"), ("cuda_toolkit-13.0.2.whl", b"t")):
        (root / name).write_bytes(data)
    wheels = {p.name: sha256_file(p) for p in sorted(root.iterdir())}
    (root / cuda.MANIFEST).write_text(json.dumps({"version": "13.0.2", "components": ["nvcc"], "wheels": wheels}))
    return root


def test_the_fetched_wheels_cross_as_one_archive_that_unpacks_to_the_same_files(tmp_path):
    source = _wheel_dir(tmp_path / "13.0.2-x86_64-nvcc")
    (source / ".stray").write_text("not the manifest's")  # left out: the archive holds what the manifest lists
    record = cuda.verify_manifest(source)
    archive = cuda.pack(source, record)
    made = archive.stat().st_mtime_ns
    assert archive.parent == tmp_path and archive.name.startswith("13.0.2-x86_64-nvcc-")
    assert cuda.pack(source, record) == archive and archive.stat().st_mtime_ns == made  # kept, named by content
    (tmp_path / "again").mkdir()
    again = _wheel_dir(tmp_path / "again" / "13.0.2-x86_64-nvcc")
    assert cuda.pack(again, record).read_bytes() == archive.read_bytes()  # mtimes and owners fixed
    into = tmp_path / "into"
    into.mkdir()
    cuda.unpack(archive, into)
    assert {p.name: p.read_bytes() for p in into.iterdir()} == \
        {p.name: p.read_bytes() for p in source.iterdir() if p.name != ".stray"}
    assert cuda.verify_manifest(into)["wheels"]
    archive.write_bytes(archive.read_bytes()[:1024])  # cut short (a crash, a full disk): packed again, whole
    assert cuda.pack(source, record).read_bytes() == cuda.pack(again, record).read_bytes()
    assert len(archive.read_bytes()) > 1024


def _tar(path, *members):
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _member(name, kind=None, data=b"x", target=""):
    import tarfile

    info = tarfile.TarInfo(name)
    info.size = len(data) if kind is None else 0
    if kind is not None:
        info.type, info.linkname = kind, target
    return info, data if kind is None else None


@pytest.mark.parametrize("member, named", [
    (_member("../escape.whl"), "'../escape.whl'"),
    (_member("sub/nested.whl"), "'sub/nested.whl'"),
    (_member("/abs.whl"), "'/abs.whl'"),
    (_member(".hidden"), "'.hidden'"),
    (_member("link.whl", b"2", target="/etc/passwd"), "'link.whl'"),  # a symlink
    (_member("hard.whl", b"1", target="manifest.json"), "'hard.whl'"),  # a hard link
    (_member("dev", b"3"), "'dev'"),  # a character device
    (_member("dir", b"5"), "'dir'"),
    (_member("fifo.whl", b"6"), "'fifo.whl'"),
])
def test_an_archive_with_anything_but_plain_files_is_refused_naming_the_member(tmp_path, member, named):
    into = tmp_path / "into"
    into.mkdir()
    archive = _tar(tmp_path / "bad.tar", _member("manifest.json"), member)
    with pytest.raises(RigError, match=f"member {named} is not a plain file"):
        cuda.unpack(archive, into)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["bad.tar", "into", "manifest.json"]


def test_an_archive_naming_one_file_twice_or_not_a_tar_is_refused(tmp_path):
    (tmp_path / "into").mkdir()
    twice = _tar(tmp_path / "twice.tar", _member("a.whl", data=b"first"), _member("a.whl", data=b"second"))
    with pytest.raises(RigError, match="is not a CUDA wheel archive rig made"):
        cuda.unpack(twice, tmp_path / "into")
    assert (tmp_path / "into" / "a.whl").read_bytes() == b"first"
    (tmp_path / "junk.tar").write_bytes(b"not a tar at all" * 100)
    (tmp_path / "into2").mkdir()
    with pytest.raises(RigError, match="is not a CUDA wheel archive rig made"):
        cuda.unpack(tmp_path / "junk.tar", tmp_path / "into2")


def test_a_sparse_member_or_sizes_beyond_the_archive_are_refused(tmp_path):
    """A sparse member reads as a regular file of any declared size (zeros): it would fill the disk."""
    import tarfile

    (tmp_path / "into").mkdir()
    sparse, _ = _member("big.whl")
    sparse.type = tarfile.GNUTYPE_SPARSE
    archive = _tar(tmp_path / "sparse.tar", _member("manifest.json"), (sparse, b"x"))
    with pytest.raises(RigError, match="big.whl|is not a CUDA wheel archive"):
        cuda.unpack(archive, tmp_path / "into")
    assert not (tmp_path / "into" / "big.whl").exists()
    claimed, _ = _member("huge.whl")
    claimed.size = 10**12  # a header alone: the bytes it claims are not there
    (tmp_path / "into3").mkdir()
    with pytest.raises(RigError, match="claim more bytes than the archive holds"):
        cuda.unpack(_tar(tmp_path / "claimed.tar", (claimed, None)), tmp_path / "into3")
    assert list((tmp_path / "into3").iterdir()) == []
    many = _tar(tmp_path / "many.tar", *(_member(f"w{i}.whl") for i in range(cuda.ARCHIVE_MEMBERS + 1)))
    (tmp_path / "into2").mkdir()
    with pytest.raises(RigError, match=f"more than {cuda.ARCHIVE_MEMBERS} members"):
        cuda.unpack(many, tmp_path / "into2")


@pytest.mark.parametrize("command", [["install", "--source", "anything"], ["install", "--check"], ["fetch"]])
def test_the_apt_method_is_refused_naming_the_role_that_installs_it(tmp_path, command):
    """A stack's cuda.method apt is NVIDIA's packages through apt, which the cuda_toolkit role installs (its
    tasks/apt.yml, the one place); rig cuda fetch and install say so in one line and change nothing."""
    from harness.commands import rig

    done = rig("cuda", *command, "--version", "13.0.2", "--method", "apt",
               *(["--prefix", str(tmp_path / "prefix")] if command[0] == "install" else
                 ["--cache", str(tmp_path / "cache")]))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "the apt method is installed by apt through the cuda_toolkit role" in done.stderr
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RigError, match="unknown CUDA install method 'yum'"):
        cuda.check_method("yum")


def test_fetch_under_check_says_what_it_would_download_and_downloads_nothing(tmp_path):
    """No network here: --check answers from the cache alone, and writes nothing into it."""
    from harness.commands import rig

    cache = tmp_path / "cache"
    done = rig("cuda", "fetch", "--version", "13.0.2", "--check", "--json", "--cache", str(cache))
    said = json.loads(done.stdout)
    assert done.returncode == 0 and said["changed"] and said["msg"].startswith("would download cuda-toolkit[")
    assert not cache.exists()
    runfile = cache / "runfile"
    runfile.mkdir(parents=True)
    (runfile / "kept.run").write_bytes(b"a runfile")
    digest = sha256_file(runfile / "kept.run")
    (runfile / "kept.run").rename(runfile / f"{digest}.run")
    argv = ["cuda", "fetch", "--version", "13.0.2", "--method", "runfile", "--url", "https://example.invalid/cuda.run",
            "--check", "--json", "--cache", str(cache)]
    assert json.loads(rig(*argv, "--sha256", digest).stdout)["changed"] is False
    other = json.loads(rig(*argv, "--sha256", "ab" * 32).stdout)
    assert other["changed"] and other["msg"].startswith("would download https://example.invalid/cuda.run")
    assert sorted(p.name for p in runfile.iterdir()) == [f"{digest}.run"]
