"""The one builder workflow: what the controller stages for a builder host or the image's builder stage."""
import shlex
import subprocess

import pytest
from harness.paths import CACHE, REPO

from rig.core import RigError
from rig.kernels.builder import stage
from rig.kernels.wheels import source_digest

EXT = REPO / "tests" / "data" / "rig_scale_ext"
STACK = str(REPO / "tests" / "data" / "stacks" / "torch-extension.yml")


@pytest.fixture
def sources(tmp_path):
    tree = tmp_path / "ext"
    subprocess.run(["cp", "-r", str(EXT), str(tree)], check=True)
    (tree / "build").mkdir()
    (tree / "build" / "leftover.o").write_bytes(b"old")  # a build leftover: never staged
    sdist = tmp_path / "ext-0.1.0.tar.gz"
    sdist.write_bytes(b"sdist bytes")
    return [{"key": "k-tree", "spec": str(tree)}, {"key": "k-sdist", "spec": str(sdist)},
            {"key": "k-git", "spec": "git+https://example.invalid/ext.git@v1"}]


def test_the_builder_gets_the_stack_and_clean_sources_and_one_argv_each(tmp_path, sources):
    out = tmp_path / "staged"
    staged = stage(sources, STACK, "abc123", CACHE, out, "/var/cache/rig/wheel-build", "/opt/rig/venv",
                   cuda_home="/usr/local/cuda-13.0", jobs=3)
    assert (out / "stack.yml").read_bytes() == open(STACK, "rb").read()
    assert not (out / "cuobjdump").exists()  # rig reads the archs itself: no cuobjdump travels
    assert source_digest(str(out / "src" / "k-tree")) == source_digest(sources[0]["spec"])  # so the same key
    assert not (out / "src" / "k-tree" / "build").exists()
    assert (out / "src" / "k-sdist" / "ext-0.1.0.tar.gz").read_bytes() == b"sdist bytes"
    root = "/var/cache/rig/wheel-build"
    assert [b["key"] for b in staged["builds"]] == ["k-tree", "k-sdist", "k-git"]
    assert [b["argv"][-1] for b in staged["builds"]] == [
        f"{root}/src/k-tree", f"{root}/src/k-sdist/ext-0.1.0.tar.gz", "git+https://example.invalid/ext.git@v1"]
    assert staged["builds"][0]["argv"][:-1] == [
        "wheels", "build", "--venv", "/opt/rig/venv", "--stack", f"{root}/stack.yml", "--lock-hash", "abc123",
        "--cache", f"{root}/cache", "--cuda-home", "/usr/local/cuda-13.0",
        "--jobs", "3"]
    assert staged["tools"] == ["g++", "python3-dev", "git"]  # git only because one source is a git URL


def test_hostile_source_paths_stay_one_argument(tmp_path):
    tree = tmp_path / "a b; rm -rf $HOME"
    subprocess.run(["cp", "-r", str(EXT), str(tree)], check=True)
    staged = stage([{"key": "k", "spec": str(tree)}], STACK, "h", CACHE, tmp_path / "out", "/r", "/v")
    assert staged["builds"][0]["argv"][-1] == "/r/src/k"  # the builder's path is rig's, never the user's
    assert shlex.split(shlex.join(staged["builds"][0]["argv"])) == staged["builds"][0]["argv"]


def test_refuses_a_dir_holding_files_and_a_relative_root_changing_nothing(tmp_path, sources):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep").write_text("mine")
    with pytest.raises(RigError, match="not empty"):
        stage(sources, STACK, "h", CACHE, full, "/r", "/v")
    assert [p.name for p in full.iterdir()] == ["keep"]
    with pytest.raises(RigError, match="absolute path"):
        stage(sources, STACK, "h", CACHE, tmp_path / "new", "relative/dir", "/v")
    assert not (tmp_path / "new").exists()
    with pytest.raises(RigError, match="no such source"):
        stage([*sources, {"key": "k", "spec": str(tmp_path / "missing")}], STACK, "h", CACHE, tmp_path / "new2",
              "/r", "/v")
    assert not (tmp_path / "new2").exists()


def test_a_source_overlapping_the_staged_dir_is_refused_and_one_source_is_staged_once(tmp_path, sources):
    out = tmp_path / "ext" / "staged"  # inside the source tree: a copy would recurse into itself
    with pytest.raises(RigError, match="overlap"):
        stage(sources[:1], STACK, "h", CACHE, out, "/r", "/v")
    assert not out.exists()
    with pytest.raises(RigError, match="overlap"):
        stage([{"key": "k", "spec": str(tmp_path)}], STACK, "h", CACHE, tmp_path / "x", "/r", "/v")
    twice = stage([sources[0], dict(sources[0])], STACK, "h", CACHE, tmp_path / "once", "/r", "/v")
    assert [b["key"] for b in twice["builds"]] == ["k-tree"]


def test_requirement_lines_are_read_strictly():
    from rig.python.pip import pinned, read_pinned

    good = pinned("torch", "2.11.0", "a" * 64)
    assert read_pinned(f"# rig\n\n{good}\n") == [("torch", "2.11.0", "a" * 64)]
    for bad in ("torch==2.11.0", f"{good} ; rm -rf /", "torch>=2 --hash=sha256:" + "a" * 64, "-e ."):
        with pytest.raises(RigError, match="line 2"):
            read_pinned(f"{good}\n{bad}\n")


def test_wheels_stage_check_keys_the_source_and_stages_nothing(tmp_path):
    """--check reads and keys the source as staging would (a link out of it still refused), copies nothing."""
    import json

    from harness.commands import rig
    from harness.paths import REPO

    source = tmp_path / "ext"
    source.mkdir()
    (source / "setup.py").write_text("from setuptools import setup\nsetup(name='ext')\n")
    cache = tmp_path / "cache"
    args = ["wheels", "stage", str(source), "--stack", str(REPO / "stacks" / "default.yml"), "--cache", str(cache),
            "--root", "/stage", "--venv", str(tmp_path / "venv"), "--check", "--json"]
    done = rig(*args)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["changed"] and said["key"] in said["dir"] and said["msg"].startswith(f"would stage {source}")
    assert not cache.exists()
    (source / "escape").symlink_to("/etc/hostname")
    refused = rig(*args)
    assert refused.returncode == 2 and "rig: error:" in refused.stderr and not cache.exists()
