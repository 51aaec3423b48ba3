"""playbooks/server.yml serving the stack `rig tune` proposes, on a box whose PID 1 is systemd: its adaptive file
(server.speculative_adaptive_config, on the controller) goes to the host with it, and its environment.vars reach
the server process through the venv's sitecustomize, which the python_stack role writes.

The server is the test stand-in (tests/data/sglang_standin, serving tests/sglang_api_server.py): it reads the
adaptive config its line names at start (SGLang's start-up check), and the faults file SGLANG_STANDIN_FAULTS
names from its own environment.
"""
from __future__ import annotations

import json

import pytest
import yaml
from harness.paths import REPO
from harness.plays import play
from serving_boxes import UNIT, drains, main_pid, serving_box

from rig.serving import adaptive

pytestmark = pytest.mark.box

HOST_COPY = "/etc/rig/sglang-server.adaptive.json"
FAULTS = "/etc/rig-test-faults.json"  # what environment.vars points the stand-in at: a context length of its own
CONTEXT = 4321
SETTINGS = {"sglang_server_require_gpu": False, "sglang_server_start_timeout": 120}
# as `rig tune` writes them: one candidate per slot, the launch's steps among them
FIRST, SECOND = adaptive.render({1: 3, 64: 0}), adaptive.render({1: 3, 16: 0})
SERVER_INFO = ("python3 -c \"import json, urllib.request; print(json.dumps(json.load(urllib.request.urlopen("
               "'http://127.0.0.1:30000/server_info', timeout=5))))\"")
# python_stack's own step that writes the venv's sitecustomize, on the stack's variables: the box's venv is the
# stand-in's, so there is no lock to install first
ENVIRONMENT_PLAY = f"""
- ansible.builtin.import_playbook: {REPO}/playbooks/stack.yml

- name: Give the venv the stack's environment, as playbooks/python.yml does
  hosts: gpu_hosts
  gather_facts: false
  tasks:
    - name: The python_stack role's environment step
      ansible.builtin.include_role:
        name: python_stack
        tasks_from: environment
"""


def proposed_stack(tmp_path) -> str:
    """The default stack with what `rig tune` proposes: adaptive speculation from a file beside it, topk 1, and
    the free-off switches in environment.vars (with the stand-in's faults file, which shows they arrived)."""
    stack = yaml.safe_load((REPO / "stacks" / "default.yml").read_text())
    stack["server"].update(model="/models/target", draft_model="/models/draft", speculative_num_steps=3,
                           speculative_eagle_topk=1, speculative_num_draft_tokens=4,
                           speculative_adaptive_config=str(tmp_path / "adaptive.json"))
    stack.setdefault("environment", {})["vars"] = {"RIG_FREE_OFF": "1", "RIG_FREE_OFF_DRAFT": "ingest",
                                                   "SGLANG_STANDIN_FAULTS": FAULTS}
    path = tmp_path / "proposed-stack.yml"
    path.write_text(yaml.safe_dump(stack))
    return str(path)


def unchanged(box, before: dict) -> None:
    """BOX as BEFORE (state) says: the same host copy, unit and server process."""
    assert state(box) == before


def state(box) -> dict:
    return {"copy": box.sh(f"cat {HOST_COPY}").stdout, "unit": box.sh(f"sha256sum {UNIT}").stdout,
            "pid": main_pid(box), "drains": drains(box)}


def test_the_role_serves_the_proposed_stack_with_its_adaptive_file_and_environment(start_box, standin_site,
                                                                                   tmp_path):
    box = serving_box(start_box, standin_site)
    box.sh(f"echo '{json.dumps({'args': ['--context-length', str(CONTEXT)]})}' > {FAULTS}")
    config = tmp_path / "adaptive.json"
    config.write_text(FIRST)
    stack = proposed_stack(tmp_path)
    environment_play = tmp_path / "environment.yml"
    environment_play.write_text(ENVIRONMENT_PLAY)
    play([box], str(environment_play), rig_stack=stack).expect_ok()

    dry = play([box], "server.yml", "--check", "--diff", rig_stack=stack, **SETTINGS).expect_ok()
    assert f"--speculative-adaptive-config {HOST_COPY}" in dry.output  # the unit's diff
    assert '"candidate_steps"' in dry.output  # the file's
    assert not box.exists(UNIT) and not box.exists(HOST_COPY)

    play([box], "server.yml", rig_stack=stack, **SETTINGS).expect_ok()
    unit = box.sh(f"cat {UNIT}").stdout
    assert f"--speculative-adaptive --speculative-adaptive-config {HOST_COPY} " in unit
    assert str(tmp_path) not in unit  # the controller's path never reaches the host
    assert box.sh(f"cat {HOST_COPY}").stdout == FIRST
    assert box.sh(f"stat -c '%U %G %a %F' {HOST_COPY}").stdout.split() == ["root", "root", "644", "regular", "file"]
    # the process systemd runs names the host's copy, and read it at start (the stand-in refuses a missing one)
    cmdline = box.sh(f"tr '\\0' ' ' < /proc/{main_pid(box)}/cmdline").stdout
    assert f"--speculative-adaptive-config {HOST_COPY} " in cmdline
    info = json.loads(box.sh(SERVER_INFO).stdout)
    assert info["speculative_adaptive"] is True and info["speculative_num_steps"] == 3
    # environment.vars reached the server process: the stand-in read the faults file it names. The unit sets none
    # of them: the venv's sitecustomize (python_stack) is the one way in
    assert info["context_length"] == CONTEXT
    assert "SGLANG_STANDIN_FAULTS" not in unit and "RIG_FREE_OFF" not in unit

    before = state(box)
    again = play([box], "server.yml", rig_stack=stack, **SETTINGS).expect_ok()
    assert again.recap("changed") == 0, again.changed_tasks()
    unchanged(box, before)

    config.write_text(SECOND)  # a new tune's policy
    dry = play([box], "server.yml", "--check", "--diff", rig_stack=stack, **SETTINGS).expect_ok()
    assert '-  "64": {' in dry.output and '+  "16": {' in dry.output
    unchanged(box, before)
    play([box], "server.yml", rig_stack=stack, **SETTINGS).expect_ok()
    after = state(box)
    assert after["copy"] == SECOND and after["unit"] == before["unit"]  # the same line, a new file
    assert after["pid"] != before["pid"] and len(after["drains"]) == len(before["drains"]) + 1  # restarted, drained
    assert json.loads(box.sh(SERVER_INFO).stdout)["context_length"] == CONTEXT

    config.write_text("{not json")
    bad = play([box], "server.yml", rig_stack=stack, **SETTINGS)
    assert not bad.ok and bad.recap("failed") == 1 and bad.recap("changed") == 0, bad.output[-3000:]
    assert f"rig server adaptive failed (exit 2): rig: error: {config}: not valid JSON" in bad.output
    unchanged(box, after)

    config.unlink()
    (tmp_path / "elsewhere.json").write_text(FIRST)
    config.symlink_to(tmp_path / "elsewhere.json")
    linked = play([box], "server.yml", rig_stack=stack, **SETTINGS)
    assert not linked.ok and linked.recap("failed") == 1 and linked.recap("changed") == 0, linked.output[-3000:]
    assert f"cannot read adaptive speculation config {config}: it is a link, and a link there is never followed" \
        in linked.output
    unchanged(box, after)

    # a new environment.vars value: python_stack rewrites the venv's environment module, and the unit, which names
    # what the venv's Python takes from rig at start, changes with it: the server restarts (drained) and reads it
    config.unlink()
    config.write_text(SECOND)
    box.sh(f"echo '{json.dumps({'args': ['--context-length', str(CONTEXT + 1)]})}' > {FAULTS}.new")
    changed = yaml.safe_load(open(stack).read())
    changed["environment"]["vars"]["SGLANG_STANDIN_FAULTS"] = f"{FAULTS}.new"
    open(stack, "w").write(yaml.safe_dump(changed))
    play([box], str(environment_play), rig_stack=stack).expect_ok()
    play([box], "server.yml", rig_stack=stack, **SETTINGS).expect_ok()
    restarted = state(box)
    assert restarted["unit"] != after["unit"] and restarted["pid"] != after["pid"]
    assert len(restarted["drains"]) == len(after["drains"]) + 1
    assert json.loads(box.sh(SERVER_INFO).stdout)["context_length"] == CONTEXT + 1
    assert play([box], "server.yml", rig_stack=stack, **SETTINGS).expect_ok().recap("changed") == 0
