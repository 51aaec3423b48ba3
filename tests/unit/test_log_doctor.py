"""rig doctor --log: every rule against a line as the failing program prints it."""
import json
import re
import time

import pytest
from harness.commands import rig
from hypothesis import given, settings
from hypothesis import strategies as st

from rig.core import RigError
from rig.core.schema import validate
from rig.machine.log_doctor import RULE_SPEC, matches, rules

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
    "flashinfer-workspace": "Exception: Capture cuda graph failed: Error in function 'aligned_alloc' at /root/venv/lib/"
                            "python3.12/site-packages/flashinfer/data/include/flashinfer/allocator.h:71: Buffer "
                            "overflow when allocating memory for batch_prefill_tmp_v with size 601882624 and "
                            "alignment 16, but only 402653184 bytes available in AlignedAllocator. Increase the "
                            "workspace buffer size.",
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


# ------------------------------------------------------------------ every rule in time linear in the line

MIB2 = 2 << 20


def adversarial(rule: dict, sample: str) -> list[str]:
    """2 MiB lines of what RULE looks for without the whole of it: the text it matches in SAMPLE less its last
    character, its first half, its first piece, each over and over (`NCCL error.*unhandled system error` took
    20 s on the first)."""
    first = rule["pieces"][0].search(sample)
    last = first
    for piece in rule["pieces"][1:]:
        last = piece.search(sample, last.end())
    matched = sample[first.start():last.end()]
    return [(" " + part) * (MIB2 // (len(part) + 1)) for part in (matched[:-1], matched[:len(matched) // 2],
                                                                    first.group())]


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["id"])
def test_every_rule_takes_under_a_second_on_a_2_mib_adversarial_line(rule):
    lines = adversarial(rule, LINES[rule["id"]])
    start = time.perf_counter()
    for line in lines:
        matches(rule, line)
    assert time.perf_counter() - start < 1.0  # the bound; a quadratic rule takes tens of seconds


@pytest.mark.parametrize("pattern", ["NCCL error.*unhandled system error", "a.+b", ["x", "y.*"], "(ab+)+c", []])
def test_a_rule_that_can_backtrack_is_refused_with_the_fix(pattern):
    with pytest.raises(RigError, match="split it|at least one piece"):
        validate([{"id": "x", "pattern": pattern, "cause": "c", "fix": "f"}], RULE_SPEC, "log_rules.yml")


FRAGMENTS = ["NCCL error", "unhandled system error", "NCCL", " error", "unhandled", "\x1b]0;x\x07", "a", " "]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=12).map("".join))
def test_pieces_in_order_match_what_the_wildcard_pattern_meant(line):
    rule = next(r for r in rules() if r["id"] == "nccl-system-error")
    assert matches(rule, line) == bool(re.search("NCCL error.*unhandled system error", line))


def test_a_matched_line_is_printed_with_its_terminal_escapes_visible(tmp_path):
    """OSC sequences in a log line would set the terminal's title or write its clipboard."""
    log = tmp_path / "server.log"
    log.write_text("\x1b]0;owned\x07RuntimeError: CUDA driver version is insufficient for CUDA runtime version"
                   "\x1b]52;c;ZXZpbA==\x07\n")
    done = rig("doctor", "--log", str(log))
    assert done.returncode == 1 and "1 known failure(s)" in done.stdout
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout
    assert "\\x1b]0;owned\\x07RuntimeError" in done.stdout and "\\x1b]52;c;ZXZpbA==\\x07" in done.stdout


def test_a_server_that_dies_at_start_names_the_known_failure_under_its_log_tail(tmp_path):
    """issue 71's flashinfer tune: EAGLE-3 died capturing its graphs; the error now says the fix, not only the tail."""
    from rig.serving.smoke import log_tail

    log = tmp_path / "eagle3-3.log"
    log.write_text("loading\n" + LINES["flashinfer-workspace"] + "\n" + "Received sigquit from a child process.\n")
    said = log_tail(str(log), lines=2)
    assert said.splitlines()[2] == LINES["flashinfer-workspace"]
    assert "known failure flashinfer-workspace, line -2 from the end" in said and "SGLANG_FLASHINFER_WORKSPACE_SIZE" \
        in said
    log.write_text("loading\nready\n")
    assert "known failure" not in log_tail(str(log))
    # a unit appends each start to one log: an earlier start's failure, long before the last lines, is not this one's
    log.write_text(LINES["flashinfer-workspace"] + "\n" + "serving\n" * 300 + LINES["no-kv-cache-memory"] + "\n")
    said = log_tail(str(log))
    assert "known failure no-kv-cache-memory, line -1 from the end" in said and "flashinfer-workspace" not in said
