"""The engine's side of a day-two upgrade (rig.machine.driver, rig.machine.upgrade): the guard rails, the
CDI spec's staleness, the rollout lock and the record a rollback reads. dpkg is this machine's real one."""
import json
import os

import pytest
from harness.commands import rig

from rig.core import RigError
from rig.machine import driver, upgrade


def dpkg_version(package: str) -> str:
    return driver.installed(package)["version"]


@pytest.mark.parametrize("branch, version, cuda, refused", [
    ("580", "580.159.04-1", "13.0.2", None),
    ("580", "", "13.0.2", None),                       # the branch's newest: the branch is enough
    ("575", "575.51.03-1", "13.0.2", "driver 575.51.03 is below what CUDA 13.0.2 needs (580.65.06, the 580 branch)"),
    ("580", "580.10.02-1", "13.0.0", "driver 580.10.02 is below what CUDA 13.0.0 needs (580.65.06"),
    ("575", "", "13.0.2", "driver 575 is below what CUDA 13.0.2 needs"),
    ("570", "570.86.10-0ubuntu1", "12.8.1", None),
    ("560", "", "12.7.0", None),                       # 12.7 is not in the table: 12.6's row holds
    ("550", "", "12.7.0", "driver 550 is below what CUDA 12.7.0 needs (560.28.03"),
    ("580", "1:580.65.06-1", "13.1.0", None),          # newer than the table: its last row, with an epoch
    ("575", "575.51.03-1", "13", "driver 575.51.03 is below what CUDA 13 needs (580.65.06"),  # 13 is 13.0
    ("575", "580.159.04-1", "13.0.2", "driver 580.159.04 is not of the 575 branch"),
    ("580", "580.200.00-1;rm", "13.0.2", "driver branch '580' / version '580.200.00-1;rm' are not driver versions"),
])
def test_the_stacks_cuda_sets_the_lowest_driver(branch, version, cuda, refused):
    found = driver.refusals(branch, version, "open", cuda, ["9.0a"])
    assert (found[0] if found else None) == refused or (refused and found and found[0].startswith(refused))


def test_blackwell_needs_the_open_modules_and_nonsense_is_named():
    said = driver.refusals("580", "", "proprietary", "13.0.2", ["12.0a", "9.0a", "10.0f"])
    assert said == ["the 'proprietary' kernel modules do not run Blackwell GPUs (the stack targets 10.0f, 12.0a): "
                    "set nvidia_driver_flavour=open"]
    assert driver.refusals("580", "", "proprietary", "13.0.2", ["9.0a", "8.0"]) == []  # Hopper and Ampere may
    assert "are not driver versions" in driver.refusals("580; rm", "", "open", None, [])[0]
    for cuda in ("11.8", "", "13.x"):
        with pytest.raises(RigError, match=f"CUDA '{cuda}' is not a release rig knows a driver for"):
            driver.refusals("580", "", "open", cuda, [])
    assert driver.upstream("1:580.159.04-1ubuntu1") == "580.159.04" and driver.upstream("") == ""


def test_a_cdi_spec_is_stale_when_a_path_it_mounts_is_gone(tmp_path):
    lib = tmp_path / "libcuda.so.580.200.00"
    lib.write_text("")
    spec = tmp_path / "nvidia.yaml"
    assert driver.cdi_missing(str(spec)) is None  # no spec: none to be stale
    spec.write_text(f"cdiVersion: 0.5.0\ncontainerEdits:\n  mounts:\n  - hostPath: {lib}\n    containerPath: /x\n"
                    f"  - hostPath: '{tmp_path}/libcuda.so.580.159.04'\n")
    assert driver.cdi_missing(str(spec)) == [f"{tmp_path}/libcuda.so.580.159.04"]
    spec.write_text(json.dumps({"cdiVersion": "0.5.0", "containerEdits": {"mounts": [{"hostPath": str(lib)}]}}))
    assert driver.cdi_missing(str(spec)) == []  # JSON, every path there
    facts = json.loads(rig("machine", "facts", "--pci-root", str(tmp_path), "--cdi-spec", str(spec), "--json").stdout)
    assert facts["cdi_current"] is True and facts["cdi_missing"] == []
    spec.write_text(json.dumps({"cdiVersion": "0.5.0", "containerEdits": {"mounts": [{"hostPath": str(lib)}]}})
                    .replace("/", "\\/"))
    assert driver.cdi_missing(str(spec)) == []  # JSON's escaped slashes are slashes
    for broken in ("", "not a cdi spec at all", '{"containerEdits": {"mou', "# hostPath: /etc/hostname\n"):
        spec.write_text(broken)
        assert driver.cdi_missing(str(spec)) == [f"{spec} has no cdiVersion: not a spec nvidia-ctk wrote"]
    spec.write_text(f"cdiVersion: 0.5.0\ncontainerEdits:\n  mounts:\n  - hostPath: {lib}\n  - hostPath: lib/libcuda.so.1\n")
    assert driver.cdi_missing(str(spec)) == ["lib/libcuda.so.1"]  # relative: no path a runtime mounts
    spec.write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")  # no libraries found: nothing gone
    assert driver.cdi_missing(str(spec)) == []
    spec.unlink()
    os.mkfifo(spec)  # never waited on
    done = rig("machine", "facts", "--pci-root", str(tmp_path), "--cdi-spec", str(spec), "--json")
    assert done.returncode == 2 and "is not a regular file" in done.stderr


def test_machine_facts_say_whether_the_loaded_module_is_the_installed_package(tmp_path):
    module = tmp_path / "version"
    module.write_text(driver.upstream(dpkg_version("dpkg")) + "\n")
    base = ["machine", "facts", "--pci-root", str(tmp_path), "--module-version-path", str(module), "--json"]
    facts = json.loads(rig(*base, "--driver-package", "dpkg").stdout)  # dpkg stands in for the driver package
    assert facts["driver_installed_package"] == dpkg_version("dpkg") and facts["module_current"] is True
    module.write_text("580.95.05\n")
    assert json.loads(rig(*base, "--driver-package", "dpkg").stdout)["module_current"] is False
    missing = json.loads(rig(*base, "--driver-package", "no-such-package-here").stdout)
    assert missing["driver_installed"] == "" and missing["module_current"] is False
    done = rig(*base, "--driver-package", "x; reboot")
    assert done.returncode == 2 and "is not a Debian package name" in done.stderr


def test_the_rollout_lock_keeps_a_second_rollout_out_and_leaves_its_lock_alone(tmp_path):
    state = str(tmp_path / "upgrade")
    assert upgrade.lock(state, "run-a", check=True)["changed"] and not (tmp_path / "upgrade").exists()
    assert upgrade.lock(state, "run-a")["changed"]
    assert not upgrade.lock(state, "run-a")["changed"]  # held already: nothing changes
    with pytest.raises(RigError, match=r"another rollout \(run-a, since 20\d\d-.*\) holds .*rollout.lock"):
        upgrade.lock(state, "run-b")
    assert not upgrade.unlock(state, "run-b")["changed"] and (tmp_path / "upgrade" / upgrade.LOCK).exists()
    assert upgrade.unlock(state, "run-a")["changed"] and not (tmp_path / "upgrade" / upgrade.LOCK).exists()
    os.symlink(tmp_path / "elsewhere", tmp_path / "upgrade" / upgrade.LOCK)  # a dangling link: never written through
    with pytest.raises(RigError, match="a link there is never followed"):
        upgrade.lock(state, "run-a")
    assert not (tmp_path / "elsewhere").exists()
    (tmp_path / "upgrade" / upgrade.LOCK).unlink()
    (tmp_path / "elsewhere").write_text('{"owner": "a secret", "since": "x"}')
    os.symlink(tmp_path / "elsewhere", tmp_path / "upgrade" / upgrade.LOCK)  # never read through either
    with pytest.raises(RigError, match="a link there is never followed.*; if no rollout runs, remove it"):
        upgrade.unlock(state, "a secret")
    assert (tmp_path / "upgrade" / upgrade.LOCK).is_symlink()
    (tmp_path / "upgrade" / upgrade.LOCK).unlink()
    for wrong in ('{"owner": 7}', ""):  # another shape; a crash between create and write
        (tmp_path / "upgrade" / upgrade.LOCK).write_text(wrong)
        with pytest.raises(RigError, match=f"; if no rollout runs, remove {state}/{upgrade.LOCK}"):
            upgrade.lock(state, "run-a")
    with pytest.raises(RigError, match="needs its rollout's id"):
        upgrade.lock(str(tmp_path / "other"), " ")


def test_the_plan_names_each_change_and_whether_the_host_is_steady(tmp_path):
    module = tmp_path / "version"
    installed = dpkg_version("dpkg")
    branch = driver.upstream(installed).split(".")[0]  # dpkg stands in for the driver: its own branch
    module.write_text(driver.upstream(installed) + "\n")
    same = upgrade.plan({"driver": ("dpkg", installed)}, str(module), branch, "open", None, ["12.0a"])
    assert not same["changed"] and same["steady"] and same["changes"] == []
    moved = upgrade.plan({"driver": ("dpkg", "580.200.00-1"), "fabricmanager": ("no-such-package-here", "580.200.00-1")},
                         str(module), "580", "open", "13.0.2", ["12.0a"])  # the target is judged, not dpkg's
    assert moved["changes"] == [f"driver: dpkg {installed} -> 580.200.00-1",
                                "fabricmanager: no-such-package-here not installed -> 580.200.00-1"]
    module.write_text("580.95.05\n")
    pending = upgrade.plan({"driver": ("dpkg", "")}, str(module), branch, "open", None, [])
    assert not pending["steady"] and "the host needs its reboot" in pending["changes"][0]
    with pytest.raises(RigError, match="refusing the driver upgrade: .*proprietary"):
        upgrade.plan({"driver": ("dpkg", "")}, str(module), branch, "proprietary", None, ["12.0"])
    # a fabric manager left at another version than the driver: a change, and no state to come back to
    module.write_text(driver.upstream(installed) + "\n")
    apart = upgrade.plan({"driver": ("dpkg", ""), "fabricmanager": ("bash", "")}, str(module), branch, "open", None, [])
    assert not apart["steady"] and apart["changes"] == [f"fabricmanager: bash {dpkg_version('bash')} -> {installed}"]


def test_the_record_is_what_a_rollback_reads_and_a_tampered_one_is_refused(tmp_path):
    state = str(tmp_path)
    with pytest.raises(RigError, match="no upgrade was recorded on this host"):
        upgrade.previous(state)
    packages = {"driver": "dpkg", "fabricmanager": "no-such-package-here", "container_toolkit": "bash"}
    assert upgrade.record(state, packages, check=True)["changed"] and not (tmp_path / upgrade.RECORD).exists()
    upgrade.record(state, packages)
    found = upgrade.previous(state)
    assert found["driver"] == {"package": "dpkg", "version": dpkg_version("dpkg")}
    assert found["fabricmanager"]["version"] == "" and found["container_toolkit"]["version"] == dpkg_version("bash")
    record = json.loads((tmp_path / upgrade.RECORD).read_text())
    record["driver"]["version"] = ""
    (tmp_path / upgrade.RECORD).write_text(json.dumps(record))
    with pytest.raises(RigError, match="records no installed driver: there is nothing to roll back to"):
        upgrade.previous(state)
    record["driver"]["version"] = "1.0; rm -rf /"
    (tmp_path / upgrade.RECORD).write_text(json.dumps(record))
    with pytest.raises(RigError, match="driver.version: is not a Debian package version"):
        upgrade.previous(state)


def test_the_record_holds_the_default_toolkit_and_the_venvs_lock_and_a_rollback_must_name_that_stack(tmp_path):
    from rig.cuda import toolkit
    from rig.python import venv

    state, prefix, env = tmp_path / "state", tmp_path / "usr-local", tmp_path / "venv"
    packages = {"driver": "dpkg", "fabricmanager": "no-such-package-here", "container_toolkit": "bash"}
    (prefix / "cuda-12.9").mkdir(parents=True)
    (prefix / "cuda-12.9" / toolkit.MARKER).write_text(json.dumps({"version": "12.9.1", "method": "wheels",
                                                                    "components": ["nvcc"]}))
    os.symlink("cuda-12.9", prefix / "cuda")
    env.mkdir()
    lock = "a" * 64
    (env / venv.MARKER).write_text(json.dumps({"lock_hash": lock, "packages": ["click==8.1.7"]}))
    said = upgrade.record(str(state), packages, str(prefix), str(env))
    assert said["toolkit"] == "12.9.1" and said["lock_hash"] == lock
    assert "CUDA 12.9.1 the default, the venv at lock aaaaaaaaaaaa" in said["msg"]
    assert upgrade.previous(str(state), "12.9.1", lock)["toolkit"] == "12.9.1"
    with pytest.raises(RigError, match=r"the host ran CUDA 12.9.1 the default .*; the stack given makes CUDA 13.0.2 "
                                       r"the default: roll back with the stack file the host ran then"):
        upgrade.previous(str(state), "13.0.2", lock)
    wrong = rig("upgrade", "previous", "--state-dir", str(state), "--lock-hash", "b" * 64)
    assert wrong.returncode == 2 and "the host ran the venv at lock aaaaaaaaaaaa" in wrong.stderr
    assert "the stack given installs lock bbbbbbbbbbbb" in wrong.stderr

    # a run again after a failed upgrade keeps the record of the state before it, until one finishes
    (env / venv.MARKER).write_text(json.dumps({"lock_hash": "c" * 64, "packages": []}))
    kept = upgrade.record(str(state), packages, str(prefix), str(env))
    assert not kept["changed"] and kept["lock_hash"] == lock and "did not finish" in kept["msg"]
    assert upgrade.finish(str(state), check=True)["changed"] and not upgrade.previous(str(state))["finished"]
    assert upgrade.finish(str(state))["changed"] and not upgrade.finish(str(state))["changed"]
    # a rollback reopens it: one that fails keeps the record as a failed upgrade does
    assert upgrade.finish(str(state), reopen=True, check=True)["changed"] and upgrade.previous(str(state))["finished"]
    assert upgrade.finish(str(state), reopen=True)["changed"] and not upgrade.previous(str(state))["finished"]
    assert not upgrade.record(str(state), packages, str(prefix), str(env))["changed"]
    plan = json.loads(rig("upgrade", "finish", "--state-dir", str(state), "--check", "--json").stdout)
    assert plan["changed"] and "would mark" in plan["msg"]  # the plan upgrade.yml reads: take the host through
    upgrade.finish(str(state))
    assert upgrade.record(str(state), packages, str(prefix), str(env))["lock_hash"] == "c" * 64

    # NVIDIA's own tree (no marker of rig's) and no venv marker: nothing recorded, so any stack may come back
    upgrade.finish(str(state))
    os.unlink(prefix / "cuda")
    (prefix / "other").mkdir()
    (prefix / "other" / "version.json").write_text("{}")
    os.symlink("other", prefix / "cuda")
    (env / venv.MARKER).unlink()
    assert {k: upgrade.record(str(state), packages, str(prefix), str(env))[k] for k in ("toolkit", "lock_hash")} \
        == {"toolkit": "", "lock_hash": ""}
    assert upgrade.previous(str(state), "13.0.2", "b" * 64)["driver"]["package"] == "dpkg"
    record = json.loads((state / upgrade.RECORD).read_text())
    for key, bad, why in (("toolkit", "12.9; rm", "is not a CUDA release"), ("lock_hash", "abc", "is not 64 hex")):
        (state / upgrade.RECORD).write_text(json.dumps({**record, key: bad}))
        with pytest.raises(RigError, match=f"{key}: .*{why}.*not rig's upgrade record: remove it"):
            upgrade.previous(str(state))
    for flag, bad, why in (("--toolkit", "", "is empty"), ("--toolkit", " 12.9.1", "is not a CUDA release"),
                           ("--lock-hash", "zz", "is not 64 hex digits")):
        done = rig("upgrade", "previous", "--state-dir", str(state), flag, bad)
        assert done.returncode == 2 and f"{flag} {bad!r}: " in done.stderr and why in done.stderr, done.stderr


def test_what_the_record_reads_on_the_host_is_refused_where_it_is_not_rigs(tmp_path):
    from rig.cuda import toolkit
    from rig.python import venv

    prefix, env, state = tmp_path / "prefix", tmp_path / "venv", str(tmp_path / "state")
    packages = {"driver": "dpkg", "fabricmanager": "dpkg", "container_toolkit": "dpkg"}
    prefix.mkdir()
    env.mkdir()
    os.symlink("cuda", prefix / "cuda")  # a loop of links
    with pytest.raises(RigError, match="cuda cannot be followed .*point it at a toolkit with `rig cuda default`"):
        upgrade.record(state, packages, str(prefix))
    os.unlink(prefix / "cuda")
    os.symlink("cuda-13.0", prefix / "cuda")  # a link to nothing: no toolkit is the default
    assert upgrade.record(state, packages, str(prefix))["toolkit"] == ""
    upgrade.finish(state)
    os.unlink(prefix / "cuda")
    (prefix / "cuda-12.9").mkdir()
    os.symlink("cuda-12.9", prefix / "cuda")
    (prefix / "cuda-12.9" / toolkit.MARKER).write_text(json.dumps({"version": "banana", "method": "wheels",
                                                                    "components": []}))
    with pytest.raises(RigError, match="names CUDA 'banana', no release rig installs: it is not rig's marker"):
        upgrade.record(state, packages, str(prefix))
    (prefix / "cuda-12.9" / toolkit.MARKER).unlink()
    os.mkfifo(prefix / "cuda-12.9" / toolkit.MARKER)  # never waited on
    with pytest.raises(RigError, match="is not a regular file"):
        upgrade.record(state, packages, str(prefix))
    os.mkfifo(env / venv.MARKER)
    with pytest.raises(RigError, match="is not a regular file"):
        upgrade.record(state, packages, venv=str(env))
    os.unlink(env / venv.MARKER)
    (tmp_path / "elsewhere.json").write_text(json.dumps({"lock_hash": "c" * 64, "packages": []}))
    os.symlink(tmp_path / "elsewhere.json", env / venv.MARKER)
    with pytest.raises(RigError, match="is a link; rig writes its venv marker as a plain file"):
        upgrade.record(state, packages, venv=str(env))
    assert upgrade.previous(state)["toolkit"] == ""  # nothing recorded from any of them since
