"""CUDA 13 beside an older toolkit, on real containers with real NVIDIA wheels."""
from __future__ import annotations

import json
import subprocess
import time

import pytest
from harness.commands import rig
from harness.paths import CUDA_STACK, REPO
from harness.plays import ansible_env, playbook_cmd

from rig.core.elf import read_shared_object

pytestmark = pytest.mark.box

KERNEL = "__global__ void axpy(float a, const float *x, float *y) { y[threadIdx.x] += a * x[threadIdx.x]; }"


def test_cuda13_lands_beside_12_9_and_the_default_switches_only_when_asked(box):
    # An older toolkit, installed by the same wheels method and made the default.
    box.play("cuda.yml", cuda_toolkit_version="12.9.1", cuda_toolkit_components=["nvcc", "cudart", "nvrtc", "cccl"],
             cuda_toolkit_make_default=True, cuda_ldconfig_versions=["12.9.1"]).expect_ok()
    assert box.sh("readlink /usr/local/cuda").stdout.strip() == "cuda-12.9"
    before = box.tree_hashes("/usr/local/cuda-12.9")
    assert "libcudart.so.12" in before

    box.play("cuda.yml").expect_ok()
    assert "release 13.0" in box.sh("/usr/local/cuda-13.0/bin/nvcc --version").stdout
    # a service's non-root user runs the compilers too (NVIDIA's wheels ship them 0744, and a
    # staging dir is made 0700); su, as setpriv here was let through the 0700 tree all the same
    assert box.sh("stat -c %a /usr/local/cuda-13.0").stdout.strip() == "755"
    for tool in ("nvcc", "ptxas"):
        assert "release 13.0" in box.sh(f"su -s /bin/sh nobody -c '/usr/local/cuda-13.0/bin/{tool} --version'").stdout
    assert box.tree_hashes("/usr/local/cuda-12.9") == before
    assert box.sh("readlink /usr/local/cuda").stdout.strip() == "cuda-12.9"

    box.play("cuda.yml", cuda_toolkit_make_default=True).expect_ok()
    assert box.sh("readlink /usr/local/cuda").stdout.strip() == "cuda-13.0"
    assert box.tree_hashes("/usr/local/cuda-12.9") == before

    rollback = box.play("cuda-rollback.yml").expect_ok()
    assert rollback.recap("changed") == 1
    assert box.sh("readlink /usr/local/cuda").stdout.strip() == "cuda-12.9"
    # both toolkits' runtimes stay resolvable side by side
    cache = box.sh("ldconfig -p").stdout
    assert "libcudart.so.12 " in cache and "libcudart.so.13 " in cache


def test_nvcc_13_compiles_for_sm120a_and_sm90a(provisioned_box):
    box = provisioned_box
    box.sh(f"mkdir -p /tmp/k && echo '{KERNEL}' > /tmp/k/k.cu && cd /tmp/k && "
           "env -i PATH=/usr/bin:/bin /usr/local/cuda-13.0/bin/nvcc -c k.cu -o k.o "
           "-gencode arch=compute_120a,code=sm_120a -gencode arch=compute_90a,code=sm_90a")
    local = REPO / "build" / "k.o"
    local.parent.mkdir(exist_ok=True)
    subprocess.run(["docker", "cp", f"{box.name}:/tmp/k/k.o", str(local)], check=True)
    assert read_shared_object(local, "k.o").cubins == ["120a", "90a"]  # rig's own reader, no cuobjdump


def test_fresh_shell_resolves_sonames_and_nvrtc_compiles_by_soname(provisioned_box):
    cache = provisioned_box.sh("env -i /sbin/ldconfig -p").stdout
    assert "libnvrtc.so.13 " in cache and "libcudart.so.13 " in cache
    probe = provisioned_box.sh("env -i /usr/bin/python3 - <<'EOF'\n"
                               "import ctypes; ctypes.CDLL('libnvrtc.so.13'); print('loaded')\nEOF")
    assert probe.stdout.strip() == "loaded"
    done = rig("doctor", "--container", provisioned_box.name, "--json", "--stack", CUDA_STACK)
    report = json.loads(done.stdout)
    assert done.returncode == 0, done.stdout
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["compile-sm_120a"] == "pass" and statuses["compile-sm_90a"] == "pass"
    assert statuses["nvidia-smi"] == "skip"  # no driver in a box: a skip, not a crash


def test_second_converge_changes_nothing(provisioned_box):
    again = provisioned_box.play("site.yml", rig_stack=CUDA_STACK).expect_ok()
    assert again.recap("changed") == 0


def test_check_diff_on_a_fresh_box_fails_nothing_and_changes_nothing(box):
    snapshot = "ls -laR /usr/local /etc/ld.so.conf.d 2>&1; ls -la /var/lib/rig /var/cache/rig 2>&1"
    before = box.sh(snapshot, check=False).stdout
    dry = box.play("site.yml", "--check", "--diff", rig_stack=CUDA_STACK).expect_ok()
    assert dry.recap("failed") == 0
    assert dry.recap("changed") >= 1  # it says what it would do
    assert "would install CUDA 13.0.2" in dry.output
    assert box.sh(snapshot, check=False).stdout == before


def test_doctor_passes_when_provisioned_and_names_the_soname_when_only_the_toolkit_ran(box):
    box.play("cuda.yml", "--skip-tags", "cuda_ldconfig").expect_ok()
    assert box.exists("/usr/local/cuda-13.0/bin/nvcc")
    done = rig("doctor", "--container", box.name, "--json", "--stack", CUDA_STACK)
    assert done.returncode == 1
    failed = {c["name"]: c for c in json.loads(done.stdout)["checks"] if c["status"] == "fail"}
    assert "libnvrtc.so.13" in failed and "libcudart.so.13" in failed
    assert "libnvrtc.so.13" in failed["compile-sm_120a"]["detail"]
    assert "cuda_ldconfig" in failed["libnvrtc.so.13"]["fix"]
    # the same box passes once the ldconfig role ran
    box.play("cuda.yml").expect_ok()
    assert rig("doctor", "--container", box.name, "--stack", CUDA_STACK).returncode == 0


def test_a_run_killed_mid_install_leaves_no_partial_tree_and_a_rerun_converges(box):
    play = subprocess.Popen(playbook_cmd([box], "cuda.yml"), cwd=REPO, env=ansible_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not box.exists("/usr/local/.cuda-13.0.rig-staging-*/lib64/libcudart.so.13"):
        assert play.poll() is None and time.monotonic() < deadline, "the install never started staging"
        time.sleep(0.2)
    box.sh("pkill -9 -f '[.]pyz cuda install '")  # the engine, from the bundle the host keeps
    play.communicate(timeout=120)
    assert play.returncode != 0
    assert not box.exists("/usr/local/cuda-13.0")
    assert box.exists("/usr/local/.cuda-13.0.rig-staging-*")  # the kill did hit the install

    box.play("cuda.yml").expect_ok()
    assert "release 13.0" in box.sh("/usr/local/cuda-13.0/bin/nvcc --version").stdout
    assert box.sh("ls -a /usr/local").stdout.count("rig-staging") == 0


def test_an_unknown_cuda_version_stops_naming_it_and_changes_nothing(box):
    before = box.sh("ls -la /usr/local /etc/ld.so.conf.d").stdout
    bad = box.play("cuda.yml", cuda_toolkit_version="13.0.9")
    assert not bad.ok
    assert "unknown CUDA version '13.0.9'" in bad.output
    assert box.sh("ls -la /usr/local /etc/ld.so.conf.d").stdout == before


def test_a_runfile_with_the_wrong_sha256_stops_naming_it_and_changes_nothing(box, tmp_path):
    runfile = tmp_path / "cuda_13.0.2_linux.run"
    runfile.write_text("#!/bin/sh\necho this installer must never run\nexit 1\n")
    wrong = "0" * 64
    before = box.sh("ls -la /usr/local /etc/ld.so.conf.d").stdout
    bad = box.play("cuda.yml", cuda_toolkit_method="runfile",
                   cuda_toolkit_runfile_url=f"file://{runfile}", cuda_toolkit_runfile_sha256=wrong)
    assert not bad.ok
    assert f"runfile file://{runfile} has sha256" in bad.output and f"expected {wrong}" in bad.output
    assert box.sh("ls -la /usr/local /etc/ld.so.conf.d").stdout == before


def test_apt_and_runfile_methods_pass_check_mode_and_change_nothing(box):
    box.sh("echo not-a-real-key > /tmp/cuda-keyring.gpg")
    before = box.sh("ls -laR /usr/local /etc/apt", check=False).stdout
    apt = box.play("cuda.yml", "--check", "--diff", "--skip-tags", "cuda_ldconfig",
                   cuda_toolkit_method="apt", cuda_toolkit_apt_repo_url="https://cuda-repo.invalid/debian12/x86_64/",
                   cuda_toolkit_apt_keyring_url="file:///tmp/cuda-keyring.gpg").expect_ok()
    assert apt.recap("failed") == 0 and apt.recap("changed") >= 2  # key and repository
    runfile = box.play("cuda.yml", "--check", "--diff", "--skip-tags", "cuda_ldconfig",
                       cuda_toolkit_method="runfile", cuda_toolkit_runfile_url="https://cuda.invalid/cuda.run",
                       cuda_toolkit_runfile_sha256="1" * 64).expect_ok()
    assert "would install CUDA 13.0.2" in runfile.output
    assert box.sh("ls -laR /usr/local /etc/apt", check=False).stdout == before


def test_the_apt_method_without_a_repository_says_which_variables_to_set(box):
    bad = box.play("cuda.yml", "--skip-tags", "cuda_ldconfig", cuda_toolkit_method="apt")
    assert not bad.ok
    assert "needs cuda_toolkit_apt_repo_url" in bad.output
