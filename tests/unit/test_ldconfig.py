"""ld.so.conf.d content: every directory of a tree that holds a shared object."""
from rig.ldconfig import conf_for


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
