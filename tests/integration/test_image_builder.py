"""rig image build's builder stage: a lock's source build compiled against the stack venv's
torch with the toolkit's nvcc, audited, kept in the controller's cache and installed into
the runtime, which holds neither the source nor the build's scratch."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import CACHE, REPO, rig, run
from rig.lock import read

pytestmark = pytest.mark.box

STACK = REPO / "tests" / "data" / "stacks" / "torch-extension.yml"
EXTENSION = REPO / "tests" / "data" / "rig_scale_ext"


def build() -> dict:
    done = rig("image", "build", "--json", "--stack", str(STACK), "--cache", CACHE)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads(done.stdout)


def inside(tag: str, script: str) -> str:
    done = run(["docker", "run", "--rm", "--entrypoint", "bash", tag, "-c", script])
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def built(base_image):
    os.environ.setdefault("RIG_BASE_IMAGE", base_image)
    key = json.loads(rig("wheels", "plan", "--json", "--stack", str(STACK), "--cache", CACHE,
                         str(EXTENSION)).stdout)["key"]
    shutil.rmtree(Path(CACHE) / "built" / key, ignore_errors=True)  # so the builder has to compile it
    result = build()
    yield {**result, "key": key}
    run(["docker", "rmi", "-f", result["tag"]])
    run(["docker", "image", "prune", "-f"])


def test_the_builder_compiles_the_extension_and_the_cache_keeps_it_audited(built):
    assert built["compiled"] == ["rig-scale-ext"] and built["builds"] == [built["key"]]
    kept = Path(CACHE) / "built" / built["key"]
    wheels = sorted(kept.glob("*.whl"))
    assert [w.name.split("-")[:2] for w in wheels] == [["rig_scale_ext", "0.1.0"]]
    audit = json.loads((kept / f"{wheels[0].name}.audit.json").read_text())
    assert audit["ok"], audit
    # the builder image is gone; its compile steps ran, not taken from a cache
    assert run(["docker", "image", "inspect", f"{built['tag']}-builder"]).returncode != 0
    compiled = [s for s in built["steps"] if "build.sh" in s["step"]]
    assert compiled and not compiled[0]["cached"]


def test_the_runtime_holds_the_built_wheel_and_no_source_or_scratch(built):
    labels = json.loads(run(["docker", "image", "inspect", built["tag"]]).stdout)[0]["Config"]["Labels"]
    assert labels["dev.rig.builds"] == "rig-scale-ext==0.1.0"
    # the sglang user imports it next to the venv's torch, without a GPU
    out = inside(built["tag"], "cd /tmp && /opt/rig/venv/bin/python -c 'import torch, rig_scale_ext; "
                               "print(torch.__version__, rig_scale_ext.__file__)'")
    assert out.startswith("2.14.1") and "/opt/rig/venv/" in out
    assert inside(built["tag"], "id -un").strip() == "sglang"
    wheel = next((Path(CACHE) / "built" / built["key"]).glob("*.whl"))
    sbom = json.loads(inside(built["tag"], "cat /opt/rig/sbom.cdx.json"))
    ext = [c for c in sbom["components"] if c["name"] == "rig-scale-ext"]
    assert ext and ext[0]["hashes"][0]["content"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert len(sbom["components"]) == len(read(STACK.with_suffix(".lock"))["wheels"]) + 1
    assert inside(built["tag"], "ls /opt/rig; ls /opt/rig/built").split() == \
        ["built", "env.json", "patches", "rig.pyz", "sbom.cdx.json", "venv", "wheelhouse", "built-requirements.txt"]


def test_a_rebuild_takes_the_kept_wheel_instead_of_compiling(built):
    again = build()
    assert again["tag"] == built["tag"] and again["compiled"] == []
    runtime = [s for s in again["steps"] if "venv add" in s["step"] or "venv install" in s["step"]]
    assert len(runtime) == 2 and all(s["cached"] for s in runtime)
