"""Roles judge nothing: where a role needs an engine document read or a verdict on the host, the engine gives
it (behind the rig action), so that the judgement is made once, in rig, and tested there."""
import re

from harness.paths import REPO

# what a role must not do itself, and what answers it instead: the loader cache read and matched in Jinja; a
# lock read as plain JSON (which skips the check of its hash)
JUDGED_IN_RIG = {r"ldconfig -p": "rig doctor --layer libraries",
                 r"lookup\([^)]*file[^)]*\)\s*\|\s*from_json": "rig wheelhouse show: a lock read with its hash checked",
                 r"paths: /dev\b|find /dev/nvidia": "rig machine facts: device_nodes",
                 r"from_json": "a rig command that reads the document (rig machine facts --docker-config)",
                 r"package_facts|ansible_facts\.packages|module_version\s*==":
                     "rig machine facts --driver-package: driver_installed, module_current",
                 r"creates:.*cdi": "rig machine facts --cdi-spec: cdi_current (a stale spec is no spec)"}


def test_no_role_reads_a_document_the_loader_cache_or_the_device_nodes_itself():
    found = [f"{path.relative_to(REPO)}: {pattern} ({instead})" for path in sorted((REPO / "roles").rglob("*.yml"))
             for pattern, instead in JUDGED_IN_RIG.items() if re.search(pattern, path.read_text())]
    assert found == []


def test_doctors_libraries_layer_alone_is_the_roles_verdict_and_says_it_in_one_line(tmp_path):
    import json

    from harness.commands import rig

    done = rig("doctor", "--cuda", "13.0.2", "--prefix", str(tmp_path), "--layer", "libraries", "--json")
    report = json.loads(done.stdout)
    assert {c["layer"] for c in report["checks"]} == {"libraries"}
    assert [c["name"] for c in report["checks"]] == ["libcudart.so.13", "libnvrtc.so.13", "libnvrtc-builtins.so.13.0"]
    assert report["ok"] == (done.returncode == 0) == all(c["status"] == "pass" for c in report["checks"])
    if not report["ok"]:  # the rig action's message of a failed task: each missing soname and its fix
        assert done.returncode == 1 and "libraries libnvrtc.so.13: libnvrtc.so.13 is not in the ldconfig cache" \
            in report["msg"] and "cuda_ldconfig role" in report["msg"]


def test_the_device_nodes_a_process_can_open_are_counted_by_rig(tmp_path):
    """Character devices nvidia0, nvidia1 ... only: not nvidiactl, nvidia-uvm, nor a plain file of that name."""
    import json
    import os
    import stat

    from harness.commands import rig

    for name in ("nvidiactl", "nvidia-uvm", "nvidia7"):
        (tmp_path / name).write_text("")
    os.symlink("/dev/null", tmp_path / "nvidia3")  # a link, even to a character device, is not the driver's node
    done = rig("machine", "facts", "--dev", str(tmp_path), "--pci-root", str(tmp_path / "none"), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["device_nodes"] == 0
    for index in (0, 1):  # character devices as the driver makes them (the numbers of /dev/null: harmless)
        os.mknod(tmp_path / f"nvidia{index}", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    done = rig("machine", "facts", "--dev", str(tmp_path), "--pci-root", str(tmp_path / "none"), "--json")
    assert json.loads(done.stdout)["device_nodes"] == 2


def test_the_libraries_layer_knows_cuda_11s_sonames_with_a_minor(monkeypatch):
    from rig.machine import doctor

    monkeypatch.setattr(doctor, "cache", lambda: {"libcudart.so.11.0": "/usr/local/cuda-11.8/lib64/libcudart.so.11.0",
                                                  "libnvrtc.so.11.2": "/usr/local/cuda-11.8/lib64/libnvrtc.so.11.2"})
    checks = {c.name: c.status for c in doctor.ALONE["libraries"]("11.8", [], "/usr/local")}
    assert checks == {"libcudart.so.11": "pass", "libnvrtc.so.11": "pass", "libnvrtc-builtins.so.11.8": "fail"}


def test_dockers_runtimes_are_read_by_rig_and_a_file_of_another_shape_is_named(tmp_path):
    import json

    from harness.commands import rig

    config = tmp_path / "daemon.json"
    facts = ["machine", "facts", "--pci-root", str(tmp_path / "none"), "--json", "--docker-config", str(config)]
    assert json.loads(rig(*facts).stdout)["docker_runtimes"] == []  # no file yet: nothing registered
    config.write_text(json.dumps({"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}, "runc": {}}}))
    assert json.loads(rig(*facts).stdout)["docker_runtimes"] == ["nvidia", "runc"]
    config.write_text('{"runtimes": ["nvidia"]}')
    done = rig(*facts)
    assert done.returncode == 2 and "is not a Docker daemon configuration" in done.stderr
