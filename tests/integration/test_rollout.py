"""playbooks/server.yml on boxes whose PID 1 is systemd: the unit really starts, gates, restarts and drains.

The server is the test stand-in (tests/data/sglang_standin, serving tests/sglang_api_server.py) in the
stack's venv; everything else is what a GPU host runs: the sglang_server role, its unit, the health gate
and `rig smoke` from the engine bundle, systemd itself.
"""
from __future__ import annotations

import json

import pytest
from harness.commands import run
from harness.plays import play
from serving_boxes import HEALTH, UNIT, main_pid, numerics_models, serving_box, stack_file

pytestmark = pytest.mark.box

# a streamed request of 6000 tokens at 50 tokens/s (the first box's rate): in flight for two minutes, while
# the rollout reaches that box (on 2 cores shared by 4 test workers that took over one minute)
# held by the stand-in until the server drains (hold_until_drain): in flight then, however slow the play
IN_FLIGHT_TOKENS = 600
IN_FLIGHT = ("import json, urllib.request\n"
             f"body = json.dumps({{'text': 'hi', 'sampling_params': {{'max_new_tokens': {IN_FLIGHT_TOKENS}}}, "
             "'stream': True, 'rig_test': {'hold_until_drain': True}})\n"
             "req = urllib.request.Request('http://127.0.0.1:30000/generate', body.encode(), "
             "{'Content-Type': 'application/json'})\n"
             "last = None\n"
             "for line in urllib.request.urlopen(req, timeout=1800):\n"  # held: silent until the drain
             "    if line.startswith(b'data: {'): last = json.loads(line[6:])\n"
             "open('/tmp/in-flight.json', 'w').write(json.dumps(last['meta_info']))\n")


def test_a_rollout_stops_at_the_first_failing_batch_and_leaves_the_rest_serving(start_box, standin_site, tmp_path):
    slow_start = ["--start-delay", "4", "--rate", "50"]
    boxes = [serving_box(start_box, standin_site, slow_start if i == 0 else None) for i in range(3)]
    first, broken, last = boxes
    settings = {"sglang_server_require_gpu": False, "sglang_server_start_timeout": 120}
    play(boxes, "server.yml", rig_stack=stack_file(tmp_path, "v1.yml", 2), **settings).expect_ok()
    for box in boxes:
        assert box.sh("systemctl is-active sglang-server").stdout.strip() == "active"
        assert box.sh(HEALTH).stdout.strip() == "200"
    # the start gate: systemd called the first box's server started only once its health answered (4 s of 503)
    times = dict(line.split("=") for line in first.sh(
        "systemctl show -p ExecMainStartTimestampMonotonic -p ActiveEnterTimestampMonotonic sglang-server").stdout.split())
    assert int(times["ActiveEnterTimestampMonotonic"]) - int(times["ExecMainStartTimestampMonotonic"]) >= 4_000_000

    again = play(boxes, "server.yml", rig_stack=stack_file(tmp_path, "v1.yml", 2), **settings).expect_ok()
    assert all(again.recap("changed", b.name) == 0 for b in boxes), again.changed_tasks()

    untouched_unit, untouched_pid = last.sh(f"sha256sum {UNIT}").stdout, main_pid(last)
    broken.sh("rm -rf /models/target")  # the second box's server cannot start with the new stack
    first.sh(f"cat > /tmp/in-flight.py <<'EOF'\n{IN_FLIGHT}EOF")
    run(["docker", "exec", "-d", first.name, "python3", "/tmp/in-flight.py"])
    first.sh("for i in $(seq 100); do python3 -c \"import json, urllib.request; exit(json.load(urllib.request.urlopen("
             "'http://127.0.0.1:30000/rig_test/stats'))['tokens'] == 0)\" && exit 0; sleep 0.1; done; exit 1")
    rollout = play(boxes, "server.yml", rig_stack=stack_file(tmp_path, "v2.yml", 3), rig_rollout_batch=1,
                   **settings)
    assert not rollout.ok
    assert "--speculative-num-steps 3" in first.sh(f"cat {UNIT}").stdout
    assert first.sh(HEALTH).stdout.strip() == "200"
    assert rollout.recap("failed", broken.name) == 1
    assert first.sh("systemctl is-active sglang-server", check=False).stdout.strip() == "active"
    assert broken.sh("systemctl is-active sglang-server", check=False).stdout.strip() != "active"
    # the third box was never reached: same unit, same process, still serving
    assert last.sh(f"sha256sum {UNIT}").stdout == untouched_unit and main_pid(last) == untouched_pid
    assert "--speculative-num-steps 2" in last.sh(f"cat {UNIT}").stdout
    assert last.sh(HEALTH).stdout.strip() == "200"
    # the request in flight on the first box when it was drained finished whole
    assert "Gracefully exiting... Remaining number of requests 1" in first.sh("cat /var/log/rig/sglang-server.log").stdout
    finished = json.loads(first.sh("cat /tmp/in-flight.json").stdout)
    assert finished["completion_tokens"] == IN_FLIGHT_TOKENS and finished["finish_reason"]["length"] == IN_FLIGHT_TOKENS


def test_the_unit_restarts_a_server_that_dies(start_box, standin_site, tmp_path):
    box = serving_box(start_box, standin_site)
    play([box], "server.yml", rig_stack=stack_file(tmp_path, "v1.yml", 2), sglang_server_require_gpu=False,
         sglang_server_start_timeout=120).expect_ok()
    before = main_pid(box)
    box.sh(f"kill -9 {before}")
    box.sh("for i in $(seq 60); do [ \"$(systemctl show -p NRestarts --value sglang-server)\" = 1 ] && "
           "systemctl is-active -q sglang-server && exit 0; sleep 1; done; exit 1")
    assert main_pid(box) != before and box.sh(HEALTH).stdout.strip() == "200"


def test_the_prove_playbook_proves_every_host_and_tabulates_them_on_the_controller(start_box, standin_site, tmp_path):
    boxes = [serving_box(start_box, standin_site, ["--numerics-fault", "wrong"] if i == 1 else None)
             for i in range(2)]
    good, bad = boxes
    models = [numerics_models(box) for box in boxes][0]  # the same path on both
    reports = tmp_path / "reports"
    done = play(boxes, "prove.yml", rig_stack=stack_file(tmp_path, "prove.yml", 3), rig_prove_reports=str(reports),
                rig_prove_skip=["doctor", "testmodel", "acceptance"], rig_prove_models=models)
    assert not done.ok, done.output[-3000:]  # the second host's numerics are wrong
    assert "FAILED on " + bad.name in done.output
    assert all((reports / box.name / "report.md").is_file() for box in boxes)
    good_report = json.loads((reports / good.name / "prove.json").read_text())
    not_passed = [s for s in good_report["steps"] if s["status"] not in ("pass", "skip")]
    assert good_report["ok"] and not not_passed, not_passed
    assert {s["name"]: s["status"] for s in good_report["steps"]}["eagle3 tp1: numerics"] == "pass"
    bad_steps = {s["name"]: s for s in json.loads((reports / bad.name / "prove.json").read_text())["steps"]}
    assert bad_steps["baseline tp1: numerics"]["status"] == "fail" and "differs at token 3" in \
        bad_steps["baseline tp1: numerics"]["detail"]
    assert bad_steps["eagle3 tp1"]["status"] == "skip"  # a wrong baseline is no reference
    summary = (reports / "summary.md").read_text()
    assert f"| {good.name} | pass | 8.00 |" in summary and f"| {bad.name} | FAIL |" in summary
    for box in boxes:  # every server prove started is gone
        assert box.sh(HEALTH).stdout.strip() == "down"
