"""A venv rig installed packed as NAME.tar.zst and NAME.manifest.json: reproducible (fixed times, owner and
order), every file hashed as it is written."""
from __future__ import annotations

import hashlib
import io
import os
import platform
import re
import stat
import struct
import tarfile
import tempfile
import threading
from pathlib import Path

from rig.core import RigError, progress
from rig.core.documents import dump_json
from rig.core.fs import atomic_file, atomic_write, open_plain, read_bytes
from rig.core.proc import PIPE, spawn
from rig.python.venv import read_marker
from rig.python.venv_archive.manifest import (
    ARCHIVE,
    FIXED_MTIME,
    FORMAT,
    absolute,
    already_made,
    archive_name,
    host_glibc,
    lies_inside,
    member_of,
    zstd_binary,
)
from rig.python.venv_archive.tree import packed_mode, walk

PYC_HEADER = struct.Struct("<4sIII")  # magic, flags (0: checked against its source's mtime and size), mtime, size
MASK = 0xFFFFFFFF


def _pyc(venv: Path, path: str, data: bytes) -> bytes | None:
    """The bytes a cached module is packed with, or None to leave it out. A __pycache__ .pyc checked by time
    records its source's mtime and size; the source is packed with FIXED_MTIME, so a pyc that matched its source
    gets FIXED_MTIME too and stays fresh once unpacked. One that no longer matches, or has no source, is left
    out (Python compiles the module again on import): a stale pyc is never made to look fresh."""
    parts = path.split("/")
    if len(parts) < 2 or parts[-2] != "__pycache__" or not path.endswith(".pyc"):
        return data
    if len(data) < PYC_HEADER.size:
        return None
    magic, flags, mtime, size = PYC_HEADER.unpack_from(data)
    if flags != 0:  # hash-based: checked against its source's hash, whatever the time
        return data
    try:
        source = os.lstat(venv.joinpath(*parts[:-2], parts[-1].split(".", 1)[0] + ".py"))
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(source.st_mode) or (mtime, size) != (int(source.st_mtime) & MASK, source.st_size & MASK):
        return None
    return PYC_HEADER.pack(magic, 0, FIXED_MTIME, size) + data[PYC_HEADER.size:]


class _Hashing:
    """A file read through a digest: the bytes tarfile copies are the bytes hashed."""

    def __init__(self, handle) -> None:
        self.handle, self.digest = handle, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size)
        self.digest.update(data)
        return data


def _add(tar: tarfile.TarFile, venv: Path, kind: str, path: str, seen: os.stat_result) -> list | None:
    """PATH into TAR as packed (owner root, FIXED_MTIME, its mode normalised); its manifest entry, or None where
    it is left out (a stale pyc)."""
    mode = packed_mode(seen.st_mode, kind)
    if kind != "file":
        link = os.readlink(venv / path) if kind == "link" else None
        tar.addfile(member_of(kind, path, mode, link=link))
        return [kind, path, mode, None, link]
    with os.fdopen(open_plain(venv / path, os.O_RDONLY, "the venv's file", follow=False), "rb") as handle:
        info = member_of(kind, path, mode, os.fstat(handle.fileno()).st_size)
        if path.endswith(".pyc"):
            data = _pyc(venv, path, handle.read())
            if data is None:
                return None
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            return [kind, path, info.mode, info.size, hashlib.sha256(data).hexdigest()]
        reader = _Hashing(handle)
        try:
            tar.addfile(info, reader)  # tarfile only reads it, through the digest
        except OSError as exc:
            if "unexpected end of data" not in str(exc):
                raise
            raise RigError(f"{venv / path} shrank while it was packed: stop what writes to the venv and pack "
                           "again") from None
        return [kind, path, info.mode, info.size, reader.digest.hexdigest()]


def _python_of(venv: Path) -> str:
    """The venv's Python X.Y.Z, from the pyvenv.cfg venv (version) or uv (version_info) wrote."""
    config = read_bytes(venv / "pyvenv.cfg", "the venv's pyvenv.cfg").decode("utf-8", "replace")
    said = re.search(r"^version(?:_info)?\s*=\s*([0-9]+\.[0-9]+\.[0-9]+)", config, re.MULTILINE)
    if not said:
        raise RigError(f"{venv}/pyvenv.cfg says no version: is it a venv? pack a venv rig installed")
    return said[1]


def pack(venv: str | Path, out_dir: str | Path, check: bool = False, patches: dict | None = None) -> dict:
    """VENV, which rig installed (its marker names the lock), as OUT_DIR/NAME.tar.zst and NAME.manifest.json;
    a no-op where OUT_DIR already holds them for this lock, Python, arch, path and patch set. PATCHES: the rig
    patch set the venv was checked to hold (rig.patches.actions.carried), recorded; None: none recorded."""
    venv, out = absolute(venv), absolute(out_dir)
    if venv.is_symlink() or not venv.is_dir():
        raise RigError(f"{venv} is not a venv directory; give --venv the venv itself")
    if lies_inside(out, venv):  # --out a link into the venv too
        raise RigError(f"--out {out} is inside the venv {venv}: the archive would pack itself; give a directory "
                       "outside it")
    marker = read_marker(venv)
    if marker is None:
        raise RigError(f"{venv} has no rig marker: pack a venv rig installed (rig venv install)")
    head = {"format": FORMAT, "lock_hash": marker["lock_hash"], "python": _python_of(venv), "glibc": host_glibc(),
            "arch": platform.machine(), "venv": str(venv), "patches": patches}
    name = archive_name(head["lock_hash"], head["python"], head["arch"])
    archive, manifest_path = out / f"{name}.tar.zst", out / f"{name}.manifest.json"
    result = {"changed": False, "archive": str(archive), "manifest": str(manifest_path), "venv": str(venv)}
    old = already_made(ARCHIVE, manifest_path, archive,
                       {key: head[key] for key in ("lock_hash", "python", "arch", "venv", "patches")})
    if old is not None:
        return {**result, "sha256": old["archive"]["sha256"], "size": old["archive"]["size"],
                "files": len(old["entries"]), "msg": f"{archive} already holds {venv}"}
    if check:
        return {**result, "changed": True, "msg": f"would pack {venv} as {archive}"}
    zstd = zstd_binary()
    items = walk(venv)  # all of it first: a FIFO is refused before anything is written
    progress(f"packing {venv} ({len(items)} entries) as {archive}")
    with atomic_file(archive, 0o644) as sink:
        entries, digest, size = _compress(zstd, venv, items, sink)
    manifest = {**head, "archive": {"name": name, "sha256": digest, "size": size}, "entries": entries}
    atomic_write(manifest_path, dump_json(manifest, "the venv archive's manifest", sort_keys=True) + "\n")  # last
    files = sum(entry[0] == "file" for entry in entries)
    left_out = sum(kind == "file" for kind, _, _ in items) - files
    return {**result, "changed": True, "sha256": digest, "size": size, "files": files, "left_out": left_out,
            "msg": f"packed {venv} ({files} files, {size / 1e6:.1f} MB) as {archive}" +
                   (f"; left out {left_out} stale or sourceless pyc files" if left_out else "")}


def _compress(zstd: str, venv: Path, items: list, sink) -> tuple[list, str, int]:
    """ITEMS as a tar streamed through `zstd` into SINK (tar and compression on two cores): the manifest's
    entries, the archive's sha256 and its size, hashed as it is written."""
    digest, written, failed = hashlib.sha256(), [0], []
    with tempfile.TemporaryFile() as errors:
        child = spawn([zstd, "-q", "-3", "-T0", "-c"], "compressing the venv", stdin=PIPE, stdout=PIPE, stderr=errors)
        assert child.stdin and child.stdout  # pipes
        compressed = child.stdout

        def drain() -> None:
            try:
                while chunk := compressed.read(1 << 20):
                    digest.update(chunk)
                    sink.write(chunk)
                    written[0] += len(chunk)
            except BaseException as exc:  # a full disk: zstd stops, and the tar's next write fails
                failed.append(exc)
                child.kill()

        pump = threading.Thread(target=drain, daemon=True)
        pump.start()
        cut = False
        try:
            # PAX, members in walk order, fixed owner and times: the same venv, the same bytes (zstd's multithreaded
            # output is the same for any number of threads; a zstd of another version may compress differently)
            with tarfile.open(fileobj=child.stdin, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                entries = [entry for item in items if (entry := _add(tar, venv, *item)) is not None]
            child.stdin.close()
        except BrokenPipeError:
            entries, cut = [], True  # zstd ended first: its status or the pump's error says why, below
        except BaseException:
            child.kill()
            pump.join()
            child.wait()
            raise
        pump.join()
        code = child.wait()
        if failed:
            raise failed[0]
        if code or cut:
            errors.seek(0)
            raise RigError(f"zstd could not compress the venv (exit {code}): "
                           f"{errors.read(2000).decode(errors='replace').strip()}")
    return entries, digest.hexdigest(), written[0]


