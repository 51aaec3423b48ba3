"""Doctor's machine layer judged on recorded machines: tests/data/gpu-health/h200x2-vm.json is
`rig.gpu_health.collect()` on the lent 2-GPU H200 (a VM; docs/validation/serving-h200/). Each
other case changes one recorded output the way that fault shows in it."""
import copy
import json
from pathlib import Path

import pytest

from rig.machine import gpu_health

H200 = json.loads((Path(__file__).parent.parent / "data" / "gpu-health" / "h200x2-vm.json").read_text())
# nvidia-smi topo -m of an 8-GPU PCIe box (RTX PRO 6000 class), in the recorded shape: tabs, legend after
PCIE8 = "\t" + "\t".join(f"GPU{i}" for i in range(8)) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n" + "".join(
    f"GPU{i}\t" + "\t".join(" X " if i == j else ("NODE" if i // 4 == j // 4 else "SYS") for j in range(8))
    + f"\t0-63\t{i // 4}\t\tN/A\n" for i in range(8)) + "\nLegend:\n\n  X    = Self\n"


def judged(raw: dict, **kw) -> dict:
    return {c.name: c for c in gpu_health.checks(raw, **kw)}


def changed(**parts) -> dict:
    raw = copy.deepcopy(H200)
    raw.update(parts)
    return raw


def test_the_recorded_h200_passes_every_layer():
    checks = judged(H200, expect_gpus=2, pcie_only_env=False)
    assert {n: c.status for n, c in checks.items()} == {
        "driver-module": "pass", "gpu-count": "pass", "one-capability": "pass", "persistence": "pass",
        "pcie-link": "pass", "ecc": "pass", "row-remap": "pass", "fabric-manager": "pass",
        "container-runtime": "skip", "topology": "pass", "pcie-p2p": "pass"}
    assert checks["topology"].detail == "2 GPU(s), NVLink (NV18)"
    assert "peer over NVLink" in checks["pcie-p2p"].detail  # recorded before rig read the peer path: not needed
    assert "gen 5 x16" in checks["pcie-link"].detail
    assert "managed outside this host" in checks["fabric-manager"].detail


def test_the_recorded_single_h200_passes_with_nothing_to_link():
    raw = json.loads((Path(__file__).parent.parent / "data" / "gpu-health" / "h200x1-vm.json").read_text())
    checks = judged(raw, expect_gpus=1)
    assert [n for n, c in checks.items() if c.status == "fail"] == []
    assert checks["topology"].detail == "1 GPU(s), single GPU" and checks["fabric-manager"].status == "skip"
    assert judged(raw, expect_gpus=8)["gpu-count"].status == "fail"  # an 8-GPU stack on this box
    # the stack's tp is a floor (a box may hold more GPUs than one server uses); --expect-gpus is exact
    assert judged(H200, expect_gpus=1, at_least=True)["gpu-count"].status == "pass"
    assert judged(H200, expect_gpus=1)["gpu-count"].status == "fail"


def test_a_module_that_differs_from_userspace_means_reboot():
    mismatch = {"rc": 18, "out": "Failed to initialize NVML: Driver/library version mismatch\n"
                                 "NVML library version: 580.159.04\n"}
    check = judged(changed(module="580.95.05", query=mismatch))["driver-module"]
    assert check.status == "fail" and check.detail.startswith("reboot required: the loaded kernel module is "
                                                               "580.95.05, the installed userspace driver is 580.159.04")
    assert "reboot" in check.fix


def test_no_driver_at_all_names_the_role():
    check = judged(changed(module=None, query={"rc": None, "out": ""}), expect_gpus=8)["driver-module"]
    assert check.status == "fail" and "nvidia_driver role" in check.fix


def test_gpu_count_persistence_and_mixed_capabilities():
    query = {"rc": 0, "out": "0, NVIDIA H200, 9.0, 580.159.04, Enabled, 5, 5, 16, 16\n"
                             "1, NVIDIA RTX PRO 6000, 12.0, 580.159.04, Disabled, 5, 5, 16, 16\n"}
    checks = judged(changed(query=query), expect_gpus=8)
    assert checks["gpu-count"].status == "fail" and checks["gpu-count"].detail == "2 GPU(s), 8 expected"
    assert checks["one-capability"].status == "fail" and "9.0, 12.0" in checks["one-capability"].detail
    assert checks["persistence"].status == "fail" and checks["persistence"].detail.endswith("GPU 1")
    assert not checks["persistence"].required and "nvidia-persistenced" in checks["persistence"].fix


def test_a_narrow_pcie_link_is_a_warning():
    query = {"rc": 0, "out": "0, NVIDIA H200, 9.0, 580.159.04, Enabled, 5, 5, 16, 16\n"
                             "1, NVIDIA H200, 9.0, 580.159.04, Enabled, 5, 5, 8, 16\n"}
    check = judged(changed(query=query))["pcie-link"]
    assert check.status == "warn" and not check.required
    assert check.detail.startswith("GPU 1 gen 5 x8 of gen 5 x16") and "reseat" in check.fix


def test_ecc_errors_and_pending_row_remaps_fail():
    checks = judged(changed(ecc={"rc": 0, "out": "0, 0\n1, 3\n"},
                            remap={"rc": 0, "out": "00000000:00:06.0, 0, No, No\n00000000:00:07.0, 1, Yes, No\n"}))
    assert checks["ecc"].status == "fail" and "GPU 1: 3" in checks["ecc"].detail
    assert checks["row-remap"].status == "fail" and "pending on 00000000:00:07.0" in checks["row-remap"].detail


def test_fabric_manager_on_a_board_with_nvswitch():
    details = H200["details"]["out"].replace("State                                          : Completed",
                                             "State                                          : In Progress")
    local = changed(nvswitch_devices=["0", "1"], fabricmanager={"rc": 3, "out": "inactive\n"})
    check = judged(local)["fabric-manager"]
    assert check.status == "fail" and "nvidia-fabricmanager not active" in check.detail
    assert judged(changed(details={"rc": 0, "out": details}))["fabric-manager"].status == "fail"
    up = changed(nvswitch_devices=["0"], fabricmanager={"rc": 0, "out": "active\n"})
    assert judged(up)["fabric-manager"].status == "pass"
    no_fabric = H200["details"]["out"].replace("State                                          : Completed",
                                               "State                                          : N/A")
    assert judged(changed(details={"rc": 0, "out": no_fabric}))["fabric-manager"].status == "skip"


def test_the_container_runtime():
    checks = judged(changed(docker_runtimes={"rc": 0, "out": '{"io.containerd.runc.v2":{},"runc":{}}\n'}))
    assert checks["container-runtime"].status == "fail" and "nvidia-ctk runtime configure" in checks["container-runtime"].fix
    with_nvidia = changed(docker_runtimes={"rc": 0, "out": '{"nvidia":{"path":"nvidia-container-runtime"},"runc":{}}'})
    assert judged(with_nvidia)["container-runtime"].status == "pass"
    assert judged(changed(cdi_specs=["/etc/cdi/nvidia.yaml"]))["container-runtime"].status == "pass"


def test_a_pcie_box_gets_the_stacks_pcie_advice():
    raw = changed(topology={"rc": 0, "out": PCIE8})
    topo = gpu_health.topology(PCIE8)
    assert topo["gpus"] == 8 and len(topo["links"]) == 28
    check = judged(raw, pcie_only_env=False)["topology"]
    assert check.status == "warn" and check.detail.startswith("8 GPU(s), PCIe (farthest hop SYS)")
    assert "nccl_pcie_only: true" in check.fix
    assert judged(raw, pcie_only_env=True)["topology"].status == "pass"
    assert judged(H200, pcie_only_env=True)["topology"].status == "warn"  # NVLink box told to act as PCIe


def peer_path(iommu: str | None, acs: str | None, cmdline: str = "BOOT_IMAGE=/vmlinuz ro quiet") -> dict:
    """The peer path of the 8-GPU PCIe box: two GPUs under each of four switch ports, below two root ports;
    each GPU's IOMMU group type as the kernel writes it, each bridge's ACSCtl line as lspci -vvv prints it."""
    gpus = [{"gpu": f"0000:{r + 2 + 2 * port + g:02x}:00.0", "iommu_type": iommu,
             "bridges": [f"0000:{r:02x}:01.0", f"0000:{r + 1:02x}:0{port}.0"]}
            for r in (0x10, 0x80) for port in range(2) for g in range(2)]
    every = sorted({b for g in gpus for b in g["bridges"]})
    return {"cmdline": cmdline, "gpus": gpus, "acs": dict.fromkeys(every, acs), "lspci": True}


REDIRECT = "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"
PLAIN = "SrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-"


def test_a_translating_iommu_with_acs_redirect_fails_pcie_p2p_with_the_fix_and_passthrough_passes():
    pcie = {"topology": {"rc": 0, "out": PCIE8}}
    bad = judged(changed(**pcie, peer_path=peer_path("DMA-FQ", REDIRECT, "ro intel_iommu=on")))["pcie-p2p"]
    assert bad.status == "fail" and bad.required
    assert bad.detail.startswith("IOMMU translating for 8 of 8 GPU(s) (kernel: intel_iommu=on) and ACS "
                                 "redirecting on 0000:10:01.0, 0000:11:00.0") and "hang or return corrupt" in bad.detail
    assert "iommu=pt" in bad.fix and "ACS" in bad.fix and "NCCL_P2P_DISABLE=1" in bad.fix
    good = judged(changed(**pcie, peer_path=peer_path("identity", PLAIN, "ro intel_iommu=on iommu=pt")))["pcie-p2p"]
    assert good.status == "pass" and "passthrough or off (kernel: intel_iommu=on iommu=pt)" in good.detail
    translated = judged(changed(**pcie, peer_path=peer_path("DMA", PLAIN)))["pcie-p2p"]
    assert translated.status == "warn" and not translated.required and "iommu=pt" in translated.fix
    redirect = judged(changed(**pcie, peer_path=peer_path(None, REDIRECT)))["pcie-p2p"]
    assert redirect.status == "warn" and "root complex" in redirect.detail and "setpci" in redirect.fix
    unread = judged(changed(**pcie, peer_path={**peer_path("identity", None), "lspci": False}))["pcie-p2p"]
    assert unread.status == "pass" and "ACS not read (no lspci: install pciutils)" in unread.detail
    assert judged(changed(**pcie))["pcie-p2p"].status == "skip"  # a record from before rig read the path


def test_the_peer_path_is_read_from_sysfs_without_following_special_files(tmp_path, monkeypatch):
    import os

    devices = tmp_path / "devices"
    real = tmp_path / "pci0000:00" / "0000:00:01.0" / "0000:01:00.0"
    real.mkdir(parents=True)
    (real / "vendor").write_text("0x10de\n")
    (real / "class").write_text("0x030200\n")
    group = tmp_path / "groups" / "7"
    group.mkdir(parents=True)
    os.mkfifo(group / "type")  # a reader of it would wait forever: rig reads only regular files
    (real / "iommu_group").symlink_to(group)
    devices.mkdir()
    (devices / "0000:01:00.0").symlink_to(real)
    monkeypatch.setenv("PATH", str(tmp_path / "no-lspci"))
    found = gpu_health.peer_path(str(devices))
    assert found["gpus"] == [{"gpu": "0000:01:00.0", "iommu_type": None, "bridges": ["0000:00:01.0"]}]
    assert found["acs"] == {"0000:00:01.0": None} and found["lspci"] is False
    (group / "type").unlink()
    (group / "type").write_text("identity\n")
    assert gpu_health.peer_path(str(devices))["gpus"][0]["iommu_type"] == "identity"


@pytest.mark.parametrize("record", ["x", {"gpus": ["x"]}, {"gpus": [{}]}, {"gpus": [{"gpu": "a", "iommu_type": 5}]},
                                    {**peer_path("DMA", PLAIN), "acs": ["x"]}, {**peer_path("DMA", PLAIN), "cmdline": 5},
                                    {**peer_path("DMA", PLAIN), "acs": {"0000:10:01.0": 5}}])
def test_a_peer_path_record_of_another_shape_is_skipped_not_a_crash(record):
    check = judged(changed(topology={"rc": 0, "out": PCIE8}, peer_path=record))["pcie-p2p"]
    assert check.status == "skip" and not check.required
