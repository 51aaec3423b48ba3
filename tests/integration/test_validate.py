"""rig validate: the shipped stacks pass; a stack broken several ways fails every way in one run.

Real metadata from the index and real wheels from the wheelhouse (sgl-kernel 0.3.21,
a CUDA 12 build, is the broken kernel); no GPU and, but for the parser check, no venv.
"""
from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from harness.commands import rig
from harness.paths import CACHE, DEFAULT_LOCK, REPO

from rig.core.fs import sha256_file
from rig.python.lock import lock_hash, stack_digest
from rig.python.wheelhouse import cached_path
from rig.stack.spec import load

CHECKS = ["schema", "lock", "conflicts", "kernels", "toolchain", "patches", "server", "environment"]


def validate(stack: Path, *extra: str) -> tuple[int, dict, list]:
    junit = stack.parent / "junit.xml" if stack.parent != REPO / "stacks" else Path(os.devnull)
    done = rig("validate", "--stack", str(stack), "--json", "--cache", CACHE, *extra,
               *([] if junit == Path(os.devnull) else ["--junit", str(junit)]))
    assert done.returncode in (0, 1), done.stderr[-3000:]
    cases = list(ET.parse(junit).getroot().iter("testcase")) if junit.exists() and junit != Path(os.devnull) else []
    return done.returncode, {c["name"]: c for c in json.loads(done.stdout)["checks"]}, cases


@pytest.mark.parametrize("name", ["default.yml", "h200-sglang-0.5.17.yml", "cuda-13.0.yml"])
def test_the_shipped_stacks_validate(name):
    code, checks, _ = validate(REPO / "stacks" / name)
    assert code == 0, {n: c["problems"] for n, c in checks.items() if c["problems"]}
    assert list(checks) == CHECKS


def _cuda12_kernel() -> dict:
    from rig.python.pip import download, target_args

    dest = Path(CACHE) / "index-wheels" / "sgl-kernel-0.3.21"  # shared with the audit tests
    if not list(dest.glob("*.whl")):
        download(["sgl-kernel==0.3.21"], dest, target_args("3.11"), [])
    wheel = next(dest.glob("*.whl"))
    entry = {"name": "sgl-kernel", "version": "0.3.21", "filename": wheel.name, "sha256": sha256_file(wheel),
             "index": "default"}
    kept = cached_path(CACHE, entry)
    if not kept.exists():
        kept.parent.mkdir(parents=True, exist_ok=True)
        os.link(wheel, kept)
    return entry


def test_a_stack_broken_three_ways_fails_three_checks_in_one_run(tmp_path):
    data = yaml.safe_load((REPO / "stacks" / "default.yml").read_text())
    data["kernel"] = {"package": "sgl-kernel", "version": "0.3.21"}
    stack = tmp_path / "broken.yml"
    stack.write_text(yaml.safe_dump(data))
    lock = json.loads(DEFAULT_LOCK.read_text())
    lock["wheels"] = sorted([w for w in lock["wheels"] if w["name"] != "sglang-kernel"] + [_cuda12_kernel()],
                            key=lambda w: w["name"])
    lock["stack_digest"] = stack_digest(load(stack))
    lock.pop("lock_hash")
    lock["lock_hash"] = lock_hash(lock)
    (tmp_path / "broken.lock").write_text(json.dumps(lock))
    patches = tmp_path / "patches"
    patches.mkdir()
    patch = yaml.safe_load((REPO / "rig" / "patches" / "set" / "sglang-symm-mem-max-sizes-sm120.yml").read_text())
    patch.update(id="drifted-anchor")
    patch["hunks"][0]["find"] = "def this_function_is_not_in_sglang_0_5_23():\n"
    (patches / "drifted-anchor.yml").write_text(yaml.safe_dump(patch))

    code, checks, cases = validate(stack, "--patches", str(patches))
    assert code == 1
    assert [n for n, c in checks.items() if c["status"] == "fail"] == ["conflicts", "kernels", "patches"]
    assert any("requires sglang-kernel==0.4.10, but the stack's kernel.package is sgl-kernel" in p
               for p in checks["conflicts"]["problems"])
    assert any("needs libcudart.so.12, a CUDA 12 library, in a CUDA 13 stack" in p for p in checks["kernels"]["problems"])
    assert any(p.startswith("drifted-anchor: drifted in sglang 0.5.23: expected code not found")
               for p in checks["patches"]["problems"])
    assert checks["server"]["status"] == "skip"
    assert [c.get("name").split(":")[0] for c in cases] == CHECKS
    failed = [c.get("name").split(":")[0] for c in cases if c.find("failure") is not None]
    assert failed == ["conflicts", "kernels", "patches"]


def relocked(tmp_path: Path, name: str, wheels: list[dict]) -> Path:
    """The default stack under NAME with its lock's wheels replaced by WHEELS, the lock current for it."""
    stack = tmp_path / f"{name}.yml"
    stack.write_text((REPO / "stacks" / "default.yml").read_text())
    lock = json.loads(DEFAULT_LOCK.read_text())
    lock["wheels"] = sorted(wheels, key=lambda w: w["name"])
    lock["stack_digest"] = stack_digest(load(stack))
    lock.pop("lock_hash")
    lock["lock_hash"] = lock_hash(lock)
    (tmp_path / f"{name}.lock").write_text(json.dumps(lock))
    return stack


def test_flashinfer_packages_of_two_versions_and_a_cuda_12_torch_fail_the_toolchain_check(tmp_path):
    wheels = json.loads(DEFAULT_LOCK.read_text())["wheels"]
    runtime = next(w for w in wheels if w["name"] == "nvidia-cuda-runtime")
    cubin = {"name": "flashinfer-cubin", "version": "0.7.1", "filename": "flashinfer_cubin-0.7.1-py3-none-any.whl",
             "sha256": "0" * 64, "index": "default"}
    stack = relocked(tmp_path, "mixed", [w for w in wheels if w is not runtime] + [cubin, {**runtime, "version": "12.8.90"}])
    code, checks, _ = validate(stack)
    assert code == 1 and checks["toolchain"]["status"] == "fail", checks["toolchain"]
    problems = checks["toolchain"]["problems"]
    assert any(p.startswith("flashinfer-cubin 0.7.1 beside flashinfer-python 0.7.2") for p in problems), problems
    assert any("torch runs CUDA 12.8 (nvidia-cuda-runtime 12.8.90) but the stack's toolkit (cuda.version 13.0.2) "
               "is CUDA 13.0" in p for p in problems), problems
    assert checks["lock"]["status"] == "pass"  # the lock is current: only what it holds disagrees


def test_a_stale_lock_fails_and_the_checks_that_need_it_say_so(tmp_path):
    data = yaml.safe_load((REPO / "stacks" / "default.yml").read_text())
    data["description"] = "edited after locking"
    stack = tmp_path / "stale.yml"
    stack.write_text(yaml.safe_dump(data))
    (tmp_path / "stale.lock").write_text(DEFAULT_LOCK.read_text())
    code, checks, _ = validate(stack)
    assert code == 1 and checks["lock"]["status"] == "fail" and "is stale" in checks["lock"]["problems"][0]
    assert checks["kernels"]["status"] == checks["patches"]["status"] == "skip"
    assert "no current, complete lock" in checks["kernels"]["detail"]


@pytest.mark.venv
def test_a_flag_the_locked_sglang_rejects_fails_the_server_check(lab, tmp_path):
    data = yaml.safe_load((REPO / "stacks" / "default.yml").read_text())
    data["server"].update(model="/models/target", draft_model="/models/draft", extra_args=["--no-such-flag"])
    stack = tmp_path / "flag.yml"
    stack.write_text(yaml.safe_dump(data))
    (tmp_path / "flag.lock").write_text(DEFAULT_LOCK.read_text())  # server settings leave the lock current
    code, checks, _ = validate(stack, "--venv", str(lab["v23"]))
    assert code == 1 and [n for n, c in checks.items() if c["status"] == "fail"] == ["server"]
    assert "sglang 0.5.23 rejects the server command line" in checks["server"]["problems"][0]
    assert "--no-such-flag" in checks["server"]["problems"][0]
