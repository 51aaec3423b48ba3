"""Verify the nvidia_driver role on the converged box (testinfra)."""


def version(host, package):
    return host.check_output(f"dpkg-query -W -f='${{Version}}' {package}")


def test_the_pinned_driver_is_installed_not_the_newest(host):
    assert version(host, "nvidia-driver-580-open") == "580.159.04-1"


def test_the_driver_and_fabric_manager_are_held(host):
    held = host.check_output("dpkg --get-selections | awk '$2 == \"hold\" {print $1}'").split()
    assert sorted(held) == ["nvidia-driver-580-open", "nvidia-fabricmanager-580"]
    # a full upgrade keeps them back, though a newer version (580.200.00) is in the repository
    upgrade = host.check_output("apt-get -s dist-upgrade")
    assert "Inst nvidia" not in upgrade and "kept back" in upgrade


def test_the_fabric_manager_matches_the_driver_exactly(host):
    assert version(host, "nvidia-fabricmanager-580") == version(host, "nvidia-driver-580-open")


def test_nouveau_is_blacklisted(host):
    conf = host.file("/etc/modprobe.d/rig-blacklist-nouveau.conf")
    assert conf.exists and "blacklist nouveau" in conf.content_string


def test_the_source_is_signed_by_its_own_key(host):
    source = host.file("/etc/apt/sources.list.d/nvidia.list").content_string
    assert "deb [signed-by=/usr/share/keyrings/nvidia-archive-keyring.gpg] file:///srv/nvidia/repo /" in source
    assert "trusted=yes" not in source
    assert host.file("/usr/share/keyrings/nvidia-archive-keyring.gpg").exists


def test_dkms_and_the_running_kernels_headers(host):
    kernel = host.check_output("uname -r")
    for package in ("dkms", f"linux-headers-{kernel}"):
        assert host.package(package).is_installed
