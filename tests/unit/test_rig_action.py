"""The rig action plugin: how it maps the engine's answer, and real ansible-playbook runs of it on the
controller itself (connection local), check mode and hostile arguments included."""
import json
import os
import sys
import time

import pytest
from harness.commands import run
from harness.paths import REPO
from harness.rig_action import SHOW, action, play

from rig.python.runtime_env import MODULE

ARGV = ["venv", "install", "--json"]


def mapped(stdout="", rc=0, stderr="", mode="apply", check_mode=False):
    return action._mapped(ARGV, {"rc": rc, "stdout": stdout, "stderr": stderr}, mode, check_mode)


def test_engine_fields_are_on_the_result_and_changed_follows_the_mode():
    answer = json.dumps({"changed": True, "msg": "would install lock abc", "lock_hash": "abc"})
    applied = mapped(answer)
    assert applied["changed"] is True and applied["lock_hash"] == "abc" and applied["msg"] == "would install lock abc"
    assert applied["would_change"] is True and "diff" not in applied
    planned = mapped(answer, mode="plan")
    assert planned["would_change"] is True and planned["changed"] is False  # the apply step reports it
    assert mapped(answer, mode="plan", check_mode=True)["changed"] is True  # in check mode the plan is the answer
    assert mapped(answer, mode="read")["changed"] is False


def test_a_change_in_check_mode_says_itself_under_diff():
    words = mapped(json.dumps({"changed": True, "msg": "would install CUDA 13.0.2"}), check_mode=True)
    assert words["diff"] == {"prepared": "would install CUDA 13.0.2\n"}
    unified = mapped(json.dumps({"changed": True, "msg": "m", "diff": "--- a\n+++ b\n"}), check_mode=True)
    assert unified["diff"] == {"prepared": "--- a\n+++ b\n"}
    assert "diff" not in mapped(json.dumps({"changed": False, "msg": "current"}), check_mode=True)


def test_the_engine_cannot_set_what_the_action_decides():
    answer = json.dumps({"changed": False, "failed": False, "skipped": True, "rc": 0, "invocation": {},
                         "stdout": "x", "diff": ["not", "text"], "msg": ["not", "text"], "path": "/p"})
    result = mapped(answer, mode="read")
    assert result == {"changed": False, "would_change": False, "path": "/p"}


@pytest.mark.parametrize("stdout", ["", "not json", "[1, 2]", '"a string"', "null", '{"a": 1} trailing'])
def test_an_answer_that_is_not_one_json_object_fails_the_task(stdout):
    result = mapped(stdout)
    assert result["failed"] is True and "did not print one JSON object" in result["msg"]


def test_a_failure_is_the_engines_error_line():
    stderr = "rig: fetching\nrig: error: stacks/x.yml: no such file (give a stack file)\n"
    result = mapped(rc=2, stderr=stderr, stdout='{"changed": true}')
    assert result["failed"] is True and result["rc"] == 2 and "changed" not in result
    assert result["msg"] == "rig venv install failed (exit 2): rig: error: stacks/x.yml: no such file (give a stack file)"
    assert mapped(rc=127, stderr="python3: not found\n")["msg"].endswith("(exit 127): python3: not found")
    lines = "rig: resolving\nrig: error: 2 conflicts; fix them all:\n  torch 2.9 vs 2.11\n  numpy\n"
    assert mapped(rc=2, stderr=lines)["msg"].endswith("(exit 2): rig: error: 2 conflicts; fix them all:\n"
                                                      "  torch 2.9 vs 2.11\n  numpy")
    hinted = "rig: warning: `--check` is now `--verify`\nrig: error: no stack\nrig: hint: give --stack FILE\n"
    assert mapped(rc=2, stderr=hinted)["msg"].endswith("(exit 2): rig: error: no stack\nrig: hint: give --stack FILE")


# ---- real runs: ansible-playbook on this controller, the bundle built by the rig_engine role

def test_a_controller_step_runs_on_the_controller_and_never_reaches_the_host(tmp_path):
    task = {"name": "Read a stack", "rig": {"argv": ["stack", "show", "--stack", str(REPO / "stacks" / "default.yml")],
                                           "controller": True, "mode": "read"}}
    rc, result = play(tmp_path, [task], host="faraway")
    assert rc == 0 and result["changed"] is False and result["name"] == "sm120-sglang-0.5.23"
    task["rig"]["controller"] = False  # the same step on the host itself: unreachable
    rc, result = play(tmp_path, [task], host="faraway")
    assert rc != 0 and result.get("unreachable") is True


@pytest.fixture
def venv(tmp_path):
    path = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path


def sitecustomize(venv) -> list:
    return [p.name for p in venv.glob(f"lib/python*/site-packages/{MODULE}*")]


def test_a_step_under_check_and_diff_changes_nothing_then_applies_once(tmp_path, venv):
    task = [{"name": "Write the environment", "rig": {"argv": ["env", "install", "--venv", str(venv),
                                                              "--stack", str(REPO / "stacks" / "default.yml")]}}]
    rc, dry = play(tmp_path, task, "--check", "--diff")
    assert rc == 0 and dry["changed"] is True and dry["diff"]["prepared"]
    assert not sitecustomize(venv)
    rc, first = play(tmp_path, task)
    assert rc == 0 and first["changed"] is True and sitecustomize(venv)
    rc, again = play(tmp_path, task)
    assert rc == 0 and again["changed"] is False


def test_hostile_argument_values_reach_the_engine_verbatim_never_a_shell(tmp_path):
    hostile = "x\n../$(touch pwned)`touch pwned2`'; touch pwned3 #.yml"
    rc, result = play(tmp_path, [{"name": "Show a stack",
                                  "rig": {"argv": ["stack", "show", "--stack", hostile], "mode": "read"}}])
    assert rc != 0 and result["failed"] is True
    assert result["msg"].startswith("rig stack show failed (exit 2): rig: error: ")
    assert "../$(touch pwned)" in result["msg"]  # the path as given, not a shell's reading of it
    assert not list(tmp_path.glob("pwned*")) and not list(REPO.glob("pwned*"))


@pytest.mark.parametrize("args, reason", [
    ({"argv": ["--check", "venv", "install"]}, "argv must start with a rig subcommand"),
    ({"argv": []}, "argv must start with a rig subcommand"),
    ({"argv": ["venv"], "mode": "force"}, "mode"),
    ({"argv": ["venv"], "shell": "id"}, "shell"),
])
def test_bad_task_arguments_fail_before_anything_runs(tmp_path, args, reason):
    rc, result = play(tmp_path, [{"name": "Bad", "rig": args}])
    assert rc != 0 and result["failed"] is True and reason in result["msg"]


def test_a_target_without_the_interpreter_fails_saying_so(tmp_path):
    task = {"name": "Show a stack", "rig": {"argv": ["stack", "show", "--stack", str(REPO / "stacks" / "default.yml")],
                                           "mode": "read"}}
    rc, result = play(tmp_path, [task], "-e", "rig_engine_python=/nonexistent/python3")
    assert rc != 0 and result["failed"] is True
    assert result["msg"].startswith("rig stack show failed (exit 127): ") and "/nonexistent/python3" in result["msg"]


def kept(tmp_path) -> list:
    return sorted(p.name for p in (tmp_path / "kept").iterdir()) if (tmp_path / "kept").is_dir() else []


def test_the_bundle_is_kept_on_the_target_by_its_sha256_and_checked_before_every_run(tmp_path):
    import hashlib
    import stat

    rc, first = play(tmp_path, [SHOW])
    digest = hashlib.sha256((tmp_path / "rig.pyz").read_bytes()).hexdigest()
    assert rc == 0 and first["name"] == "sm120-sglang-0.5.23" and kept(tmp_path) == [f"rig-{digest[:16]}.pyz"]
    held = tmp_path / "kept" / f"rig-{digest[:16]}.pyz"
    assert stat.S_IMODE(held.stat().st_mode) == 0o644 and held.read_bytes() == (tmp_path / "rig.pyz").read_bytes()
    # altered on the host: refused by its sha256 and sent again; a link there is replaced, never written through
    held.write_bytes(b"import sys; sys.exit(0)\n")
    assert play(tmp_path, [SHOW])[0] == 0 and held.read_bytes() == (tmp_path / "rig.pyz").read_bytes()
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    held.unlink()
    held.symlink_to(victim)
    assert play(tmp_path, [SHOW])[0] == 0 and victim.read_bytes() == b"keep me" and not held.is_symlink()
    # when this one is kept, another rig version's bundle stays while another run may read it, a week
    for name, days in (("rig-0000000000000000.pyz", 8), ("rig-1111111111111111.pyz", 1)):
        (tmp_path / "kept" / name).write_bytes(b"old")
        os.utime(tmp_path / "kept" / name, (time.time() - days * 86400,) * 2)
    held.unlink()
    assert play(tmp_path, [SHOW])[0] == 0 and set(kept(tmp_path)) == {"rig-1111111111111111.pyz", held.name}


def test_check_mode_keeps_nothing_and_a_keep_dir_that_is_a_link_is_never_used(tmp_path):
    rc, dry = play(tmp_path, [SHOW], "--check")
    assert rc == 0 and dry["name"] == "sm120-sglang-0.5.23" and kept(tmp_path) == []
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "kept").symlink_to(elsewhere)
    rc, result = play(tmp_path, [SHOW])  # the task still runs, from its temporary directory
    assert rc == 0 and result["name"] == "sm120-sglang-0.5.23" and list(elsewhere.iterdir()) == []


def test_the_tasks_environment_reaches_the_engine(tmp_path):
    task = {"name": "Show a missing stack", "rig": {"argv": ["stack", "show", "--stack", str(tmp_path / "none.yml")],
                                                   "mode": "read"}}
    rc, plain = play(tmp_path, [task])
    rc_debug, debug = play(tmp_path, [{**task, "environment": {"RIG_DEBUG": "1"}}])
    assert rc != 0 and rc_debug != 0 and "Traceback" not in plain["stderr"]
    assert "Traceback" in debug["stderr"] and "rig: error:" in debug["msg"]


@pytest.mark.parametrize("keep", ["", "/", "relative/dir", "~/cache", "-rf"])
def test_a_keep_dir_that_is_not_an_absolute_directory_is_refused_naming_it(tmp_path, keep):
    rc, result = play(tmp_path, [SHOW], "-e", f"rig_engine_keep_dir={keep}")
    assert rc != 0 and result["failed"] is True and "give an absolute directory other than /" in result["msg"]


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_the_engines_stderr_is_told_from_its_answer_over_a_tty_too(newline):
    """Over SSH the tty merges stderr into stdout and writes CRLF; the marker line splits them either way."""
    marker = "--- rig stderr 0123456789abcdef ---"
    printed = newline.join(['{"changed": false, "msg": "m"}', "", marker, "rig: error: it failed", ""])
    stdout, stderr = action._split(printed, marker)
    assert action._one_object(stdout) == {"changed": False, "msg": "m"} and stderr.startswith("rig: error: it failed")
    assert action._split(newline + marker + newline + "only stderr", marker) == ("", "only stderr")
    assert action._split('{"a": 1}\n', marker) == ('{"a": 1}\n', "")
