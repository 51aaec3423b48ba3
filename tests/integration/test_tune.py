"""`rig tune` end to end: real rig CLI runs that start, measure and stop real server processes.

The servers are the SGLang stand-in package (tests/data/sglang_standin) in a venv of its own, started
from the line `rig server args` renders, so `python -m sglang.launch_server` serves SGLang's HTTP API
through tests/sglang_api_server.py with its batched scheduler: each decode step costs more the more
steps it drafts and the larger the batch, so EAGLE-3's advantage at one stream turns into a loss under
load, and SGLang's adaptive config is read and routed as SGLang does.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from harness.commands import rig
from harness.paths import REPO
from harness.standin import MODEL, STANDIN, kill_servers, listening, make_standin_venv, servers_running
from harness.tune import tune

from rig.serving.measure import record


def three_steps_only(stack: Path) -> None:
    """The baseline against 3 steps alone: by MODEL's costs 1 step is within 5% of the baseline at C=64, a
    near-tie that the machine's load decides (how ties are chosen is test_tune_policy's)."""
    data = yaml.safe_load(stack.read_text())
    data["tune"]["steps"] = [3]
    stack.write_text(yaml.safe_dump(data))


def test_crossing_curves_give_speculation_below_the_crossover_and_step_0_above(tune_case):
    stack, env = tune_case(*MODEL)
    three_steps_only(stack)
    stack.write_text("# the user's own words, kept by the proposal\n" + stack.read_text())
    out = tune_case.dir / "out"
    busy = tune_case.dir / "load.json"  # a server that runs 64 requests nine tenths of its busy time
    busy.write_text(json.dumps({"histogram": {"64": 9, "1": 1}}))
    done = tune(stack, out, env, "--load-profile", str(busy))
    assert done.returncode in (0, 1), done.stderr[-2000:]
    result = json.loads((out / "tune.json").read_text())
    assert result["schema_version"] == 2 and result["format"] == 1 and result["levels"] == ["C=1", "C=64"]
    mine = result["load_profile"]
    assert mine["weights"] == {"C=1": 0.1, "C=64": 0.9} and set(mine["expected"]) == set(result["variants"])
    assert mine["chosen"] == max(mine["expected"], key=mine["expected"].get)
    assert f"For the load in {busy}: serve {mine['chosen']}" in result["recommendation"]
    assert "## For the load in" in (out / "report.md").read_text()
    assert list(result["variants"]) == ["baseline", "eagle3-3", "policy"]
    chosen = {r["level"]: r["chosen"] for r in result["choices"]}
    assert chosen == {"C=1": "eagle3-3", "C=64": "baseline"}, result["choices"]
    assert result["policy"]["kind"] == "adaptive" and result["policy"]["slots"] == {"1": 3, "64": 0}
    assert json.loads((out / "adaptive.json").read_text()) == {"1": {"candidate_steps": [3]},
                                                               "64": {"candidate_steps": [0]}}
    # the policy server ran SGLang's adaptive mode with that file, and the baseline ran without speculation
    policy_argv = result["variants"]["policy"]["argv"]
    assert "--speculative-adaptive" in policy_argv and str(out / "adaptive.json") in policy_argv
    assert "--speculative-algorithm" not in result["variants"]["baseline"]["argv"]
    eagle = result["variants"]["eagle3-3"]["levels"]["C=1"]
    # 2.95 tokens a step, the last step of each 16-token request cut short: 16 tokens in 6 verify steps
    assert 2.5 < eagle["server_accept_length"] < 2.95 and eagle["median_itl_ms"] > 0
    assert result["confirmation"]["levels"][0]["level"] == "C=1"
    proposed = yaml.safe_load((out / "proposed-stack.yml").read_text())
    assert proposed["server"]["speculative_adaptive_config"] == str(out / "adaptive.json")
    assert "+  speculative_adaptive_config:" in result["stack_diff"]
    assert (out / "proposed-stack.yml").read_text().startswith("# the user's own words, kept by the proposal\n")
    removed = [line for line in result["stack_diff"].splitlines()[2:] if line.startswith("-")]
    assert all("speculative" in line for line in removed), removed  # against the file itself: only what changed
    for name in result["variants"]:
        assert (out / "logs" / f"{name}.log").is_file()
    assert (out / "tune.png").read_bytes().startswith(b"\x89PNG") and "## Confirmation" in (out / "report.md").read_text()
    # and rig server args takes the proposed stack: both flags, the config read by the venv's sglang loader
    args = rig("server", "args", "--stack", str(out / "proposed-stack.yml"), "--json")
    assert args.returncode == 0, args.stderr
    assert "--speculative-adaptive-config" in json.loads(args.stdout)["argv"]


def test_a_policy_whose_step_0_loses_to_the_baseline_is_reported_so(tune_case):
    # the draft-extend pass costs 0.5 ms per running request even at step 0: at 64 in flight the policy's
    # step-0 slot runs well below a server without speculation
    stack, env = tune_case(*MODEL, "--extend-ms", "0.5")
    three_steps_only(stack)
    out = tune_case.dir / "out"
    done = tune(stack, out, env)
    assert done.returncode == 1, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert not report["confirmation"]["confirmed"]
    # the claim is the step-0 slot's (about half the baseline's rate by the costs); C=1's verdict rests on a
    # few 16-token requests, which an overloaded machine's scheduling can swing either way (seen with 6 workers
    # on 2 cores)
    levels = {t["level"]: t for t in report["confirmation"]["levels"]}
    assert levels["C=64"]["verdict"] == "lost" and levels["C=64"]["ratio_baseline"] < 0.9
    assert "step 0 is not a free off" in report["recommendation"]
    assert "run eagle3-3 where load stays at or below 1 requests in flight" in report["recommendation"]


def test_check_renders_every_line_and_starts_nothing(tune_case):
    stack, env = tune_case(*MODEL)
    done = tune(stack, tune_case.dir / "out", env, "--check", "--request-rate", "50")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert set(plan["variants"]) == {"baseline", "eagle3-1", "eagle3-3"}
    assert plan["levels"] == ["C=1", "C=64", "R=50/s"]
    assert "--speculative-num-steps" in plan["variants"]["eagle3-1"]
    assert not listening(tune_case.port) and not (tune_case.dir / "out").exists()


def test_poisson_rates_are_measured_and_mapped_to_their_running_batch(tune_case):
    """Beside them C=1 profiled for more steps than its round runs: each server's profile is stopped once the round
    is over, said, and not read (SGLang writes a trace only when its steps are in, or on /stop_profile)."""
    stack, env = tune_case(*MODEL)
    data = yaml.safe_load(stack.read_text())
    data["bench"]["concurrency"] = [1]
    data["tune"].update(profile_levels=[1], profile_steps=1000)
    stack.write_text(yaml.safe_dump(data))
    out = tune_case.dir / "out"
    done = tune(stack, out, env, "--concurrency", "1", "--request-rate", "40", "--rounds", "1")
    assert done.returncode in (0, 1), done.stderr[-2000:]
    result = json.loads((out / "tune.json").read_text())
    level = result["variants"]["baseline"]["levels"]["R=40/s"]
    assert level["rate"] == 40 and level["requests"] >= 8 and level["failed"] == 0
    row = next(r for r in result["choices"] if r["level"] == "R=40/s")
    assert row["batch"] >= 1 and isinstance(row["batch"], int)
    # judged by each request's speed (open loop): the choice's value is that, not the arrival-bound throughput
    assert level["round_request_speed"] and row["best_value"] == max(
        v["levels"]["R=40/s"]["request_speed"] for v in result["variants"].values() if "R=40/s" in v["levels"])
    assert "at each request rate request_speed" in (out / "report.md").read_text()
    for name, variant in result["variants"].items():
        said = variant["levels"]["C=1"]["profile"]["error"]
        assert said.startswith("the round ended before the profile's 1000 steps were in (stopped"), (name, said)
        assert (out / "profiles" / name / f"{name}-C1-TP-0.trace.json.gz").is_file()  # the stop reached the server


@pytest.mark.parametrize("content, says", [
    ('{"prompt": "hello"}\n{"prompt": ""}\n', "line 2: no prompt text"),
    ('{"prompt": "hello", "max_tokens": 0}\n', "max_tokens must be a whole number"),
    ('{"prompt": "hi"\n', "line 1"),
    ('[{"conversations": [{"from": "gpt", "value": "x"}]}]', "holds no prompt: none of its 1 ShareGPT conversation"),
    ('[{"conversations": [{"from": "human", "value": 7}]}]', "entry 1: no prompt text"),
    ("", "holds no prompt"),
    (None, "is not a regular file"),
])
def test_bad_prompt_files_are_one_clear_error_and_start_nothing(tune_case, content, says):
    stack, env = tune_case(*MODEL)
    prompts = tune_case.dir / "prompts.jsonl"
    if content is None:
        os.mkfifo(prompts)  # a read would block forever
    else:
        prompts.write_text(content)
    done = tune(stack, tune_case.dir / "out", env, "--prompts", str(prompts))
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert done.stderr.count("rig: error:") == 1 and not listening(tune_case.port)


def test_a_prompt_file_drives_the_requests(tune_case):
    stack, env = tune_case(*MODEL)
    prompts = tune_case.dir / "sharegpt.json"
    prompts.write_text(json.dumps([{"conversations": [{"from": "human", "value": f"question {i}"},
                                                      {"from": "gpt", "value": "answer"}]} for i in range(5)]))
    out = tune_case.dir / "out"
    done = tune(stack, out, env, "--prompts", str(prompts), "--concurrency", "1", "--rounds", "1")
    assert done.returncode in (0, 1), done.stderr[-2000:]
    level = json.loads((out / "tune.json").read_text())["variants"]["baseline"]["levels"]["C=1"]
    assert level["failed"] == 0 and level["total_output_tokens"] == level["requests"] * 16


def test_a_server_that_dies_mid_tune_fails_that_step_and_leaves_nothing_running(tune_case):
    stack, env = tune_case(*MODEL, "--die-after", "12")
    out = tune_case.dir / "out"
    done = tune(stack, out, env)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "rig: error: baseline: the server stopped answering" in done.stderr
    result = json.loads((out / "tune.json").read_text())
    assert result["stopped"] and result["variants"]["baseline"]["stopped"]
    assert list(result["variants"]) == ["baseline"]  # nothing after the failed step started
    assert not listening(tune_case.port)


def test_server_args_refuses_adaptive_speculation_sglang_would_refuse(tune_case, tmp_path):
    stack, env = tune_case(*MODEL)
    config = tmp_path / "adaptive.json"
    config.write_text('{"1": {"candidate_steps": [3]}}')
    data = yaml.safe_load(stack.read_text())
    data["server"].update(speculative_adaptive_config=str(config), speculative_eagle_topk=4)
    bad = tmp_path / "topk4.yml"
    bad.write_text(yaml.safe_dump(data))
    done = rig("server", "args", "--stack", str(bad))
    assert done.returncode == 2 and "speculative_eagle_topk=4 (only topk=1 is supported)" in done.stderr
    data["server"]["speculative_eagle_topk"] = 1
    for text, says in (('{"1": {"candidate_steps": []}}', "candidate_steps must be a non-empty list"),
                       ('{"ema_alpha": 0.2}', "no batch-size key"), ('{"x1": {}}', "neither a batch size")):
        config.write_text(text)
        bad.write_text(yaml.safe_dump(data))
        done = rig("server", "args", "--stack", str(bad))
        assert done.returncode == 2 and says in done.stderr, done.stderr
    config.write_text('{"1": {"candidate_steps": [3]}, "16": {"candidate_steps": [0]}}')
    done = rig("server", "args", "--stack", str(bad), "--json")
    assert done.returncode == 0, done.stderr
    argv = json.loads(done.stdout)["argv"]
    assert argv[argv.index("--speculative-adaptive-config") + 1] == str(config)


def test_sigterm_stops_every_server_it_started_and_writes_what_was_measured(tune_case):
    import signal
    import time

    stack, env = tune_case(*MODEL)
    out = tune_case.dir / "out"
    proc = subprocess.Popen([str(Path(sys.executable).parent / "rig"), "tune", "--stack", str(stack), "--out", str(out),
                             "--min-requests", "8", "--min-seconds", "30"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not listening(tune_case.port) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    time.sleep(2)  # the baseline is up and being measured (each round lasts 30 s)
    assert listening(tune_case.port) and servers_running(tune_case.venv)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and "rig: terminated" in err, err[-2000:]
    result = json.loads((out / "tune.json").read_text())
    assert result["stopped"] and result["recommendation"] == "not finished"
    assert not listening(tune_case.port)


def test_a_tune_killed_outright_keeps_every_server_it_finished_and_each_rounds_numbers(tune_case):
    """A lent machine taken back mid-run kills rig with no chance to write: the record is checkpointed after each
    server, and each round's numbers are in its progress line."""
    import signal
    import time

    stack, env = tune_case(*MODEL)
    out = tune_case.dir / "out"
    with open(tune_case.dir / "tune.err", "w+") as err:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "rig"), "tune", "--stack", str(stack), "--out",
                                 str(out), "--min-requests", "8"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                stderr=err)
        deadline = time.monotonic() + 300
        while not (out / "tune.json").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kill_servers(tune_case.venv)  # what rig, killed, left running
        err.seek(0)
        said = err.read()
    assert (out / "tune.json").exists(), said[-2000:]
    result = json.loads((out / "tune.json").read_text())
    assert result["stopped"] == record.STILL_RUNNING, said[-2000:]
    baseline = result["variants"]["baseline"]["levels"]
    assert list(baseline) == ["C=1", "C=64"] and all(lv["output_throughput"] > 0 for lv in baseline.values())
    rounds = baseline["C=64"]["round_output_throughput"]
    assert len(rounds) == 2  # the stack's rounds
    for round_no, tok_s in enumerate(rounds, 1):
        assert re.search(rf"baseline: concurrency 64, round {round_no}: \d+/128 completed, {tok_s:.1f} output tok/s",
                         said), said[-2000:]


@pytest.mark.parametrize("setup, args, says", [
    ("fifo-log", [], "baseline.log is not a regular file"),
    ("link-logs", [], "logs is not a directory of its own"),
    ("dir-output", [], "holds directories where rig writes tune.json"),
    (None, ["--request-rate", "0.0001"], "0.0001 is out of range: give 0.001 to 100000"),
    (None, ["--request-rate", "1_0"], "give comma-separated numbers"),
    (None, ["--concurrency", "1,1"], "1 given more than once: give each once"),
])
def test_hostile_outputs_and_levels_are_refused_and_leave_nothing_running(tune_case, setup, args, says):
    stack, env = tune_case(*MODEL)
    out = tune_case.dir / "out"
    (out / "logs").parent.mkdir()
    if setup == "fifo-log":
        (out / "logs").mkdir()
        os.mkfifo(out / "logs" / "baseline.log")  # opening it to write would wait for a reader forever
    elif setup == "link-logs":
        (tune_case.dir / "elsewhere").mkdir()
        (out / "logs").symlink_to(tune_case.dir / "elsewhere")
    elif setup == "dir-output":
        (out / "tune.json").mkdir()
    done = tune(stack, out, env, *args)
    assert done.returncode == 2 and says in done.stderr and done.stderr.count("rig: error:") == 1, done.stderr[-1500:]
    assert not listening(tune_case.port)
    assert not (tune_case.dir / "elsewhere").exists() or not any((tune_case.dir / "elsewhere").iterdir())


@pytest.mark.parametrize("out", ["", "bad\nname"])
def test_an_out_path_that_cannot_be_a_plain_directory_is_refused(tune_case, out):
    stack, env = tune_case(*MODEL)
    done = rig("tune", "--stack", str(stack), "--out", out, env=env, timeout=60)
    assert done.returncode == 2 and "--out" in done.stderr and "control characters" in done.stderr


def test_sampling_lowers_acceptance_and_a_capped_server_is_measured_uncapped_and_step_0_on_its_own(tune_case):
    """At temperature 1 each drafted position is accepted at 0.8 x 0.7 (the stand-in's target gives its draft
    token 0.7); SGLang caps a speculative server at 48 running requests, below its decode graph of 64, so tune
    measures each speculative variant again with --max-running-requests 64; SGLang's step 0 is a server of its own,
    its draft extend (0.02 ms a request) still paid."""
    stack, env = tune_case(*MODEL, "--extend-ms", "0.02")
    data = yaml.safe_load(stack.read_text())
    data["tune"].update(steps=[3], uncapped=True, step0=["step0"], profile_levels=[64], profile_steps=10,
                        profile_host=True)
    stack.write_text(yaml.safe_dump(data))
    out = tune_case.dir / "out"
    done = tune(stack, out, env, "--temperature", "1", "--rounds", "1")
    assert done.returncode in (0, 1), done.stderr[-2000:]
    result = json.loads((out / "tune.json").read_text())
    assert result["plan"]["temperature"] == 1
    variants = result["variants"]
    assert [n for n in variants if n != "policy"] == ["baseline", "step0", "step0-uncapped", "eagle3-3",
                                                     "eagle3-3-uncapped"]
    capped, lifted = variants["eagle3-3"], variants["eagle3-3-uncapped"]
    assert capped["max_running_requests"] == 48 and capped["cuda_graph_bs"][-1] == 64
    assert lifted["max_running_requests"] == 64 and "--max-running-requests" in lifted["argv"]
    assert record.capped(capped, capped["levels"]["C=64"]) == 48 and record.capped(lifted, lifted["levels"]["C=64"]) \
        is None and "max_running_requests" in result and "running_cap" not in result
    # 1 + 0.56 + 0.56^2 + 0.56^3 = 2.05 tokens a step at temperature 1 (greedy: 2.95)
    assert 1.7 < capped["levels"]["C=1"]["server_accept_length"] < 2.3
    assert variants["step0"]["argv"].count("--speculative-adaptive") == 1
    assert set(result["family_scores"]) == {"default", "/uncapped"}
    # where a step's time goes at C=64: the profile the server wrote, summed per kernel; step 0 still extends
    kernels = {v: {k["name"]: k["ms_per_step"] for k in variants[v]["levels"]["C=64"]["profile"]["kernels"]}
               for v in ("baseline", "eagle3-3", "eagle3-3-uncapped", "step0")}
    assert "draft_extend" not in kernels["baseline"] and kernels["step0"]["draft_extend"] > 0
    # at most 48 running (capped) and 64 (lifted), 4 tokens a step: how full the batch stays while the profile runs
    # is the client's pace of refills, which a loaded machine slows (requests of one length end together, and a
    # queue of 16 behind the cap did not always cover them: 44.9 running on average once, beside stress-ng); the
    # caps themselves are asserted above, from the servers' own answers
    assert 0 < kernels["eagle3-3"]["target_forward"] <= 0.5 * 48 * 4
    assert 0 < kernels["eagle3-3-uncapped"]["target_forward"] <= 0.5 * 64 * 4
    # its parts back to back over each step: the GPU's busy time is their sum, the span adds the gaps between steps
    profile = variants["baseline"]["levels"]["C=64"]["profile"]
    # in a round of its own before the measured one, which alone makes the level's numbers
    said = done.stderr
    assert said.index("baseline: concurrency 64, the profile's round (not measured)") < \
        said.index("baseline: concurrency 64, round 1/1") and "baseline: concurrency 64, the profile's round: " in said
    assert all(len(v["levels"]["C=64"]["round_output_throughput"]) == 1 for v in variants.values())
    assert profile["gpu_busy_ms_per_step"] == pytest.approx(profile["kernel_ms_per_step"], rel=1e-3)
    assert profile["span_ms_per_step"] >= profile["gpu_busy_ms_per_step"] and 0 <= profile["gpu_idle_share"] < 1
    assert "Where a decode step's time goes" in (out / "report.md").read_text()
    assert "| GPU idle |" in (out / "report.md").read_text()
    # and the host's launch of each part: as many cudaLaunchKernel calls a step as kernels
    launches = {c["name"]: c["calls_per_step"] for c in profile["host_calls"]}
    assert launches == {"cudaLaunchKernel": pytest.approx(len(kernels["baseline"]), abs=0.01)}
    assert "cudaLaunchKernel" in (out / "report.md").read_text()
    # profile_host: the host's Python too, each function's own time; the stand-in's run_batch spans its step
    own = {c["name"]: c["ms_per_step"] for c in profile["host_own"]}
    assert set(own) == {"stand_in/scheduler.py(1): run_batch", "cudaLaunchKernel"}
    assert own["stand_in/scheduler.py(1): run_batch"] == pytest.approx(
        profile["kernel_ms_per_step"] - own["cudaLaunchKernel"], rel=0.01)
    assert "run_batch" in (out / "report.md").read_text()
    assert "acc " in (out / "report.md").read_text()
    # whatever it serves is held to the per-level best: a single server by its own rounds, a policy by its run
    report = json.loads(done.stdout)
    assert report["ok"] == bool(result["confirmation"]["confirmed"]) == (done.returncode == 0)
    if not report["ok"]:
        assert "What pays instead" in result["recommendation"]


@pytest.mark.parametrize("which, said", [
    ("step0-skip-extend", "does not read SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND"),
    ("step0-plain", "does not have rig's free-off patch: add free-off to the stack's patches.opt_in"),
    ("step0-plain-ingest", "does not have rig's free-off patch: add free-off to the stack's patches.opt_in"),
])
def test_a_step_0_server_the_installed_sglang_cannot_run_is_refused(tune_case, which, said):
    stack, env = tune_case(*MODEL)
    data = yaml.safe_load(stack.read_text())
    data["tune"]["step0"] = [which]
    stack.write_text(yaml.safe_dump(data))
    done = tune(stack, tune_case.dir / "out", env, "--check")
    assert done.returncode == 2 and said in done.stderr


def test_the_ingest_step_0_server_needs_a_patch_that_reads_its_switch_and_is_started_with_it(tune_case):
    """step0-plain-ingest is free-off's step 0 with the draft kept in step by its KV alone: refused, naming the fix,
    where the applied patch does not read RIG_FREE_OFF_DRAFT; where it does, the plan starts that server with
    RIG_FREE_OFF_DRAFT=ingest and step0-plain with =extend, both with RIG_FREE_OFF=1."""
    import shutil

    worker = 'import os as _rig_os\n\n_RIG_FREE_OFF = _rig_os.environ.get("RIG_FREE_OFF", "1") != "0"\n'
    stack, env = tune_case(*MODEL)
    data = yaml.safe_load(stack.read_text())
    data["tune"].update(steps=[3], step0=["step0-plain", "step0-plain-ingest"])
    for name, text in (("older", worker), ("patched", worker + '_D = _rig_os.environ.get("RIG_FREE_OFF_DRAFT")\n')):
        package = tune_case.dir / name
        shutil.copytree(STANDIN, package, ignore=shutil.ignore_patterns("__pycache__"))
        (package / "sglang" / "srt" / "speculative" / "eagle_worker_v2.py").write_text(text)
        data["venv"] = str(make_standin_venv(tune_case.dir / f"venv-{name}", package))
        stack.write_text(yaml.safe_dump(data))
        done = tune(stack, tune_case.dir / f"out-{name}", env, "--check")
        if name == "older":
            assert done.returncode == 2 and "does not read RIG_FREE_OFF_DRAFT" in done.stderr, done.stderr
            assert "rig patch revert --stack STACK" in done.stderr
        else:
            assert done.returncode == 0, done.stderr
            plan = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].split()
                    for line in json.loads(done.stdout)["msg"].splitlines() if line.startswith("  step0-plain")}
            # each says both switches itself, so that one exported where rig runs reaches neither
            assert plan["step0-plain"][:2] == ["RIG_FREE_OFF=1", "RIG_FREE_OFF_DRAFT=extend"]
            assert plan["step0-plain-ingest"][:2] == ["RIG_FREE_OFF=1", "RIG_FREE_OFF_DRAFT=ingest"]
            assert plan["step0-plain"][2:] == plan["step0-plain-ingest"][2:] and "=" not in plan["step0-plain"][2]


def test_free_offs_plain_step_0_is_measured_beside_sglangs_and_the_policy_runs_on_it(tune_case):
    """Where rig's free-off patch is applied (here: a worker module beside the stand-in that reads RIG_FREE_OFF as
    the patched eagle_worker_v2.py does), step0-plain runs step 0 as a plain decode and step0 SGLang's own (the
    server started with RIG_FREE_OFF=0): a verify costs as much as a decode, so at C=64 SGLang's step 0 keeps about
    half the baseline and the plain one all of it; the adaptive policy serves its step-0 slot plain."""
    import shutil

    package = tune_case.dir / "patched"
    shutil.copytree(STANDIN, package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "sglang" / "srt" / "speculative" / "eagle_worker_v2.py").write_text(
        'import os as _rig_os\n\n_RIG_FREE_OFF = _rig_os.environ.get("RIG_FREE_OFF", "1") != "0"\n')
    venv = make_standin_venv(tune_case.dir / "venv", package)
    # MODEL's costs four times over: a step's sleep stays well above the stand-in's own Python work on a loaded
    # machine (at MODEL's, a starved stand-in ran its step-0 servers at half their modelled speed)
    slow = ["--step-ms", "16", "--token-ms", "2", "--draft-ms", "1", "--accept-rate", "0.8", "--verify-ms", "2"]
    stack, env = tune_case(*slow)
    data = yaml.safe_load(stack.read_text())
    data["venv"] = str(venv)
    data["tune"].update(steps=[3], step0=["step0", "step0-plain"])
    stack.write_text(yaml.safe_dump(data))
    out = tune_case.dir / "out"
    done = tune(stack, out, env)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    result = json.loads((out / "tune.json").read_text())
    variants = result["variants"]
    assert [n for n in variants if n != "policy"] == ["baseline", "step0", "step0-plain", "eagle3-3"]
    plain = {"RIG_FREE_OFF": "1", "RIG_FREE_OFF_DRAFT": "extend"}
    assert variants["step0"]["env"] == {"RIG_FREE_OFF": "0"} and variants["step0-plain"]["env"] == plain
    value = {name: variants[name]["levels"]["C=64"]["output_throughput"] for name in ("baseline", "step0", "step0-plain")}
    assert value["step0"] < 0.8 * value["step0-plain"], value  # the same level, the same load: half against all
    assert result["step0_stand_in"] in (None, "step0-plain")  # priced where the choice switches with load
    report = (out / "report.md").read_text()
    assert "step0-plain" in report and "| step0 |" in report.replace("`", "")
    if result["policy"]["kind"] != "adaptive":  # a machine loaded enough to blur C=1 into a tie chose no drafting
        assert result["policy"]["kind"] == "baseline", result["policy"]
        return
    assert result["step0_stand_in"] == "step0-plain"
    assert result["policy"]["slots"]["1"] == 3 and 0 in result["policy"]["slots"].values()
    assert variants["policy"]["env"] == plain
    assert variants["policy"]["levels"]["C=64"]["output_throughput"] > 0.7 * value["baseline"]
    # what the policy's server ran with is proposed with it, and said
    assert yaml.safe_load((out / "proposed-stack.yml").read_text())["environment"]["vars"] == plain
    if result["confirmation"]["confirmed"]:
        assert "RIG_FREE_OFF_DRAFT=extend in environment.vars" in result["recommendation"]


def test_the_units_start_digest_follows_the_venvs_patch_record(tune_case):
    """rig server args names the patch record among what the server takes at start: a patch applied or reverted
    alone rewrites the unit, so the server restarts with it (issue 71)."""
    stack, _ = tune_case()
    line = ["server", "args", "--stack", str(stack), "--gate-engine", "/var/cache/rig/engine/rig.pyz", "--json"]

    def digest() -> str:
        done = rig(*line)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["start_digest"]

    unpatched = digest()
    (tune_case.venv / ".rig-patches.json").write_text('{"files": {}}')
    patched = digest()
    (tune_case.venv / ".rig-patches.json").unlink()
    assert unpatched != patched and digest() == unpatched
