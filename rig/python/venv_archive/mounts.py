"""The kernel's side of a venv image: whether this host can loop-mount squashfs, what is mounted where (and from
which file), and the one mount and unmount rig runs. mount_unit() is the seam a systemd mount unit takes over
by: its What/Where/Type/Options are the mount attach() runs."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from rig.core import RigError
from rig.core.fs import read_bytes
from rig.core.proc import run

TYPE = "squashfs"
OPTIONS = "ro,loop,nodev,nosuid"  # read-only; no device node or set-id bit in it acts, whoever built it
MOUNT_TIMEOUT = 60.0
FALL_BACK = "unpack the venv archive instead (rig venv unpack), or run as root on a host with loop devices and squashfs"


class CannotMount(RigError):
    """This host cannot mount the image at all (no root, no loop device, no squashfs, mount refused): a caller
    falls back to unpacking the archive. The boundary says so as `reason: cannot-mount` and its own exit status."""

    reason = "cannot-mount"


def mount_unit(image: str | Path, where: str | Path) -> dict[str, str]:
    """The mount of IMAGE at WHERE as a systemd .mount unit's [Mount] section names it."""
    return {"What": str(image), "Where": str(where), "Type": TYPE, "Options": OPTIONS}


def attach(image: str | Path, where: str | Path) -> None:
    """IMAGE mounted read-only at WHERE, or CannotMount with what mount(8) said."""
    unit = mount_unit(image, where)
    done = run(["mount", "-t", unit["Type"], "-o", unit["Options"], unit["What"], unit["Where"]],
               "mounting the venv image", timeout=MOUNT_TIMEOUT, ok=None)
    if done.returncode:
        said = (done.stderr or done.stdout or "").strip()[-500:]
        raise CannotMount(f"cannot mount {image} at {where}: mount exited {done.returncode}: {said}", hint=FALL_BACK)


def detach(where: str | Path) -> str | None:
    """WHERE unmounted (its loop device goes with it); why not (it is busy), or None."""
    done = run(["umount", str(where)], "unmounting an old venv image", timeout=MOUNT_TIMEOUT, ok=None)
    return (done.stderr or done.stdout or f"umount exited {done.returncode}").strip()[-300:] if done.returncode else None


def mountable() -> str | None:
    """Why this host cannot loop-mount a squashfs image, or None."""
    if os.geteuid() != 0:
        return "mounting an image needs root"
    if not (shutil.which("mount") and shutil.which("umount")):
        return "mount and umount are not on PATH (util-linux)"
    if not os.path.exists("/dev/loop-control") and not any(Path("/dev").glob("loop[0-9]*")):
        return "this host has no loop device (/dev/loop-control); a container needs them passed in"
    if not _kernel_has(TYPE):
        return f"this kernel has no {TYPE} (not in /proc/filesystems, no module to load)"
    return None


def _kernel_has(fstype: str) -> bool:
    """Whether the kernel mounts FSTYPE: built in or loaded (/proc/filesystems), or a module it loads on demand."""
    try:
        if re.search(rf"\s{fstype}$", read_bytes("/proc/filesystems", "the kernel's filesystems").decode(), re.M):
            return True
        modules = read_bytes(f"/lib/modules/{os.uname().release}/modules.dep", "the kernel's modules", 64 << 20)
    except RigError:
        return False
    return f"/{fstype}.ko".encode() in modules


def _unescape(field: str) -> str:
    """A mountinfo path: space, tab, newline and backslash are written as octal escapes (\\040)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def mounted(where: str | Path) -> dict | None:
    """What is mounted at WHERE (the last mount there): {"type", "source", "backing"}, the backing file of a loop
    device (None for another source); None where nothing is. The mount table names real paths: WHERE's directory
    is resolved to compare (a link above the store), its last part is not (a link there is no mount point)."""
    found = None
    above, name = os.path.split(os.path.abspath(where))
    point = os.path.join(os.path.realpath(above), name)
    text = read_bytes("/proc/self/mountinfo", "the mount table", 64 << 20).decode(errors="replace")
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) >= 5 and len(rest) >= 2 and _unescape(fields[4]) == point:
            found = {"type": rest[0], "source": _unescape(rest[1])}
    if found is None:
        return None
    return {**found, "backing": backing_file(found["source"])}


def backing_file(source: str) -> str | None:
    """The file behind the loop device SOURCE (/dev/loopN), as the kernel recorded it; None for another source."""
    device = re.fullmatch(r"/dev/(loop[0-9]+)", source)
    if not device:
        return None
    try:
        said = read_bytes(f"/sys/block/{device[1]}/loop/backing_file", "a loop device's backing file")
    except RigError:
        return None
    return said.decode(errors="replace").rstrip("\n")


def mounted_from(where: str | Path, image: str | Path) -> bool:
    """Whether IMAGE (the very file, not one deleted or replaced since) is what is mounted at WHERE."""
    seen = mounted(where)
    return bool(seen and seen["type"] == TYPE and seen["backing"] == os.path.realpath(image))
