"""The NVIDIA driver on a host as the driver role and a day-two upgrade see it: what dpkg installed and holds,
whether the loaded kernel module is that driver, whether the CDI spec still names files that exist, and
what the stack's CUDA and GPUs ask of a driver (the guard rails an upgrade checks before it changes anything).
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from rig.core import RigError
from rig.core.proc import run

# The lowest Linux driver each CUDA release needs at GA, from NVIDIA's CUDA Toolkit release notes (table
# "CUDA Toolkit and Corresponding Driver Versions"). A release newer than the table needs at least the last row.
MIN_DRIVER = {"12.0": "525.60.13", "12.1": "530.30.02", "12.2": "535.54.03", "12.3": "545.23.06",
              "12.4": "550.54.14", "12.5": "555.42.02", "12.6": "560.28.03", "12.8": "570.26",
              "12.9": "575.51.03", "13.0": "580.65.06"}
OPEN_ONLY_FROM = 10  # Blackwell (SM 10.x and 12.x) runs only on the open kernel modules
PACKAGE_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]{0,99}")
PACKAGE_VERSION = re.compile(r"([0-9]+:)?[0-9][A-Za-z0-9.+~-]{0,99}|")  # "" where none is installed
VERSION = re.compile(r"[0-9]+(\.[0-9]+){0,3}")


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def upstream(package_version: str) -> str:
    """'1:580.159.04-1ubuntu1' -> '580.159.04': the driver's own version in a Debian package version."""
    return package_version.split(":", 1)[-1].rsplit("-", 1)[0] if package_version else ""


def installed(package: str) -> dict:
    """{"version", "upstream", "held"} of PACKAGE as dpkg has it ("" and False where it is not installed)."""
    if not PACKAGE_NAME.fullmatch(package):
        raise RigError(f"{package!r} is not a Debian package name; give the driver's package (nvidia-driver-580-open)")
    if not shutil.which("dpkg-query"):
        raise RigError("dpkg-query is not on this host: the driver role manages Debian and Ubuntu hosts only")
    done = run(["dpkg-query", "-W", "-f", "${db:Status-Want} ${db:Status-Status} ${Version}", package],
               f"reading {package} from dpkg", timeout=60, ok=(0, 1))
    want, status, version = ((done.stdout.split() + ["", "", ""])[:3]) if done.returncode == 0 else ("", "", "")
    version = version if status == "installed" else ""
    return {"version": version, "upstream": upstream(version), "held": want == "hold" and bool(version)}


def cdi_missing(spec: str) -> list[str] | None:
    """What makes a CDI spec stale: the host paths it mounts that are not there (after a driver change, the old
    driver's libraries), or that it is no CDI spec at all (an empty or broken file); None where there is no spec.
    The spec is YAML or JSON; its hostPath keys are read as text, since targets have no YAML parser."""
    from rig.core.documents import read_text
    from rig.core.fs import MissingFile

    try:
        text = read_text(spec, "CDI spec")
    except MissingFile:
        return None
    lines = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    paths = {path.replace("\\/", "/")
             for path in re.findall(r"""["']?hostPath["']?\s*:\s*["']?([^"',\s}]+)""", lines)}
    if not re.search(r"""^["']?cdiVersion["']?\s*:""", lines.lstrip("{ \n"), re.M) and '"cdiVersion"' not in lines:
        return [f"{spec} has no cdiVersion: not a spec nvidia-ctk wrote"]
    return sorted(path for path in paths if not path.startswith("/") or not Path(path).exists())


def _below_cuda(branch: str, version: str, cuda: str) -> str | None:
    """Why the driver (BRANCH, or VERSION where given) is below what CUDA needs, or None."""
    series = ".".join((cuda.split(".") + ["0"])[:2])  # "13" is 13.0
    known = [s for s in MIN_DRIVER if _numbers(s) <= _numbers(series)] if VERSION.fullmatch(series) else []
    if not known or not VERSION.fullmatch(cuda):
        raise RigError(f"CUDA {cuda!r} is not a release rig knows a driver for; give 12.0 or newer")
    needed = MIN_DRIVER[max(known, key=_numbers)]
    have = upstream(version) or branch
    if _numbers(have)[:1] < _numbers(needed)[:1] or (version and _numbers(have) < _numbers(needed)):
        return (f"driver {have} is below what CUDA {cuda} needs ({needed}, the "
                f"{needed.split('.')[0]} branch): set nvidia_driver_branch and nvidia_driver_version to it")
    return None


def refusals(branch: str, version: str, flavour: str, cuda: str | None, archs: list[str]) -> list[str]:
    """Why a driver must not go onto a host serving this stack ([] when it may): below what the stack's CUDA
    needs, or the proprietary kernel modules where the stack's GPUs are Blackwell."""
    found = []
    if not VERSION.fullmatch(branch) or (version and not (PACKAGE_VERSION.fullmatch(version)
                                                          and VERSION.fullmatch(upstream(version)))):
        return [f"driver branch {branch!r} / version {version!r} are not driver versions (580, 580.159.04-1)"]
    if version and upstream(version).split(".")[0] != branch:
        return [f"driver {upstream(version)} is not of the {branch} branch: set nvidia_driver_branch to "
                f"{upstream(version).split('.')[0]}, or a version of the {branch} branch"]
    if cuda is not None and (below := _below_cuda(branch, version, cuda)):
        found.append(below)
    blackwell = sorted(a for a in archs if (major := re.match(r"[0-9]+", a)) and int(major[0]) >= OPEN_ONLY_FROM)
    if blackwell and flavour != "open":
        found.append(f"the {flavour!r} kernel modules do not run Blackwell GPUs (the stack targets "
                     f"{', '.join(blackwell)}): set nvidia_driver_flavour=open")
    return found
