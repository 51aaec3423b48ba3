"""playbooks/upgrade.yml on three systemd boxes serving the SGLang stand-in, with the signed stand-in NVIDIA
repository (tests/nvidia_repo.py) in two versions: a driver whose module loads at the next boot, and on one box
a module that never loads. The reboot is real (systemd restarts the container); apt, dpkg, DKMS's call, the
CDI spec, the drain, the health gate, `rig smoke` and `rig prove` are what a GPU host runs."""
from __future__ import annotations

import json
import os

import pytest
import yaml
from conftest import _remove, _start, ok, play, rig
from serving_boxes import HEALTH, UNIT, Load, drains, numerics_models, serving_box, stack_file

pytestmark = pytest.mark.box

OLD, NEW = "580.159.04-1", "580.200.00-1"
DRIVER = "nvidia-driver-580-open"
FABRIC = "nvidia-fabricmanager-580"
CDI = "/etc/cdi/nvidia.yaml"
NEVER_LOADS = "/etc/rig-standin/module-never-loads"
LOCK = "/var/lib/rig/upgrade/rollout.lock"
SETTINGS = {
    "nvidia_driver_repo_url": "file:///srv/nvidia/repo", "nvidia_driver_keyring_url": "file:///srv/nvidia/key.gpg",
    "nvidia_driver_pci_root": "/srv/fake/pci",  # a GPU and an NVSwitch: the fabric manager goes with the driver
    "nvidia_driver_module_version_path": "/srv/fake/module-version",
    "nvidia_driver_allow_reboot": True,
    # a container shares its host's boot_id and has no logind for shutdown(8): systemd reboots it, and PID 1's
    # start time tells one boot from the next
    "nvidia_driver_reboot_command": "systemctl reboot",
    "nvidia_driver_boot_time_command": "cut -d' ' -f22 /proc/1/stat", "nvidia_driver_reboot_timeout": 300,
    # and answers docker exec as soon as PID 1 runs, before the boot's units (the stand-in module's among them):
    # back once systemd has no boot job left, as a host is once sshd answers
    "nvidia_driver_reboot_test_command": "systemctl is-system-running | grep -qxE 'running|degraded'",
    "nvidia_container_toolkit_mode": "cdi", "nvidia_container_toolkit_manage_services": False,
    "sglang_server_require_gpu": False, "sglang_server_start_timeout": 120,
    "rig_upgrade_doctor": False,  # the machine layer reads nvidia-smi, which no box has
    # the driver's tests (their stack is not locked); the last test takes the toolkit and the venv through
    "rig_upgrade_toolkit": False, "rig_upgrade_stack": False,
    # the boxes' stand-in venv has no torch to write test models with: the numerics model is written beside it
    # (rig_prove_models), the agreeing one for acceptance nowhere
    "rig_prove_skip": ["doctor", "testmodel", "acceptance"],
}


def versions(box) -> dict:
    """Each driver package's installed version and dpkg selection."""
    out = box.sh(f"dpkg-query -W -f='${{Package}} ${{Version}} ${{db:Status-Want}}\\n' {DRIVER} {FABRIC} "
                 "nvidia-container-toolkit", check=False).stdout
    return {name: (version, want) for name, version, want in (line.split() for line in out.splitlines())}


@pytest.fixture(scope="module")
def fleet(systemd_image, standin_site, tmp_path_factory):
    """Three boxes serving the stand-in on driver OLD, its module loaded, a CDI spec of OLD's libraries; shared by
    the tests here in order (the guard rails change nothing; the rollout test takes the fleet through)."""
    tmp_path = tmp_path_factory.mktemp("fleet")
    started: list = []

    def start(systemd: bool):
        started.append(_start(systemd_image, systemd=systemd))
        return started[-1]

    try:
        boxes = [serving_box(start, standin_site) for _ in range(3)]
        os.environ["MOLECULE_EPHEMERAL_DIRECTORY"] = str(tmp_path)  # where the prepare play builds the repository
        try:
            play(boxes, "../tests/molecule/prepare-nvidia-repo.yml").expect_ok()
        finally:
            del os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]
        models = [numerics_models(box) for box in boxes][0]  # the same path on each
        settings = {**SETTINGS, "rig_stack": stack_file(tmp_path, "stack.yml", 2), "rig_prove_models": models}
        play(boxes, "bare-metal.yml", nvidia_driver_version=OLD, **settings).expect_ok()
        play(boxes, "server.yml", rig_rollout_batch=3, **settings).expect_ok()  # a first start: nothing to roll
        for box in boxes:
            assert versions(box)[DRIVER] == (OLD, "hold") and box.sh(HEALTH).stdout.strip() == "200"
            assert "libcuda.so.580.159.04" in box.sh(f"cat {CDI}").stdout
        yield boxes, settings
    finally:
        _remove(started)


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
    back = play([failing], "upgrade.yml", rig_upgrade_rollback=True, **settings).expect_ok()
    assert versions(failing)[DRIVER] == versions(failing)[FABRIC] == (OLD, "hold")
    assert failing.sh(HEALTH).stdout.strip() == "200" and "libcuda.so.580.159.04" in failing.sh(f"cat {CDI}").stdout
    assert back.recap("failed", failing.name) == 0

    # its module fixed, the rollout goes on over the rest, each drained with requests in flight, then holds
    failing.sh(f"rm {NEVER_LOADS}")
    drained = {box.name: len(drains(box)) for box in boxes}
    with Load(boxes, tokens=1000) as load:
        play(boxes, "upgrade.yml", nvidia_driver_version=NEW, **settings).expect_ok()
    for box in boxes:
        assert versions(box)[DRIVER] == versions(box)[FABRIC] == (NEW, "hold")
        assert box.sh(HEALTH).stdout.strip() == "200" and not load.cut_short(box)
    for box in (failing, last):
        assert any(n >= 1 for n in drains(box)[drained[box.name]:])
    assert drains(first)[drained[first.name]:] == []  # on the new driver already: left serving
    again = play(boxes, "upgrade.yml", nvidia_driver_version=NEW, rig_rollout_batch=3, **settings).expect_ok()
    assert all(again.recap("changed", box.name) == 0 for box in boxes), again.changed_tasks()


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


def test_the_toolkit_and_the_venv_upgrade_inside_one_drain_and_come_back_by_their_stack_file(fleet, tmp_path):
    boxes, settings = fleet
    box = boxes[0]
    old = locked_stack(tmp_path, "stack-old", "12.9.1", "8.1.7", 2)
    new = locked_stack(tmp_path, "stack-new", "13.0.2", "8.1.8", 3)
    # the stand-in has none of the files the SM120 patches change: the role keeps them off
    base = {**settings, "rig_upgrade_toolkit": True, "rig_upgrade_stack": True, "sglang_patches_state": "absent"}

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
    upgrade(old, rig_upgrade_rollback=True).expect_ok()
    assert stack_state(box) == {"cuda": "cuda-12.9", "lock": lock_of(old), "click": ["click==8.1.7"], "steps": ["2"]}
    assert box.sh(HEALTH).stdout.strip() == "200"
    again = upgrade(old).expect_ok()
    assert again.recap("changed", box.name) == 0, again.changed_tasks()
