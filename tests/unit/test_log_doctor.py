"""rig doctor --log: every rule against a line as the failing program prints it."""
import json

import pytest
from conftest import rig

from rig.machine.log_doctor import rules

LINES = {
    "no-kernel-image": "RuntimeError: CUDA error: no kernel image is available for execution on the device",
    "nvrtc-not-found": "OSError: libnvrtc.so.13: cannot open shared object file: No such file or directory",
    "torch-abi-mismatch": "ImportError: /opt/rig/venv/lib/python3.11/site-packages/sgl_kernel/common_ops.abi3.so: "
                          "undefined symbol: _ZN3c1017RegisterOperatorsD1Ev",
    "driver-too-old": "RuntimeError: CUDA driver version is insufficient for CUDA runtime version",
    "nccl-system-error": "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
                         "ProcessGroupNCCL.cpp:3356, unhandled system error (run with NCCL_DEBUG=INFO for details)",
    "symm-mem-sm120": "KeyError: 12",
    "kimi-eagle3-delegation": "AttributeError: 'KimiK25ForConditionalGeneration' object has no attribute "
                              "'set_eagle3_layers_to_capture'",
    "no-kv-cache-memory": "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
    "transformers-too-new": "ValueError: 'deepseek_vl_v2' is already used by a Transformers config, pick another name.",
    "context-too-long": "ValueError: Requested token count exceeds the model's maximum context length of 4096 tokens. "
                        "You requested a total of 5000 tokens: 4488 tokens from the input messages and 512 tokens "
                        "for the completion. Please reduce the number of tokens in the input messages or the "
                        "completion to fit within the limit.",
}


def test_every_rule_has_a_line_here():
    assert sorted(r["id"] for r in rules()) == sorted(LINES)


@pytest.mark.parametrize("rule, line", sorted(LINES.items()))
def test_each_known_failure_is_named_with_its_cause_and_fix(tmp_path, rule, line):
    log = tmp_path / "server.log"
    log.write_text("[2026-11-30 12:00:00] Load weight begin.\n" + "Traceback (most recent call last):\n" + line + "\n")
    done = rig("doctor", "--log", str(log), "--json")
    assert done.returncode == 1, done.stderr
    findings = json.loads(done.stdout)["findings"]
    assert [f["rule"] for f in findings] == [rule] and findings[0]["line"] == 3
    assert findings[0]["cause"] and findings[0]["fix"]


def test_a_clean_log_passes_and_a_binary_one_is_read_leniently(tmp_path):
    log = tmp_path / "ok.log"
    log.write_bytes(b"The server is fired up and ready to roll!\n\xff\xfe KeyError: 120\n")
    done = rig("doctor", "--log", str(log))
    assert done.returncode == 0 and "0 known failure(s)" in done.stdout


def test_a_missing_log_is_one_error_line(tmp_path):
    done = rig("doctor", "--log", str(tmp_path / "nope.log"))
    assert done.returncode == 2 and done.stderr.startswith("rig: error: cannot read log")
