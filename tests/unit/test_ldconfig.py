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
