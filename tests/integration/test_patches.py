"""rig patch on real installed sglang and flashinfer: 0.5.9 + 0.6.3 and 0.5.23 + 0.7.2."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from harness.commands import ok, rig
from harness.lab import overlay
from harness.paths import DEFAULT_LOCK, REPO

pytestmark = pytest.mark.venv

NEEDED_059 = {"sglang-symm-mem-max-sizes-sm120", "sglang-symm-mem-multimem-sm120", "sglang-fusion-gate-sm120",
              "sglang-kimi-k25-eagle3-delegation", "flashinfer-trtllm-comm-sm120"}
NEEDED_0523 = {"sglang-symm-mem-max-sizes-sm120", "sglang-symm-mem-multimem-sm120",
               "sglang-fusion-backend-sm120", "sglang-fusion-preflight-unicast"}


def patch(*args: str) -> subprocess.CompletedProcess:
    return rig("patch", *args)


def statuses(venv: Path, *extra: str) -> dict:
    rows = json.loads(ok(patch("status", "--json", "--venv", str(venv), *extra)).stdout)["patches"]
    return {r["id"]: r for r in rows}


def digests(rows: dict) -> dict:
    return {r["path"]: hashlib.sha256(Path(r["path"]).read_bytes()).hexdigest()
            for r in rows.values() if r.get("path") and Path(r["path"]).is_file()}


def py(venv: Path, code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, check=False)


def test_on_0_5_9_every_patch_goes_needed_applied_and_revert_restores_every_byte(lab):
    v9 = lab["v9"]
    before = statuses(v9)
    assert {i for i, r in before.items() if r["status"] == "needed"} == NEEDED_059
    originals = digests(before)

    dry = json.loads(ok(patch("apply", "--check", "--json", "--venv", str(v9))).stdout)
    assert dry["changed"] and "+        12: [4, 6, 8],  # rig: SM120" in dry["diff"]
    assert digests(before) == originals and not (v9 / ".rig-patches.json").exists()

    ok(patch("apply", "--venv", str(v9)))
    after = statuses(v9)
    assert {i for i, r in after.items() if r["status"] == "applied"} == NEEDED_059
    patched = digests(after)
    assert all(patched[p] != originals[p] for p in patched if any(
        after[i]["path"] == p for i in NEEDED_059))
    state = json.loads((v9 / ".rig-patches.json").read_text())["files"]
    assert {path: e["original_sha256"] for path, e in state.items()} == {
        after[i]["path"]: originals[after[i]["path"]] for i in NEEDED_059}

    again = json.loads(ok(patch("apply", "--json", "--venv", str(v9))).stdout)
    assert not again["changed"] and digests(after) == patched

    ok(patch("revert", "--venv", str(v9)))
    assert digests(before) == originals
    assert not (v9 / ".rig-patches.json").exists() and not (v9 / ".rig-patches").exists()
    assert {i for i, r in statuses(v9).items() if r["status"] == "needed"} == NEEDED_059


def test_the_patched_0_5_9_behaves_as_sm120_needs_and_the_original_does_not(lab):
    v9 = lab["v9"]
    probe = """
import json
from sglang.srt.distributed.device_communicators.all_reduce_utils import TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES as sizes
from sglang.srt.distributed.device_communicators.torch_symm_mem import TorchSymmMemCommunicator as comm
import flashinfer.jit.comm as fi
try:
    flags = fi.gen_trtllm_comm_module().extra_cuda_cflags
except RuntimeError as exc:
    flags = str(exc)
print(json.dumps({"sizes12": sizes.get(12, {}).get(8), "multimem12": comm._WORLD_SIZES_MULTIMEM.get(12), "flags": flags}))
"""
    def observe() -> dict:
        done = py(v9, probe, FLASHINFER_CUDA_ARCH_LIST="12.0a")
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    original = observe()
    assert original["sizes12"] is None and original["multimem12"] is None
    assert "No supported CUDA architectures found for major versions [9, 10]" in original["flags"]
    ok(patch("apply", "--venv", str(v9)))
    try:
        patched = observe()
        assert patched["sizes12"] == 128 * 2**20 and 8 in patched["multimem12"]
        assert "-gencode=arch=compute_120a,code=sm_120a" in patched["flags"]
        # kimi_k25 cannot be imported without a GPU driver (sgl_kernel links libcuda.so.1),
        # which is why its patch check runs the wrapper's methods from the file instead
        kimi = py(v9, "import sglang.srt.models.kimi_k25")
        assert kimi.returncode != 0 and "libcuda.so.1" in kimi.stdout + kimi.stderr
    finally:
        ok(patch("revert", "--venv", str(v9)))


def test_every_check_fails_on_the_original_code(lab):
    """A check that passed on unpatched code would prove nothing."""
    from rig.patches.env import probe
    from rig.patches.patchset import load
    from rig.patches.report import status
    from rig.patches.verify import verify

    env = probe(str(lab["v9"] / "bin" / "python"), ["sglang", "flashinfer-python"])
    found = load()
    rows = {r["id"]: r for r in status(env, found)}
    checks = [{"id": p.id, "file": rows[p.id]["path"], "code": p.check} for p in found if p.id in NEEDED_059]
    failed = verify(env, {}, checks)
    assert set(failed) == NEEDED_059, failed


def test_on_0_5_23_delegation_is_upstream_and_the_rest_applies_cleanly(lab, tmp_path):
    v23 = overlay(lab["v23"], DEFAULT_LOCK, tmp_path / "v23", {"sglang", "flashinfer-python"})  # lab's is shared
    before = statuses(v23)
    assert before["sglang-kimi-k25-eagle3-delegation"]["status"] == "upstream"
    assert before["flashinfer-trtllm-comm-sm120"]["status"] == "upstream"
    assert {i for i, r in before.items() if r["status"] == "needed"} == NEEDED_0523
    originals = digests(before)
    ok(patch("apply", "--venv", str(v23)))
    assert {i for i, r in statuses(v23).items() if r["status"] == "applied"} == NEEDED_0523
    # upstream's own wrapper, built without weights around a recording model, delegates
    delegation = py(v23, """
import torch.nn as nn
from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration as Kimi
class Inner:
    calls = []
    def __getattr__(self, name):
        return lambda *args: self.calls.append(name) or name
wrapper = Kimi.__new__(Kimi)
nn.Module.__init__(wrapper)
wrapper.language_model = Inner()
wrapper.set_eagle3_layers_to_capture([1, 2]); wrapper.set_embed_and_head("e", "h")
assert wrapper.get_embed_and_head() == "get_embed_and_head"
print(Inner.calls)
""")
    assert delegation.returncode == 0, delegation.stderr[-3000:]
    assert "['set_eagle3_layers_to_capture', 'set_embed_and_head', 'get_embed_and_head']" in delegation.stdout
    ok(patch("revert", "--venv", str(v23)))
    assert digests(before) == originals


def test_drifted_code_is_reported_and_apply_changes_nothing(lab):
    v9 = lab["v9"]
    rows = statuses(v9)
    target = Path(rows["sglang-symm-mem-multimem-sm120"]["path"])
    original = target.read_bytes()
    try:
        target.write_bytes(original.replace(b"        9: [4, 6, 8],", b"        9: [4, 8],"))
        drifted = statuses(v9)
        assert drifted["sglang-symm-mem-multimem-sm120"]["status"] == "drifted"
        assert "expected code not found" in drifted["sglang-symm-mem-multimem-sm120"]["detail"]
        before = digests(drifted)
        done = patch("apply", "--venv", str(v9))
        assert done.returncode == 2 and "sglang-symm-mem-multimem-sm120" in done.stderr
        assert "Nothing was changed" in done.stderr
        assert digests(drifted) == before and not (v9 / ".rig-patches.json").exists()
    finally:
        target.write_bytes(original)


def _patch_dir(tmp_path: Path, **changes) -> Path:
    """A copy of the flashinfer patch with some fields changed."""
    data = yaml.safe_load((REPO / "rig" / "patches" / "set" / "flashinfer-trtllm-comm-sm120.yml").read_text())
    data.update(changes)
    (tmp_path / "flashinfer-trtllm-comm-sm120.yml").write_text(yaml.safe_dump(data, sort_keys=False))
    return tmp_path


def test_a_version_no_patch_knows_is_refused_naming_the_ranges(lab, tmp_path):
    patches = _patch_dir(tmp_path, needed=">=0.6.4,<0.6.17")
    done = patch("apply", "--venv", str(lab["v9"]), "--patches", str(patches))
    assert done.returncode == 2
    assert "flashinfer-python 0.6.3 is outside every patch's range (>=0.6.17,<=0.7.2; >=0.6.4,<0.6.17)" in done.stderr
    forced = json.loads(ok(patch("apply", "--json", "--force", "--venv", str(lab["v9"]), "--patches",
                                 str(patches))).stdout)
    assert not forced["changed"] and forced["patches"][0]["status"] == "not-applicable"


def test_a_failing_check_puts_the_file_back(lab, tmp_path):
    patches = _patch_dir(tmp_path, check="assert False, 'this check always fails'\n")
    rows = statuses(lab["v9"], "--patches", str(patches))
    before = digests(rows)
    done = patch("apply", "--venv", str(lab["v9"]), "--patches", str(patches))
    assert done.returncode == 2 and "this check always fails" in done.stderr and "put back" in done.stderr
    assert digests(rows) == before and not (lab["v9"] / ".rig-patches.json").exists()
    assert not (lab["v9"] / ".rig-patches").exists()


REAL_COST = REPO / "docs" / "validation" / "real-cost-h200"
FREE_OFF_0523 = {"sglang-free-off-graphs", "sglang-free-off-worker-0523"}
FREE_OFF_CHECK = {"sglang-free-off-check"}  # opt-in free-off-check: RIG_FREE_OFF_CHECK's comparison, not for serving


def test_free_off_is_applied_only_where_the_stack_opts_in_and_taken_out_when_it_stops(lab, tmp_path):
    v23 = overlay(lab["v23"], DEFAULT_LOCK, tmp_path / "v23", {"sglang", "flashinfer-python"})
    stack = yaml.safe_load((REPO / "stacks" / "default.yml").read_text())
    stack.update(venv=str(v23), patches={"opt_in": ["free-off"]})
    opted = tmp_path / "opted.yml"
    opted.write_text(yaml.safe_dump(stack))
    before = statuses(v23)
    assert {i for i, r in before.items() if r["status"] == "opt-in"} == FREE_OFF_0523 | FREE_OFF_CHECK
    assert "applied where opt-in free-off is asked for" in before["sglang-free-off-graphs"]["detail"]
    originals = digests(before)
    ok(patch("apply", "--stack", str(opted)))  # the stack's venv and its opt-in
    applied = statuses(v23, "--opt-in", "free-off")
    assert {i for i, r in applied.items() if r["status"] == "applied"} == NEEDED_0523 | FREE_OFF_0523
    worker = Path(applied["sglang-free-off-worker-0523"]["path"]).read_text()
    assert '_RIG_FREE_OFF = _rig_os.environ.get("RIG_FREE_OFF", "1") != "0"' in worker  # on where applied
    # the real-cost runbook's free-off-0523 phase (issue 71), rehearsed as far as a CPU goes: every line its tune
    # starts is rendered and checked by this patched sglang 0.5.23 (its parser and start-up hook), nothing written
    phase = ok(rig("tune", "--check", "--json", "--stack", str(REAL_COST / "stack-free-off-0523.yml"),
                   "--venv", str(v23), "--out", str(tmp_path / "tune")))
    planned = json.loads(phase.stdout)
    assert set(planned["variants"]) == {"baseline", "step0-plain-ingest", "eagle3-3"}
    assert re.findall(r"^  ([\w-]+): ", planned["msg"], re.M) == ["baseline", "step0-plain-ingest", "eagle3-3"]  # as run
    assert "  step0-plain-ingest: RIG_FREE_OFF=1 RIG_FREE_OFF_DRAFT=ingest " in planned["msg"]
    assert not (tmp_path / "tune").exists()
    # the stack no longer asks: the next apply takes free-off out and leaves the SM120 patches in
    dropped = json.loads(ok(patch("apply", "--json", "--venv", str(v23))).stdout)
    assert dropped["changed"] and dropped["msg"].startswith("took out sglang-free-off-graphs, sglang-free-off-worker")
    after = statuses(v23)
    assert {i for i, r in after.items() if r["status"] == "applied"} == NEEDED_0523
    assert {i for i, r in after.items() if r["status"] == "opt-in"} == FREE_OFF_0523 | FREE_OFF_CHECK
    assert json.loads(ok(patch("apply", "--json", "--venv", str(v23))).stdout)["changed"] is False
    unknown = patch("apply", "--venv", str(v23), "--opt-in", "free-lunch")
    assert unknown.returncode != 0 and "no patch of the set is opt-in 'free-lunch'; the opt-in features are: " \
        "free-off, free-off-check" in unknown.stderr and after == statuses(v23)
    ok(patch("revert", "--venv", str(v23)))
    assert digests(before) == originals


def test_free_off_anchors_apply_and_revert_on_both_locked_wheels():
    """docs/validation/free-off/check_anchors.py: the 0.5.17 and 0.5.23 wheels' files under rig's engine."""
    done = subprocess.run([sys.executable, str(REPO / "docs/validation/free-off/check_anchors.py")],
                          capture_output=True, text=True, check=False, cwd=REPO)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert done.stdout.count("rig apply without free-off: took out sglang-free-off-graphs") == 2
    assert done.stdout.count("rig apply without free-off-check: took out sglang-free-off-check (opt-in") == 2
    assert done.stdout.count("the serving worker holds no comparison code, and says RIG_FREE_OFF_CHECK=1 needs "
                             "the check: True") == 2
    assert "all checks passed for 0.5.17, 0.5.23" in done.stdout
