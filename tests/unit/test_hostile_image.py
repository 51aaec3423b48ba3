"""rig venv image / mount under attack: an archive whose members are not its (self-consistent) manifest's, a
store, state or mount point someone else made or mounted over, two runs at once. Every refusal is one RigError
naming the problem, and nothing is changed: no image built, nothing pulled, mounted or linked."""
from __future__ import annotations

import copy
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from test_venv_archive import make_venv, zstd_of

from rig.core import RigError
from rig.python.venv import MARKER
from rig.python.venv_archive.image import image
from rig.python.venv_archive.pack import pack

pytestmark = pytest.mark.skipif(not (shutil.which("zstd") and shutil.which("mksquashfs")),
                                reason="needs zstd and mksquashfs (apt install zstd squashfs-tools)")


@pytest.fixture(scope="module")
def packed_once(tmp_path_factory) -> tuple[Path, dict, list[tuple[tarfile.TarInfo, bytes]]]:
    """A real venv packed once: its manifest, and its tar's members with their bytes (to craft archives from)."""
    root = tmp_path_factory.mktemp("packed")
    done = pack(make_venv(root / "venv"), root / "out")
    raw = subprocess.run(["zstd", "-q", "-dc", done["archive"]], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
        members = [(member, tar.extractfile(member).read() if member.isfile() else b"") for member in tar]
    return Path(done["manifest"]), json.loads(Path(done["manifest"]).read_text()), members


def _member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", mode: int = 0o644, **fields) -> tuple:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode, info.mtime = kind, len(data) if kind == tarfile.REGTYPE else 0, mode, 1577836800
    for key, value in fields.items():
        setattr(info, key, value)
    return info, data


def crafted_pair(where: Path, manifest: dict, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    """MEMBERS as WHERE/NAME.tar.zst and the (unchanged, valid) entries of MANIFEST beside it, the archive's sha256
    and size right: a hostile packer's self-consistent pair, whose tar alone says what the venv holds."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    archive = zstd_of(raw.getvalue())
    where.mkdir(parents=True, exist_ok=True)
    name = manifest["archive"]["name"]
    (where / f"{name}.tar.zst").write_bytes(archive)
    told = {**manifest, "archive": {**manifest["archive"], "sha256": hashlib.sha256(archive).hexdigest(),
                                    "size": len(archive)}}
    (where / f"{name}.manifest.json").write_text(json.dumps(told))
    return where / f"{name}.manifest.json"


def _swapped(members: list, name: str, change) -> list:
    return [change(info, data) if info.name == name else (info, data) for info, data in members]


def _setuid(info: tarfile.TarInfo, data: bytes) -> tuple:
    info = copy.copy(info)
    info.mode = 0o4755
    return info, data


def _other_bytes(info: tarfile.TarInfo, data: bytes) -> tuple:
    return info, b"#!/bin/sh\necho owned!\n"[:len(data)].ljust(len(data), b"#")


def _before_links(members: list, *extra: tuple) -> list:
    """EXTRA inserted after the last file (the links come last, as rig packs them)."""
    last = max(index for index, (info, _) in enumerate(members) if not info.issym())
    return [*members[:last + 1], *extra, *members[last + 1:]]


HOSTILE = {
    "a FIFO": lambda m: _before_links(m, _member("bin/fifo", tarfile.FIFOTYPE)),
    "a device": lambda m: _before_links(m, _member("bin/null", tarfile.CHRTYPE, mode=0o666, devmajor=1, devminor=3)),
    "a set-id bit": lambda m: _swapped(m, "bin/tool", _setuid),
    "other bytes": lambda m: _swapped(m, "bin/tool", _other_bytes),
    "a hard link out": lambda m: _before_links(m, _member("bin/passwd", tarfile.LNKTYPE, linkname="/etc/passwd")),
    "a hard link in": lambda m: _before_links(m, _member("bin/again", tarfile.LNKTYPE, linkname="bin/tool")),
    "an absolute path": lambda m: _before_links(m, _member("/etc/rig-owned", data=b"x")),
    "a member twice": lambda m: _before_links(m, *[(i, d) for i, d in m if i.name == "bin/tool"]),
    "a member missing": lambda m: [(i, d) for i, d in m if i.name != "bin/tool"],
    "a link elsewhere": lambda m: _swapped(m, "bin/python", lambda i, d: (_member("bin/python", tarfile.SYMTYPE,
                                                                                   mode=0o777, linkname="/bin/sh")[0], d)),
}


@pytest.mark.parametrize("attack", HOSTILE)
def test_an_archive_whose_members_are_not_its_manifests_entries_is_imaged_to_nothing(packed_once, tmp_path, attack):
    """The archive's sha256 is its manifest's, so only its members can give it away: each one is checked against
    the manifest's next entry as it streams to mksquashfs (a hard link to /etc/passwd made mksquashfs 4.5.1 crash;
    a device node, a set-id bit or other bytes were imaged as the tar said)."""
    _, manifest, members = packed_once
    crafted = crafted_pair(tmp_path / "crafted", manifest, HOSTILE[attack](list(members)))
    with pytest.raises(RigError, match="not its manifest's|do not belong together|leads outside|not whole"):
        image(crafted, tmp_path / "images")
    assert not (tmp_path / "images").exists() or list((tmp_path / "images").iterdir()) == []


def test_the_untouched_members_still_image(packed_once, tmp_path):
    _, manifest, members = packed_once
    built = image(crafted_pair(tmp_path / "crafted", manifest, list(members)), tmp_path / "images")
    assert built["changed"] and Path(built["image"]).is_file()


def test_an_archive_whose_marker_names_another_lock_is_imaged_to_nothing(packed_once, tmp_path):
    """Entries and members agree, but the venv's marker names lock b...: the image would say it holds lock a...
    (the name it is mounted by) while the venv inside says b..., as unpack already refuses."""
    _, manifest, members = packed_once
    other = json.dumps({"lock_hash": "b" * 64, "packages": ["a==1"]}).encode()
    swapped = _swapped(list(members), MARKER, lambda info, _: _member(MARKER, data=other))
    told = {**manifest, "entries": [["file", MARKER, 0o644, len(other), hashlib.sha256(other).hexdigest()]
                                    if entry[1] == MARKER else entry for entry in manifest["entries"]]}
    with pytest.raises(RigError, match=f"marker {MARKER} names lock b{{16}}, its manifest lock a{{16}}"):
        image(crafted_pair(tmp_path / "crafted", told, swapped), tmp_path / "images")
    assert list((tmp_path / "images").iterdir()) == []
