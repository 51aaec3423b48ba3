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

On a target the bundle is kept in rig_engine_keep_dir, named by its sha256; before every run it is
copied into a file of the run's own, and that copy is checked against the sha256 and run. A keep dir
another user could change (it, or a directory above it, not root's or the task user's, or writable by
others) fails the task saying so. The bundle crosses the connection once per rig version, not once per task (a
target the connection user cannot write there, and check mode, which leaves the host as it
was, get it in the task's temporary directory as before). The task's `environment:` reaches
the engine.

controller: true runs the subcommand on the controller instead (with the Python that runs
Ansible, where rig is installed): steps on the controller's cache and wheelhouse, whose
changes are no host's. Give them mode read. Such a step runs as the controller's user, in
Ansible's own environment, whatever the task's become and environment: say.

Every engine field is on the registered result (`result.path`, `result.lock_hash`);
`would_change` is the engine's own `changed`, whatever the mode.
Under --diff the engine's unified diff is shown, or in check mode its msg where a
change has no file diff ("would install lock ..."); its `rig: error:` line is the
msg of a failure.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shlex
import subprocess
import sys

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

# What the action sets itself: the engine's own values for these are mapped, not copied.
RESERVED = frozenset(("changed", "failed", "skipped", "diff", "msg", "rc", "stdout", "stderr", "invocation"))
CANNOT_KEEP = "rig_engine_cannot_keep"  # a host fact: the keep dir this host's connection cannot write
NOT_KEPT = 200  # the run script's status when the kept bundle is absent or another one (the engine exits 0-3)
UNSAFE = 201  # the keep dir (or a directory above it) is one another user could change: refused, never used
UNSAFE_LINE = "rig-keep-unsafe: "
# The engine from the bundle at "$b", stderr after a marker line on stdout when it fails: over SSH a tty
# merges the two streams (and writes CRLF), and stdout must stay one JSON object.
RUN = """{check}e={err} || exit {not_kept}
{command} 2>"$e"; rc=$?
[ "$rc" -eq 0 ] || {{ printf '\\n%s\\n' {marker}; cat "$e"; }}
rm -f "$e"; exit "$rc"
"""
# Whoever may write the keep dir, or a directory above it, could swap the engine that root runs: each one on
# its physical path ($p after this) must belong to root or this user and be writable by nobody else (a sticky
# directory above it, as /tmp, excepted: nobody else can move what is in it).
SAFE = """me=$(id -u); p=$(cd "$d" && pwd -P) || exit {not_kept}; q=$p
while :; do
  o=$(stat -c %u "$q") && m=$(stat -c %a "$q") || {{ echo "{line}cannot stat $q" >&2; exit {unsafe}; }}
  if [ "$o" != 0 ] && [ "$o" != "$me" ]; then echo "{line}$q belongs to uid $o" >&2; exit {unsafe}; fi
  if [ $((0$m & 022)) -ne 0 ] && {{ [ "$q" = "$p" ] || [ $((0$m & 01000)) -eq 0 ]; }}; then
    echo "{line}$q is writable by group or others (mode $m)" >&2; exit {unsafe}; fi
  [ "$q" = / ] && break; q=$(dirname "$q")
done
"""
# The kept bundle is copied into a file of this run's own (mktemp: 0600) and that copy is hashed and run: the
# bytes checked are the bytes that run, whatever happens to the kept file meanwhile.
CHECK = """d={keep}; [ -d "$d" ] && [ ! -L "$d" ] || exit {not_kept}
{safe}k="$p/{name}"; [ -f "$k" ] && [ ! -L "$k" ] || exit {not_kept}
b=$(mktemp -t rig-XXXXXX.pyz) || exit {not_kept}  # named as a bundle: ps and pkill see what runs
trap 'rm -f "$b"' EXIT
cat < "$k" > "$b" && [ "$(sha256sum < "$b")" = "{digest}  -" ] || exit {not_kept}
"""
# The bundle sent once, put in place by one rename from a file mktemp made (never through a link). Bundles
# of other rig versions stay until they are a week old: another controller's run may be reading one.
KEEP = """d={keep}; n=
trap 'rm -f "$n"' EXIT
umask 022
[ ! -L "$d" ] && mkdir -p -m 0755 "$d" && [ -d "$d" ] && [ ! -L "$d" ] || exit 1
{safe}k="$p/{name}"
n=$(mktemp "$p/.rig-XXXXXX") && cat {sent} > "$n" && chmod 0644 "$n" && [ "$(sha256sum < "$n")" = "{digest}  -" ] &&
{{ find "$p" -maxdepth 1 -type f -name 'rig-*.pyz' ! -path "$k" -mtime +7 -delete 2>/dev/null; mv -f "$n" "$k"; }}
"""


def _split(stdout: str, marker: str) -> tuple[str, str]:
    """(the engine's stdout, its stderr) from what RUN printed; a tty's CRLF line ends included."""
    parts = re.split(r"\r?\n" + re.escape(marker) + r"\r?\n", stdout, maxsplit=1)
    return (parts[0], parts[1]) if len(parts) == 2 else (stdout, "")


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
        if "ansible_facts" in out:
            result["ansible_facts"] = out["ansible_facts"]
        return result

    def _on_target(self, argv: list[str], task_vars: dict) -> dict:
        bundle = self._engine_var(task_vars, "rig_engine_bundle")
        python = shlex.split(self._engine_var(task_vars, "rig_engine_python"))
        keep = self._engine_var(task_vars, "rig_engine_keep_dir").rstrip("/")
        if not keep.startswith("/") or not keep.strip("/"):
            raise AnsibleActionFail(f"rig_engine_keep_dir {keep!r}: give an absolute directory other than /, "
                                    "where the target keeps the engine bundle (default /var/cache/rig/engine)")
        digest = _sha256(bundle)
        name = f"rig-{digest[:16]}.pyz"
        refused = {**task_vars.get("ansible_facts", {}), **task_vars}.get(CANNOT_KEEP) == keep
        out = {"rc": NOT_KEPT}
        if not refused:  # a host that could not keep it is not asked again in this run
            out = self._run(python, argv, keep=(keep, name, digest))
            if out["rc"] == NOT_KEPT and not self._task.check_mode:  # check mode leaves the host as it was
                if self._send(bundle, lambda sent: self._keep(sent, keep, name, digest)):
                    out = self._run(python, argv, keep=(keep, name, digest))
                else:
                    out["ansible_facts"] = {CANNOT_KEEP: keep}
        if out["rc"] == NOT_KEPT:  # a target rig cannot keep it on: the bundle for this task alone, as before
            facts = {"ansible_facts": out["ansible_facts"]} if "ansible_facts" in out else {}
            out = {**self._send(bundle, lambda sent: self._run(python, argv, sent=sent)), **facts}
        return out

    def _run(self, python: list[str], argv: list[str], keep: tuple[str, str, str] | None = None,
             sent: str | None = None) -> dict:
        """The engine on the target: the bundle KEEP (dir, name, sha256) names, copied and checked first (NOT_KEPT
        where it is absent or another one), or the one this task SENT, its stderr in the task's temporary dir."""
        marker = f"--- rig stderr {secrets.token_hex(8)} ---"
        env = self._compute_environment_string()  # the task's `environment:`, as VAR=value words
        command = " ".join([env] * bool(env) + [shlex.quote(p) for p in python] + ['"$b"']
                           + [shlex.quote(a) for a in argv])
        if keep:
            check = CHECK.format(keep=shlex.quote(keep[0]), name=keep[1], digest=keep[2], not_kept=NOT_KEPT,
                                 safe=self._safe())
            err = "$(mktemp)"
        else:
            check = f"b={shlex.quote(str(sent))}\n"
            err = shlex.quote(os.path.join(os.path.dirname(str(sent)), "rig.err"))
        script = RUN.format(check=check, err=err, not_kept=NOT_KEPT, command=command, marker=shlex.quote(marker))
        out = self._low_level_execute_command(f"sh -c {shlex.quote(script)}", sudoable=True)
        if keep:
            self._refuse_unsafe(out, keep[0])
        stdout, said = _split(out.get("stdout", ""), marker)
        return {**out, "stdout": stdout, "stderr": said + out.get("stderr", "")}

    def _keep(self, sent: str, keep: str, name: str, digest: str) -> bool:
        script = KEEP.format(keep=shlex.quote(keep), name=name, sent=shlex.quote(sent), digest=digest,
                             safe=self._safe())
        out = self._low_level_execute_command(f"sh -c {shlex.quote(script)}", sudoable=True)
        self._refuse_unsafe(out, keep)
        return out["rc"] == 0

    @staticmethod
    def _safe() -> str:
        return SAFE.format(line=UNSAFE_LINE, unsafe=UNSAFE, not_kept=NOT_KEPT)

    @staticmethod
    def _refuse_unsafe(out: dict, keep: str) -> None:
        """A keep dir another user could change fails the task, naming what and the fix (its stderr line may
        arrive on stdout: over SSH a tty merges the two)."""
        if out.get("rc") != UNSAFE:
            return
        said = f"{out.get('stderr', '')}\n{out.get('stdout', '')}"
        why = next((line.strip()[len(UNSAFE_LINE):] for line in said.splitlines()
                    if line.strip().startswith(UNSAFE_LINE)), "it could not be checked")
        raise AnsibleActionFail(
            f"rig_engine_keep_dir {keep} is not safe to run the engine from: {why}. The engine runs from it as "
            "this task's user, so it and every directory above it must belong to root or that user and be "
            "writable by nobody else: fix the owner or mode (chown root:root, chmod 0755) or set "
            "rig_engine_keep_dir to such a directory")

    def _send(self, bundle: str, then):
        """THEN(path) with the bundle copied into the task's temporary directory, which is removed after."""
        try:
            remote = self._connection._shell.join_path(self._make_tmp_path(), "rig.pyz")
            self._transfer_file(bundle, remote)
            self._fixup_perms2((os.path.dirname(remote), remote))
            return then(remote)
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)

    @staticmethod
    def _on_controller(argv: list[str]) -> dict:
        done = subprocess.run([sys.executable, "-m", "rig", *argv], capture_output=True, text=True, check=False)
        return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}

    def _engine_var(self, task_vars: dict, name: str) -> str:
        if name not in task_vars:
            raise AnsibleActionFail(f"{name} is not set: run the task in a role that depends on rig_engine")
        return str(self._templar.template(task_vars[name]))


_DIGESTS: dict = {}


def _sha256(path: str) -> str:
    """The bundle's sha256, computed once per file version in this controller process."""
    seen = os.stat(path)
    key = (path, seen.st_size, seen.st_mtime_ns, seen.st_ino)
    if key not in _DIGESTS:
        with open(path, "rb") as handle:
            _DIGESTS[key] = hashlib.file_digest(handle, "sha256").hexdigest()
    return _DIGESTS[key]


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
        # the engine's error is its last `rig: ` line (its `rig: hint:` line goes on from it) and the indented lines
        # that go on with them
        start = next((i for i in reversed(range(len(lines))) if lines[i].startswith("rig: ")
                      and not lines[i].startswith("rig: hint: ")), len(lines) - 1)
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
