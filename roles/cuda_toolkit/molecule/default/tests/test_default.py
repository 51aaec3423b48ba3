"""Verify the cuda_toolkit role on the converged container (testinfra)."""

TREE = "/usr/local/cuda-13.0"


def test_nvcc_reports_the_installed_release(host):
    out = host.check_output(f"{TREE}/bin/nvcc --version")
    assert "release 13.0" in out


def test_tree_has_the_layout_nvcc_and_linkers_expect(host):
    for rel in ("bin/ptxas", "nvvm/bin/cicc", "nvvm/libdevice/libdevice.10.bc",
                "include/cuda_runtime.h", "lib64/libcudart.so.13", "lib64/libnvrtc.so.13",
                "lib64/libnvrtc-builtins.so.13.0", "lib64/libcudart.so"):
        assert host.file(f"{TREE}/{rel}").exists, rel


def test_no_staging_leftovers_and_default_link_untouched(host):
    assert host.run("ls -a /usr/local | grep -c rig-staging").stdout.strip() == "0"
    assert not host.file("/usr/local/cuda").exists


def test_nvcc_compiles_for_sm120a(host):
    host.run_expect([0], "printf '__global__ void k(float *x) { x[0] = 1; }\\n' > /tmp/k.cu")
    host.run_expect([0], f"{TREE}/bin/nvcc -cubin -arch=sm_120a -o /tmp/k.cubin /tmp/k.cu")
    assert host.file("/tmp/k.cubin").size > 0
