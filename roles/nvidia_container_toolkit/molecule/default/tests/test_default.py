"""Verify the nvidia_container_toolkit role on the converged box (testinfra)."""
import json


def test_the_pinned_toolkit_is_installed_and_held(host):
    assert host.check_output("dpkg-query -W -f='${Version}' nvidia-container-toolkit") == "1.18.0-1"
    held = host.check_output("dpkg --get-selections nvidia-container-toolkit").split()
    assert held == ["nvidia-container-toolkit", "hold"]


def test_docker_knows_the_nvidia_runtime(host):
    config = json.loads(host.file("/etc/docker/daemon.json").content_string)
    assert config["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"


def test_a_cdi_spec_is_written(host):
    spec = host.file("/etc/cdi/nvidia.yaml")
    assert spec.exists and "kind: nvidia.com/gpu" in spec.content_string
