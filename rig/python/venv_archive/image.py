"""A venv archive as one read-only squashfs image: NAME.sqfs and NAME.image.json, built from the archive's tar as
it streams (`zstd -dc | mksquashfs - -tar`), so no file of the venv is ever written out. The same archive builds to
the same bytes; a host mounts the image at the venv's path instead of unpacking 120k files (mount.py).

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
from pathlib import Path

from rig.core import RigError, progress
from rig.core.documents import dump_json, parse_json
from rig.core.fs import MAX_READ, atomic_write, open_plain, read_bytes, sha256_data
from rig.core.proc import PIPE, run, spawn
from rig.core.schema import Field, sha256
from rig.python.venv import MARKER, MARKER_SPEC
from rig.python.venv_archive import members
from rig.python.venv_archive.manifest import (
    FIXED_MTIME,
    MANIFEST_LIMIT,
    MANIFEST_SPEC,
    Artifact,
    absolute,
    digest_of,
    interpreter_of,
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
    NAME.image.json; a no-op where OUT_DIR already holds the image of this archive at its size."""
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
    old = _built(described, built, head)
    if old is not None:
        return {**result, "sha256": old["image"]["sha256"], "size": old["image"]["size"],
                "msg": f"{built} already holds {name}"}
    zstd, mksquashfs = zstd_binary(), mksquashfs_binary()
    if check:  # the archive the run reads, looked at whole: a check refuses what the run would
        with os.fdopen(open_plain(archive, os.O_RDONLY, "the venv archive", follow=False), "rb") as handle:
            if digest_of(handle) != (manifest["archive"]["sha256"], manifest["archive"]["size"]):
                raise _not_its(archive)
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


def _built(described: Path, built: Path, head: dict) -> dict | None:
    """The image manifest already in the out dir when it is of HEAD's archive and its image is there at its size."""
    if described.is_symlink() or not described.is_file() or built.is_symlink() or not built.is_file():
        return None
    try:
        old = read_image_manifest(described)
    except RigError:
        return None
    same = all(old[key] == value for key, value in head.items())
    return old if same and built.stat().st_size == old["image"]["size"] else None


def _not_its(archive: Path) -> RigError:
    return RigError(f"{archive} is not the archive its manifest describes (sha256 or size differs); nothing was "
                    "imaged", hint="pack the venv again (rig venv pack), or give the manifest written with it")


def _build(zstd: str, mksquashfs: str, archive: Path, manifest: dict, target: Path) -> tuple[str, int]:
    """ARCHIVE, read once and hashed as it is read, through `zstd -dc`, each member checked against the manifest's
    next entry (members.read_tar, as unpack reads it) as it is passed on to `mksquashfs - TARGET -tar`: TARGET's
    sha256 and size once all three succeeded (else a RigError). mksquashfs images whatever tar it is given (a
    device node, a set-id bit, a hard link out, bytes the manifest does not list) and is no parser for a hostile
    one (4.5.1 crashed on a hard link to /etc/passwd): it sees only members that were checked."""
    source = os.fdopen(open_plain(archive, os.O_RDONLY, "the venv archive", follow=False), "rb")
    with source, tempfile.TemporaryFile() as zstd_said, tempfile.TemporaryFile() as mksquashfs_said:
        unzstd = spawn([zstd, "-q", "-dc"], "decompressing the venv archive", stdin=PIPE, stdout=PIPE,
                       stderr=zstd_said)
        builder = spawn([mksquashfs, "-", str(target), *BUILD_OPTIONS], "building the venv image", stdin=PIPE,
                        stdout=mksquashfs_said, stderr=mksquashfs_said)
        assert unzstd.stdin and unzstd.stdout and builder.stdin  # pipes
        read: list[tuple[str, int] | BaseException] = []  # what _feed read, or why it stopped
        marker = io.BytesIO()
        feeder = threading.Thread(target=_feed, args=(source, unzstd.stdin, read), daemon=True)
        feeder.start()
        refused, built = None, None
        try:
            try:
                read_tar(unzstd, manifest["entries"], str(archive), functools.partial(_hash_file, str(archive), marker),
                         zstd_said, builder.stdin)
                members.marked(lambda: _marker(marker, str(archive)), manifest, str(archive))
            except RigError as exc:
                refused = exc
            except BrokenPipeError:
                pass  # mksquashfs ended early: its status says why
            for end in (builder.stdin, unzstd.stdout):
                with contextlib.suppress(BrokenPipeError):
                    end.close()
            if refused is None:
                built = builder.wait(MKSQUASHFS_TIMEOUT)
                unzstd.wait(MKSQUASHFS_TIMEOUT)
        finally:
            for child in (unzstd, builder):
                if child.poll() is None:
                    child.kill()
                    child.wait()
            feeder.join()
            with contextlib.suppress(BrokenPipeError):
                unzstd.stdin.close()
        fed, expected = read[0], (manifest["archive"]["sha256"], manifest["archive"]["size"])
        if isinstance(fed, BaseException):
            raise fed
        if fed != expected:  # read whole: whatever the tools or the members said, it is not the manifest's
            raise _not_its(archive)
        if refused is not None:
            raise refused
        if unzstd.returncode or built:
            said = (members.said(zstd_said) + " " + members.said(mksquashfs_said, 4000)).strip()
            raise RigError(f"cannot image {archive}: zstd exited {unzstd.returncode}, mksquashfs {built}: "
                           f"{said[-2000:]}")
    with os.fdopen(open_plain(target, os.O_RDONLY, "the venv image", follow=False), "rb") as handle:
        os.fsync(handle.fileno())
        return digest_of(handle)


def _hash_file(source: str, marker: io.BytesIO, tar: tarfile.TarFile, member: tarfile.TarInfo, kind: str,
               entry: list) -> None:
    """A file's bytes, as they pass on to mksquashfs, must be its entry's; the venv's marker is kept in MARKER
    (one rig wrote is a few kB), to be checked for the manifest's lock, as unpack checks it."""
    if kind == "file":
        keep = member.name == MARKER and member.size <= MAX_READ
        members.hashed(tar, member, entry[4], source, marker if keep else None)


def _marker(kept: io.BytesIO, source: str) -> dict | None:
    """The venv's marker as kept while it passed (None where none did), read as read_marker reads one."""
    data = kept.getvalue()
    return parse_json(data.decode(errors="replace"), f"{source}: {MARKER}", MARKER_SPEC) if data else None


def _feed(source, sink, read: list) -> None:
    """SOURCE's bytes into SINK, hashed: READ gets (sha256, size), or the error that stopped it. A sink that
    closed early (the read refused, zstd or mksquashfs failed) stops the feed, not the hash: the archive is still
    read whole, so that one that is not its manifest's is named so, whatever else went wrong."""
    digest, size = hashlib.sha256(), 0
    try:
        while block := source.read(1 << 20):
            digest.update(block)
            size += len(block)
            if sink is not None:
                try:
                    sink.write(block)
                except BrokenPipeError:
                    sink = None
        read.append((digest.hexdigest(), size))
    except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
        read.append(exc)
    finally:
        if sink is not None:
            with contextlib.suppress(BrokenPipeError):
                sink.close()
