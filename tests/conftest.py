"""The suite's fixtures and hooks: a real Docker engine, rig's base image, boxes, the lab, the SGLang stand-in
(its servers, its venv, a tune run's case); what the tests import is in tests/harness/.

A box is a fresh container from the base image standing for a GPU machine;
every box a test starts is removed afterwards, pass or fail. Playbooks run
against boxes with real ansible-playbook over the community.docker connection.
"""
from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.boxes import Box, new_box, remove_boxes
from harness.commands import run
from harness.lab import Lab, built_once, default_venv, overlay
from harness.paths import BIN, CUDA_STACK, LOCK_059, REPO
from harness.standin import STAND_IN, free_port, listening, make_standin_venv, servers_running, standin_case
from harness.worker_groups import GroupScheduling, collection_rank


def pytest_configure(config: pytest.Config) -> None:
    # The lab's venv is installed without bytecode (it holds 34,853 modules; the tests import a small part): the
    # first process that imports a module writes its bytecode and the rest read it. A caller's
    # PYTHONDONTWRITEBYTECODE would have every process that imports torch compile it again (10-28 CPU-seconds
    # each).
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def pytest_xdist_make_scheduler(config, log):
    """Under `--dist loadscope` (make test's box run), the box run's groups (tests/harness/worker_groups.py)."""
    if config.getvalue("dist") != "loadscope":
        return None
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:  # said, not silent: the run asked for xdist's loadscope and gets the suite's groups
        reporter.write_line("--dist loadscope: scheduled by the suite's worker groups (tests/harness/worker_groups.py)")
    return GroupScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: collection_rank(item.nodeid))  # stable: within a group, the file's own order


@pytest.fixture
def serve():
    """Start stand-in servers (tests/sglang_api_server.py) here: serve(*options) -> URL; all are stopped after
    the test."""
    procs = []

    def start(*options: str, log: Path | None = None) -> str:
        """LOG: where its stdout goes (the lines SGLang's log would hold), else nowhere."""
        port = free_port()
        with open(log or os.devnull, "wb") as out:
            proc = subprocess.Popen([sys.executable, str(STAND_IN), "--port", str(port), *options],
                                    stdout=out, stderr=subprocess.PIPE)
        procs.append(proc)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if listening(port):
                return f"http://127.0.0.1:{port}"
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.1)
        raise AssertionError("the stand-in did not listen within 30 s")

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def standin_venv(tmp_path_factory) -> Path:
    return make_standin_venv(tmp_path_factory.mktemp("tune") / "venv")


@pytest.fixture
def tune_case(tmp_path, standin_venv):
    """(stack path, faults file, port) for one run; a stack with topk 1 and the stand-in's model dirs."""
    for name in ("target", "draft"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    port = free_port()
    stack = {"name": "tune-test", "cuda": {"version": "13.0.2"}, "venv": str(standin_venv),
             "server": {"model": str(tmp_path / "target"), "draft_model": str(tmp_path / "draft"), "port": port,
                        "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
                        "cuda_graph_max_bs": 64, "start_timeout": 90},
             "bench": {"concurrency": [1, 64], "max_tokens": 16, "rounds": 2},
             "tune": {"steps": [1, 3], "uncapped": False}}
    case = standin_case(tmp_path, stack)
    case.port, case.venv, case.dir = port, standin_venv, tmp_path
    yield case
    assert not servers_running(standin_venv), "a server outlived the tune run"


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


@pytest.fixture
def start_box(base_image, request):
    """A factory of fresh boxes (systemd=True: systemd as PID 1; loop=True: it can loop-mount a venv image); every
    box it started is removed when the test ends."""
    started: list[Box] = []

    def start(network: str = "bridge", systemd: bool = False, loop: bool = False) -> Box:
        image = request.getfixturevalue("systemd_image") if systemd else base_image
        started.append(new_box(image, network, systemd, loop))
        return started[-1]

    yield start
    remove_boxes(started)


@pytest.fixture
def box(start_box) -> Box:
    return start_box()


@pytest.fixture(scope="session")
def provisioned_box(base_image):
    """One box converged with site.yml (CUDA stack), shared by the tests that only read it."""
    shared = new_box(base_image)
    try:
        shared.play("site.yml", rig_stack=CUDA_STACK).expect_ok()
        yield shared
    finally:
        remove_boxes([shared])


@pytest.fixture(scope="session")
def lab(tmp_path_factory) -> dict:
    """Real environments built by rig from its wheelhouse on this machine.

    v23 is the default stack's lock (sglang 0.5.23, flashinfer 0.7.2, torch 2.14.1): an 11 GB install that the
    workers share, so no test changes it (test_patches patches an overlay of its own). v9 holds the 0.5.9
    stack's locked sglang 0.5.9 and flashinfer 0.6.3 wheels over v23's packages, one per worker that uses it:
    that stack's torch 2.9.1+cu130 comes from a per-site index this machine does not have, and the patched
    modules import on these.
    """
    v23 = built_once(tmp_path_factory, "lab-v23", default_venv)
    return Lab(v23=v23, make_v9=lambda: overlay(v23, LOCK_059, tmp_path_factory.mktemp("lab") / "v9"))
