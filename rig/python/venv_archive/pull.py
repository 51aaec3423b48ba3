"""An archive and its manifest pulled from a server (the archive resumed where a pull stopped), and `rig venv
unpack`'s whole run: the manifest from a file or a URL, the archive pulled where it is remote, then unpacked."""
from __future__ import annotations

import errno
import io
import os
import shutil
import urllib.parse
from pathlib import Path

from rig.core import RigError, http
from rig.core.fs import atomic_write, held, open_plain, plain_dir
from rig.python.venv_archive.manifest import (
    ANY_PATCHES,
    ARCHIVE,
    MANIFEST_LIMIT,
    MANIFEST_TIMEOUT,
    Artifact,
    absolute,
    digest_of,
    is_url,
    manifest_source,
    read_manifest,
)
from rig.python.venv_archive.unpack import made_parents, settle, unpack

PULL_TIMEOUT = 3600.0  # seconds for the whole archive; a pull cut off resumes where it stopped when run again


def pull(source: str, dest_dir: str | Path, expected: dict | None = None, timeout: float = PULL_TIMEOUT,
         artifact: Artifact = ARCHIVE) -> Path:
    """An archive (or, with ARTIFACT=IMAGE, an image) and its manifest from SOURCE (the manifest's URL, a
    directory's URL where EXPECTED names the lock_hash, or a local path) into DEST_DIR; the file's path. Each key
    of EXPECTED (the manifest already read, or some of its fields) must equal the pulled manifest's, before the
    file is downloaded. The file grows in NAME.SUFFIX.part, resumed from its size where a pull was cut short,
    hashed as it streams, and takes its name only once its sha256 and size are the manifest's; the manifest is
    written last: present means whole."""
    wanted = expected or {}
    source = manifest_source(source, wanted.get("lock_hash"), artifact)
    if not is_url(source):
        source = Path(source).absolute().as_uri()
    taken = io.BytesIO()
    http.download(source, taken, f"{artifact.what}'s manifest", MANIFEST_LIMIT, MANIFEST_TIMEOUT)
    manifest = artifact.read(taken.getvalue(), source)
    for key, value in wanted.items():
        if manifest.get(key) != value:
            raise RigError(f"{source} is not the manifest expected: its {key} is {str(manifest.get(key))[:80]!r}, "
                           f"not {str(value)[:80]!r}")
    held_file = manifest[artifact.field]
    name, want, size = held_file["name"], held_file["sha256"], held_file["size"]
    url = urllib.parse.urljoin(source, urllib.parse.quote(f"{name}{artifact.suffix}"))
    dest = Path(dest_dir)
    final, part = dest / f"{name}{artifact.suffix}", dest / f"{name}{artifact.suffix}.part"
    plain_dir(dest, "rig pulls only into a directory of its own")
    dest.mkdir(parents=True, exist_ok=True)
    with held(dest / f".{name}.pull.lock"):  # two pulls into one directory take turns; the second finds it whole
        if _whole(final, artifact, want, size):
            atomic_write(dest / f"{name}{artifact.manifest_suffix}", taken.getvalue())
            return final
        _room(dest, part, size, artifact.what)
        digest = http.resume(url, part, f"the {artifact.field}", size, timeout)
        if digest != want:
            part.unlink(missing_ok=True)
            raise RigError(f"{url} is not the {artifact.field} its manifest describes (sha256 or size differs); the "
                           f"partial download is removed: pull again, or make the {artifact.field} again where it "
                           "is served")
        os.replace(part, final)
        atomic_write(dest / f"{name}{artifact.manifest_suffix}", taken.getvalue())
    return final


def _whole(final: Path, artifact: Artifact, want: str, size: int) -> bool:
    """Whether FINAL, pulled before, is still the manifest's file; one that cannot be read through (fs-verity
    refuses a read of bytes changed since it was turned on: EIO) is pulled again, replacing it."""
    if not final.is_file() or final.is_symlink() or final.stat().st_size != size:
        return False
    try:
        with os.fdopen(open_plain(final, os.O_RDONLY, artifact.what, follow=False), "rb") as handle:
            return digest_of(handle) == (want, size)
    except OSError as exc:
        if exc.errno != errno.EIO:  # anything else is a fault of this host, said as it was before
            raise
        return False


def _room(dest: Path, part: Path, size: int, what: str) -> None:
    """DEST must have room for what is left to pull of SIZE bytes: a manifest's size is not believed into a full
    disk (the server's answer is cut at SIZE, but SIZE is the manifest's word)."""
    have = part.stat().st_size if part.is_file() and not part.is_symlink() else 0
    free = shutil.disk_usage(dest).free
    if size - have > free:
        raise RigError(f"{what} is {size} bytes ({size - have} to pull), {dest} has {free} free; nothing is pulled",
                       hint=f"free space on {dest}'s filesystem, or check the manifest's size")


def restore(manifest_from: str, venv: str | Path, archive: str | Path | None = None, lock_hash: str | None = None,
            check: bool = False, timeout: float = PULL_TIMEOUT, read: dict[str, str | Path] | None = None,
            patches: dict | str | None = ANY_PATCHES) -> dict:
    """`rig venv unpack`: the manifest from a file (its archive beside it, or ARCHIVE) or a URL (its archive
    pulled beside the venv, resumable, removed once unpacked), or from a directory of either kind where LOCK_HASH
    names the archive; everything that can refuse without the archive (one of another lock or patch set, PATCHES)
    refuses before it is pulled. READ: the other files the command read ({"stack": path, ...}), held with the
    manifest and archive to lie outside the venv."""
    venv = absolute(venv)
    manifest_from = manifest_source(manifest_from, lock_hash)
    manifest = read_manifest(manifest_from)
    if archive is None and not is_url(manifest_from):
        archive = Path(manifest_from).with_name(f"{manifest['archive']['name']}.tar.zst")
    local = {"manifest": manifest_from} if not is_url(manifest_from) else {}
    done = settle(manifest, venv, lock_hash, {**(read or {}), **local, **({"archive": archive} if archive else {})},
                  patches)
    if done is not None:
        return done
    if archive is not None:
        return unpack(archive, manifest, venv, lock_hash, check, patches)
    if check:  # the pull is the run's first action: the archive is looked at once it is here
        return {"changed": True, "venv": str(venv), "msg": f"would pull {manifest['archive']['name']} from "
                f"{manifest_from} and unpack it into {venv}"}
    pulled = venv.parent / f".{venv.name}.rig-pull"
    with made_parents(venv.parent):  # a refused pull or unpack leaves no parent it made
        try:
            got = pull(manifest_from, pulled, manifest, timeout)
        except BaseException:
            _drop(pulled, keep_part=True)  # a pull cut short leaves its .part to resume from, and nothing else
            raise
        try:
            result = unpack(got, manifest, venv, lock_hash, patches=patches)
        except RigError:
            _drop(pulled)  # an archive that does not unpack would not unpack next time either
            raise
    _drop(pulled)  # unpacked and checked: the download has served
    return result


def _drop(pulled: Path, keep_part: bool = False) -> None:
    """The pull directory PULLED removed (but where it holds a partial download to resume, with KEEP_PART); never
    anything a link there leads to."""
    if pulled.is_symlink() or not pulled.is_dir():
        return
    if keep_part and any(path.name.endswith(".part") for path in pulled.iterdir()):
        return
    shutil.rmtree(pulled, ignore_errors=True)


