"""ld.so.conf.d content: every directory of a tree that holds a shared object."""
import json
import os
import sys
from pathlib import Path

from harness.commands import rig, run
from harness.paths import REPO

from rig.cuda import ldconfig
from rig.cuda.ldconfig import SBIN, conf_for
from rig.machine.doctor import _libraries


def test_conf_lists_every_library_directory_once(tmp_path):
    tree = tmp_path / "cuda-13.0"
    for rel in ("lib64/libcudart.so.13", "lib64/libnvrtc-builtins.so.13.0", "nvvm/lib64/libnvvm.so.4",
                "lib64/stubs/libcuda.so", "bin/nvcc"):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(b"\x7fELF")
    conf = conf_for("13.0.2", str(tmp_path), "/etc/ld.so.conf.d")
    assert conf["path"] == "/etc/ld.so.conf.d/rig-cuda-13-0.conf"
    assert conf["dirs"] == [str(tree / "lib64"), str(tree / "nvvm" / "lib64")]
    assert conf["content"].splitlines()[1:] == conf["dirs"]


def test_conf_for_a_toolkit_not_yet_installed_names_the_conventional_dir(tmp_path):
    conf = conf_for("13.0.2", str(tmp_path))
    assert conf["installed"] is False
    assert conf["dirs"] == [str(tmp_path / "cuda-13.0" / "lib64")]


def test_driver_compat_libraries_and_tool_private_dirs_are_left_out(tmp_path):
    # the layout of an apt-installed CUDA 13.0 (seen on the H200 machine)
    tree = tmp_path / "cuda-13.0"
    for rel in ("targets/x86_64-linux/lib/libcudart.so.13", "compat/libcuda.so.580.65.06",
                "compute-sanitizer/x86/libsanitizer-collection.so", "nvvm/lib64/libnvvm.so.4",
                "nsight-compute-2025.3.1/host/libQt6Core.so.6", "targets/x86_64-linux/lib/stubs/libcuda.so"):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(b"\x7fELF")
    (tree / "lib64").symlink_to("targets/x86_64-linux/lib")
    assert conf_for("13.0.2", str(tmp_path))["dirs"] == [
        str(tree / "nvvm" / "lib64"), str(tree / "targets" / "x86_64-linux" / "lib")]


def test_an_image_staging_tree_is_scanned_where_it_is_and_written_as_seen_from_root(tmp_path):
    """The image's toolkit stage assembles the tree under /out; the file must name /usr/local paths."""
    staging = tmp_path / "out"
    tree = staging / "usr" / "local" / "cuda-13.0"
    for rel in ("lib64/libcudart.so.13", "nvvm/lib64/libnvvm.so.4"):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(b"\x7fELF")
    done = rig("cuda", "ldconfig-conf", "--version", "13.0.2", "--prefix", "/usr/local", "--root", str(staging),
               "--write-under", str(staging), "--json")
    assert done.returncode == 0, done.stderr
    written = staging / "etc" / "ld.so.conf.d" / "rig-cuda-13-0.conf"
    assert written.read_text().splitlines()[1:] == ["/usr/local/cuda-13.0/lib64", "/usr/local/cuda-13.0/nvvm/lib64"]


def test_ldconfig_conf_refuses_a_version_that_is_not_a_release(tmp_path):
    done = rig("cuda", "ldconfig-conf", "--version", "13/../../etc", "--write-under", str(tmp_path))
    assert done.returncode == 2 and "give a CUDA release like 13.0" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_doctor_finds_ldconfig_off_a_users_path(tmp_path):
    """A non-root user on Debian has no /sbin on PATH; the linker cache is still read."""
    assert any(Path(p).is_file() for p in SBIN)
    done = run([sys.executable, "-c", "from rig.machine.doctor import _libraries; import json; "
                "print(json.dumps([c.name for c in _libraries('13.0.2')]))"],
               env={**os.environ, "PATH": str(tmp_path)}, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["libcudart.so.13", "libnvrtc.so.13", "libnvrtc-builtins.so.13.0"]


def test_doctor_without_any_ldconfig_reports_a_failed_check(monkeypatch):
    monkeypatch.setattr(ldconfig.shutil, "which", lambda name: None)
    monkeypatch.setattr(ldconfig, "SBIN", ())
    [check] = _libraries("13.0.2")
    assert check.status == "fail" and "ldconfig not found" in check.detail and check.fix
