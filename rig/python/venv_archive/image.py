"""A venv archive as one read-only squashfs image: NAME.sqfs and NAME.image.json, built as the archive's tar streams
(`zstd -dc`, each member checked and written anew, `mksquashfs - -tar`), so no file of the venv is ever written
out. The same archive builds to the same bytes; a host mounts the image at the venv's path instead of unpacking 120k
files (mount.py).

squashfs with zstd level 3 was chosen by measurement (docs/BENCHMARKS.md, "The venv as one read-only image")."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import os
import re
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from rig.core import RigError, progress
from rig.core.documents import dump_json, parse_json
from rig.core.fs import MAX_READ, atomic_write, open_regular, read_bytes, sha256_data
from rig.core.proc import PIPE, Running, run, running
from rig.core.schema import Field, sha256
from rig.python.runtime_env import hook_problem
from rig.python.venv import MARKER, MARKER_SPEC
from rig.python.venv_archive import members
from rig.python.venv_archive.manifest import (
    FIXED_MTIME,
    MANIFEST_LIMIT,
    MANIFEST_SPEC,
    Artifact,
    absolute,
    already_made,
    digest_of,
    interpreter_of,
    member_of,
    named,
    read_bytes_of,
    read_manifest,
    zstd_binary,
)
from rig.python.venv_archive.members import read_tar

FORMAT = "squashfs"
ALGORITHM, LEVEL = "zstd", 3
COMPRESSION = {"algorithm": ALGORITHM, "level": LEVEL}
MKSQUASHFS_TIMEOUT = 3 * 3600.0  # seconds: 11 GB of venv built in 64 s on 2 busy cores; a hang must still end
SQUASHFS_TOOLS = "install squashfs-tools 4.5 or later (apt install squashfs-tools)"
# every choice that makes the same tar build the same bytes: fixed times (the pyc headers name FIXED_MTIME as
# their sources' time, so a read-only tree never recompiles), root's, no xattrs, the root directory a venv's
BUILD_OPTIONS = ["-tar", "-no-strip", "-comp", ALGORITHM, "-Xcompression-level", str(LEVEL), "-reproducible",
                 "-mkfs-time", "0", "-all-time", str(FIXED_MTIME), "-root-time", str(FIXED_MTIME),
                 "-root-mode", "0755", "-all-root", "-noappend", "-no-xattrs", "-quiet", "-no-progress"]
END = bytes(2 * tarfile.BLOCKSIZE)  # a tar's end: two zero blocks

_FIELDS = MANIFEST_SPEC.fields
IMAGE_SPEC = Field(dict, fields={
    "format": Field(required=True, choices=(FORMAT,)),
    "compression": Field(dict, required=True, fields={
        "algorithm": Field(required=True, choices=(ALGORITHM,)),
        "level": Field(int, required=True, check=lambda v: None if 1 <= v <= 22 else "a zstd level is 1-22")}),
    **{key: _FIELDS[key] for key in ("lock_hash", "python", "glibc", "arch", "venv", "patches")},
    "interpreter": Field(required=True, check=lambda v: None if v == "" or v.startswith("/") else
                         f"{v[:120]!r} is not an absolute path (or empty: bin/python stays in the venv)"),
    "image": _FIELDS["archive"],
    "archive": Field(dict, required=True, fields={
        "name": Field(required=True), "sha256": Field(required=True, check=sha256),
        "manifest_sha256": Field(required=True, check=sha256)}),
})


def read_image_manifest(source: bytes | str | Path, what: str = "venv image manifest") -> dict:
    """An image's manifest (its bytes, a file, or an http(s):// or file:// URL), checked whole; its image's name
    what its lock, Python and arch make it."""
    where, text = read_bytes_of(source, what)
    return named(parse_json(text, where, IMAGE_SPEC), where, "image")


IMAGE = Artifact("the venv image", ".image.json", ".sqfs", "image", read_image_manifest)


def mksquashfs_binary() -> str:
    """mksquashfs, of a version that reads a tar on stdin (-tar came with 4.5)."""
    found = shutil.which("mksquashfs")
    if not found:
        raise RigError("mksquashfs is not on PATH (venv images are squashfs)", hint=SQUASHFS_TOOLS)
    said = run([found, "-version"], "asking mksquashfs its version", timeout=30, ok=None).stdout
    version = re.search(r"version ([0-9]+)\.([0-9]+)", said or "")
    if not version or (int(version[1]), int(version[2])) < (4, 5):
        raise RigError(f"{found} is not mksquashfs 4.5 or later (it said {(said or '').strip()[:80]!r}): "
                       "it cannot read a tar", hint=SQUASHFS_TOOLS)
    return found


def image(manifest_path: str | Path, out_dir: str | Path, archive: str | Path | None = None,
          check: bool = False) -> dict:
    """The archive MANIFEST_PATH describes (ARCHIVE, else NAME.tar.zst beside it) as OUT_DIR/NAME.sqfs and
    NAME.image.json; a no-op where OUT_DIR already holds the image of this archive (its sha256 its manifest's)."""
    raw = read_bytes(manifest_path, "venv archive manifest", MANIFEST_LIMIT)
    manifest = read_manifest(raw, str(manifest_path))
    name = manifest["archive"]["name"]
    archive = Path(archive) if archive else Path(manifest_path).with_name(f"{name}.tar.zst")
    out = absolute(out_dir)
    built, described = out / f"{name}{IMAGE.suffix}", out / f"{name}{IMAGE.manifest_suffix}"
    head = {"format": FORMAT, "compression": dict(COMPRESSION),
            **{key: manifest[key] for key in ("lock_hash", "python", "glibc", "arch", "venv", "patches")},
            "interpreter": interpreter_of(manifest) or "",
            "archive": {"name": name, "sha256": manifest["archive"]["sha256"], "manifest_sha256": sha256_data(raw)}}
    result = {"changed": False, "image": str(built), "image_manifest": str(described), "archive": str(archive)}
    old = already_made(IMAGE, described, built, head)
    if old is not None:
        return {**result, "sha256": old["image"]["sha256"], "size": old["image"]["size"],
                "msg": f"{built} already holds {name}"}
    if why := hook_problem(manifest):  # mounted, it could not take the stack's environment
        raise RigError(f"archive {name} cannot be imaged: {why}",
                       hint="pack the venv again after `rig env hook --venv VENV` (the python_stack role does)")
    zstd, mksquashfs = zstd_binary(), mksquashfs_binary()
    if check:  # the archive the run reads, looked at whole: a check refuses what the run would
        with open_regular(archive, "the venv archive", follow=False) as handle:
            _vouched(digest_of(handle), manifest, archive)
        return {**result, "changed": True, "msg": f"would image {archive} as {built}"}
    out.mkdir(parents=True, exist_ok=True)
    progress(f"imaging {archive} as {built}")
    # built in a directory only this run made, so mksquashfs never writes through a link; renamed into place
    scratch = Path(tempfile.mkdtemp(dir=out, prefix=f".{name}.rig-image-"))
    try:
        digest, size = _build(zstd, mksquashfs, archive, manifest, scratch / built.name)
        os.chmod(scratch / built.name, 0o644)
        os.replace(scratch / built.name, built)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    described_now = {**head, "image": {"name": name, "sha256": digest, "size": size}}
    atomic_write(described, dump_json(described_now, "the venv image's manifest", sort_keys=True) + "\n")  # last
    return {**result, "changed": True, "sha256": digest, "size": size,
            "msg": f"imaged {archive} as {built} ({size / 1e6:.1f} MB)"}


def _vouched(read: tuple[str, int] | BaseException, manifest: dict, archive: Path) -> None:
    """READ, the archive's (sha256, size) or what stopped its read, must be its manifest's."""
    if isinstance(read, BaseException):
        raise read
    if read != (manifest["archive"]["sha256"], manifest["archive"]["size"]):
        raise RigError(f"{archive} is not the archive its manifest describes (sha256 or size differs); nothing was "
                       "imaged", hint="pack the venv again (rig venv pack), or give the manifest written with it")


def _build(zstd: str, mksquashfs: str, archive: Path, manifest: dict, target: Path) -> tuple[str, int]:
    """ARCHIVE as the squashfs image TARGET (its sha256 and size), in three stages side by side: fed (read once,
    hashed as zstd reads it), checked (`zstd -dc`'s tar, each member against the manifest's next entry, as unpack
    reads it) and built (`mksquashfs - TARGET -tar`). mksquashfs images whatever tar it is given (a device node, a
    set-id bit, a hard link out, a member tarfile took for the tar's end) and is no parser for a hostile one (4.5.1
    crashed on a hard link to /etc/passwd): it reads only the tar the check writes anew, each checked member
    from its manifest entry alone. A RigError where any stage fails; an archive that is not its manifest's is
    named so, whatever else went wrong with it."""
    source = str(archive)
    with open_regular(archive, "the venv archive", follow=False) as handle, _fed(handle, manifest, archive) as tar_zst, \
            members.unzstd(zstd, tar_zst) as unzstd, _mksquashfs(mksquashfs, target) as builder:
        _built(builder, source, _check(unzstd, builder.child.stdin, manifest, source))
        members.unzstd_ended(unzstd, source)
    with open_regular(target, "the venv image", follow=False) as handle:
        os.fsync(handle.fileno())
        return digest_of(handle)


@contextlib.contextmanager
def _fed(handle, manifest: dict, archive: Path) -> Iterator[int]:
    """A pipe that a thread fills with HANDLE's bytes, hashed as they pass (_feed): its read end for the block (zstd's
    input). Once the block ended, the thread is awaited and the bytes it read must be the manifest's archive: that
    error, where it is one, replaces whatever the block raised (a tar that is not the manifest's archive fails to
    decompress or to check, and is named so)."""
    into, out = os.pipe()
    read: list[tuple[str, int] | BaseException] = []
    feeder = threading.Thread(target=_feed, args=(handle, out, read), daemon=True)
    feeder.start()
    try:
        yield into
    finally:
        os.close(into)  # zstd's is closed by now: the feed's next write fails, and it only hashes the rest
        feeder.join()
        _vouched(read[0], manifest, archive)


def _feed(handle, out: int, read: list) -> None:
    """HANDLE's bytes into the pipe OUT (closed once all are written), hashed: READ gets (sha256, size), or the
    error that stopped the read. A pipe whose reader left (the check refused, zstd failed) stops the feed, not the
    hash: the archive is still read whole, so that one that is not its manifest's is named so."""
    digest, size = hashlib.sha256(), 0
    sink = os.fdopen(out, "wb", buffering=members.READ)
    try:
        while block := handle.read(members.READ):
            digest.update(block)
            size += len(block)
            if not sink.closed:
                try:
                    sink.write(block)
                except BrokenPipeError:
                    _close(sink)
        read.append((digest.hexdigest(), size))
    except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
        read.append(exc)
    finally:
        _close(sink)


def _close(pipe) -> None:
    """PIPE closed, even where its reader left before the last bytes (the close's flush fails; the pipe closes)."""
    with contextlib.suppress(BrokenPipeError):
        pipe.close()


def _mksquashfs(mksquashfs: str, target: Path):
    """`mksquashfs - TARGET -tar` running for the block, reading the tar _check writes (in large writes: one per
    member cost a fifth of the build)."""
    return running([mksquashfs, "-", str(target), *BUILD_OPTIONS], "building the venv image", stdin=PIPE,
                   bufsize=members.READ)


def _check(unzstd: Running, out, manifest: dict, source: str) -> bool:
    """The tar zstd writes, read member by member (members.read_tar), each checked member written anew into OUT,
    mksquashfs's input (_written), the venv's marker checked for the manifest's lock, then the tar's end: the tar
    mksquashfs reads holds nothing the manifest does not vouch for. False where mksquashfs stopped reading it."""
    marker = io.BytesIO()
    try:
        read_tar(unzstd, manifest["entries"], source, functools.partial(_written, out, marker, source))
        members.marked(lambda: _marker(marker, source), manifest, source)
        out.write(END)
    except BrokenPipeError:
        return False
    return True


def _built(builder: Running, source: str, whole: bool) -> None:
    """mksquashfs's input closed (the tar WHOLE, or cut where it stopped reading) and its exit awaited: a RigError
    where it failed."""
    _close(builder.child.stdin)
    code = builder.child.wait(MKSQUASHFS_TIMEOUT)
    if code or not whole:
        raise RigError(f"cannot image {source}: mksquashfs {f'exited {code}' if code else 'stopped reading its tar'}: "
                       f"{builder.said(4000)[-2000:]}")


def _written(out, marker: io.BytesIO, source: str, tar: tarfile.TarFile, member: tarfile.TarInfo, kind: str,
             entry: list) -> None:
    """A checked member of TAR into OUT (mksquashfs's input) as its ENTRY says, its header PAX as pack writes it
    (manifest.member_of); a file's bytes, as they pass, must be its entry's. The venv's marker is kept in MARKER
    (one rig wrote is a few kB), to be checked for the manifest's lock, as unpack checks it."""
    path, mode, size, data = entry[1:]
    out.write(member_of(kind, path, mode, size, data if kind == "link" else None).tobuf(
        tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape"))  # as tarfile's addfile() writes it for pack
    if kind == "file":
        kept = member.name == MARKER and member.size <= MAX_READ
        members.hashed(tar, member, data, source, marker if kept else out)
        if kept:
            out.write(marker.getvalue())
        out.write(bytes(-size % tarfile.BLOCKSIZE))


def _marker(kept: io.BytesIO, source: str) -> dict | None:
    """The venv's marker as kept while it passed (None where none did), read as read_marker reads one."""
    data = kept.getvalue()
    return parse_json(data.decode(errors="replace"), f"{source}: {MARKER}", MARKER_SPEC) if data else None
