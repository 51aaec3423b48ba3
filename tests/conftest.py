"""Shared harness: a real Docker engine, rig's base image, and boxes.

A box is a fresh container from the base image standing for a GPU machine;
every box a test starts is removed afterwards, pass or fail. Playbooks run
against boxes with real ansible-playbook over the community.docker connection.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# CUDA alone: the toolkit tests converge site.yml with it, without the packages' venv
CUDA_STACK = str(REPO / "stacks" / "cuda-13.0.yml")
CACHE = os.environ.get("RIG_CACHE", str(Path.home() / ".cache" / "rig"))
DEFAULT_LOCK = REPO / "stacks" / "sm120-sglang-0.5.23.lock"
LOCK_059 = REPO / "stacks" / "sm120-sglang-0.5.9.lock"
BIN = Path(sys.executable).parent
# The lab's venv is installed without bytecode (it holds 34,853 modules; the tests import a small part): the
# first process that imports a module writes its bytecode and the rest read it. A caller's
# PYTHONDONTWRITEBYTECODE would have every process that imports torch compile it again (10-28 CPU-seconds each).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def run(cmd: list[str], check: bool = False, **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    return subprocess.run(cmd, check=check, **kwargs)


def rig(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return run([str(BIN / "rig"), *args], cwd=REPO, **kwargs)


def ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def in_image(tag: str, script: str) -> str:
    """SCRIPT's output in a throwaway container of TAG, as the image's own user."""
    return ok(run(["docker", "run", "--rm", "--entrypoint", "bash", tag, "-c", script])).stdout


BUILD_CACHE_KEEP = "16GB"


def prune(lock: Path) -> None:
    """Remove LOCK's untagged images (an earlier build of a tag that has moved on): only those, so that
    other locks' images stay."""
    from rig.image import LABEL
    from rig.python.lock import read

    run(["docker", "image", "prune", "-f", "--filter", f"label={LABEL}.lock-hash={read(lock)['lock_hash']}"])
    # BuildKit keeps every build's steps (an 11 GB venv per engine and lock) until told: the most recently
    # used stay, for the next run to start warm, and the disk of a 2-core CI machine is not filled
    run(["docker", "builder", "prune", "-f", "--keep-storage", BUILD_CACHE_KEEP])


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

    def play(self, playbook: str, *args: str, **extra_vars) -> "Play":
        return play([self], playbook, *args, **extra_vars)


def playbook_cmd(boxes: list[Box], playbook: str, *args: str, **extra_vars) -> list[str]:
    """ansible-playbook PLAYBOOK against BOXES (the gpu_hosts group), through the Docker API."""
    hosts = "".join(f"        {b.name}:\n          ansible_connection: community.docker.docker_api\n"
                    "          ansible_python_interpreter: /usr/bin/python3\n" for b in boxes)
    inventory = Path(f"/tmp/rig-test-inventory-{boxes[0].name}.yml")
    # the controller's wheelhouse server stops soon after the play, not ten minutes after the test
    inventory.write_text("all:\n  vars:\n    python_stack_serve_idle: 120\n  children:\n    gpu_hosts:\n      hosts:\n"
                         + hosts)
    cmd = [str(BIN / "ansible-playbook"), "-i", str(inventory), str(REPO / "playbooks" / playbook), *args]
    return cmd + ["-e", json.dumps(extra_vars)] if extra_vars else cmd


def play(boxes: list[Box], playbook: str, *args: str, **extra_vars) -> "Play":
    return Play.run(playbook_cmd(boxes, playbook, *args, **extra_vars))


@dataclass
class Play:
    done: subprocess.CompletedProcess
    results: dict | None = None  # what tests/callback_plugins/rig_results.py wrote: recap counts, changed tasks

    @classmethod
    def run(cls, cmd: list[str]) -> "Play":
        """ansible-playbook CMD, its results read from the JSON the suite's callback writes."""
        with tempfile.TemporaryDirectory(prefix="rig-play-") as scratch:
            path = Path(scratch) / "results.json"
            started, cpu = time.monotonic(), _children_cpu()
            done = run(cmd, cwd=REPO, env={**ansible_env(), "RIG_RESULTS": str(path)})
            play = cls(done, json.loads(path.read_text()) if path.exists() else None)
            _log_play(cmd, time.monotonic() - started, _children_cpu() - cpu, play.results)
            return play

    @property
    def output(self) -> str:
        return self.done.stdout + self.done.stderr

    def recap(self, key: str, host: str | None = None) -> int:
        """HOST's count of KEY (ok, changed, failed, ...) in the play's recap; without HOST, every host's."""
        assert self.results, f"the play wrote no results:\n{self.output[-3000:]}"
        stats = self.results["stats"]
        key = {"failed": "failures"}.get(key, key)  # the recap line's name for what Ansible counts as failures
        assert host is None or host in stats, f"{host} is not in the recap of {sorted(stats)}"
        return sum(counts[key] for name, counts in stats.items() if host in (None, name))

    def changed_tasks(self, host: str | None = None) -> list[str]:
        """The tasks that changed something ('task: host'): what to read when a run should not have."""
        assert self.results, f"the play wrote no results:\n{self.output[-3000:]}"
        return [f"{c['task']}: {c['host']}" for c in self.results["changed"] if host in (None, c["host"])]

    @property
    def ok(self) -> bool:
        return self.done.returncode == 0

    def expect_ok(self) -> "Play":
        assert self.ok, self.output[-6000:]
        return self


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _log(**fields) -> None:
    """Where the box tests' time goes: with $RIG_PLAY_LOG set, one JSON line of FIELDS and the running test."""
    path = os.environ.get("RIG_PLAY_LOG")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0], **fields})
                      + "\n")


def _log_play(cmd: list[str], seconds: float, cpu: float, results: dict | None) -> None:
    """A play's line: the playbook, its wall and controller CPU seconds, each task's seconds per host."""
    _log(playbook=next((Path(a).name for before, a in zip(cmd, cmd[1:], strict=False)
                        if a.endswith(".yml") and before != "-i"), "?"),
         check="--check" in cmd, seconds=round(seconds, 2), controller_cpu=round(cpu, 2),
         timings=(results or {}).get("timings", []))


def _log_box_cpu(boxes: list[Box]) -> None:
    """Each box's line before it goes: its CPU seconds over its life (its cgroup's count)."""
    if not os.environ.get("RIG_PLAY_LOG"):
        return
    ids = run(["docker", "inspect", "-f", "{{.Id}}", *(b.name for b in boxes)]).stdout.split()
    for box, cid in zip(boxes, ids, strict=False):
        for usage in (Path("/sys/fs/cgroup/cpuacct/docker", cid, "cpuacct.usage"),
                      Path("/sys/fs/cgroup/system.slice", f"docker-{cid}.scope", "cpu.stat")):
            if usage.is_file():
                text = usage.read_text()
                ns = int(text) if usage.name == "cpuacct.usage" else int(text.split()[1]) * 1000
                _log(box=box.name, box_cpu=round(ns / 1e9, 2))
                break


STAND_IN = REPO / "tests" / "sglang_api_server.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def serve():
    """Start stand-in servers (tests/sglang_api_server.py) here: serve(*options) -> URL; all are stopped after
    the test."""
    procs = []

    def start(*options: str) -> str:
        port = free_port()
        proc = subprocess.Popen([sys.executable, str(STAND_IN), "--port", str(port), *options],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        procs.append(proc)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return f"http://127.0.0.1:{port}"
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.1)
        raise AssertionError("the stand-in did not listen within 30 s")

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def standin_case(tmp_path: Path, stack: dict):
    """STACK as a stack file for servers that are the SGLang stand-in, and CASE(*options): the stand-in's
    options for the next run (its faults and performance model) -> (stack path, the run's environment)."""
    import yaml

    path = tmp_path / "stack.yml"
    path.write_text(yaml.safe_dump(stack))
    faults = tmp_path / "faults.json"

    def case(*model: str) -> tuple[Path, dict]:
        faults.write_text(json.dumps({"args": list(model)}))
        return path, {**os.environ, "SGLANG_STANDIN_FAULTS": str(faults)}

    return case


def ansible_env() -> dict:
    return {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "PATH": f"{BIN}:{os.environ['PATH']}", "ANSIBLE_NOCOLOR": "1",
            # the suite's results callback: a play's recap and changed tasks as JSON (Play.run)
            "ANSIBLE_CALLBACK_PLUGINS": str(REPO / "tests" / "callback_plugins"),
            "ANSIBLE_CALLBACKS_ENABLED": "rig_results"}


# Under `-n N --dist loadscope` (make test's box run) the scheduler below keeps on one worker each module's
# tests (they share its module-scoped boxes and images), and puts some modules together:
# - the three that each hold a whole stack on disk (the default stack's 11.7 GB image; the source-build
#   image with its builder stage; a box converged with the default stack, about 10 GB: test_python_stack's
#   site test alone, its small stacks' tests go beside) run one after the other: beside the lab's 11 GB venv
#   and the caches, any two together filled the disk of a CI machine (the chain is the box run's longest path);
# - the modules that use the lab, in two groups of about equal length.
# pytest-xdist's own loadgroup cannot: pytest 9 builds a test's id from its node, and the group suffix
# xdist writes is never read.
GROUPS = {"test_image": "whole-stacks", "test_image_builder": "whole-stacks",
          "test_python_stack::test_site_yml_with_the_default_stack_provisions_a_box_with_no_internet": "whole-stacks",
          "test_patches": "lab-1", "test_server_args": "lab-1", "test_testmodel": "lab-1", "test_validate": "lab-1",
          "test_prove": "lab-2", "test_wheels": "lab-2", "test_runbooks": "lab-2"}


def node_name(nodeid: str) -> str:
    """module::test of NODEID, without its parameters."""
    path, _, name = nodeid.partition("::")
    return f"{path.rsplit('/', 1)[-1].removesuffix('.py')}::{name.split('[')[0]}"


def worker_group(nodeid: str) -> str:
    """The group of NODEID's test (by module::test, else by module), else its module."""
    name = node_name(nodeid)
    module = name.split("::")[0]
    return GROUPS.get(name, GROUPS.get(module, module))


# xdist gives each worker a group, and the next group in this order to whichever worker is down to its
# last two tests (a worker runs a test only once it holds the one after it): the longest groups first.
FIRST = ("whole-stacks", "lab-1", "lab-2", "test_upgrade", "test_bare_metal", "test_rollout", "test_upgrade_stack",
         "test_cuda_toolkit", "test_role_scenarios")
# Each of these first in its group: the whole-stacks chain's last two tests were the site test (10 min) and
# another, so a group given at their start (Molecule's, 6 min) ran after them, the box run's last (37.8 min;
# with the site test first, the chain's last two tests take seconds and come after the queue is empty).
LEADS = ("test_python_stack::test_site_yml_with_the_default_stack_provisions_a_box_with_no_internet",)


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedState(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    config.option.loadscopereorder = False  # the groups in collection order, which FIRST sets
    return SharedState(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> tuple[int, bool]:
        group = worker_group(item.nodeid)
        return FIRST.index(group) if group in FIRST else len(FIRST), node_name(item.nodeid) not in LEADS

    items.sort(key=rank)  # stable: within a group, the file's own order after its lead


@pytest.fixture(scope="session")
def standin_site(tmp_path_factory):
    """aiohttp and what it needs, for the boxes' Python 3.11, from the package index (pip's own cache)."""
    site = tmp_path_factory.mktemp("standin-site")
    done = run([str(BIN / "python"), "-m", "pip", "install", "--quiet", "--only-binary", ":all:", "--target",
                str(site), f"aiohttp=={importlib.metadata.version('aiohttp')}"])
    assert done.returncode == 0, done.stderr
    return site



@pytest.fixture(scope="session")
def base_image() -> str:
    """The base image tag; built (or reused) by the project's own scripts."""
    if os.environ.get("RIG_BASE_IMAGE"):
        return os.environ["RIG_BASE_IMAGE"]
    assert run(["bash", str(REPO / "scripts" / "ensure-docker.sh")], capture_output=False).returncode == 0
    done = run(["bash", str(REPO / "scripts" / "base-image.sh")])
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def systemd_image(base_image) -> str:
    """The base image with systemd as PID 1 (tests/data/systemd-box), built once; Docker caches its layer."""
    tag = f"rig-systemd:{base_image.split(':')[-1]}"
    done = run(["docker", "build", "-q", "-t", tag, "--build-arg", f"BASE={base_image}",
                str(REPO / "tests" / "data" / "systemd-box")])
    assert done.returncode == 0, done.stderr
    return tag


# systemd as PID 1 without privileges: its own /run, and the cgroup tree to read; a reboot (systemd ends the
# container) starts it again, as a machine comes back
SYSTEMD_RUN = ["--tmpfs", "/run", "--tmpfs", "/run/lock", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:ro",
               "--restart", "unless-stopped"]


def _start(image: str, network: str = "bridge", systemd: bool = False) -> Box:
    name = f"rig-test-{uuid.uuid4().hex[:8]}"
    command = SYSTEMD_RUN + [image] if systemd else [image, "sleep", "infinity"]
    done = run(["docker", "run", "-d", "--name", name, "--network", network, "--label", "rig.test=1", *command])
    assert done.returncode == 0, done.stderr
    box = Box(name)
    if systemd:
        # until systemd answers on its socket, systemctl cannot even ask
        state = box.sh("for i in $(seq 120); do s=$(systemctl is-system-running 2>/dev/null); case $s in "
                       "running|degraded) break;; esac; sleep 0.5; done; echo $s", check=False).stdout.strip()
        if state not in ("running", "degraded"):
            why = box.sh("systemctl --failed --no-legend; journalctl -b --no-pager | tail -20", check=False).stdout
            run(["docker", "rm", "-f", name])
            raise AssertionError(f"systemd in {name} is {state!r}:\n{why}")
    return box


def _remove(boxes: list[Box]) -> None:
    if boxes:
        _log_box_cpu(boxes)
        run(["docker", "rm", "-f", *(b.name for b in boxes)])
        for b in boxes:
            Path(f"/tmp/rig-test-inventory-{b.name}.yml").unlink(missing_ok=True)


@pytest.fixture
def start_box(base_image, request):
    """A factory of fresh boxes (systemd=True: systemd as PID 1); every box it started is removed when the
    test ends."""
    started: list[Box] = []

    def start(network: str = "bridge", systemd: bool = False) -> Box:
        image = request.getfixturevalue("systemd_image") if systemd else base_image
        started.append(_start(image, network, systemd))
        return started[-1]

    yield start
    _remove(started)


@pytest.fixture
def box(start_box) -> Box:
    return start_box()


@pytest.fixture(scope="session")
def provisioned_box(base_image):
    """One box converged with site.yml (CUDA stack), shared by the tests that only read it."""
    shared = _start(base_image)
    try:
        shared.play("site.yml", rig_stack=CUDA_STACK).expect_ok()
        yield shared
    finally:
        _remove([shared])


def shared_root(tmp_path_factory) -> Path:
    """The run's temporary root, the same for every pytest-xdist worker."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


# A test marked so (`@pytest.mark.ansible_payload_cache`) runs its plays with $RIG_ANSIBALLZ_CACHE set: the
# results callback then keeps the modules' payloads in one directory of the run, with module_utils' bytecode,
# by patching ansible-core's private module_common._CachedModule.dump (tests/callback_plugins/rig_results.py).
# That is another Ansible than the users': only tests that check a role's own behaviour (Molecule's scenarios,
# the small box tests) ask for it; the end-to-end site, upgrade and rollout tests run stock ansible-core.
PAYLOAD_CACHE = "ansible_payload_cache"


@pytest.fixture(autouse=True)
def shared_module_payloads(request, tmp_path_factory, monkeypatch):
    if request.node.get_closest_marker(PAYLOAD_CACHE):
        monkeypatch.setenv("RIG_ANSIBALLZ_CACHE", str(shared_root(tmp_path_factory) / "ansiballz"))
    else:
        monkeypatch.delenv("RIG_ANSIBALLZ_CACHE", raising=False)


def built_once(tmp_path_factory, name: str, build) -> Path:
    """NAME under the run's shared temporary root, built by BUILD(path) by the first worker that asks
    (the others wait on a file lock) and reused by all: one copy on disk however many workers need it."""
    import fcntl

    root = shared_root(tmp_path_factory)
    target, done = root / name, root / f"{name}.built"
    with open(root / f"{name}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(target, ignore_errors=True)
            build(target)
            done.touch()
    return target


def _default_venv(root: Path) -> None:
    from rig.python.lock import read

    for lock in (DEFAULT_LOCK, LOCK_059):
        ok(rig("wheelhouse", "fetch", str(lock), "--cache", CACHE))
    house = root.with_name(root.name + "-house")
    ok(rig("wheelhouse", "export", str(DEFAULT_LOCK), str(house), "--cache", CACHE))
    ok(rig("venv", "install", "--venv", str(root), "--lock-hash", read(DEFAULT_LOCK)["lock_hash"],
           "--python-version", "3.11", "--wheelhouse", str(house), "--installer", "uv",
           "--no-compile"))  # the tests import a small part of it: 2.5 CPU-minutes less
    shutil.rmtree(house)


def overlay(base: Path, lock: Path, dest: Path, names: set[str] | None = None) -> Path:
    """A venv at DEST with LOCK's wheels (those in NAMES, or all) installed in it and BASE's packages under
    them (a .pth file): a few MB of its own, so that a test may patch it while others read BASE."""
    from rig.python.lock import read
    from rig.python.wheelhouse import cached_path

    ok(subprocess.run(["python3", "-m", "venv", "--without-pip", str(dest)], capture_output=True, text=True,
                      check=False))
    wheels = [str(cached_path(CACHE, w)) for w in read(lock)["wheels"] if names is None or w["name"] in names]
    # no bytecode at install: the tests import a small part of these packages, and the first import writes what
    # it needs (the 0.5.23 overlay's install 29-43 -> 10-15 CPU-seconds side by side, docs/BENCHMARKS.md)
    ok(subprocess.run([str(base / "bin" / "python"), "-m", "pip", "--python", str(dest / "bin" / "python"),
                       "install", "-q", "--no-compile", "--no-deps", "--no-index", *wheels], capture_output=True,
                      text=True, check=False))
    site = "lib/python3.11/site-packages"
    (dest / site / "zz-rig-lab-base.pth").write_text(str(base / site) + "\n")
    return dest


@pytest.fixture(scope="session")
def lab(tmp_path_factory) -> dict:
    """Real environments built by rig from its wheelhouse on this machine.

    v23 is the default stack's lock (sglang 0.5.23, flashinfer 0.7.2, torch 2.14.1): an 11 GB install that the
    workers share, so no test changes it (test_patches patches an overlay of its own). v9 holds the 0.5.9
    stack's locked sglang 0.5.9 and flashinfer 0.6.3 wheels over v23's packages, one per worker that uses it:
    that stack's torch 2.9.1+cu130 comes from a per-site index this machine does not have, and the patched
    modules import on these.
    """
    v23 = built_once(tmp_path_factory, "lab-v23", _default_venv)
    return _Lab(v23=v23, make_v9=lambda: overlay(v23, LOCK_059, tmp_path_factory.mktemp("lab") / "v9"))


class _Lab(dict):
    """The lab's venvs by name: v23 at once, v9 made on a worker's first lab["v9"] (a pip install; the modules of
    one lab group use it, the other's never do)."""

    def __init__(self, v23: Path, make_v9):
        super().__init__(v23=v23)
        self._make_v9 = make_v9

    def __missing__(self, key: str) -> Path:
        if key != "v9":
            raise KeyError(key)
        self["v9"] = self._make_v9()
        return self["v9"]
