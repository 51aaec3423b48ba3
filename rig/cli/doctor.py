"""`rig doctor`: layered health checks, or a log's known failures."""
from __future__ import annotations

import socket
from pathlib import Path

import click
from click.core import ParameterSource

from rig.cli.common import (
    DEFAULT_BUNDLE,
    arch_option,
    emit,
    json_option,
    judged,
    junit_option,
    log_option,
    need_stack,
    prefix_option,
    refuse_unused,
    stack_option,
    venv_option,
    write_junit,
)
from rig.cli.types import Choice, Number
from rig.core import check as report
from rig.core.documents import dump_json
from rig.machine import doctor as checks
from rig.machine.log_doctor import diagnose
from rig.python.lock import lock_path, read
from rig.stack.spec import load, pins_packages


@click.command()
@stack_option(required=False, help="The stack whose CUDA version, archs, venv, lock and TP the checks hold the box "
              "to, where --cuda, --arch and --venv do not say.")
@click.option("--cuda", "cuda_version", metavar="VERSION", help="CUDA release to expect (default: the stack's).")
@arch_option(help="Target arch, e.g. 12.0a; repeat (default: the stack's).")
@click.option("--attention-backend", "backends", multiple=True, metavar="NAME",
              help="An attention backend the server uses, e.g. fa3, whose kernels must run on every arch; repeat "
                   "(default: the stack's server.attention_backends).")
@venv_option(help="Check this venv against the stack's lock (where the stack pins no packages, only a venv "
                 "given is checked).")
@prefix_option
@click.option("--container", metavar="NAME", help="Run the checks inside this running container instead of here.")
@click.option("--expect-gpus", type=Number(int, 1), help="GPUs this box must have (default, where a driver is: "
              "the stack's server.tp).")
@log_option(help="Instead: read a server or build log and name each known failure, its cause and fix.")
@click.option("--layer", type=Choice(["toolkit", "libraries", "nvrtc"]),
              help="Only this layer's checks (the cuda_ldconfig role asks `libraries`: do the sonames resolve?).")
@junit_option
@json_option
def doctor(stack_path, cuda_version, archs, backends, venv_path, prefix, container, expect_gpus, log_path, layer,
           junit, as_json) -> None:
    """Check the machine, driver, GPUs, toolkits, ldconfig, an NVRTC compile and the venv, layer by layer.

    The machine layer: the loaded kernel module against the userspace driver
    (reboot required?), persistence, the fabric manager where NVSwitch is, the
    GPU count, one compute capability, PCIe links at their maximum, ECC errors
    and row remaps, the container runtime and the GPUs' topology. Each failed
    check names its fix. With --log, the log's known failures instead (rules in
    rig/log_rules.yml; no other option applies); exit 1 when one is found.
    """
    if log_path:
        refuse_unused("--log", "log_path")
        found = diagnose(log_path)
        emit(found, as_json)
        judged(not found["findings"])

    cuda_version, archs, backends, venv_path, default_gpus, pcie_only = _with_stack(
        stack_path, cuda_version, archs, backends, venv_path, layer)
    if container:
        result = checks.run_in_container(container, DEFAULT_BUNDLE, cuda_version, archs, prefix, venv_path,
                                         expect_gpus, layer, list(backends))
    elif layer:
        result = checks.ALONE[layer](cuda_version, list(archs), prefix)
    else:
        # what a venv rig did not install is held to: the stack's lock, where there is one
        lock_file = lock_path(stack_path) if venv_path and stack_path else None
        result = checks.run(cuda_version, list(archs), prefix, venv_path, expect_gpus, default_gpus, pcie_only,
                            lock=read(lock_file) if lock_file and lock_file.is_file() else None,
                            backends=list(backends))
    write_junit(junit, result, f"rig doctor {container or socket.gethostname()}")
    # a controller checked before anything was provisioned on it: the stack's venv is not here
    unprovisioned = venv_path if not container and not layer and not Path(venv_path or ".", "bin", "python").exists() \
        else None
    click.echo(dump_json(report.as_json(result), "the checks", indent=2) if as_json else
               checks.render(result, unprovisioned))
    judged(not report.failed(result))


def _with_stack(stack_path: str | None, cuda_version: str | None, archs: tuple, backends: tuple,
                venv_path: str | None, layer: str | None) -> tuple:
    """(CUDA version, archs, backends, venv, default GPUs, PCIe-only): the options, the stack's where they do not
    say. The stack is read when a check needs what only it says, or when it was named (option or $RIG_STACK)."""
    stack_given = click.get_current_context().get_parameter_source("stack_path") is not ParameterSource.DEFAULT
    if cuda_version and (archs or layer not in (None, "nvrtc")) and not stack_given:
        return cuda_version, archs, backends, venv_path, None, None
    data = load(need_stack(stack_path))
    return (cuda_version or data["cuda"]["version"], archs or data["archs"],
            backends or data["server"]["attention_backends"],
            venv_path or (data["venv"] if pins_packages(data) else None),
            data["server"]["tp"], data["environment"]["nccl_pcie_only"])
