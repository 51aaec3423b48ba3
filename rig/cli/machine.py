"""`rig machine probe` and the `rig machine` group: the GPUs and the machine under the stack."""
from __future__ import annotations

from pathlib import Path

import click

from rig.cli.common import (
    driver_package_option,
    emit,
    group,
    json_option,
    judged,
    module_version_option,
    out_option,
    pci_root_option,
    python_option,
    stack_option,
    venv_of,
    venv_option,
)
from rig.cli.types import DIR, FILE, Number
from rig.core import RigError
from rig.core.proc import interpreter as resolved
from rig.machine import driver, gpu_health
from rig.machine import probe as probing


@click.command()
@venv_option(help="The stack's venv: its torch and NCCL run the all-reduce.")
@stack_option(required=False, help="The stack whose venv it is (when neither --venv nor --python is given).")
@python_option()
@click.option("--gpus", type=Number(int, 1), help="GPUs to all-reduce across (default: every GPU nvidia-smi lists).")
@out_option("probe-results", "probe.json, probe.md and probe.png.", ("probe.json", "probe.md", "probe.png"))
@json_option
def probe(venv_path, stack_path, python, gpus, out_dir, as_json) -> None:
    """Measure the GPUs' all-reduce (8 KB to 256 MB) and say what it means for the stack.

    One process per GPU through torch.distributed and NCCL in the stack's venv:
    latency of small messages, bus bandwidth (nccl-tests' busbw) of large ones,
    the link class they imply (NVLink or PCIe) and advice for the stack. Then
    every GPU pair's peer-to-peer: offered or not, a copy each way checked and
    timed, each pair under a deadline (a hang fails that pair, not the probe).
    """
    count = gpus or len(gpu_health.gpus(gpu_health.collect()))
    if not count:
        raise RigError("nvidia-smi lists no GPUs here: nothing to probe (install the driver, or give --gpus)")
    # --python as typed: ./x is a path
    interpreter = resolved(python or Path(venv_of(venv_path, stack_path)) / "bin" / "python")
    result = probing.analyse(probing.measure(interpreter, count))
    result["peers"] = probing.measure_peers(interpreter, count)
    files = probing.write(result, out_dir)
    emit({**result, "files": files, "msg": f"{result['world_size']} GPU(s), {result['link_class']}: peak busbw "
          f"{result['peak_busbw_gbps']:.1f} GB/s, small-message latency {result['small_message_latency_us'] or 0:.1f} us"
          f"; wrote {', '.join(files)}\n" + "\n".join(f"advice: {a}" for a in result["advice"] + result["peers"]["advice"])},
         as_json)
    judged(result["correct"] and result["peers"]["ok"])


@group()
def machine() -> None:
    """Facts about the machine under the stack (roles read them before a driver exists)."""


machine.add_command(probe)


@machine.command("facts")
@pci_root_option()
@module_version_option()
@click.option("--dev", default="/dev", show_default=True, type=DIR, metavar="DIR",
              help="Where the driver's device nodes are.")
@click.option("--docker-config", type=FILE, metavar="FILE",
              help="Also list the runtimes this Docker daemon configuration registers.")
@driver_package_option(help="Also say this driver package's installed version and whether the loaded module is it "
                            "(module_current).")
@click.option("--cdi-spec", type=FILE, metavar="FILE",
              help="Also list the host paths this CDI spec mounts that are gone (cdi_missing; cdi_current is false "
                   "then, or where there is no spec).")
@json_option
def machine_facts(pci_root, module_version_path, dev, docker_config, driver_package, cdi_spec, as_json) -> None:
    """NVIDIA GPUs and NVSwitches on the PCI bus, the GPU device nodes a process here can open, and the
    loaded driver module's version (and with --docker-config, the container runtimes Docker has)."""
    facts = {**gpu_health.pci_devices(pci_root), "device_nodes": gpu_health.device_nodes(dev),
             "module_version": gpu_health.module_version(module_version_path)}
    if docker_config:
        facts["docker_runtimes"] = gpu_health.docker_runtimes(docker_config)
    if driver_package:
        have = driver.installed(driver_package)
        facts.update(driver_installed=have["upstream"], driver_installed_package=have["version"],
                     module_current=bool(have["upstream"]) and facts["module_version"] == have["upstream"])
    if cdi_spec:
        missing = driver.cdi_missing(cdi_spec)
        facts.update(cdi_missing=missing or [], cdi_current=missing == [])
    emit(facts, as_json)
