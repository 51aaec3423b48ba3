"""Day two by remount: site.yml takes a loop-capable systemd box from lock A (its image mounted) to lock B (a new image
at its own mount point, the link moved, A still mounted), back to A (only the link moves: nothing pulled, unpacked or
installed) and on to C (the oldest, B, collected). The images carry the stack's patches, so sglang_patches on the
mounted image finds them applied and writes nothing. Each step's wall time is printed (run with -s to see it).

The CUDA plays are skipped by tag: the toolkit is not what this tests. playbooks/upgrade.yml is not used here: its
box (serving_boxes.driver_fleet: the stand-in driver and server) cannot loop-mount."""
from __future__ import annotations

import time

import pytest
import yaml
from harness.commands import ok, rig
from harness.plays import play
from harness.venv_takes import CLICK, MOUNT, UNPACK, VENV, WHEELS

pytestmark = pytest.mark.box

PACK = "Pack the venv into one archive and its manifest"
PATCH = "Apply or revert the patches"
NO_CUDA = ("--skip-tags", "cuda_toolkit,cuda_ldconfig")
STEPS = {"A": "8.1.7", "B": "8.1.8", "C": "8.1.6"}  # each lock's click


def locked(tmp_path, name: str, click: str) -> str:
    """A small real stack (one pure-Python wheel), locked here."""
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump({"name": name, "python": "3.11", "venv": VENV, "cuda": {"version": "13.0.2"},
                                    "extra_packages": [f"click=={click}"]}))
    ok(rig("lock", "--stack", str(path)))
    return str(path)


def site(box, stack: str, what: str):
    """site.yml with STACK on BOX, its wall time printed."""
    started = time.monotonic()
    done = play([box], "site.yml", *NO_CUDA, rig_stack=stack).expect_ok()
    print(f"day two: {what}: site.yml {time.monotonic() - started:.1f} s")
    return done


def store_state(box) -> dict:
    """The images in rig's store for the venv: where the venv links, what is mounted, each image file's inode."""
    target = box.sh(f"readlink {VENV}").stdout.strip()
    store = target.rsplit("/", 1)[0]
    mounted = [p for p in box.sh("findmnt -rn -o TARGET -t squashfs").stdout.split() if p.startswith(f"{store}/")]
    files = box.sh(f"stat -c '%n %i' {store}/*.sqfs").stdout.split("\n")
    return {"link": target.rsplit("/", 1)[1], "mounted": sorted(p.rsplit("/", 1)[1] for p in mounted),
            "files": dict(line.rsplit(" ", 1) for line in files if line)}


def test_a_new_lock_mounts_beside_the_old_going_back_only_moves_the_link_and_a_third_collects_the_oldest(
        start_box, tmp_path, monkeypatch):
    monkeypatch.setenv("RIG_CACHE", str(tmp_path / "cache"))  # this test's own controller cache
    stacks = {step: locked(tmp_path, f"day-two-{step.lower()}", click) for step, click in STEPS.items()}
    packer = start_box()  # unprivileged: it installs the wheels, patches, packs and images each lock
    for step, stack in stacks.items():
        packed = site(packer, stack, f"packer, lock {step} from its wheels, packed and imaged")
        changed = packed.changed_tasks(packer.name)
        assert any(WHEELS in t for t in changed) and any(PACK in t for t in changed), changed
    host = start_box(systemd=True, loop=True)
    names: dict[str, str] = {}
    for step, expect, kept in (("A", "mounted", "A"), ("B", "mounted beside A", "AB"),
                               ("A", "back: only the link", "AB"), ("C", "mounted, the oldest collected", "AC")):
        before = store_state(host) if step == "A" and "A" in names else None
        done = site(host, stacks[step], f"lock {step} {expect}")
        changed = done.changed_tasks(host.name)
        assert any(MOUNT in t for t in changed), changed
        assert not any(UNPACK in t or WHEELS in t or PACK in t or PATCH in t for t in changed), changed
        assert host.sh(CLICK).stdout.strip() == STEPS[step]
        state = store_state(host)
        names.setdefault(step, state["link"])
        assert state["link"] == names[step], state
        # the image before stays mounted, for a rollback; a third lock collects the oldest (B: A was linked last)
        assert state["mounted"] == sorted(names[k] for k in kept) and len(state["files"]) == len(kept), state
        if before is not None:  # nothing pulled: the image file is the one pulled the first time, still mounted
            assert state["files"] == before["files"] and state["mounted"] == before["mounted"], (before, state)
    # the patches are the image's: a dry run of the whole site plans no change
    dry = play([host], "site.yml", "--check", "--diff", *NO_CUDA, rig_stack=stacks["C"]).expect_ok()
    assert dry.recap("changed", host.name) == 0, dry.changed_tasks()
