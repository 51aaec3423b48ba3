"""The controller's fetched CUDA wheels as one archive: the manifest and the wheels it lists in one uncompressed tar
beside the wheel dir, so a host gets one file instead of a round trip per wheel; and the host's side, unpacked with
nothing but plain files in it (rig.cuda.toolkit fetches, verifies and installs)."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from rig.core import RigError, progress
from rig.core.fs import atomic_file, sha256_file
from rig.python.venv_archive.manifest import FIXED_MTIME  # the venv archive's: the same wheels, the same archive
from rig.python.venv_archive.members import kind_of

MANIFEST = "manifest.json"  # the wheel dir's record (version, components, each wheel's sha256): the first member
ARCHIVE_MEMBERS = 64  # a release's wheels and the manifest: ten or so


def pack(wheel_dir: Path, record: dict) -> Path:
    """WHEEL_DIR's manifest and the wheels it lists as one uncompressed tar beside it, named by the manifest's
    sha256 and kept once made (rebuilt where what is there does not list those files at their sizes): a host
    gets one file instead of a round trip per wheel."""
    import tarfile

    names = [MANIFEST, *sorted(record["wheels"])]
    archive = wheel_dir.with_name(f"{wheel_dir.name}-{sha256_file(wheel_dir / MANIFEST)[:16]}.tar")
    wanted = [(name, (wheel_dir / name).stat().st_size) for name in names]
    if archive.is_file() and not archive.is_symlink():
        try:
            with tarfile.open(archive, mode="r:") as tar:
                if [(m.name, m.size) for m in tar] == wanted:
                    return archive
        except tarfile.TarError:
            pass
        progress(f"{archive} does not hold the fetched wheels; packing it again")
    with atomic_file(archive, 0o644) as out, tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            info = tar.gettarinfo(str(wheel_dir / name), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode, info.mtime = 0o644, FIXED_MTIME
            with open(wheel_dir / name, "rb") as data:
                tar.addfile(info, data)
    return archive


def unpack(archive: Path, into: Path) -> None:
    """The tar pack() made, into the empty directory INTO: plain files with plain names only (a link, a
    directory, a device, a sparse file or a path is refused, naming it), none written twice, none outside INTO,
    and no more bytes than the archive holds."""
    import tarfile

    budget = archive.stat().st_size
    try:
        with tarfile.open(archive, mode="r:") as tar:
            for count, member in enumerate(tar, 1):  # read lazily: a flood of headers stops at the limit
                if count > ARCHIVE_MEMBERS:
                    raise RigError(f"{archive} has more than {ARCHIVE_MEMBERS} members; a CUDA wheel archive "
                                   "holds the manifest and a release's wheels: fetch it again (rig cuda fetch)")
                name = member.name
                if kind_of(member) != "file" or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", name):
                    raise RigError(f"{archive}: member {name!r} is not a plain file with a plain name; a CUDA "
                                   "wheel archive holds the manifest and the wheels only: fetch it again")
                budget -= member.size
                if budget < 0:
                    raise RigError(f"{archive}: its members claim more bytes than the archive holds; fetch it again")
                source = tar.extractfile(member)
                assert source is not None  # a regular member
                with source, open(into / name, "xb") as out:  # exclusive: never twice, never through a link
                    shutil.copyfileobj(source, out, 1 << 20)
    except (tarfile.TarError, FileExistsError) as exc:
        raise RigError(f"{archive} is not a CUDA wheel archive rig made ({exc}): fetch it again") from None
