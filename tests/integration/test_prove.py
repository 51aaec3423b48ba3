"""`rig prove` end to end: real rig CLI runs that build the numerics test model in a venv with the default
stack's torch and transformers (the lab's, on the CPU), then start, check, benchmark and stop servers.

The servers are the SGLang stand-in (tests/data/sglang_standin) over the lab's packages, started from the
line `rig server args` renders; given the numerics model, it generates that model's rule tokens for
`input_ids`, and its --numerics-fault makes them wrong as a broken kernel would.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.commands import rig
from harness.paths import BIN, REPO
from harness.standin import free_port, listening, servers_running, standin_case

pytestmark = pytest.mark.venv


@pytest.fixture(scope="module")
def prove_venv(lab, tmp_path_factory) -> Path:
    """A venv whose sglang is the stand-in, with the lab's torch, transformers, safetensors and tokenizers."""
    venv = tmp_path_factory.mktemp("prove") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    ours = [p for p in sys.path if p.endswith("site-packages")]
    lab_site = next((lab["v23"] / "lib").glob("python3*/site-packages"))
    (site / "standin.pth").write_text("\n".join([str(REPO / "tests" / "data" / "sglang_standin"),
                                                 str(REPO / "tests"), *ours, str(lab_site)]) + "\n")
    return venv


@pytest.fixture(scope="module")
def models(prove_venv, tmp_path_factory) -> Path:
    """The numerics test model, built once for the runs that skip prove's own testmodel step."""
    root = tmp_path_factory.mktemp("prove-models") / "models"
    done = rig("testmodel", "--kind", "numerics", "--out", str(root), "--venv", str(prove_venv), "--tp", "8")
    assert done.returncode == 0, done.stderr[-3000:]
    return root


@pytest.fixture
def prove_case(tmp_path, prove_venv, models):
    port = free_port()
    stack = {"name": "prove-test", "cuda": {"version": "13.0.2"}, "venv": str(prove_venv),
             "server": {"model": "/models/target", "draft_model": "/models/eagle3", "port": port,
                        "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
                        "tp": 8, "start_timeout": 90}}
    case = standin_case(tmp_path, stack)
    case.port, case.dir, case.models = port, tmp_path, models
    yield case
    assert not servers_running(prove_venv), "a server outlived the prove run"
    assert not listening(port)


def prove(stack: Path, out: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return rig("prove", "--stack", str(stack), "--out", str(out), "--json", *args, env=env, timeout=600)


def steps(out: Path) -> dict:
    return {s["name"]: s for s in json.loads((out / "prove.json").read_text())["steps"]}


def test_a_box_that_serves_right_passes_every_step_it_can_run(prove_case):
    stack, env = prove_case()
    out = prove_case.dir / "out"
    done = prove(stack, out, env, "--skip", "doctor", "--models", str(prove_case.models))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "prove.json").read_text())
    assert result["schema_version"] == 1 and result["format"] == 1 and result["ok"] and result["tp_sizes"] == [1, 8]
    found = {name: s["status"] for name, s in steps(out).items()}
    assert found == {"doctor": "skip", "probe": "skip", "testmodel": "pass", "baseline tp1: start and smoke": "pass",
                     "baseline tp1: numerics": "pass", "baseline tp1: bench": "pass",
                     "eagle3 tp1: start and smoke": "pass", "eagle3 tp1: numerics": "pass", "eagle3 tp1: bench": "pass",
                     "tp8": "skip", "agree testmodel": "pass", "baseline agree: start and smoke": "pass",
                     "baseline agree: bench": "pass", "eagle3 agree: start and smoke": "pass",
                     "eagle3 agree: bench": "pass", "agree: acceptance": "pass", "free-off": "skip"}, found
    assert "does not opt into free-off" in steps(out)["free-off"]["detail"]
    named = steps(out)
    assert "no GPU is visible" in named["probe"]["detail"] and "needs 8 GPUs; 0 visible" in named["tp8"]["detail"]
    assert named["testmodel"]["data"]["reference"]["bfloat16"]["matched"] == 8  # transformers, in the venv
    assert named["eagle3 tp1: start and smoke"]["data"]["speculative_algorithm"] == "EAGLE3"  # the server's own word
    assert "--speculative-algorithm" not in named["baseline tp1: start and smoke"]["data"]["argv"]
    assert named["baseline tp1: numerics"]["data"]["min_margin"] == 8  # SGLang's top logprobs, as the stand-in gives
    assert named["eagle3 tp1: numerics"]["data"]["matched"] == 8  # against the baseline's tokens, without logprobs
    assert named["eagle3 tp1: bench"]["data"]["C=8"]["output_throughput"] > 0
    assert result["versions"]["transformers"] and result["versions"]["torch"]
    report = (out / "report.md").read_text()
    assert "PASSED" in report and "| eagle3 tp1: numerics | pass |" in report
    assert (out / "prove.png").read_bytes().startswith(b"\x89PNG")
    assert (out / "logs" / "eagle3-tp1.log").is_file()
    # acceptance: the tiny agreeing model, greedy, 3 steps: every drafted token accepted, EAGLE-3 ahead at C=1
    accepted = named["agree: acceptance"]["data"]
    assert accepted["accept_length"] == 4.0 and accepted["ratio"] > 1, accepted
    assert json.loads((out / "models-agree" / "testmodel.json").read_text())["spec"]["draft"] == "agree"


@pytest.mark.parametrize("fault, failing, against", [
    ("wrong", "baseline tp1: numerics", "the rule's tokens"),
    ("garbage", "baseline tp1: numerics", "the rule's tokens"),
    ("speculative", "eagle3 tp1: numerics", "the baseline's tokens")])
def test_a_server_with_wrong_numerics_fails_that_step_and_names_the_first_difference(prove_case, fault, failing,
                                                                                   against):
    stack, env = prove_case("--numerics-fault", fault)
    out = prove_case.dir / "out"
    done = prove(stack, out, env, "--skip", "doctor", "--skip", "testmodel", "--models", str(prove_case.models),
                 "--skip", "acceptance")
    assert done.returncode == 1, done.stderr[-3000:]
    named = steps(out)
    assert named[failing]["status"] == "fail" and against in named[failing]["detail"]
    assert "differs at token" in named[failing]["detail"] and "rig audit" in named[failing]["detail"]
    if fault != "speculative":  # a baseline that is wrong is no reference for EAGLE-3
        assert named["eagle3 tp1"]["status"] == "skip" and "no reference" in named["eagle3 tp1"]["detail"]
    assert "FAILED" in (out / "report.md").read_text()


def test_a_draft_the_target_rejects_passes_numerics_and_fails_acceptance(prove_case):
    """As on the H200: prove's numerics draft proposes one fixed token, so SGLang accepts almost none (1.02); that
    proves the rejection path (the numerics step passes). The agreeing draft accepting as little fails the
    acceptance step, saying what it saw: an accept length near 1 is never a pass for speculation."""
    stack, env = prove_case("--accept-length", "1.02", "--accept-rate", "0.007")  # about 1 + 3 x 0.007 with 3 steps
    out = prove_case.dir / "out"
    done = prove(stack, out, env, "--skip", "doctor", "--skip", "testmodel", "--models", str(prove_case.models))
    assert done.returncode == 1, done.stderr[-3000:]
    named = steps(out)
    started = named["eagle3 tp1: start and smoke"]
    assert started["status"] == "pass" and "accept length 1.02" in started["detail"], started
    assert named["eagle3 tp1: numerics"]["status"] == "pass"
    judged = named["agree: acceptance"]
    assert judged["status"] == "fail" and re.search(r"not accepted: accept length 1\.0\d with 3 steps", judged["detail"])


def test_a_server_that_dies_mid_prove_fails_that_step_and_nothing_keeps_running(prove_case):
    stack, env = prove_case("--die-after", "3")
    out = prove_case.dir / "out"
    done = prove(stack, out, env, "--skip", "doctor", "--skip", "testmodel", "--models", str(prove_case.models),
                 "--skip", "acceptance")
    assert done.returncode == 1, done.stderr[-3000:]
    named = steps(out)
    assert named["baseline tp1: start and smoke"]["status"] == "fail", named  # it died in smoke's third request
    assert named["eagle3 tp1"]["status"] == "skip" and "did not serve" in named["eagle3 tp1"]["detail"]


def test_sigterm_stops_every_server_prove_started_and_leaves_what_it_has(prove_case):
    stack, env = prove_case("--rate", "20")
    out = prove_case.dir / "out"
    proc = subprocess.Popen([str(BIN / "rig"), "prove", "--stack", str(stack), "--out", str(out), "--skip", "doctor",
                             "--skip", "testmodel", "--models", str(prove_case.models), "--skip", "acceptance"],
                            cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not listening(prove_case.port) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert listening(prove_case.port), proc.communicate()[1][-2000:]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM and "rig: terminated" in err, err[-2000:]
    result = json.loads((out / "prove.json").read_text())
    assert result["stopped"].startswith("Terminated") and result["ok"] is False
    interrupted = result["steps"][-1]  # the step that was running: failed, never passed
    assert interrupted["status"] == "fail" and interrupted["detail"].startswith("stopped: Terminated"), interrupted


def test_check_prints_every_server_line_and_starts_nothing(prove_case):
    stack, env = prove_case()
    out = prove_case.dir / "out"
    done = prove(stack, out, env, "--check", "--tp", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    plan = json.loads(done.stdout)
    assert sorted(plan["servers"]) == ["baseline agree", "baseline tp1", "baseline tp2", "eagle3 agree", "eagle3 tp1",
                                       "eagle3 tp2"]
    agree = plan["servers"]["eagle3 agree"]
    assert agree[agree.index("--speculative-num-steps") + 1] == "3" and str(out / "models-agree" / "target") in agree
    eagle = plan["servers"]["eagle3 tp2"]
    assert "--speculative-algorithm" in eagle and eagle[eagle.index("--tp-size") + 1] == "2"
    assert str(out / "models" / "target") in plan["servers"]["baseline tp1"]
    assert not out.exists() and not listening(prove_case.port)


def test_a_given_model_that_is_not_the_numerics_one_is_refused_before_any_server_starts(prove_case):
    stack, env = prove_case()
    models = prove_case.dir / "serving-model"
    models.mkdir()
    (models / "testmodel.json").write_text(json.dumps({"spec": {"kind": "serving", "heads": 8}}))
    done = prove(stack, prove_case.dir / "out", env, "--skip", "doctor", "--skip", "testmodel", "--models", str(models),
                 "--skip", "acceptance")
    assert done.returncode == 1, done.stderr[-2000:]
    named = steps(prove_case.dir / "out")
    given = named["testmodel (given)"]
    assert given["status"] == "fail" and "no numerics test model" in given["detail"]
    assert named["servers"]["status"] == "skip" and not (prove_case.dir / "out" / "logs" / "baseline-tp1.log").exists()
