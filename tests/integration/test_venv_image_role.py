"""The python_stack role mounts the venv as one read-only image (python_stack_venv_image): the host that packs the
archive images it, the controller keeps both, and a later host mounts the image, with a systemd mount unit that
brings it back after a reboot; a host that cannot mount, or an image that is not its manifest's, takes the
archive instead and the play says why."""
from __future__ import annotations

import json
import shutil

import pytest
import yaml
from harness.boxes import running
from harness.commands import rig, run
from harness.plays import play
from harness.venv_takes import CLICK, MOUNT, UNPACK, VENV, WHEELS

from rig.python.lock import read
from rig.python.venv_archive.manifest import kept_dir
from rig.python.venv_archive.verity import NOT_HERE

pytestmark = pytest.mark.box

ENVIRONMENT = {"pinned": {"CUDA_HOME": "/usr/local/cuda-13.0"}, "defaults": {"NCCL_P2P_LEVEL": "SYS"},
               "home": {"FLASHINFER_WORKSPACE_BASE": ".cache/rig/flashinfer-jit/cuda-13.0.2-flashinfer-0.7.2"},
               "stack": "tiny"}
SEEN = f"env -i {VENV}/bin/python -c 'import os; print(os.environ.get(\"CUDA_HOME\"), " \
       "os.environ.get(\"TRITON_CACHE_DIR\"), os.environ.get(\"FLASHINFER_WORKSPACE_BASE\"))'"


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """A small real stack (one pure-Python wheel), locked, installed on one box that packs and images its venv into
    a controller cache of this module's own: {"lock", "cache", "kept"}."""
    root = tmp_path_factory.mktemp("venv-image")
    stack = root / "tiny.yml"
    stack.write_text(yaml.safe_dump({"name": "tiny", "python": "3.11", "cuda": {"version": "13.0.2"},
                                     "extra_packages": ["click==8.1.7"]}))
    assert rig("lock", "--stack", str(stack)).returncode == 0
    lock, cache = stack.with_suffix(".lock"), root / "cache"
    return {"lock": str(lock), "cache": cache, "kept": kept_dir(cache, read(lock)["lock_hash"], VENV)}


def image_vars(packed) -> dict:
    return {"python_stack_lock": packed["lock"], "python_stack_venv_image": True,
            "python_stack_environment": ENVIRONMENT}


@pytest.fixture
def imaged(packed, start_box, monkeypatch):
    """The controller's cache holding the lock's archive and image, packed by a box that installed the wheels."""
    monkeypatch.setenv("RIG_CACHE", str(packed["cache"]))
    if not list(packed["kept"].glob("*.image.json")):
        packer = start_box()  # unprivileged: it packs and images, it never mounts
        done = play([packer], "python.yml", **image_vars(packed)).expect_ok()
        assert any(WHEELS in t for t in done.changed_tasks(packer.name)), done.changed_tasks()
    kept = packed["kept"]
    assert len(list(kept.glob("*.sqfs"))) == len(list(kept.glob("*.image.json"))) == 1, list(kept.iterdir())
    assert len(list(kept.glob("*.tar.zst"))) == len(list(kept.glob("*.manifest.json"))) == 1
    return packed


def test_a_host_that_can_mount_takes_the_image_keeps_it_over_a_reboot_and_a_second_run_changes_nothing(
        imaged, start_box):
    host = start_box(systemd=True, loop=True)
    dry = host.play("python.yml", "--check", "--diff", **image_vars(imaged)).expect_ok()
    assert "would install lock" in dry.output and not host.exists(VENV)
    took = host.play("python.yml", **image_vars(imaged)).expect_ok()
    changed = took.changed_tasks(host.name)
    assert any(MOUNT in t for t in changed) and not any(UNPACK in t or WHEELS in t for t in changed), changed
    said = " ".join(took.output.split())  # the callback wraps a long message
    assert "fs-verity keeps it checked while mounted" in said or any(  # where this kernel and store offer it
        f"nothing keeps it checked while mounted: {why}" in said for why in NOT_HERE.values()), took.output[-4000:]
    target = host.sh(f"readlink {VENV}").stdout.strip()
    assert target.startswith("/var/lib/rig/venv-images/") and host.sh(CLICK).stdout.strip() == "8.1.7"
    assert host.sh(f"findmnt -n -o FSTYPE,OPTIONS {target}").stdout.split()[0] == "squashfs"
    assert host.sh(f"touch {VENV}/x", check=False).returncode != 0  # read-only
    # the environment, from the venv path's writable site dir; the caches in root's own directory
    assert host.sh(SEEN).stdout.split() == ["/usr/local/cuda-13.0", "/var/cache/rig/venv-runtime/uid-0/triton",
                                            "/var/cache/rig/venv-runtime/uid-0/flashinfer-jit/cuda-13.0.2-flashinfer-0.7.2"]
    unit = host.sh(f"systemd-escape --path --suffix=mount {target}").stdout.strip()
    assert host.sh(f"systemctl is-enabled '{unit}'").stdout.strip() == "enabled"
    assert f"What={target}.sqfs" in host.sh(f"cat '/etc/systemd/system/{unit}'").stdout
    again = host.play("python.yml", **image_vars(imaged)).expect_ok()
    assert again.recap("changed", host.name) == 0, again.changed_tasks()
    check = host.play("python.yml", "--check", "--diff", **image_vars(imaged)).expect_ok()
    assert check.recap("changed", host.name) == 0, check.changed_tasks()
    # a reboot: nothing is mounted until the unit mounts the image again, and the venv runs
    assert run(["docker", "restart", host.name]).returncode == 0
    running(host)
    assert host.sh(CLICK).stdout.strip() == "8.1.7" and host.sh(f"systemctl is-active '{unit}'").stdout.strip() == "active"


def test_a_host_that_cannot_mount_takes_the_archive_and_says_why(imaged, start_box):
    host = start_box()  # a container without CAP_SYS_ADMIN or loop devices
    took = host.play("python.yml", **image_vars(imaged)).expect_ok()
    said = " ".join(took.output.split())  # the callback wraps a long message
    assert "cannot mount image" in said and "taking the archive instead" in said, took.output[-4000:]
    changed = took.changed_tasks(host.name)
    assert any(UNPACK in t for t in changed) and not any(WHEELS in t for t in changed), changed
    assert not host.sh(f"test -L {VENV}", check=False).returncode == 0 and host.sh(CLICK).stdout.strip() == "8.1.7"
    assert host.sh(SEEN).stdout.split() == ["/usr/local/cuda-13.0", "None",
                                            "/root/.cache/rig/flashinfer-jit/cuda-13.0.2-flashinfer-0.7.2"]
    assert host.play("python.yml", **image_vars(imaged)).expect_ok().recap("changed", host.name) == 0


def test_an_image_that_is_not_its_manifests_is_refused_and_the_archive_taken(imaged, start_box):
    image = next(imaged["kept"].glob("*.sqfs"))
    original = image.read_bytes()
    flipped = bytearray(original)
    flipped[len(flipped) // 2] ^= 0xFF
    image.write_bytes(bytes(flipped))
    try:
        host = start_box(loop=True)
        took = host.play("python.yml", **image_vars(imaged)).expect_ok()
    finally:
        image.write_bytes(original)
    said = " ".join(took.output.split())  # the callback wraps a long message
    assert "is not the image its manifest describes (sha256 or size differs)" in said, took.output[-4000:]
    assert "taking the archive instead" in said, took.output[-4000:]
    assert any(UNPACK in t for t in took.changed_tasks(host.name)), took.changed_tasks()
    assert host.sh(CLICK).stdout.strip() == "8.1.7" and host.sh(f"test -d {VENV} -a ! -L {VENV}").returncode == 0


def test_an_image_and_archive_of_another_patch_set_are_refused_said_and_the_wheels_packed_anew(
        imaged, start_box, tmp_path, monkeypatch):
    """The controller's image and archive carry no patch set (packed without python_stack_patches); a host asking for
    the stack's takes neither, says why, installs the wheels, and its venv (patched) is packed and imaged anew."""
    cache = tmp_path / "cache"
    shutil.copytree(imaged["cache"], cache)  # the module's cache stays as the other tests read it
    monkeypatch.setenv("RIG_CACHE", str(cache))
    kept = kept_dir(cache, read(imaged["lock"])["lock_hash"], VENV)
    host = start_box(loop=True)
    asked = {**image_vars(imaged), "python_stack_patches": {"opt_in": []}}
    took = host.play("python.yml", **asked).expect_ok()
    said = " ".join(took.output.replace("''", "'").split())  # the callback wraps a long message, quotes a quote
    assert "image venv-" in said and "archive venv-" in said, took.output[-4000:]  # both refused, each said
    assert "does not fit /opt/rig/venv: it carries no rig patch set, the host asks for rig patch set" in said
    assert "taking the archive instead" in said and "installing the lock's wheels" in said, took.output[-4000:]
    changed = took.changed_tasks(host.name)
    assert any(WHEELS in t for t in changed) and any("Pack the venv into one archive" in t for t in changed), changed
    manifests = [*kept.glob("*.manifest.json"), *kept.glob("*.image.json")]
    assert len(manifests) == 2 and all(json.loads(m.read_text())["patches"]["opt_in"] == [] for m in manifests)
    again = start_box(loop=True)  # the next host mounts the image packed anew
    assert any(MOUNT in t for t in again.play("python.yml", **asked).expect_ok().changed_tasks(again.name))


def test_an_archive_kept_without_its_image_is_imaged_on_the_controller_and_mounted(imaged, start_box, tmp_path,
                                                                                   monkeypatch):
    """A controller cache from before images (the archive alone): the play images it there once, and the host
    mounts it."""
    cache = tmp_path / "cache"
    shutil.copytree(imaged["cache"], cache)
    monkeypatch.setenv("RIG_CACHE", str(cache))
    kept = kept_dir(cache, read(imaged["lock"])["lock_hash"], VENV)
    for made in [*kept.glob("*.sqfs"), *kept.glob("*.image.json")]:
        made.unlink()
    host = start_box(loop=True)
    took = host.play("python.yml", **image_vars(imaged)).expect_ok()
    changed = took.changed_tasks(host.name)  # the imaging changes the controller's cache, no host (mode read)
    assert any(MOUNT in t for t in changed) and not any(UNPACK in t or WHEELS in t for t in changed), changed
    assert [p.read_bytes() for p in kept.glob("*.image.json")] == [
        p.read_bytes() for p in imaged["kept"].glob("*.image.json")]  # the same image the packer made
    assert host.sh(CLICK).stdout.strip() == "8.1.7"
