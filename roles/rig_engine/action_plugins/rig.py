"""The `rig` action: run one rig subcommand on the target from the engine bundle and
map its JSON answer onto Ansible's result (changed, diff, msg, failed).

Roles that depend on rig_engine call the engine through it:

    - name: Apply the patches
      rig:
        argv: [patch, apply, --venv, /opt/rig/venv]

mode says how the subcommand meets check mode:
- apply (the default): it changes the host; in check mode it gets --check, plans
  and changes nothing, and the task reports what it would change.
- plan: it always gets --check; `would_change` says whether the step that follows is
  needed. The task reports a change in check mode only, where the plan is the answer.
- read: it only reads; it runs in check mode too and never reports a change.

controller: true runs the subcommand on the controller instead (with the Python that runs
Ansible, where rig is installed): steps on the controller's cache and wheelhouse, whose
changes are no host's. Give them mode read.

Every engine field is on the registered result (`result.path`, `result.lock_hash`);
`would_change` is the engine's own `changed`, whatever the mode.
Under --diff the engine's unified diff is shown, or in check mode its msg where a
change has no file diff ("would install lock ..."); its `rig: error:` line is the
msg of a failure.
"""
from __future__ import annotations

import json
import shlex
import subprocess
import sys

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

# What the action sets itself: the engine's own values for these are mapped, not copied.
RESERVED = frozenset(("changed", "failed", "skipped", "diff", "msg", "rc", "stdout", "stderr", "invocation"))


class ActionModule(ActionBase):
    TRANSFERS_FILES = False  # a controller step touches no host: the target's tmp dir is made when needed
    _supports_check_mode = True
    _VALID_ARGS = frozenset(("argv", "mode", "controller"))

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        _, args = self.validate_argument_spec(argument_spec={
            "argv": {"type": "list", "elements": "str", "required": True},
            "mode": {"type": "str", "default": "apply", "choices": ["apply", "plan", "read"]},
            "controller": {"type": "bool", "default": False},
        })
        result = super().run(tmp, task_vars)
        del tmp
        argv = list(args["argv"])
        if not argv or argv[0].startswith("-"):
            raise AnsibleActionFail(f"argv must start with a rig subcommand, not {argv!r}")
        mode = args["mode"]
        if mode == "plan" or (mode == "apply" and self._task.check_mode):
            argv.append("--check")
        argv.append("--json")
        out = self._on_controller(argv) if args["controller"] else self._on_target(argv, task_vars)
        result.update(_mapped(argv, out, mode, self._task.check_mode))
        return result

    def _on_target(self, argv: list[str], task_vars: dict) -> dict:
        bundle = self._engine_var(task_vars, "rig_engine_bundle")
        python = self._engine_var(task_vars, "rig_engine_python")
        shell = self._connection._shell
        try:
            tmpdir = self._make_tmp_path()
            remote, err = shell.join_path(tmpdir, "rig.pyz"), shell.join_path(tmpdir, "rig.err")
            self._transfer_file(bundle, remote)
            self._fixup_perms2((tmpdir, remote))
            # stderr to a file: over SSH with become a tty merges it into stdout, which must stay one JSON object
            cmd = " ".join(shlex.quote(part) for part in (*shlex.split(python), remote, *argv))
            out = self._low_level_execute_command(shell.wrap_for_exec(f"{cmd} 2>{shlex.quote(err)}"), sudoable=True)
            if out["rc"] != 0:
                said = self._low_level_execute_command(f"cat {shlex.quote(err)}", sudoable=True)
                out["stderr"] = said.get("stdout", "") + out.get("stderr", "")
            return out
        finally:
            self._remove_tmp_path(shell.tmpdir)

    @staticmethod
    def _on_controller(argv: list[str]) -> dict:
        done = subprocess.run([sys.executable, "-m", "rig", *argv], capture_output=True, text=True, check=False)
        return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}

    def _engine_var(self, task_vars: dict, name: str) -> str:
        if name not in task_vars:
            raise AnsibleActionFail(f"{name} is not set: run the task in a role that depends on rig_engine")
        return str(self._templar.template(task_vars[name]))


def _mapped(argv: list[str], out: dict, mode: str, check_mode: bool) -> dict:
    """Ansible's result for the engine's exit status and its one JSON object on stdout."""
    rc, stdout, stderr = out.get("rc"), out.get("stdout", ""), out.get("stderr", "")
    command = "rig " + " ".join(argv[:2])
    answer = _one_object(stdout)
    if rc != 0:
        if isinstance(answer, dict) and isinstance(answer.get("msg"), str):  # a judgement: its verdict says why
            fields = {key: value for key, value in answer.items() if key not in RESERVED}
            return {**fields, "failed": True, "rc": rc, "stderr": stderr,
                    "msg": f"{command} failed (exit {rc}): {answer['msg']}"}
        lines = [line for line in stderr.splitlines() if line.strip()]
        # the engine's error is its last `rig: ` line and the indented lines that go on with it
        start = next((i for i in reversed(range(len(lines))) if lines[i].startswith("rig: ")), len(lines) - 1)
        reason = "\n".join(lines[max(start, 0):])
        return {"failed": True, "rc": rc, "stderr": stderr, "msg": f"{command} failed (exit {rc}): {reason}"}
    if not isinstance(answer, dict):
        return {"failed": True, "rc": rc, "stdout": stdout,
                "msg": f"{command} did not print one JSON object (is the bundle from this rig?)"}
    result = {key: value for key, value in answer.items() if key not in RESERVED}
    would_change = result["would_change"] = bool(answer.get("changed"))
    result["changed"] = would_change and (mode == "apply" or (mode == "plan" and check_mode))
    if isinstance(answer.get("msg"), str):
        result["msg"] = answer["msg"]
    if isinstance(answer.get("diff"), str) and answer["diff"]:
        result["diff"] = {"prepared": answer["diff"]}
    elif check_mode and result["changed"] and result.get("msg"):
        # --check --diff is how Ansible says what would change; a change with no file diff says it in words
        result["diff"] = {"prepared": result["msg"] + "\n"}
    return result


def _one_object(stdout: str) -> object:
    try:
        return json.loads(stdout)
    except ValueError:
        return None
