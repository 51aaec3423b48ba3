"""What one role task costs on a box (docker_api): the rig action with its bundle kept on the host against
sent per task, and a command task with pipelining on against off: the per-task overhead every play pays."""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from .common import BIN, REPO, timed, write_section

TASKS = 10


def source_bundle(work: Path) -> Path:
    """The engine bundle as it was before it carried bytecode (its .pyc files left out; the action runs it with
    python3, so no interpreter line), beside the stamp of its sources, so that the role's build step keeps it."""
    import zipfile

    from rig.engine.bundle import build

    built = Path(build(work / "built" / "rig.pyz")["path"])
    out = work / "sources-only" / "rig.pyz"
    out.parent.mkdir()
    with zipfile.ZipFile(built) as full, zipfile.ZipFile(out, "w") as sources:
        for info in full.infolist():
            if not info.filename.endswith(".pyc"):
                sources.writestr(info, full.read(info))
    shutil.copyfile(built.with_suffix(".sha256"), out.with_suffix(".sha256"))
    return out


def bench_tasks(rounds: int) -> None:
    """Seconds per task of a play of TASKS rig actions (stack show, read) and of TASKS command tasks on one box,
    each play under the settings it is compared in, interleaved round by round. A bundle sent per task is what
    a host rig cannot keep it on gets (a keep dir that cannot be made, under /proc)."""
    import yaml

    image = subprocess.run(["bash", "scripts/base-image.sh"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()[-1]
    work = Path(tempfile.mkdtemp(prefix="rig-bench-tasks-"))
    box = f"rig-bench-tasks-{os.getpid()}"
    subprocess.run(["docker", "run", "-d", "--name", box, image, "sleep", "infinity"], capture_output=True, check=True)
    try:
        (work / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": {box: {
            "ansible_connection": "community.docker.docker_api", "ansible_python_interpreter": "/usr/bin/python3"}}}}))
        loop = {"loop": list(range(TASKS))}
        plays = {
            "rig": [{"hosts": "all", "gather_facts": False, "roles": ["rig_engine"], "tasks": [
                {"name": "Show the stack", "rig": {"argv": ["stack", "show", "--stack", "/nonexistent.yml"], "mode": "read"},
                 "failed_when": False, **loop}]}],
            "command": [{"hosts": "all", "gather_facts": False, "tasks": [
                {"name": "A command", "ansible.builtin.command": "true", "changed_when": False, **loop}]}],
            # as a role's tasks are: Ansible forks a worker for each
            "separate": [{"hosts": "all", "gather_facts": False, "tasks": [
                {"name": f"Command {n}", "ansible.builtin.command": "true", "changed_when": False}
                for n in range(TASKS)]}]}
        for name, play in plays.items():
            (work / f"{name}.yml").write_text(yaml.safe_dump(play))
        env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(REPO / "roles")}
        sources_only = source_bundle(work)
        cases = {
            "rig action, bundle kept on the host (rig's default)": ("rig", {}, []),
            "rig action, kept, its modules without bytecode": ("rig", {}, ["-e", f"rig_engine_bundle={sources_only}"]),
            "rig action, bundle sent with every task": ("rig", {}, ["-e", "rig_engine_keep_dir=/proc/rig-keep"]),
            "command task, pipelining on (rig's ansible.cfg)": ("command", {}, []),
            "command task, pipelining off": ("command", {"ANSIBLE_PIPELINING": "0"}, []),
            "command tasks, a worker each": ("separate", {}, []),
            "command tasks, a worker each, the connection plugin loaded before the forks (the suite's callback)": (
                "separate", {"ANSIBLE_CALLBACK_PLUGINS": str(REPO / "tests" / "callback_plugins"),
                             "ANSIBLE_CALLBACKS_ENABLED": "rig_results"}, []),
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(rounds):
            for name, (book, extra, args) in cases.items():
                seconds, _ = timed([str(BIN / "ansible-playbook"), "-i", str(work / "inventory.yml"),
                                    str(work / f"{book}.yml"), *args], {**env, **extra})
                times[name].append(seconds / TASKS)
    finally:
        subprocess.run(["docker", "rm", "-f", box], capture_output=True, check=False)
        shutil.rmtree(work, ignore_errors=True)
    rows = ["| task | median s per task | range |", "| --- | --- | --- |"]
    rows += [f"| {name} | {statistics.median(t):.2f} | {min(t):.2f}-{max(t):.2f} |" for name, t in times.items()]
    kept, compiling, sent = (statistics.median(times[n]) for n in list(cases)[:3])
    piped, unpiped, forked, warm = (statistics.median(times[n]) for n in list(cases)[3:])
    write_section("tasks", f"""## What one role task costs on a box (docker_api, {datetime.now(timezone.utc):%Y-%m-%d})

`python scripts/bench.py tasks`: a play of {TASKS} tasks against one box from rig's base image, {rounds} rounds,
the cases interleaved, {os.cpu_count()} cores; a play's wall time (ansible-playbook's start included)
divided by its tasks.

{chr(10).join(rows)}

Keeping the bundle on the host: {sent / kept:.2f}x as fast per rig task; its modules' bytecode in the bundle (no
compiling on every run): {compiling / kept:.2f}x. Pipelining: {unpiped / piped:.2f}x per command task. The
connection plugin imported once before Ansible forks its workers: {forked / warm:.2f}x per task that has a
worker of its own.
""")
