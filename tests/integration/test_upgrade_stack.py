"""playbooks/upgrade.yml takes one serving box's CUDA toolkit and venv to a new stack file inside one drain, and
rolls them back by the old one (the box of serving_boxes.driver_fleet: the stand-in serves, the driver stays). The
box can loop-mount: once each lock is packed and imaged, the venv goes back and forth by remount (the link moved to
the other lock's image), inside the same drain."""
from __future__ import annotations

import json
import time

import pytest
import yaml
from harness.commands import ok, rig
from harness.plays import play
from harness.venv_takes import MOUNT, WHEELS
from serving_boxes import HEALTH, UNIT, Load, drains, driver_fleet

pytestmark = pytest.mark.box


@pytest.fixture(scope="module")
def serving(systemd_image, standin_site, tmp_path_factory):
    with driver_fleet(systemd_image, standin_site, tmp_path_factory.mktemp("fleet"), 1, loop=True) as (boxes, settings):
        yield boxes[0], settings


def locked_stack(tmp_path, name: str, cuda: str, click: str, steps: int) -> str:
    """A small real stack the stand-in serves: CUDA CUDA made the default, one pure-Python wheel, locked here."""
    components = ["nvcc", "cudart", "nvrtc", "cccl"] if cuda.startswith("12.") else ["nvcc", "cudart", "nvrtc",
                                                                                    "cccl", "crt", "nvvm"]
    stack = {"name": name, "python": "3.11", "venv": "/opt/rig/venv", "archs": ["12.0a", "9.0a"],
             "cuda": {"version": cuda, "components": components, "make_default": True},  # the caches test_cuda_toolkit fills
             "extra_packages": [f"click=={click}"],
             "server": {"model": "/models/target", "draft_model": "/models/draft", "speculative_num_steps": steps}}
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(stack))
    ok(rig("lock", "--stack", str(path)))
    return str(path)


def stack_state(box) -> dict:
    """What the stack made on BOX: the default toolkit, the venv's lock and click, the server's steps."""
    marker = json.loads(box.sh("cat /opt/rig/venv/.rig-stack.json").stdout)
    unit = box.sh(f"cat {UNIT}").stdout
    return {"cuda": box.sh("readlink /usr/local/cuda").stdout.strip(), "lock": marker["lock_hash"],
            "click": [p for p in marker["packages"] if p.startswith("click==")],
            "steps": [n for n in ("2", "3") if f"--speculative-num-steps {n}" in unit]}


def lock_of(stack: str) -> str:
    return json.loads(open(stack.replace(".yml", ".lock")).read())["lock_hash"]


def test_the_toolkit_and_the_venv_upgrade_inside_one_drain_and_come_back_by_their_stack_file(serving, tmp_path):
    box, settings = serving
    old = locked_stack(tmp_path, "stack-old", "12.9.1", "8.1.7", 2)
    new = locked_stack(tmp_path, "stack-new", "13.0.2", "8.1.8", 3)
    # the stand-in has none of the files the SM120 patches change: the role keeps them off. rig prove runs in the
    # last upgrade alone (a venv on a remounted image): in each upgrade before, it would prove the same stand-in
    base = {**settings, "rig_upgrade_toolkit": True, "rig_upgrade_stack": True, "sglang_patches_state": "absent",
            "rig_upgrade_prove": False}

    def upgrade(stack: str, *args: str, **more):
        return play([box], "upgrade.yml", *args, **{**base, "rig_stack": stack, **more})

    upgrade(old).expect_ok()  # no toolkit, no lock yet: the old stack's
    assert stack_state(box) == {"cuda": "cuda-12.9", "lock": lock_of(old), "click": ["click==8.1.7"], "steps": ["2"]}

    state = "ls -la /usr/local /usr/local/cuda/; cat /opt/rig/venv/.rig-stack.json /etc/ld.so.conf.d/*; " \
            f"cat {UNIT}; dpkg -l | sort"
    before = box.sh(state).stdout
    check = upgrade(new, "--check", "--diff").expect_ok()
    assert "would install CUDA 13.0.2 at /usr/local/cuda-13.0" in check.output, check.output[-3000:]
    assert f"would install lock {lock_of(new)[:12]}" in check.output and check.recap("changed", box.name) > 0
    assert box.sh(state).stdout == before

    drained = len(drains(box))
    with Load([box], tokens=1000, streams=4) as load:  # one box: enough streams that one is always in flight
        upgrade(new).expect_ok()
    assert stack_state(box) == {"cuda": "cuda-13.0", "lock": lock_of(new), "click": ["click==8.1.8"], "steps": ["3"]}
    assert box.exists("/usr/local/cuda-12.9/bin/ptxas")  # the old toolkit stays beside the new (its wheels ship ptxas)
    assert "/usr/local/cuda-13.0/" in box.sh("ldconfig -p | grep libnvrtc.so.13").stdout
    # one drain for toolkit, venv and server together, a request in flight, every accepted request whole
    assert [n >= 1 for n in drains(box)[drained:]] == [True], box.sh("cat /var/log/rig/sglang-server.log").stdout
    assert not load.cut_short(box) and any(o["accepted"] for o in load.outcomes[box.name])
    assert box.sh(HEALTH).stdout.strip() == "200"
    recorded = json.loads(box.sh("cat /var/lib/rig/upgrade/previous.json").stdout)
    assert (recorded["toolkit"], recorded["lock_hash"]) == ("12.9.1", lock_of(old))

    wrong = upgrade(new, rig_upgrade_rollback=True)
    assert not wrong.ok and "the host ran CUDA 12.9.1 the default" in wrong.output, wrong.output[-3000:]
    assert "the stack given makes CUDA 13.0.2 the default: roll back with the stack file the host ran then" \
        in wrong.output
    assert stack_state(box)["lock"] == lock_of(new) and box.sh(HEALTH).stdout.strip() == "200"  # nothing changed
    drained = len(drains(box))
    back = timed("rollback to the old lock's image", lambda: upgrade(old, rig_upgrade_rollback=True).expect_ok())
    assert stack_state(box) == {"cuda": "cuda-12.9", "lock": lock_of(old), "click": ["click==8.1.7"], "steps": ["2"]}
    # the old lock's venv comes back as its image (packed and imaged when it was first installed), no wheel again
    assert mounted(box) and any(MOUNT in t for t in back.changed_tasks(box.name)), back.changed_tasks()
    assert not any(WHEELS in t for t in back.changed_tasks(box.name))
    assert [n >= 1 for n in drains(box)[drained:]] == [True] and box.sh(HEALTH).stdout.strip() == "200"
    # and forward again by remount, a request in flight: the new lock's image (imaged when it was installed)
    drained = len(drains(box))
    box.sh("rm -f /var/lib/rig/prove/prove.json")  # what the forward upgrade's rig prove writes
    with Load([box], tokens=1000, streams=4) as load:
        forward = timed("upgrade to the new lock's image", lambda: upgrade(new, rig_upgrade_prove=True).expect_ok())
    assert stack_state(box)["lock"] == lock_of(new) and mounted(box)
    assert any(MOUNT in t for t in forward.changed_tasks(box.name)), forward.changed_tasks()
    assert [n >= 1 for n in drains(box)[drained:]] == [True], box.sh("cat /var/log/rig/sglang-server.log").stdout
    assert not load.cut_short(box) and box.sh(HEALTH).stdout.strip() == "200"
    assert json.loads(box.sh("cat /var/lib/rig/prove/prove.json").stdout)["ok"]  # proven before serving again
    again = upgrade(new).expect_ok()
    assert again.recap("changed", box.name) == 0, again.changed_tasks()


def mounted(box) -> bool:
    """The venv is a link to a squashfs image rig mounted."""
    target = box.sh("readlink /opt/rig/venv").stdout.strip()
    return target.startswith("/var/lib/rig/venv-images/") and \
        box.sh(f"findmnt -n -o FSTYPE {target}").stdout.strip() == "squashfs"


def timed(what: str, step):
    """STEP's result, its wall time printed (the day-two numbers docs/BENCHMARKS.md quotes come from here)."""
    start = time.monotonic()
    result = step()
    print(f"{what}: {time.monotonic() - start:.1f} s")
    return result
