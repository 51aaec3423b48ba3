"""A venv image's mount made to survive a reboot: a systemd .mount unit of the very mount `rig venv mount` made
(mounts.mount_unit's fields), named by systemd's path escaping of its mount point, enabled for local-fs.target.
Where systemd is not PID 1 there is no unit: the plain mount stands until the host restarts, and the result says so.

One unit per venv path: the units of its store's other mount points (an image the venv left) are disabled and
removed, so a boot mounts only the image the venv links to (the previous one is mounted again by a rollback)."""
from __future__ import annotations

import os
import re
from pathlib import Path

from rig.core import RigError
from rig.core.documents import converge_file, read_text
from rig.core.proc import run
from rig.python.venv_archive.image import IMAGE
from rig.python.venv_archive.manifest import absolute
from rig.python.venv_archive.mounts import mount_unit
from rig.python.venv_archive.place import STORE, rig_link, store_of

UNIT_DIR = Path("/etc/systemd/system")
BOOTED = Path("/run/systemd/system")  # sd_booted(3): systemd is PID 1 where this directory is
WANTED_BY = "local-fs.target"
SYSTEMCTL_TIMEOUT = 60.0
# what a unit file carries as it is: no % (a specifier), no space, quote or backslash (unit-file escapes); a path
# rig computed from a venv path with any other character is refused, never pasted
UNIT_SAFE = re.compile(r"/[A-Za-z0-9/._+@-]{1,1000}")
_KEPT = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789:_.")


def escape_path(path: str) -> str:
    """`systemd-escape --path PATH` (systemd's unit_name_path_escape): the path's components joined by "-", every
    byte but [A-Za-z0-9:_.] (and a leading ".") written \\xNN; "/" is "-". A path that is not absolute and
    normalized (no "." or ".." component) is refused, as systemd refuses it."""
    if not path.startswith("/") or any(part in (".", "..") for part in path.split("/")):
        raise RigError(f"{path!r} is not an absolute, normalized path; no mount unit is named after it")
    parts = [part for part in path.split("/") if part]
    if not parts:
        return "-"
    escaped = []
    for index, byte in enumerate("/".join(parts).encode()):
        kept = byte in _KEPT and not (index == 0 and byte == ord("."))
        escaped.append("-" if byte == ord("/") else chr(byte) if kept else f"\\x{byte:02x}")
    return "".join(escaped)


UNIT_NAME_MAX = 255  # bytes: systemd's limit, and a file name's


def unit_name(where: str | Path) -> str:
    name = f"{escape_path(str(where))}.mount"
    if len(name.encode()) > UNIT_NAME_MAX:
        raise RigError(f"the mount unit of {str(where)[:120]}... would be named {len(name.encode())} bytes, longer "
                       f"than the {UNIT_NAME_MAX} bytes systemd takes; no unit written",
                       hint="give the venv a shorter path (its last part names the store directory)")
    return name


def unit_text(fields: dict[str, str], name: str) -> str:
    """The unit file of the mount FIELDS names (What, Where, Type, Options), each value checked, none pasted."""
    for key in ("What", "Where"):
        if not UNIT_SAFE.fullmatch(fields[key]) or os.path.normpath(fields[key]) != fields[key]:
            raise RigError(f"the venv image's {key.lower()} {fields[key]!r} holds a character a unit file would "
                           "read otherwise (% space quote backslash) or is not a normalized path; no unit written",
                           hint="give the venv a path of letters, digits and /._+@- (--venv, python_stack_venv)")
    if not re.fullmatch(r"[a-z0-9]+", fields["Type"]) or not re.fullmatch(r"[a-z0-9,=]+", fields["Options"]):
        raise RigError(f"mount type {fields['Type']!r} or options {fields['Options']!r} is not plain; no unit written")
    lines = ["# Written by rig: the venv image rig venv mount mounted, mounted again at every boot.",
             "[Unit]", f"Description=rig venv image {name}", "",
             "[Mount]", *(f"{key}={fields[key]}" for key in ("What", "Where", "Type", "Options")), "",
             "[Install]", f"WantedBy={WANTED_BY}"]
    return "\n".join(lines) + "\n"


def persist(venv: str | Path, check: bool = False, unit_dir: Path = UNIT_DIR, booted: Path = BOOTED,
            root: str | Path = STORE) -> dict:
    """VENV's image mount as an enabled .mount unit where systemd is PID 1 (a no-op where it already is), the
    units of the store's other images removed; where VENV is no image rig mounted into its store under ROOT (a
    link elsewhere is never made a boot-time mount), only those removals."""
    venv = absolute(venv)
    target = rig_link(venv, absolute(root))
    store = target.parent if target else store_of(venv, absolute(root))
    result = {"venv": str(venv), "image": target is not None, "systemd": booted.is_dir()}
    if not result["systemd"]:
        said = (f"systemd is not PID 1 here: the mount of {target} will not survive a reboot (run `rig venv mount` "
                "again after one)" if target else f"{venv} is no venv image rig mounted; no mount unit")
        return {**result, "changed": False, "unit": None, "msg": said}
    wanted, text, written = None, "", {"changed": False, "diff": ""}
    if target is not None:
        wanted = unit_name(target)
        text = unit_text(mount_unit(target.parent / f"{target.name}{IMAGE.suffix}", target), target.name)
        written = converge_file(unit_dir / wanted, text, "the mount unit", check=True)
    stale = [unit for unit in _units_of(unit_dir, store) if unit != wanted]
    enabled = wanted is None or _enabled(wanted, unit_dir)
    steps = ([("write", f"{unit_dir / wanted}")] if wanted and written["changed"] else []) + \
        ([("enable", wanted)] if not enabled else []) + [("disable and remove", unit) for unit in stale]
    result = {**result, "changed": bool(steps), "unit": wanted, "stale": stale,
              "diff": written["diff"]}
    if not steps:
        return {**result, "msg": f"{wanted} mounts {target} at boot, enabled" if wanted else
                f"{venv} is no venv image rig mounted; no mount unit"}
    if check:
        return {**result, "msg": "would " + "; ".join(f"{verb} {what}" for verb, what in steps)}
    _apply(unit_dir, stale, wanted, text, enabled)
    done = {"write": "wrote", "enable": "enabled", "disable and remove": "disabled and removed"}
    return {**result, "msg": "; ".join(f"{done[verb]} {what}" for verb, what in steps)}


def _apply(unit_dir: Path, stale: list[str], wanted: str | None, text: str, enabled: bool) -> None:
    """The STALE units disabled and removed, WANTED written with TEXT and enabled where it is not."""
    for unit in stale:
        _systemctl("disable", unit)
        (unit_dir / unit).unlink(missing_ok=True)
    if wanted:
        converge_file(unit_dir / wanted, text, "the mount unit")
    _systemctl("daemon-reload")
    if wanted and not enabled:
        _systemctl("enable", wanted)


def _units_of(unit_dir: Path, store: Path) -> list[str]:
    """The mount units rig wrote for STORE's mount points: named after a path under it, and saying so."""
    prefix = escape_path(str(store)) + "-"
    if not unit_dir.is_dir():
        return []
    found = []
    for entry in sorted(unit_dir.iterdir()):
        ours = entry.name.startswith(prefix) and entry.name.endswith(".mount")
        if ours and entry.is_file() and not entry.is_symlink() and \
                read_text(entry, "a mount unit").startswith("# Written by rig: the venv image"):
            found.append(entry.name)
    return found


def _enabled(unit: str, unit_dir: Path) -> bool:
    return (unit_dir / f"{WANTED_BY}.wants" / unit).is_symlink()


def _systemctl(*argv: str) -> None:
    run(["systemctl", *argv], f"systemctl {' '.join(argv)}", timeout=SYSTEMCTL_TIMEOUT)
