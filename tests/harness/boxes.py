"""Boxes: fresh containers from the base image, each standing for a GPU machine, and the commands run in them.

Every box a test starts is removed afterwards, pass or fail (tests/conftest.py start_box)."""
from __future__ import annotations

import subprocess
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from harness.commands import run
from harness.play_log import log_box_cpu
from harness.plays import Play, play

_THREAD = threading.local()


def docker_api():
    """This thread's Docker API client (a load's threads each hold one: a client's session is not shared
    across threads): a box command through it spares a docker CLI process (about 45 ms of CPU each,
    thousands of them in a run)."""
    import docker

    if not hasattr(_THREAD, "docker"):  # DOCKER_HOST, as the CLI and Ansible follow it
        _THREAD.docker = docker.APIClient(**docker.utils.kwargs_from_env())
    return _THREAD.docker


def box_exec(name: str, argv: list[str]) -> subprocess.CompletedProcess:
    """ARGV in the running container NAME, as `docker exec` runs it; a box that is not running (one
    rebooting) answers exit 1 and the engine's reason, as the CLI does."""
    from docker.errors import APIError, DockerException
    from requests import RequestException

    try:
        started = docker_api().exec_create(name, argv)["Id"]
        out, err = docker_api().exec_start(started, demux=True)
        code = docker_api().exec_inspect(started)["ExitCode"]
    except APIError as exc:
        return subprocess.CompletedProcess(argv, 1, "", str(exc.explanation or exc))
    except (DockerException, RequestException, OSError) as exc:  # the exec's socket reset by a reboot
        return subprocess.CompletedProcess(argv, 1, "", f"{name}: {exc}")
    if code is None:  # the box stopped under the command (a reboot): as the CLI says of it
        return subprocess.CompletedProcess(argv, 1, "", f"{name} stopped while running {argv}")
    return subprocess.CompletedProcess(argv, code, (out or b"").decode(errors="replace"),
                                       (err or b"").decode(errors="replace"))


@dataclass
class Box:
    name: str

    def sh(self, script: str, check: bool = True) -> subprocess.CompletedProcess:
        done = box_exec(self.name, ["bash", "-c", script])
        if check and done.returncode != 0:
            raise AssertionError(f"in {self.name}: {script}\n{done.stdout}{done.stderr}")
        return done

    def engine(self, *args: str) -> tuple[int, str, str]:
        """Run the rig engine bundle inside the box, as the roles do."""
        from rig.cli import DEFAULT_BUNDLE
        from rig.engine.container import run_engine

        return run_engine(self.name, list(args), DEFAULT_BUNDLE)

    def exists(self, path: str) -> bool:
        return self.sh(f"test -e {path}", check=False).returncode == 0

    def tree_hashes(self, path: str) -> str:
        """One line per file under PATH: its sha256 and path (links by target)."""
        return self.sh(f"cd {path} && find . -type f -print0 | sort -z | xargs -0 sha256sum;"
                       f" find . -type l -printf '%p -> %l\\n' | sort").stdout

    def play(self, playbook: str, *args: str, **extra_vars) -> Play:
        return play([self], playbook, *args, **extra_vars)


# systemd as PID 1 without privileges: its own /run, and the cgroup tree to read; a reboot (systemd ends the
# container) starts it again, as a machine comes back
SYSTEMD_RUN = ["--tmpfs", "/run", "--tmpfs", "/run/lock", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:ro",
               "--restart", "unless-stopped"]


def loop_run() -> list[str]:
    """What a box needs to loop-mount an image (a venv image): CAP_SYS_ADMIN (Docker's default seccomp profile then
    allows mount(2)), no AppArmor profile (Docker's denies mounts), and the host's loop devices (a container's /dev
    holds no node made after it started). Not --privileged: an engine that itself runs with fewer capabilities
    cannot start one."""
    loops = sorted(str(p) for p in Path("/dev").glob("loop[0-9]*")) + ["/dev/loop-control"]
    return ["--cap-add", "SYS_ADMIN", "--security-opt", "apparmor=unconfined",
            *(part for loop in loops for part in ("--device", loop))]


def new_box(image: str, network: str = "bridge", systemd: bool = False, loop: bool = False) -> Box:
    """A new box of IMAGE on NETWORK (systemd=True: systemd as PID 1, running once this returns; loop=True: it can
    loop-mount); the caller removes it (remove_boxes)."""
    name = f"rig-test-{uuid.uuid4().hex[:8]}"
    command = (loop_run() if loop else []) + (SYSTEMD_RUN + [image] if systemd else [image, "sleep", "infinity"])
    done = run(["docker", "run", "-d", "--name", name, "--network", network, "--label", "rig.test=1", *command])
    assert done.returncode == 0, done.stderr
    box = Box(name)
    if systemd:
        running(box)
    return box


def running(box: Box) -> None:
    """Wait until systemd in BOX runs (started, or back from a reboot); a box whose systemd does not is removed."""
    # until systemd answers on its socket, systemctl cannot even ask
    state = box.sh("for i in $(seq 120); do s=$(systemctl is-system-running 2>/dev/null); case $s in "
                   "running|degraded) break;; esac; sleep 0.5; done; echo $s", check=False).stdout.strip()
    if state not in ("running", "degraded"):
        why = box.sh("systemctl --failed --no-legend; journalctl -b --no-pager | tail -20", check=False).stdout
        run(["docker", "rm", "-f", box.name])
        raise AssertionError(f"systemd in {box.name} is {state!r}:\n{why}")


def remove_boxes(boxes: list[Box]) -> None:
    """BOXES gone (their CPU logged first), with the inventories their plays wrote."""
    if boxes:
        log_box_cpu([b.name for b in boxes])
        run(["docker", "rm", "-f", *(b.name for b in boxes)])
        for b in boxes:
            Path(f"/tmp/rig-test-inventory-{b.name}.yml").unlink(missing_ok=True)
