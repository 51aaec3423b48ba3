"""rig prove's free-off steps (rig.serving.prove_free_off) against the SGLang stand-in, on the CPU: the stand-in's
batched scheduler routes by the adaptive slots as SGLang does, and with --free-off it holds the routing and logs
each switch as rig's free-off patch does (`rig free-off: steps A -> B at batch N ...`, the 1st, 2nd, 4th, ...)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rig.core import RigError
from rig.core.check import Check, Runner
from rig.serving import numerics, prove_fallbacks
from rig.serving import prove_free_off as free_off
from rig.serving.prove import greedy_tokens

KEY = "RIG_TEST_NO_KEY"


@pytest.fixture
def standin(serve, tmp_path):
    """start(*options) -> (URL, its log): the stand-in adaptive over prove's SLOTS at 3 steps (tests/conftest.py serve
    starts it and stops it after the test)."""
    logs = iter(range(100))

    def start(*options: str) -> tuple[str, Path]:
        log = tmp_path / f"standin-{next(logs)}.log"
        url = serve("--steps", str(free_off.STEPS), "--accept-length", "2.5", "--adaptive-config",
                    str(free_off.slots_file(tmp_path)), "--cuda-graph-bs", "1,2,4,8,16", *options, log=log)
        return url, log

    return start


@pytest.fixture
def rule(tmp_path) -> Path:
    """The numerics model's rule as rig testmodel records it (testmodel.json's spec.rule)."""
    path = tmp_path / "testmodel.json"
    path.write_text(json.dumps({"spec": {"kind": "numerics", "rule": numerics.table()}}))
    return path


def ask(url: str, prompt: list[int], count: int) -> dict:
    return greedy_tokens(url, prompt, count, KEY, logprobs=False)


def switches_step(url: str, log: Path) -> Check:
    record = Check("prove", free_off.SWITCHES, "", "")
    free_off.judge_switches(free_off.burst(url, KEY, ask), free_off.switches_seen(log), record)
    return record


NUMERICS = ("--step-ms", "1", "--free-off")


def test_a_burst_that_trails_off_switches_both_ways_and_keeps_the_rules_tokens(standin, rule):
    url, log = standin(*NUMERICS, "--free-off-hold", "0", "--rule", str(rule))
    record = switches_step(url, log)
    seen = free_off.switches_seen(log)
    assert (3, 0) in seen and (0, 3) in seen, log.read_text()
    assert record.data["prompts"] == 8 and record.data["tokens"] == sum((i + 1) * 16 for i in range(8))
    assert "= the rule's across" in record.detail and "0 -> 3" in record.detail


def test_tokens_lost_after_a_switch_fail_the_step_at_the_first_difference(standin, rule):
    url, log = standin(*NUMERICS, "--free-off-hold", "0", "--rule", str(rule), "--numerics-fault", "after-switch")
    with pytest.raises(RigError, match=r"lost tokens across the switches: prompt [0-9] differs at token 40: "):
        switches_step(url, log)


@pytest.mark.parametrize("options, why", [
    # no free-off patch: SGLang switches but logs nothing of rig's, so nothing shows the load switched
    ((), "logged no switch both ways"),
    # held over 64 steps (the patch's default): the burst's tail never leaves step 0, one switch only
    (("--free-off-hold", "64"), r"logged no switch both ways \(`rig free-off: steps A -> B` lines: 3 -> 0\)"),
])
def test_a_load_that_did_not_switch_both_ways_proves_nothing(standin, rule, options, why):
    url, log = standin("--step-ms", "1", *(("--free-off", *options) if options else ()), "--rule", str(rule))
    with pytest.raises(RigError, match=why):
        switches_step(url, log)


AGREE = ("--step-ms", "2", "--token-ms", "0.05", "--draft-ms", "0.3", "--accept-length", "4", "--accept-rate", "1",
         "--sampled-accept", "1", "--free-off", "--free-off-hold", "0")


def test_the_draft_accepts_as_it_did_fresh_once_drafting_resumes(standin):
    url, log = standin(*AGREE)
    record = Check("prove", free_off.AFTER_OFF, "", "")
    free_off.judge_after_off(free_off.accept_phases(url, None, KEY, log), record)
    # the off window's ramp and tail draft for the few steps its batch is below 4: a hair above 1
    assert record.data["fresh"] == 4.0 and 1.0 <= record.data["off"] < 1.05 and record.data["resumed"] == 4.0, \
        record.data
    assert "resumed 4.00" in record.detail


def test_a_draft_out_of_step_after_the_off_window_fails_with_both_accept_lengths(standin):
    url, log = standin(*AGREE, "--stale-draft")
    phases = free_off.accept_phases(url, None, KEY, log)
    with pytest.raises(RigError, match=r"the draft came back out of step: accept length fresh 4.00, in the off window "
                                       r"at C=8 1.0[0-9], resumed [12]\.[0-9]{2}"):
        free_off.judge_after_off(phases, Check("prove", free_off.AFTER_OFF, "", ""))
    assert phases["resumed"] < 3.0


@pytest.mark.parametrize("phases, says", [
    ({"fresh": 4.0, "off": 2.5, "resumed": 4.0}, "the off window drafted"),
    ({"fresh": 4.0, "off": 1.0, "resumed": None}, "not read in every phase"),
    ({"fresh": 4.0, "off": 1.0, "resumed": 3.85}, "0.15 apart"),
])
def test_the_after_off_verdict_names_what_it_saw(phases, says):
    with pytest.raises(RigError, match=says):
        free_off.judge_after_off(phases, Check("prove", free_off.AFTER_OFF, "", ""))
    record = Check("prove", free_off.AFTER_OFF, "", "")
    free_off.judge_after_off({"fresh": 4.0, "off": 1.0, "resumed": 3.95}, record)  # within 0.1: passes
    assert record.data["tolerance"] == 0.1


def fallbacks_step(url: str, log: Path) -> Runner:
    report = Runner("prove")
    prove_fallbacks.run_step(url, KEY, log, report)
    return report


def test_requests_that_need_sglangs_verify_path_come_out_of_a_step0_batch_as_out_of_drafting(standin, rule):
    url, log = standin(*NUMERICS, "--free-off-hold", "0", "--rule", str(rule))
    [check] = fallbacks_step(url, log).checks
    assert check.status == "pass", (check.detail, check.problems)
    assert set(check.data["fallbacks_logged"]) == {"grammar", "logprobs", "penalties"}, log.read_text()
    answers = check.data["answers"]
    assert answers["grammar"]["mixed"][0]["text"] == '{"rank":"high"}'
    assert answers["stop"]["alone"]["finish_reason"]["type"] == "stop" and len(answers["n"]["mixed"]) == 2
    assert "the grammar gave '{\"rank\":\"high\"}'" in check.detail


def test_logprobs_that_differ_in_a_step0_batch_fail_the_step_naming_them(standin, rule):
    url, log = standin(*NUMERICS, "--free-off-hold", "0", "--rule", str(rule), "--fallback-fault")
    [check] = fallbacks_step(url, log).checks
    assert check.status == "fail" and check.problems[0].startswith("logprobs: "), check.problems
    assert "within 2 bf16 steps" in check.detail


def test_without_the_patchs_fallback_lines_the_step_says_nothing_showed_a_step0_batch(standin, rule):
    url, log = standin("--step-ms", "1", "--rule", str(rule))  # SGLang's own step 0: no rig lines in its log
    [check] = fallbacks_step(url, log).checks
    assert check.status == "fail" and "the log names no fallback for grammar, logprobs, penalties" in check.detail


def test_a_server_without_a_grammar_backend_skips_the_grammar_with_its_reason(standin, rule):
    url, log = standin(*NUMERICS, "--free-off-hold", "0", "--rule", str(rule), "--grammar-backend", "none")
    skipped, check = fallbacks_step(url, log).checks
    assert skipped.status == "skip" and "--grammar-backend none" in skipped.detail
    assert check.status == "pass" and "grammar" not in check.data["kinds"], check.detail


@pytest.mark.parametrize("a, b, close", [(-8.0, -8.0625, True), (-8.0, -8.2, False), (-1e-6, -0.007, True),
                                         (-0.5, -0.6, False), (float("nan"), -1.0, False), (None, -1.0, False)])
def test_logprobs_agree_within_two_bf16_steps_at_their_size(a, b, close):
    assert prove_fallbacks.bf16_close(a, b) is close


def test_a_garbage_kernel_answers_token_0_without_logprobs_not_an_http_error(standin, rule):
    """The stand-in's --numerics-fault garbage (NaN logits) still answers: the logprobs it cannot give are null."""
    url, _ = standin("--step-ms", "1", "--rule", str(rule), "--numerics-fault", "garbage")
    answer = greedy_tokens(url, numerics.prompts()[0], 4, KEY)
    assert answer == {"tokens": [0, 0, 0, 0], "margins": []}  # null logprobs give no margin, as prove reads them
