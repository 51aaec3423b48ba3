"""rig image build's builder stage and a base that brings its own CUDA.

A lock's source build is compiled against the stack venv's torch with the toolkit's nvcc,
audited, kept in the controller's cache and installed into the runtime, which holds
neither the source nor the build's scratch. The base here carries a CUDA 13.0 tree that
rig did not install, where NVIDIA's CUDA images carry theirs (no registry answers here to
pull one); the image must keep that tree, not refuse it or copy a second one."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from harness.commands import ok, rig, run
from harness.images import in_image, prune
from harness.paths import CACHE, REPO

from rig.python.lock import read

pytestmark = pytest.mark.box

STACK = REPO / "tests" / "data" / "stacks" / "torch-extension.yml"
EXTENSION = REPO / "tests" / "data" / "rig_scale_ext"


def build(base: str, *args: str) -> dict:
    done = rig("image", "build", "--json", "--stack", str(STACK), "--cache", CACHE, "--base", base, *args)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads(done.stdout)


def derived_base(base_image: str, work: Path, tag: str, *lines: str) -> str:
    (work / "Dockerfile").write_text("\n".join([f"FROM {base_image}", *lines]) + "\n")
    ok(run(["docker", "build", "-q", "-t", tag, str(work)]))
    return tag


@pytest.fixture(scope="module")
def cuda_base(base_image, tmp_path_factory):
    """rig's base with a CUDA 13.0 tree at /usr/local/cuda-13.0 that rig did not install."""
    work = tmp_path_factory.mktemp("cuda-base")
    fetched = json.loads(ok(rig("cuda", "fetch", "--json", "--version", "13.0.2", "--cache", CACHE)).stdout)
    ok(rig("cuda", "install", "--version", "13.0.2", "--source", fetched["dir"], "--prefix", str(work)))
    (work / "cuda-13.0" / ".rig-toolkit.json").unlink()  # not rig's: the build must not touch it
    yield derived_base(base_image, work, "rig-test/cuda-base:13.0", "COPY cuda-13.0 /usr/local/cuda-13.0")
    run(["docker", "rmi", "-f", "rig-test/cuda-base:13.0"])


@pytest.fixture(scope="module")
def built(cuda_base):
    key = json.loads(rig("wheels", "plan", "--json", "--stack", str(STACK), "--cache", CACHE,
                         str(EXTENSION)).stdout)["key"]
    # so the builder has to compile it: neither rig's cache nor BuildKit's (an earlier run's) may hold it
    shutil.rmtree(Path(CACHE) / "built" / key, ignore_errors=True)
    result = build(cuda_base, "--no-cache")
    yield {**result, "key": key, "base": cuda_base}
    run(["docker", "rmi", "-f", result["tag"]])
    prune(STACK.with_suffix(".lock"))


def test_the_builder_compiles_the_extension_and_the_cache_keeps_it_audited(built):
    assert built["compiled"] == ["rig-scale-ext"] and built["builds"] == [built["key"]]
    kept = Path(CACHE) / "built" / built["key"]
    wheels = sorted(kept.glob("*.whl"))
    assert [w.name.split("-")[:2] for w in wheels] == [["rig_scale_ext", "0.1.0"]]
    audit = json.loads((kept / f"{wheels[0].name}.audit.json").read_text())
    assert audit["ok"], audit
    # no builder image is left (only its wheels come out); its compile step ran, not taken from a cache
    assert run(["docker", "image", "inspect", f"{built['tag']}-builder"]).returncode != 0
    compiled = [s for s in built["steps"] if "build.sh" in s["step"]]
    assert compiled and not compiled[0]["cached"]


def test_the_runtime_holds_the_built_wheel_and_no_source_or_scratch(built):
    labels = json.loads(run(["docker", "image", "inspect", built["tag"]]).stdout)[0]["Config"]["Labels"]
    assert labels["dev.rig.builds"] == "rig-scale-ext==0.1.0"
    # the sglang user imports it next to the venv's torch, without a GPU
    out = in_image(built["tag"], "cd /tmp && /opt/rig/venv/bin/python -c 'import torch, rig_scale_ext; "
                               "print(torch.__version__, rig_scale_ext.__file__)'")
    assert out.startswith("2.14.1") and "/opt/rig/venv/" in out
    assert in_image(built["tag"], "id -un").strip() == "sglang"
    wheel = next((Path(CACHE) / "built" / built["key"]).glob("*.whl"))
    sbom = json.loads(in_image(built["tag"], "cat /opt/rig/sbom.cdx.json"))
    ext = [c for c in sbom["components"] if c["name"] == "rig-scale-ext"]
    assert ext and ext[0]["hashes"][0]["content"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert len(sbom["components"]) == len(read(STACK.with_suffix(".lock"))["wheels"]) + 1
    assert in_image(built["tag"], "ls /opt/rig; ls /opt/rig/built").split() == \
        ["built", "env.json", "patches", "rig.pyz", "sbom.cdx.json", "venv", "wheelhouse", "built-requirements.txt"]


def test_the_image_keeps_the_bases_cuda_tree_and_verifies(built):
    assert built["toolkit"] == "base"
    # the base's tree, untouched (no rig marker), and no second copy of it in a layer of the build
    assert in_image(built["tag"], "ls -A /usr/local/cuda-13.0").split() == \
        in_image(built["base"], "ls -A /usr/local/cuda-13.0").split()
    assert ".rig-toolkit.json" not in in_image(built["tag"], "ls -A /usr/local/cuda-13.0")
    history = run(["docker", "history", "--no-trunc", "--human=false", "--format", "{{.Size}}|{{.CreatedBy}}",
                   built["tag"]]).stdout.splitlines()
    toolkit_layer = [int(line.split("|")[0]) for line in history if "COPY /out/ /" in line]
    assert len(toolkit_layer) == 1 and toolkit_layer[0] < 100_000, history  # the ldconfig file alone
    done = rig("image", "verify", built["tag"], "--json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    checks = {c["name"]: c["status"] for c in json.loads(done.stdout)["doctor"]["checks"]}
    assert checks["cuda-13.0"] == checks["libnvrtc.so.13"] == checks["compile-sm_120a"] == "pass", checks


def test_a_base_without_python3_is_refused_before_anything_builds(base_image, tmp_path):
    tag = derived_base(base_image, tmp_path, "rig-test/no-python:1", "RUN rm -f /usr/bin/python3*")
    try:
        done = rig("image", "build", "--stack", str(STACK), "--cache", CACHE, "--base", tag)
        assert done.returncode == 2
        assert "has no python3" in done.stderr and "Python 3.11" in done.stderr
    finally:
        run(["docker", "rmi", "-f", tag])


def test_a_rebuild_takes_the_kept_wheel_instead_of_compiling(built):
    again = build(built["base"])
    assert again["tag"] == built["tag"] and again["compiled"] == []
    runtime = [s for s in again["steps"] if "venv add" in s["step"] or "venv install" in s["step"]]
    assert len(runtime) == 2 and all(s["cached"] for s in runtime)
