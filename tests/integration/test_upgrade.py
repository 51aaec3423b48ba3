"""playbooks/upgrade.yml on three systemd boxes serving the SGLang stand-in, with the signed stand-in NVIDIA
repository (tests/nvidia_repo.py) in two versions: a driver whose module loads at the next boot, and on one box
a module that never loads. The reboot is real (systemd restarts the container); apt, dpkg, DKMS's call, the
CDI spec, the drain, the health gate, `rig smoke` and `rig prove` are what a GPU host runs."""
from __future__ import annotations

import json

import pytest
from harness.plays import play
from serving_boxes import CDI, DRIVER, FABRIC, HEALTH, NEW, OLD, Load, drains, driver_fleet, versions

pytestmark = pytest.mark.box

NEVER_LOADS = "/etc/rig-standin/module-never-loads"
LOCK = "/var/lib/rig/upgrade/rollout.lock"


@pytest.fixture(scope="module")
def fleet(systemd_image, standin_site, tmp_path_factory):
    """Three boxes serving the stand-in on driver OLD (serving_boxes.driver_fleet); shared by the tests here in
    order (the guard rails change nothing; the rollout test takes the fleet through)."""
    with driver_fleet(systemd_image, standin_site, tmp_path_factory.mktemp("fleet"), 3) as found:
        yield found


def test_guard_rails_refuse_an_old_driver_proprietary_blackwell_and_a_held_lock(fleet):
    boxes, settings = fleet
    box = boxes[0]
    before = box.sh("dpkg -l | sort; cat /srv/fake/module-version").stdout
    old = play([box], "upgrade.yml", nvidia_driver_branch="575", nvidia_driver_version="575.51.03-1", **settings)
    assert not old.ok
    assert "driver 575.51.03 is below what CUDA 13.0.2 needs (580.65.06, the 580 branch)" in old.output, \
        old.output[-3000:]
    closed = play([box], "upgrade.yml", nvidia_driver_flavour="proprietary", **settings)
    assert not closed.ok
    assert "the 'proprietary' kernel modules do not run Blackwell GPUs (the stack targets 12.0a)" in closed.output, \
        closed.output[-3000:]
    never = play([box], "upgrade.yml", rig_upgrade_rollback=True, **settings)
    assert not never.ok and "no upgrade was recorded on this host" in never.output, never.output[-3000:]
    box.sh(f"mkdir -p /var/lib/rig/upgrade && echo '{{\"owner\": \"other\", \"since\": \"then\"}}' > {LOCK}")
    try:
        held = play([box], "upgrade.yml", nvidia_driver_version=NEW, **settings)
        assert not held.ok and f"another rollout (other, since then) holds {LOCK} on this host" in held.output
        assert box.sh("dpkg -l | sort; cat /srv/fake/module-version").stdout == before
        assert box.sh(f"cat {LOCK}").stdout.strip() == '{"owner": "other", "since": "then"}'  # theirs, left alone
        assert box.sh(HEALTH).stdout.strip() == "200"
    finally:
        box.sh(f"rm -f {LOCK}")  # that rollout is gone: the next test takes the fleet through


def test_a_driver_upgrade_rolls_through_serving_boxes_stops_at_a_failing_one_and_rolls_it_back(fleet):
    boxes, settings = fleet
    first, failing, last = boxes
    failing.sh(f"mkdir -p {NEVER_LOADS.rsplit('/', 1)[0]} && touch {NEVER_LOADS}")
    before = {box.name: box.sh("dpkg -l | sort; ls -l /etc/cdi; cat /srv/fake/module-version").stdout for box in boxes}

    # the check and the last run take the three boxes in one batch: neither drains nor changes a host
    check = play(boxes, "upgrade.yml", "--check", "--diff", nvidia_driver_version=NEW, rig_rollout_batch=3,
                 **settings).expect_ok()
    assert f"{DRIVER} {OLD} -> {NEW}" in check.output and check.recap("changed", first.name) > 0
    assert all(box.sh("dpkg -l | sort; ls -l /etc/cdi; cat /srv/fake/module-version").stdout == before[box.name]
               for box in boxes)

    drained = {box.name: len(drains(box)) for box in boxes}
    with Load(boxes, tokens=1000) as load:
        rollout = play(boxes, "upgrade.yml", nvidia_driver_version=NEW, **settings)
    assert not rollout.ok
    assert f"the NVIDIA driver 580.200.00 did not load on {failing.name}: after a reboot the loaded kernel module " \
           "is 580.159.04" in rollout.output, rollout.output[-4000:]
    # the first box: driver and fabric manager at one held version, its module loaded, a spec of the new libraries
    assert versions(first)[DRIVER] == versions(first)[FABRIC] == (NEW, "hold")
    assert first.sh("cat /srv/fake/module-version").stdout.strip() == "580.200.00"
    spec = first.sh(f"cat {CDI}").stdout
    assert "libcuda.so.580.200.00" in spec and "580.159.04" not in spec
    assert "autoinstall -k" in first.sh("cat /var/log/dkms-standin.log").stdout
    proven = json.loads(first.sh("cat /var/lib/rig/prove/prove.json").stdout)  # beside the serving port
    assert proven["ok"] and "30099" in json.dumps([s.get("data", {}).get("argv") for s in proven["steps"]])
    assert first.sh(HEALTH).stdout.strip() == "200"
    # the request in flight when it was drained finished whole; no accepted request was cut short
    assert any(n >= 1 for n in drains(first)[drained[first.name]:]), first.sh("cat /var/log/rig/sglang-server.log").stdout

    assert not load.cut_short(first) and any(o["accepted"] for o in load.outcomes[first.name])
    # the third box was never reached: the old version, still serving
    assert versions(last)[DRIVER] == (OLD, "hold") and last.sh(HEALTH).stdout.strip() == "200"
    assert len(drains(last)) == drained[last.name]  # never drained
    assert [box.name for box in boxes if box.exists(LOCK)] == [], rollout.output[-4000:]  # every lock given back

    # rollback puts the failing box back to what it ran before, the same way, and it serves
    recorded = json.loads(failing.sh("cat /var/lib/rig/upgrade/previous.json").stdout)
    assert recorded["driver"] == {"package": DRIVER, "version": OLD}
    # rig prove ran in the first box's upgrade (above); the rollback and the rest of the rollout skip it
    back = play([failing], "upgrade.yml", rig_upgrade_rollback=True, rig_upgrade_prove=False, **settings).expect_ok()
    assert versions(failing)[DRIVER] == versions(failing)[FABRIC] == (OLD, "hold")
    assert failing.sh(HEALTH).stdout.strip() == "200" and "libcuda.so.580.159.04" in failing.sh(f"cat {CDI}").stdout
    assert back.recap("failed", failing.name) == 0

    # its module fixed, the rollout goes on over the rest, each drained with requests in flight, then holds
    failing.sh(f"rm {NEVER_LOADS}")
    drained = {box.name: len(drains(box)) for box in boxes}
    with Load(boxes, tokens=1000) as load:
        play(boxes, "upgrade.yml", nvidia_driver_version=NEW, rig_upgrade_prove=False, **settings).expect_ok()
    for box in boxes:
        assert versions(box)[DRIVER] == versions(box)[FABRIC] == (NEW, "hold")
        assert box.sh(HEALTH).stdout.strip() == "200" and not load.cut_short(box)
    for box in (failing, last):
        assert any(n >= 1 for n in drains(box)[drained[box.name]:])
    assert drains(first)[drained[first.name]:] == []  # on the new driver already: left serving
    again = play(boxes, "upgrade.yml", nvidia_driver_version=NEW, rig_rollout_batch=3, **settings).expect_ok()
    assert all(again.recap("changed", box.name) == 0 for box in boxes), again.changed_tasks()
