"""The machine under the stack: driver module, persistence, fabric manager, GPU count and
capability, PCIe links, ECC and row remapping, container runtime, topology, and what carries
peer-to-peer traffic on PCIe boxes (the IOMMU's mode, ACS redirection on the bridges above the GPUs).

`collect()` reads the raw facts (nvidia-smi's outputs, sysfs, systemctl, docker);
`checks()` judges them. The two are apart so every judgement is tested on recorded
outputs of real machines (tests/data/gpu-health/) and a box can be recorded once
and judged anywhere.
"""
from __future__ import annotations

import csv
import io
import re
import shutil
from pathlib import Path

from rig.core import RigError
from rig.core.check import Check
from rig.core.documents import parse_json
from rig.core.proc import run

QUERY = ("index", "name", "compute_cap", "driver_version", "persistence_mode", "pcie.link.gen.current",
         "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max")
ECC_QUERY = ("index", "ecc.errors.uncorrected.volatile.total")
REMAP_QUERY = ("gpu_bus_id", "remapped_rows.uncorrectable", "remapped_rows.pending", "remapped_rows.failure")
MODULE_VERSION = "/sys/module/nvidia/version"
CDI_SPECS = ("/etc/cdi/nvidia.yaml", "/var/run/cdi/nvidia.yaml", "/etc/cdi/nvidia.json", "/var/run/cdi/nvidia.json")
DRIVER_FIX = "install the NVIDIA driver (the nvidia_driver role: 580 branch, open kernel modules for Blackwell)"


PCI_ROOT = "/sys/bus/pci/devices"
NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # PCI display and 3D controllers


def _small_text(path: Path) -> str | None:
    """A sysfs or procfs file's text; None when it is not there or not a regular file (never waited on)."""
    from rig.core.documents import read_text

    try:
        return read_text(path, "machine file").strip()
    except RigError:
        return None


def pci_devices(root: str = PCI_ROOT) -> dict:
    """NVIDIA's PCI functions by kind, from sysfs: read before any driver is installed (lspci's source).
    GPUs are display (0x0300) or 3D (0x0302) controllers; NVSwitches are 'other bridges' (0x0680)."""
    found = {"gpus": 0, "nvswitches": 0}
    for dev in sorted(Path(root).glob("*")) if Path(root).is_dir() else []:
        vendor, kind = _small_text(dev / "vendor"), _small_text(dev / "class") or ""
        if vendor != NVIDIA_VENDOR:
            continue
        if kind.startswith(GPU_CLASSES):
            found["gpus"] += 1
        elif kind.startswith("0x0680"):
            found["nvswitches"] += 1
    return found


def device_nodes(dev: str = "/dev") -> int:
    """The GPUs a process here can open: the driver's /dev/nvidiaN character devices (a container's own, where
    the PCI bus in sysfs shows the host's)."""
    import stat

    return sum(1 for node in Path(dev).glob("nvidia[0-9]*")
               if node.name[6:].isdigit() and stat.S_ISCHR(node.lstat().st_mode))


def docker_runtimes(config: str) -> list[str]:
    """The runtimes Docker's daemon configuration registers (none where there is no file yet)."""
    from rig.core.documents import load_json
    from rig.core.fs import MissingFile

    try:
        found = load_json(config, "Docker daemon configuration")
    except MissingFile:
        return []
    runtimes = found.get("runtimes", {}) if isinstance(found, dict) else None
    if not isinstance(runtimes, dict):
        raise RigError(f"{config} is not a Docker daemon configuration (a JSON object whose runtimes is an object); "
                       "fix it, or move it away for nvidia-ctk to write a new one")
    return sorted(str(name) for name in runtimes)


def module_version(path: str = MODULE_VERSION) -> str | None:
    return _small_text(Path(path)) or None


def _out(argv: list[str]) -> dict:
    """{"rc", "out"} of a command; rc None when it is not installed."""
    if not shutil.which(argv[0]):
        return {"rc": None, "out": ""}
    try:
        done = run(argv, f"reading the machine with {argv[0]}", timeout=60, ok=None)
    except RigError as exc:  # it could not start, or hung
        return {"rc": -1, "out": str(exc)}
    return {"rc": done.returncode, "out": done.stdout + done.stderr}


PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")  # VMD domains are 5 digits


def peer_path(root: str = PCI_ROOT) -> dict:
    """For each NVIDIA GPU function: its IOMMU group's type (DMA, DMA-FQ: translated; identity: passthrough) and
    the PCI bridges above it (from the device's sysfs path), with their ACS control line from lspci."""
    gpus: list[dict] = []
    for dev in sorted(Path(root).glob("*")) if Path(root).is_dir() else []:
        if _small_text(dev / "vendor") != NVIDIA_VENDOR or not (_small_text(dev / "class") or "").startswith(GPU_CLASSES):
            continue
        group = dev / "iommu_group"
        bridges = [part for part in dev.resolve().parts[:-1] if PCI_ADDRESS.fullmatch(part)]
        gpus.append({"gpu": dev.name, "iommu_type": _small_text(group / "type") if group.exists() else None,
                     "bridges": bridges})
    acs: dict[str, str | None] = {}
    for bridge in sorted({b for g in gpus for b in g["bridges"]}):
        shown = _out(["lspci", "-vvv", "-s", bridge])
        line = re.search(r"ACSCtl:\s*(.*)", shown["out"]) if shown["rc"] == 0 else None
        acs[bridge] = line.group(1).strip() if line else None
    return {"cmdline": _small_text(Path("/proc/cmdline")), "gpus": gpus, "acs": acs,
            "lspci": shutil.which("lspci") is not None}


def collect(module_path: str = MODULE_VERSION) -> dict:
    """Everything the checks read, as text: one JSON-able record of the machine."""
    smi = "nvidia-smi"
    module = module_version(module_path)
    return {
        "query": _out([smi, f"--query-gpu={','.join(QUERY)}", "--format=csv,noheader,nounits"]),
        "ecc": _out([smi, f"--query-gpu={','.join(ECC_QUERY)}", "--format=csv,noheader,nounits"]),
        "remap": _out([smi, f"--query-remapped-rows={','.join(REMAP_QUERY)}", "--format=csv,noheader,nounits"]),
        "details": _out([smi, "-q"]),
        "topology": _out([smi, "topo", "-m"]),
        "module": module,
        "nvswitch_devices": sorted(p.name for p in Path("/proc/driver/nvidia-nvswitch/devices").glob("*"))
        if Path("/proc/driver/nvidia-nvswitch/devices").is_dir() else [],
        "fabricmanager": _out(["systemctl", "is-active", "nvidia-fabricmanager"]),
        "docker_runtimes": _out(["docker", "info", "--format", "{{json .Runtimes}}"]),
        "cdi_specs": [p for p in CDI_SPECS if Path(p).is_file()],
        "peer_path": peer_path(),
    }


def _rows(text: str, names: tuple) -> list[dict]:
    rows = []
    for row in csv.reader(io.StringIO(text.strip())):
        if len(row) == len(names):
            rows.append({n: v.strip() for n, v in zip(names, row, strict=False)})
    return rows


def _number(value: str) -> int | None:
    return int(value) if re.fullmatch(r"\d+", value or "") else None


def gpus(raw: dict) -> list[dict]:
    query = raw.get("query") or {}
    return _rows(query.get("out", ""), QUERY) if query.get("rc") == 0 else []


def _userspace_version(raw: dict, found: list[dict]) -> str | None:
    if found:
        return found[0]["driver_version"]
    # with a mismatch nvidia-smi cannot start; it still names its NVML library's version
    match = re.search(r"NVML library version:\s*([\d.]+)", (raw.get("query") or {}).get("out", ""))
    return match.group(1) if match else None


def driver_checks(raw: dict) -> list[Check]:
    found = gpus(raw)
    userspace, module = _userspace_version(raw, found), raw.get("module")
    if module is None and userspace is None:
        return [Check("machine", "driver-module", "fail", "no NVIDIA kernel module loaded and no nvidia-smi",
                      DRIVER_FIX)]
    if module is None:
        return [Check("machine", "driver-module", "fail", f"userspace driver {userspace}, but no nvidia kernel "
                      "module is loaded", "reboot (or modprobe nvidia) so the installed module loads")]
    if userspace != module:
        return [Check("machine", "driver-module", "fail", f"reboot required: the loaded kernel module is {module}, "
                      f"the installed userspace driver is {userspace or 'unreadable'}",
                      "reboot the host so the module of the installed driver loads (nvidia_driver_allow_reboot)")]
    return [Check("machine", "driver-module", "pass", f"kernel module {module} = userspace {userspace}")]


def gpu_checks(raw: dict, expect_gpus: int | None, at_least: bool = False) -> list[Check]:
    """EXPECT_GPUS exactly, or at least that many (the stack's tp: a box may have more GPUs than one server uses)."""
    found = gpus(raw)
    if not found:
        return [Check("machine", "gpus", "fail" if expect_gpus else "skip", "nvidia-smi lists no GPUs",
                      DRIVER_FIX if expect_gpus else "", required=bool(expect_gpus))]
    checks = []
    if expect_gpus:
        ok = len(found) >= expect_gpus if at_least else len(found) == expect_gpus
        checks.append(Check("machine", "gpu-count", "pass" if ok else "fail",
                            f"{len(found)} GPU(s), {'at least ' if at_least else ''}{expect_gpus} expected",
                            "" if ok else "find the missing GPUs (nvidia-smi, dmesg: fallen off the bus?) or set "
                            "--expect-gpus / server.tp to the GPUs this box has"))
    ccs = sorted({g["compute_cap"] for g in found}, key=lambda cc: tuple(int(x) for x in re.findall(r"\d+", cc)))
    checks.append(Check("machine", "one-capability", "pass" if len(ccs) == 1 else "fail",
                        f"compute capability {', '.join(ccs)} across {len(found)} GPU(s)",
                        "" if len(ccs) == 1 else "serve from GPUs of one kind: mixed capabilities split one "
                        "tensor-parallel group (CUDA_VISIBLE_DEVICES)"))
    off = [g["index"] for g in found if g["persistence_mode"].lower() != "enabled"]
    checks.append(Check("machine", "persistence", "fail" if off else "pass",
                        f"persistence mode off on GPU {', '.join(off)}" if off else "persistence mode on every GPU",
                        "enable nvidia-persistenced (systemctl enable --now nvidia-persistenced; the nvidia_driver "
                        "role does)" if off else "", required=False))
    checks.append(_pcie(found))
    return checks


def _pcie(found: list[dict]) -> Check:
    degraded, unread = [], []
    for g in found:
        gen, gen_max = _number(g["pcie.link.gen.current"]), _number(g["pcie.link.gen.max"])
        width, width_max = _number(g["pcie.link.width.current"]), _number(g["pcie.link.width.max"])
        if gen is None or gen_max is None or width is None or width_max is None:
            unread.append(g["index"])
        elif width < width_max or gen < gen_max:
            degraded.append(f"GPU {g['index']} gen {gen} x{width} of gen {gen_max} x{width_max}")
    if degraded:
        return Check("machine", "pcie-link", "warn", "; ".join(degraded) + " (an idle GPU may lower its "
                     "generation to save power: measure under load before acting)",
                     "reseat the GPU or check the slot and riser; a narrower link than its maximum is a hardware "
                     "fault", required=False)
    if unread and len(unread) == len(found):
        return Check("machine", "pcie-link", "skip", "the driver does not report PCIe link state", required=False)
    g = found[0]
    return Check("machine", "pcie-link", "pass", f"every GPU at its maximum: gen {g['pcie.link.gen.max']} "
                 f"x{g['pcie.link.width.max']}", required=False)


def memory_checks(raw: dict) -> list[Check]:
    checks = []
    ecc = raw.get("ecc") or {}
    if ecc.get("rc") == 0:
        bad = [f"GPU {r['index']}: {r['ecc.errors.uncorrected.volatile.total']}" for r in
               _rows(ecc["out"], ECC_QUERY) if (_number(r["ecc.errors.uncorrected.volatile.total"]) or 0) > 0]
        checks.append(Check("machine", "ecc", "fail" if bad else "pass",
                            "uncorrectable ECC errors since boot: " + "; ".join(bad) if bad else
                            "no uncorrectable ECC errors since boot",
                            "drain the host, reset the GPU (nvidia-smi -r -i N) and watch it; replace it if they "
                            "return" if bad else ""))
    remap = raw.get("remap") or {}
    if remap.get("rc") == 0:
        rows = _rows(remap["out"], REMAP_QUERY)
        pending = [r["gpu_bus_id"] for r in rows if r["remapped_rows.pending"].lower() in ("yes", "1")]
        failed = [r["gpu_bus_id"] for r in rows if r["remapped_rows.failure"].lower() in ("yes", "1")]
        detail = ([f"row remap pending on {', '.join(pending)}"] if pending else []) + \
                 ([f"row remapping failed on {', '.join(failed)}"] if failed else [])
        checks.append(Check("machine", "row-remap", "fail" if detail else "pass",
                            "; ".join(detail) or f"no pending or failed row remaps on {len(rows)} GPU(s)",
                            "reset the GPU (or reboot) so pending remaps take effect; a failed remap means "
                            "replacing the GPU" if detail else ""))
    return checks


def _fabric(details: str) -> tuple[str | None, str | None]:
    """(State, Status) of the first GPU's Fabric section in `nvidia-smi -q`; N/A without NVSwitch."""
    match = re.search(r"\n\s*Fabric\s*\n\s*State\s*:\s*([^\n]+)\n\s*Status\s*:\s*([^\n]+)", details)
    return (match.group(1).strip(), match.group(2).strip()) if match else (None, None)


def fabric_checks(raw: dict, nvswitch: bool | None = None) -> list[Check]:
    """NVSwitch boards (HGX) start CUDA only once the fabric is up: a fabric manager of the driver's exact
    version runs on the host, or, in a VM of a shared NVSwitch system, outside it."""
    state, status = _fabric((raw.get("details") or {}).get("out", ""))
    local_switches = bool(raw.get("nvswitch_devices"))
    present = nvswitch if nvswitch is not None else local_switches or (state not in (None, "N/A"))
    if not present:
        return [Check("machine", "fabric-manager", "skip", "no NVSwitch fabric: no fabric manager needed",
                      required=False)]
    active = ((raw.get("fabricmanager") or {}).get("out") or "").strip() == "active"
    ready = (state or "").lower() == "completed" and (status or "").lower() == "success"
    ok = ready and (active or not local_switches)
    where = "nvidia-fabricmanager active here" if active else \
        ("nvidia-fabricmanager not active" if local_switches else "no NVSwitch device here: the fabric is managed "
         "outside this host")
    return [Check("machine", "fabric-manager", "pass" if ok else "fail",
                  f"NVLink fabric state {state or 'unknown'}, status {status or 'unknown'}; {where}",
                  "" if ok else "install nvidia-fabricmanager of exactly the driver's version and start it "
                  "(the nvidia_driver role does where NVSwitch is present)")]


def runtime_checks(raw: dict) -> list[Check]:
    runtimes = raw.get("docker_runtimes") or {}
    cdi = raw.get("cdi_specs") or []
    if runtimes.get("rc") is None and not cdi:
        return [Check("machine", "container-runtime", "skip", "no Docker here", required=False)]
    try:
        names = sorted(parse_json(runtimes.get("out") or "{}", "docker's runtimes")) if runtimes.get("rc") == 0 else []
    except RigError:
        names = []
    ok = "nvidia" in names or bool(cdi)
    seen = (f"docker runtimes: {', '.join(names)}" if names else "docker answered no runtimes") + \
        (f"; CDI specs: {', '.join(cdi)}" if cdi else "")
    return [Check("machine", "container-runtime", "pass" if ok else "fail", seen,
                  "" if ok else "install nvidia-container-toolkit and run `nvidia-ctk runtime configure "
                  "--runtime=docker` (or `nvidia-ctk cdi generate`); the nvidia_container_toolkit role does",
                  required=False)]


PCIE_HOPS = ("PIX", "PXB", "PHB", "NODE", "SYS")  # from nearest to farthest


def topology(text: str) -> dict:
    """The GPU-to-GPU link classes from `nvidia-smi topo -m`: NVLink (NV#) or PCIe (PIX..SYS)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # nvidia-smi underlines the header on a terminal
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return {"gpus": 0, "links": []}
    header = lines[0].split()
    gpu_cols = [i for i, h in enumerate(header) if re.fullmatch(r"GPU\d+", h)]
    links = []
    for ln in lines[1:]:
        cells = ln.split()
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        for col in gpu_cols:
            cell = cells[col + 1] if col + 1 < len(cells) else ""
            if cell != "X" and header[col] > cells[0]:
                links.append({"a": cells[0], "b": header[col], "link": cell})
    return {"gpus": len(gpu_cols), "links": links}


def link_class(topo: dict, nvswitch: bool) -> str:
    if topo["gpus"] <= 1:
        return "single GPU"
    kinds = {lk["link"] for lk in topo["links"]}
    if kinds and all(k.startswith("NV") for k in kinds):
        return "NVSwitch" if nvswitch else "NVLink"
    worst = max((PCIE_HOPS.index(k) for k in kinds if k in PCIE_HOPS), default=None)
    return "PCIe" + (f" (farthest hop {PCIE_HOPS[worst]})" if worst is not None else "")


def topology_check(raw: dict, pcie_only_env: bool | None = None) -> list[Check]:
    topo_out = raw.get("topology") or {}
    if topo_out.get("rc") != 0:
        return [Check("machine", "topology", "skip", "nvidia-smi topo -m gave nothing", required=False)]
    topo = topology(topo_out["out"])
    kind = link_class(topo, bool(raw.get("nvswitch_devices")))
    advice, status, fix = "", "pass", ""
    if kind.startswith("PCIe"):
        advice = ("; all-reduce goes over PCIe: expect speculation to pay at low concurrency only "
                  "(rig machine probe measures)")
        if pcie_only_env is False:
            status, fix = "warn", "set environment.nccl_pcie_only: true in the stack (NCCL_P2P_LEVEL=SYS and no NVLS)"
    elif kind in ("NVLink", "NVSwitch") and pcie_only_env:
        status, fix = "warn", "environment.nccl_pcie_only is meant for PCIe-only boxes; set it false here"
    pairs = ", ".join(sorted({lk["link"] for lk in topo["links"]}))
    return [Check("machine", "topology", status, f"{topo['gpus']} GPU(s), {kind}" + (f" ({pairs})" if pairs else "")
                  + advice, fix, required=False)]


P2P_IOMMU_FIX = ("boot with iommu=pt (intel_iommu=on iommu=pt, or amd_iommu=on iommu=pt) so GPU peer traffic "
                 "is not translated")
P2P_ACS_FIX = ("turn ACS redirection off on the switch ports above the GPUs (BIOS: ACS off; or setpci ECAP_ACS+6.w=0 "
               "on each bridge at boot)")
P2P_AT_A_COST = "; meanwhile NCCL_P2P_DISABLE=1 in the stack's environment.vars avoids it, at a cost"


def _peer_record(path: dict) -> bool:
    """Whether a (possibly recorded, possibly edited) peer path has the shape peer_path() writes."""
    text = (str, type(None))
    return (isinstance(path.get("gpus"), list) and isinstance(path.get("acs", {}), dict)
            and isinstance(path.get("cmdline"), text)
            and all(isinstance(g, dict) and isinstance(g.get("gpu"), str) and isinstance(g.get("iommu_type"), text)
                    for g in path["gpus"])
            and all(isinstance(v, text) for v in (path.get("acs") or {}).values()))


def peer_check(raw: dict) -> list[Check]:
    """PCIe peer-to-peer can hang or corrupt under a translating IOMMU with ACS redirecting requests upstream."""
    topo_out = raw.get("topology") or {}
    topo: dict = topology(topo_out.get("out", "")) if topo_out.get("rc") == 0 else {"gpus": 0, "links": []}
    path = raw.get("peer_path")
    if topo["gpus"] <= 1:
        return [Check("machine", "pcie-p2p", "skip", "fewer than two GPUs: no peer-to-peer", required=False)]
    kind = link_class(topo, bool(raw.get("nvswitch_devices")))
    if not kind.startswith("PCIe"):
        return [Check("machine", "pcie-p2p", "pass", f"the GPUs peer over {kind}: neither the IOMMU nor ACS "
                      "carries their traffic", required=False)]
    if not path or not isinstance(path, dict) or not path.get("gpus"):
        return [Check("machine", "pcie-p2p", "skip", "the GPUs' PCI paths were not read (no sysfs record)",
                      required=False)]
    if not _peer_record(path):
        return [Check("machine", "pcie-p2p", "skip", "the record's peer_path is not one rig.machine.gpu_health "
                      "wrote (record the machine again)", required=False)]
    return [_peer_path_check(path)]


def _peer_path_check(path: dict) -> Check:
    """The verdict on PCIe peers from their recorded PCI path: the IOMMU's mode per GPU, ACS above them."""
    types = {g["gpu"]: g.get("iommu_type") for g in path["gpus"]}
    translated = sorted(gpu for gpu, kind_ in types.items() if kind_ in ("DMA", "DMA-FQ"))
    redirecting = sorted(b for b, line in (path.get("acs") or {}).items()
                         if line and re.search(r"\b(ReqRedir|CmpltRedir)\+", line))
    unknown = "" if path.get("lspci") else "; ACS not read (no lspci: install pciutils)"
    kernel = " ".join(t for t in (path.get("cmdline") or "").split() if "iommu" in t)
    mode = (f"IOMMU translating for {len(translated)} of {len(types)} GPU(s)" if translated else
            "IOMMU in passthrough or off") + (f" (kernel: {kernel})" if kernel else "")
    if translated and redirecting:
        return Check("machine", "pcie-p2p", "fail", f"{mode} and ACS redirecting on {', '.join(redirecting)}: "
                     "PCIe peer-to-peer can hang or return corrupt data", P2P_IOMMU_FIX + "; and " + P2P_ACS_FIX
                     + P2P_AT_A_COST)
    if translated:
        return Check("machine", "pcie-p2p", "warn", f"{mode}: peer traffic is translated (slower)" + unknown,
                     P2P_IOMMU_FIX, required=False)
    if redirecting:
        return Check("machine", "pcie-p2p", "warn", f"{mode}, ACS redirecting on {', '.join(redirecting)}: peer "
                     "traffic goes up to the root complex", P2P_ACS_FIX, required=False)
    return Check("machine", "pcie-p2p", "pass", f"{mode}, no ACS redirection above the GPUs" + unknown,
                 required=False)


def checks(raw: dict, expect_gpus: int | None = None, nvswitch: bool | None = None,
           pcie_only_env: bool | None = None, at_least: bool = False) -> list[Check]:
    return (driver_checks(raw) + gpu_checks(raw, expect_gpus, at_least) + memory_checks(raw) + fabric_checks(raw, nvswitch)
            + runtime_checks(raw) + topology_check(raw, pcie_only_env) + peer_check(raw))
