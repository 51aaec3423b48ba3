"""The rig action plugin (roles/rig_engine/action_plugins/rig.py) loaded as a module, and real ansible-playbook
runs of it on this controller (connection local) after the rig_engine role, with a task that reads a stack."""
from __future__ import annotations

import importlib.util
import json
import os
import sys

import yaml

from harness.commands import run
from harness.paths import BIN, REPO

PLUGIN = REPO / "roles" / "rig_engine" / "action_plugins" / "rig.py"
_spec = importlib.util.spec_from_file_location("rig_action_plugin", PLUGIN)
action = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(action)


def play(tmp_path, tasks: list[dict], *args: str, host: str = "localhost") -> tuple[int, dict]:
    """Run TASKS on HOST after rig_engine; (exit status, the last task's result). The inventory holds
    localhost (local) and `faraway`, a host nobody can reach."""
    book, inventory = tmp_path / "play.yml", tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {
        "localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        "faraway": {"ansible_connection": "ssh", "ansible_host": "192.0.2.1"}}}}))  # TEST-NET-1: never routed
    book.write_text(yaml.safe_dump([{
        "hosts": host, "gather_facts": False,
        "vars": {"rig_engine_python": sys.executable, "rig_engine_bundle": str(tmp_path / "rig.pyz"),
                 "rig_engine_keep_dir": str(tmp_path / "kept")},
        "roles": ["rig_engine"], "tasks": tasks}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}
    done = run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(book), *args], env=env, cwd=tmp_path)
    report = json.loads(done.stdout)
    return done.returncode, report["plays"][0]["tasks"][-1]["hosts"][host]


SHOW = {"name": "Show a stack",
        "rig": {"argv": ["stack", "show", "--stack", str(REPO / "stacks" / "default.yml")], "mode": "read"}}
