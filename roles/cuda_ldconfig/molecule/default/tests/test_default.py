"""Verify the cuda_ldconfig role on the converged container (testinfra)."""
import json


def test_one_conf_file_for_the_toolkit(host):
    conf = host.file("/etc/ld.so.conf.d/rig-cuda-13-0.conf")
    assert conf.exists and conf.mode == 0o644
    assert "/usr/local/cuda-13.0/lib64" in conf.content_string


def test_sonames_resolve_without_ld_library_path(host):
    cache = host.check_output("env -i /sbin/ldconfig -p")
    for soname in ("libcudart.so.13", "libnvrtc.so.13", "libnvrtc-builtins.so.13.0"):
        assert soname in cache


def test_nvrtc_compiles_by_soname_in_a_clean_environment(host):
    script = (
        "import ctypes, json; lib = ctypes.CDLL('libnvrtc.so.13'); p = ctypes.c_void_p();"
        "lib.nvrtcCreateProgram(ctypes.byref(p), b'__global__ void k(){}', b'k.cu', 0, None, None);"
        "o = (ctypes.c_char_p * 1)(b'--gpu-architecture=sm_120a');"
        "print(json.dumps(lib.nvrtcCompileProgram(p, 1, o)))"
    )
    out = host.check_output(f"env -i /usr/bin/python3 -c \"{script}\"")
    assert json.loads(out) == 0
