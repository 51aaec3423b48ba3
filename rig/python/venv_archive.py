"""An installed venv as one archive: NAME.tar.zst and, beside it, NAME.manifest.json that lists every entry.

A host that unpacks it gets the venv a build host installed, byte for byte, in one download instead of an
install: no wheel is unpacked or compiled again. The archive is reproducible (the same venv packs to the same
bytes), so its sha256 names its content; the manifest holds that hash and every entry's, and unpacking checks
both, writing into a staging directory that takes the venv's place only once every byte has matched. A venv
holds its own absolute path (its scripts' #! lines, activate), so an archive fits only the path it was packed at.
"""
from __future__ import annotations

import hashlib
import io
import os
import platform
import re
import shutil
import stat
import struct
import sys
import tarfile
import tempfile
import threading
import urllib.error
import urllib.parse
from pathlib import Path
from typing import Any

from rig.core import RigError, http, progress
from rig.core.documents import dump_json, parse_json
from rig.core.fs import atomic_file, atomic_write, held, open_plain, read_bytes
from rig.core.proc import PIPE, TimeoutExpired, spawn
from rig.core.schema import Field, sha256
from rig.python.venv import MARKER, read_marker

FORMAT = 1
FIXED_MTIME = 1_577_836_800  # 2020-01-01: every entry's time in the tar, so that the same venv packs to the same bytes
MANIFEST_LIMIT = 128 << 20  # bytes: a CUDA venv lists ~100k entries at ~120 bytes each
MANIFEST_TIMEOUT = 120.0
PULL_TIMEOUT = 3600.0  # seconds for the whole archive; a pull cut off resumes where it stopped when run again
KINDS = ("dir", "file", "link")
MODES = {"dir": (0o755,), "file": (0o644, 0o755), "link": (0o777,)}  # never a set-id bit, never world-writable
PYC_HEADER = struct.Struct("<4sIII")  # magic, flags (0: checked against its source's mtime and size), mtime, size
MASK = 0xFFFFFFFF
# a control character (a NUL, a newline, an escape that rewrites the terminal) or a lone surrogate (a name that is
# not UTF-8): no name or link text rig packs holds one
UNSAFE = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")
HEADER_LIMIT = 1 << 20  # bytes of one tar extended header (PAX, GNU long name): a path of 4096 needs a few kB
HEADERS_NESTED = 4  # extended headers before one member: a PAX global, a PAX, a GNU long name and long link
ZSTD_EXIT = 5.0  # seconds zstd takes to exit once it has failed and closed its output
TRAILER_LIMIT = 1 << 20  # bytes after the tar's end: tar pads its last record (10 kB); not a stream to drain


def archive_name(lock_hash: str, python: str, arch: str) -> str:
    """NAME of the two files: venv-LOCK-pyX.Y-ARCH (PYTHON may be X.Y.Z)."""
    return f"venv-{lock_hash[:16]}-py{'.'.join(python.split('.')[:2])}-{arch}"


def _glibc() -> str:
    lib, version = platform.libc_ver()
    return version if lib == "glibc" else ""


def _one_of(pattern: str, said: str):
    return lambda value: None if re.fullmatch(pattern, value) else f"{value[:80]!r} is not {said}"


def _path_problem(path: Any) -> str | None:
    """Why PATH is no path inside the venv (absolute, `..`, an empty or `.` part, a control character, not
    UTF-8), or None."""
    if not isinstance(path, str) or not path or len(path) > 4096 or UNSAFE.search(path) or \
            path.startswith("/") or any(part in ("", ".", "..") for part in path.split("/")):
        return (f"{str(path)[:120]!r} is not a relative path inside the venv (no absolute path, no `..`, no control "
                "character, UTF-8); refusing it")
    return None


def _entry(entry: list) -> str | None:
    """One manifest entry: [kind, path, mode, size or null, sha256 or link text or null]."""
    if len(entry) != 5:
        return "an entry is [kind, path, mode, size, sha256 or link text]"
    kind, path, mode, size, data = entry
    if kind not in KINDS:
        return f"{str(kind)[:20]!r} is not an entry kind ({', '.join(KINDS)})"
    if problem := _path_problem(path):
        return problem
    if type(mode) is not int or mode not in MODES[kind]:  # 493.0 and True are no mode
        return f"{path}: mode {mode!r} is not one rig packs for a {kind} ({', '.join(map(oct, MODES[kind]))})"
    if kind == "file":
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size < 1 << 48:
            return f"{path}: size {size!r} is not a byte count"
        return sha256(data) if isinstance(data, str) else f"{path}: a file's entry ends with its sha256"
    if size is not None:
        return f"{path}: a {kind} has no size (null)"
    if kind == "dir":
        return None if data is None else f"{path}: a directory's entry ends with null"
    if _link_problem(data):
        return f"{path}: a link's entry ends with its link text, one line of UTF-8 with no control character"
    return None


def _link_problem(text: Any) -> bool:
    """Whether TEXT is no link text rig packs (empty, longer than a path, a control character, not UTF-8)."""
    return not isinstance(text, str) or not text or len(text) > 4096 or bool(UNSAFE.search(text))


def _tree(entries: list) -> str | None:
    """The entries as unpacking writes them: each path once, its directory listed before it, the links last
    (every file is written before any link exists, so nothing is ever written through one)."""
    seen: dict[str, str] = {}
    linked = False
    for kind, path, *_ in entries:
        parent = path.rpartition("/")[0]
        if path in seen:
            return f"{path} is listed twice"
        if parent and seen.get(parent) != "dir":
            return f"{path}: its directory {parent} is not listed before it"
        if kind != "link" and linked:
            return f"{path} comes after a link: the links come last"
        seen[path], linked = kind, linked or kind == "link"
    return None


MANIFEST_SPEC = Field(dict, fields={
    "format": Field(int, required=True, check=lambda v: None if v == FORMAT else
                    f"format {v} is not one this rig reads ({FORMAT}): unpack it with the rig that packed it"),
    "lock_hash": Field(required=True, check=sha256),
    "python": Field(required=True, check=_one_of(r"[0-9]+\.[0-9]+\.[0-9]+[0-9a-z+]*", "a Python version X.Y.Z")),
    "glibc": Field(required=True, check=_one_of(r"([0-9]{1,4}\.[0-9]{1,4})?", "a glibc version (2.NN) or empty")),
    "arch": Field(required=True, check=_one_of(r"[A-Za-z0-9_.-]{1,32}", "a machine name (x86_64, aarch64)")),
    "venv": Field(required=True, check=lambda v: None if v.startswith("/") and os.path.normpath(v) == v else
                  f"{v[:120]!r} is not an absolute, normalised path"),
    "archive": Field(dict, required=True, fields={
        "name": Field(required=True), "sha256": Field(required=True, check=sha256),
        "size": Field(int, required=True, check=lambda v: None if v >= 0 else "a size is at least 0")}),
    "entries": Field(list, required=True, check=_tree, item=Field(list, check=_entry)),
})


def _absolute(path: str | Path) -> Path:
    """PATH absolute and normalised as `python -m venv` writes it into the venv's scripts (os.path.abspath)."""
    return Path(os.path.abspath(path))


def _is_url(source: str) -> bool:
    try:
        return urllib.parse.urlsplit(source).scheme.lower() in ("http", "https", "file")
    except ValueError as exc:  # an unclosed [ of an IPv6 host
        raise RigError(f"{source[:200]!r} is neither a file nor a URL rig reads ({exc}); give a path or an "
                       "http(s):// or file:// URL") from None


def read_manifest(source: bytes | str | Path, what: str = "venv archive manifest") -> dict:
    """A manifest (its bytes, a file, or an http(s):// or file:// URL), checked whole: its fields, every entry's
    path confined to the venv, and its archive's name what its fields make it. Anything else is one RigError."""
    if isinstance(source, bytes):
        where, data = what, source
    elif isinstance(source, str) and _is_url(source):
        taken = io.BytesIO()
        http.download(source, taken, what, MANIFEST_LIMIT, MANIFEST_TIMEOUT)
        where, data = source, taken.getvalue()
    else:
        where, data = str(source), read_bytes(source, what, MANIFEST_LIMIT)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RigError(f"{where}: not UTF-8 (byte {exc.start}); not a manifest rig wrote") from None
    manifest = parse_json(text, where, MANIFEST_SPEC)
    wanted = archive_name(manifest["lock_hash"], manifest["python"], manifest["arch"])
    if manifest["archive"]["name"] != wanted:
        raise RigError(f"{where}: archive.name {manifest['archive']['name'][:80]!r} is not {wanted!r}, the name its "
                       "lock, Python and arch give; not a manifest rig wrote")
    return manifest


def _interpreter(manifest: dict) -> str | None:
    """The absolute path the archive's bin/python leads to (through the venv's own links), where it leads out."""
    links = {path: text for kind, path, _, _, text in manifest["entries"] if kind == "link"}
    path = "bin/python"
    for _ in range(8):
        if path not in links:
            return None
        text = links[path]
        if text.startswith("/"):
            return text
        path = os.path.normpath(os.path.join(os.path.dirname(path), text))
    return None


def fits(manifest: dict, lock_hash: str | None, venv: str | Path) -> str | None:
    """Why MANIFEST's archive cannot be this host's venv at VENV (of lock LOCK_HASH, when given), or None."""
    here_python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    glibc, theirs = _glibc(), manifest["glibc"]
    base = _interpreter(manifest)
    if lock_hash is not None and lock_hash != manifest["lock_hash"]:
        return f"it holds lock {manifest['lock_hash'][:16]}, not {lock_hash[:16]}, the lock given"
    if str(_absolute(venv)) != manifest["venv"]:
        return (f"it was packed at {manifest['venv']}, not {_absolute(venv)} (a venv's scripts name its path): "
                "pack one at that path")
    if ".".join(manifest["python"].split(".")[:2]) != here_python:
        return f"it is for Python {manifest['python']}, this host runs {here_python}"
    if manifest["arch"] != platform.machine():
        return f"it is for {manifest['arch']}, this host is {platform.machine()}"
    # its compiled wheels need at most the glibc they were installed on; a newer one runs them too
    if (theirs and not glibc) or (glibc and not theirs) or \
            (theirs and tuple(map(int, glibc.split("."))) < tuple(map(int, theirs.split(".")))):
        return f"it was packed on glibc {theirs or 'none'}, this host has {glibc or 'none'}"
    if base and not os.path.exists(base):
        return f"its bin/python leads to {base}, which this host lacks: install Python {manifest['python']} there"
    return None


def _zstd() -> str:
    found = shutil.which("zstd")
    if not found:
        raise RigError("zstd is not on PATH (venv archives are zstd tars): install zstd (apt-get install zstd)")
    return found


def _walk(venv: Path) -> list[tuple[str, str, os.stat_result]]:
    """(kind, path, lstat) of every entry under VENV, never following a link: directories and files in path order
    (a directory before what it holds), then every link, in path order."""
    found: list[tuple[str, str, os.stat_result]] = []
    links: list[tuple[str, str, os.stat_result]] = []

    def visit(inner: str) -> None:
        try:
            listed = os.scandir(venv / inner if inner else venv)
        except OSError as exc:
            raise RigError(f"cannot list {venv / inner}: {exc.strerror or exc}; rig packs all of a venv") from None
        with listed:
            for entry in listed:
                path = f"{inner}/{entry.name}" if inner else entry.name
                if _path_problem(path):  # what read_manifest refuses is never packed: the archive would not unpack
                    raise RigError(f"{venv}/{path!r}: a name that is not UTF-8, holds a control character or is "
                                   "too long; rename it")
                seen = entry.stat(follow_symlinks=False)
                if stat.S_ISLNK(seen.st_mode):
                    if _link_problem(os.readlink(entry.path)):
                        raise RigError(f"{venv}/{path} is a link to {os.readlink(entry.path)!r}: link text that is "
                                       "not UTF-8, holds a control character or is too long; replace the link")
                    links.append(("link", path, seen))
                elif stat.S_ISDIR(seen.st_mode):
                    found.append(("dir", path, seen))
                    visit(path)
                elif stat.S_ISREG(seen.st_mode):
                    found.append(("file", path, seen))  # a hard link too: its bytes, as a file of its own
                else:
                    raise RigError(f"{venv}/{path} is a FIFO, a socket or a device: a venv holds directories, files "
                                   "and links only; remove it and pack again")

    visit("")
    return sorted(found, key=lambda e: e[1]) + sorted(links, key=lambda e: e[1])


def _mode(st_mode: int, kind: str) -> int:
    """The mode an entry is packed with: only whether a file is executable is kept (no owner's quirks, no set-id)."""
    return {"dir": 0o755, "link": 0o777}.get(kind) or (0o755 if st_mode & 0o111 else 0o644)


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
    info = tarfile.TarInfo(path)
    info.mtime, info.mode = FIXED_MTIME, _mode(seen.st_mode, kind)
    if kind == "dir":
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
        return [kind, path, info.mode, None, None]
    if kind == "link":
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(venv / path)
        tar.addfile(info)
        return [kind, path, info.mode, None, info.linkname]
    with os.fdopen(open_plain(venv / path, os.O_RDONLY, "the venv's file", follow=False), "rb") as handle:
        info.size = os.fstat(handle.fileno()).st_size
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


def pack(venv: str | Path, out_dir: str | Path, check: bool = False) -> dict:
    """VENV, which rig installed (its marker names the lock), as OUT_DIR/NAME.tar.zst and NAME.manifest.json;
    a no-op where OUT_DIR already holds them for this lock, Python, arch and path."""
    venv, out = _absolute(venv), _absolute(out_dir)
    if venv.is_symlink() or not venv.is_dir():
        raise RigError(f"{venv} is not a venv directory; give --venv the venv itself")
    real_venv, real_out = (Path(os.path.realpath(path)) for path in (venv, out))  # --out a link into the venv too
    if out == venv or venv in out.parents or real_out == real_venv or real_venv in real_out.parents:
        raise RigError(f"--out {out} is inside the venv {venv}: the archive would pack itself; give a directory "
                       "outside it")
    marker = read_marker(venv)
    if marker is None:
        raise RigError(f"{venv} has no rig marker: pack a venv rig installed (rig venv install)")
    head = {"format": FORMAT, "lock_hash": marker["lock_hash"], "python": _python_of(venv), "glibc": _glibc(),
            "arch": platform.machine(), "venv": str(venv)}
    name = archive_name(head["lock_hash"], head["python"], head["arch"])
    archive, manifest_path = out / f"{name}.tar.zst", out / f"{name}.manifest.json"
    result = {"changed": False, "archive": str(archive), "manifest": str(manifest_path), "venv": str(venv)}
    old = _packed(manifest_path, archive, head)
    if old is not None:
        return {**result, "sha256": old["archive"]["sha256"], "size": old["archive"]["size"],
                "files": len(old["entries"]), "msg": f"{archive} already holds {venv}"}
    if check:
        return {**result, "changed": True, "msg": f"would pack {venv} as {archive}"}
    zstd = _zstd()
    items = _walk(venv)  # all of it first: a FIFO is refused before anything is written
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


def _packed(manifest_path: Path, archive: Path, head: dict) -> dict | None:
    """The manifest already in the out dir when it is of HEAD's venv and its archive is there at its size."""
    if not manifest_path.is_file() or manifest_path.is_symlink() or archive.is_symlink() or not archive.is_file():
        return None
    try:
        old = read_manifest(manifest_path)
    except RigError:
        return None
    same = all(old[key] == head[key] for key in ("lock_hash", "python", "arch", "venv"))
    return old if same and archive.stat().st_size == old["archive"]["size"] else None


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


def _digest_of(handle) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    while block := handle.read(1 << 20):
        digest.update(block)
        size += len(block)
    return digest.hexdigest(), size


def _manifest_source(source: str, lock_hash: str | None) -> str:
    """SOURCE where it names a manifest; where it names a directory (a URL not ending in .manifest.json, or a local
    directory), the manifest in it of LOCK_HASH's archive for this host's Python and arch."""
    local = not _is_url(source)
    if source.endswith(".manifest.json") or (local and not Path(source).is_dir()):
        return source
    if not lock_hash:
        raise RigError(f"{source} is a directory, not a manifest: give its NAME.manifest.json, or the lock (--lock) "
                       "whose archive to take from it")
    name = archive_name(lock_hash, f"{sys.version_info[0]}.{sys.version_info[1]}", platform.machine())
    return str(Path(source) / f"{name}.manifest.json") if local else \
        urllib.parse.urljoin(source.rstrip("/") + "/", f"{name}.manifest.json")


def pull(source: str, dest_dir: str | Path, expected: dict | None = None, timeout: float = PULL_TIMEOUT) -> Path:
    """An archive and its manifest from SOURCE (the manifest's URL, a directory's URL where EXPECTED names the
    lock_hash, or a local path) into DEST_DIR; the archive's path. Each key of EXPECTED (the manifest already read,
    or some of its fields) must equal the pulled manifest's, before the archive is downloaded. The archive grows in
    NAME.tar.zst.part, resumed from its size where a pull was cut short, hashed as it streams, and takes its name
    only once its sha256 and size are the manifest's; the manifest is written last: present means whole."""
    wanted = expected or {}
    source = _manifest_source(source, wanted.get("lock_hash"))
    if not _is_url(source):
        source = Path(source).absolute().as_uri()
    taken = io.BytesIO()
    http.download(source, taken, "the venv archive's manifest", MANIFEST_LIMIT, MANIFEST_TIMEOUT)
    manifest = read_manifest(taken.getvalue(), source)
    for key, value in wanted.items():
        if manifest.get(key) != value:
            raise RigError(f"{source} is not the manifest expected: its {key} is {str(manifest.get(key))[:80]!r}, "
                           f"not {str(value)[:80]!r}")
    name, want, size = manifest["archive"]["name"], manifest["archive"]["sha256"], manifest["archive"]["size"]
    url = urllib.parse.urljoin(source, urllib.parse.quote(f"{name}.tar.zst"))
    dest = Path(dest_dir)
    final, part = dest / f"{name}.tar.zst", dest / f"{name}.tar.zst.part"
    if dest.is_symlink() or (os.path.lexists(dest) and not dest.is_dir()):
        raise RigError(f"{dest} is a link or not a directory; rig pulls only into a directory of its own: remove it")
    dest.mkdir(parents=True, exist_ok=True)
    with held(dest / f".{name}.pull.lock"):  # two pulls into one directory take turns; the second finds it whole
        if final.is_file() and not final.is_symlink() and final.stat().st_size == size:
            with os.fdopen(open_plain(final, os.O_RDONLY, "the venv archive", follow=False), "rb") as handle:
                if _digest_of(handle) == (want, size):
                    atomic_write(dest / f"{name}.manifest.json", taken.getvalue())
                    return final
        try:
            made = open_plain(part, os.O_RDWR | os.O_CREAT, "the archive's partial download", follow=False)
        except RigError as exc:
            raise RigError(f"{exc}: rig's partial download is a plain file; remove it and pull again") from None
        with os.fdopen(made, "r+b") as handle:
            digest, have, resumed = _download(handle, url, size, timeout, part)
        if have < size:  # the answer ended short of the archive, as it said it would (no length, or a file)
            if have > resumed:
                raise RigError(f"{url} ended after {have} of the archive's {size} bytes: run again to resume")
            part.unlink(missing_ok=True)
            raise RigError(f"{url} has no bytes past {have} of the archive's {size}: the partial download is "
                           "removed; pull again, or pack the archive again where it is served")
        if (digest.hexdigest(), have) != (want, size):
            part.unlink(missing_ok=True)
            raise RigError(f"{url} is not the archive its manifest describes (sha256 or size differs); the partial "
                           "download is removed: pull again, or pack the archive again where it is served")
        os.replace(part, final)
        atomic_write(dest / f"{name}.manifest.json", taken.getvalue())
    return final


def _download(handle, url: str, size: int, timeout: float, part: Path) -> tuple[Any, int, int]:
    """URL into HANDLE, the open partial download PART, from where it stops: (its digest, its bytes, the bytes it
    held before). A download that fails leaves its bytes to resume from, but an empty part, and a part the server
    has no more bytes for (416: it is longer than the server's file), which no run could finish."""
    digest, have = hashlib.sha256(), 0
    try:
        if os.fstat(handle.fileno()).st_size <= size:  # the bytes already there, hashed first
            while block := handle.read(1 << 20):
                digest.update(block)
                have += len(block)
        resumed = have
        if have < size:
            if have:
                progress(f"resuming {url} at byte {have} of {size}")
            with http.answer(url, "the venv archive", size, timeout, offset=have) as (start, chunks):
                if start != have:  # the server sent the whole file: start over
                    handle.seek(0)
                    digest, have, resumed = hashlib.sha256(), 0, 0
                handle.truncate(have)
                for chunk in chunks:
                    digest.update(chunk)
                    handle.write(chunk)
                    have += len(chunk)
        handle.flush()
        os.fsync(handle.fileno())
    except BaseException as exc:
        shorter = isinstance(exc.__cause__, urllib.error.HTTPError) and exc.__cause__.code == 416
        try:
            handle.flush()  # what came before the failure is kept
        except OSError:
            pass
        kept = os.fstat(handle.fileno()).st_size
        if shorter or not kept:
            part.unlink(missing_ok=True)
        if shorter:
            raise RigError(f"{exc}: the archive there ends before byte {have}, where the partial download stopped; "
                           "the partial download is removed: pull again") from None
        if kept and isinstance(exc, RigError):
            raise RigError(f"{exc}; the {kept} bytes pulled are kept: run again to resume") from exc
        raise
    return digest, have, resumed


def _settled(manifest: dict, venv: Path, lock_hash: str | None, check: bool) -> dict | None:
    """Every refusal that needs no archive, then the answer where nothing is to be written (the venv already
    holds the lock); None where the archive is to be read."""
    name = manifest["archive"]["name"]
    if why := fits(manifest, lock_hash, venv):
        raise RigError(f"archive {name} does not fit {venv}: {why}")
    if venv.parent == venv:
        raise RigError(f"{venv} is the root directory, no venv's path; give the venv's own directory")
    try:
        seen = os.lstat(venv)
    except (FileNotFoundError, NotADirectoryError):  # a file above it: said below
        seen = None
    except OSError as exc:
        raise RigError(f"cannot look at the venv {venv}: {exc.strerror or exc}") from None
    if seen is not None and not stat.S_ISDIR(seen.st_mode):
        raise RigError(f"{venv} is a link or not a directory; rig replaces only a venv directory: remove it")
    if seen is None:  # the venv is made in its parent, which must be a directory (a link to one) or not yet there
        above = next(path for path in venv.parents if os.path.lexists(path))
        if not above.is_dir():
            raise RigError(f"{above} is not a directory (a file, or a link to nothing), so {venv} cannot be made "
                           "under it: remove it or give another --venv")
    marker = read_marker(venv) if seen else None
    if seen and marker is None and not os.path.lexists(venv / "pyvenv.cfg") and any(venv.iterdir()):
        raise RigError(f"{venv} holds files but is no venv (no {MARKER}, no pyvenv.cfg); rig replaces only a venv: "
                       "move what is there, or give another --venv")
    if marker and marker["lock_hash"] == manifest["lock_hash"]:
        return {"changed": False, "venv": str(venv), "msg": f"{venv} already has lock {manifest['lock_hash'][:12]}"}
    return None


def unpack(archive: str | Path, manifest: dict, venv: str | Path, lock_hash: str | None = None,
           check: bool = False) -> dict:
    """The archive MANIFEST (as read_manifest returns it) describes, as the venv VENV: refused before anything is
    written where it does not fit (fits(), with LOCK_HASH) or its bytes are not the manifest's; a no-op where the
    venv already holds its lock. Every member must be the manifest's next entry, bytes and all, or the staging
    directory is removed and nothing at VENV changes."""
    venv = _absolute(venv)
    settled = _settled(manifest, venv, lock_hash, check)
    if settled is not None:
        return settled
    zstd, name = _zstd(), manifest["archive"]["name"]
    with os.fdopen(open_plain(archive, os.O_RDONLY, "the venv archive"), "rb") as handle:
        if _digest_of(handle) != (manifest["archive"]["sha256"], manifest["archive"]["size"]):
            raise RigError(f"{archive} is not the archive its manifest describes (sha256 or size differs): pull or "
                           "copy it again")
        if check:  # every precondition of the run, the archive's bytes included, checked; only the writing skipped
            return {"changed": True, "venv": str(venv), "msg": f"would unpack {name} into {venv}" +
                    (", replacing the venv there" if venv.exists() else "")}
        handle.seek(0)  # zstd reads the very file just hashed, not whatever the path names by now
        venv.parent.mkdir(parents=True, exist_ok=True)
        try:
            staging = Path(tempfile.mkdtemp(dir=venv.parent, prefix=f".{venv.name}.rig-unpack-"))  # same filesystem
        except OSError as exc:
            raise RigError(f"cannot make the staging directory beside {venv}: {exc.strerror or exc}") from None
        try:
            progress(f"unpacking {name} ({len(manifest['entries'])} entries) into {venv}")
            _decompress(zstd, handle, manifest, staging, str(archive))
            _marked(staging, manifest, str(archive))
            _swap(staging, venv)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return {"changed": True, "venv": str(venv), "lock_hash": manifest["lock_hash"], "entries": len(manifest["entries"]),
            "msg": f"unpacked {name} into {venv}"}


class _Member(tarfile.TarInfo):
    """tarfile's member, its headers bounded: tarfile reads an extended header (PAX, a GNU long name) whole into
    memory and follows a chain of them by recursion, so a few kB of zstd could claim a header of gigabytes or a
    chain thousands deep. A sparse member, which rig never packs, is refused before its map is read."""

    def _proc_member(self, tar):
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise tarfile.ReadError(f"{self.name[:200]!r} is a sparse member")
        if self.type not in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
                             tarfile.GNUTYPE_LONGLINK):
            return super()._proc_member(tar)
        nested = getattr(tar, "rig_nested", 0)
        if self.size > HEADER_LIMIT or nested >= HEADERS_NESTED:
            raise tarfile.ReadError(f"an extended header of {self.size} bytes, {nested + 1} deep (rig packs one of a "
                                    "few kB before a member)")
        tar.rig_nested = nested + 1
        try:
            return super()._proc_member(tar)
        finally:
            tar.rig_nested = nested

    def _proc_gnusparse_10(self, *_):  # a PAX sparse member: its map is read from the stream, unbounded
        raise tarfile.ReadError("a sparse member")


def _marked(staging: Path, manifest: dict, source: str) -> None:
    """The unpacked venv's marker, which says which lock a venv holds (a later unpack, verify, install read it),
    must name the manifest's lock: a manifest that claims a lock its archive does not hold is refused."""
    try:
        marker = read_marker(staging)
    except RigError as exc:
        raise RigError(f"{source}: its venv's marker {MARKER} is not one rig wrote ({exc}); the archive is not one "
                       "rig packs: pack the venv again") from None
    if marker is None or marker["lock_hash"] != manifest["lock_hash"]:
        said = f"names lock {marker['lock_hash'][:16]}" if marker else "is missing"
        raise RigError(f"{source}: its venv's marker {MARKER} {said}, its manifest lock {manifest['lock_hash'][:16]}; "
                       "the archive and its manifest do not belong together: pack the venv again")


def _decompress(zstd: str, handle, manifest: dict, staging: Path, source: str) -> None:
    """`zstd -dc` of HANDLE piped into tarfile, each member written into STAGING (decompressing and writing on
    two cores)."""
    with tempfile.TemporaryFile() as errors:
        child = spawn([zstd, "-dc"], "decompressing the venv archive", stdin=handle, stdout=PIPE, stderr=errors)
        assert child.stdout  # a pipe
        try:
            try:
                # reads of 1 MiB: tarfile's default 10 KiB record made a third of the unpack's time
                with tarfile.open(fileobj=child.stdout, mode="r|", bufsize=1 << 20, tarinfo=_Member) as tar:
                    _extract(tar, manifest["entries"], staging, source)
                # the tar's end padding: zstd ends once it is read; more is no tar rig packs, and is not drained (a
                # few kB of zstd decompress to terabytes)
                if len(child.stdout.read(TRAILER_LIMIT + 1)) > TRAILER_LIMIT:
                    raise RigError(f"{source}: holds more than {TRAILER_LIMIT >> 20} MiB after the tar's end; not an "
                                   "archive rig packs: pack it again")
            except (tarfile.TarError, EOFError, ValueError) as exc:  # ValueError: tarfile's of a malformed header
                try:  # zstd that failed has ended; zstd still writing what nobody reads would wait for good
                    code = child.wait(ZSTD_EXIT)
                except TimeoutExpired:
                    code = 0  # it decompresses: the tar is what is wrong (finally kills it)
                errors.seek(0)
                said = errors.read(2000).decode(errors="replace").strip()
                raise RigError(f"{source}: " + (f"zstd could not decompress it (exit {code}): {said}" if code else
                                                f"not a tar as rig packs it ({exc})")) from None
            code = child.wait()
            if code:
                errors.seek(0)
                raise RigError(f"{source}: zstd could not decompress it (exit {code}): "
                               f"{errors.read(2000).decode(errors='replace').strip()}")
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            child.stdout.close()


def _kind(member: tarfile.TarInfo) -> str:
    return "dir" if member.isdir() else "link" if member.issym() else \
        "file" if member.type in (tarfile.REGTYPE, tarfile.AREGTYPE) and not member.issparse() else "other"


def _extract(tar: tarfile.TarFile, entries: list, staging: Path, source: str) -> None:
    """Each member of TAR, which must be the next of ENTRIES (kind, path, mode, size, bytes, link text), into
    STAGING: files created new and never through a link, links only after every file, every time FIXED_MTIME."""
    expected, dirs, linked, links = iter(entries), [], False, set()
    for member in tar:
        entry = next(expected, None)
        kind = _kind(member)
        if entry is None or [kind, member.name, member.mode] != entry[:3] or \
                (kind == "file" and member.size != entry[3]) or (kind == "link" and member.linkname != entry[4]):
            listed = f"the manifest's next entry is {entry[1]!r} ({entry[0]})" if entry else "the manifest lists no more"
            if entry and [kind, member.name] == entry[:2]:
                listed = f"its {'mode' if member.mode != entry[2] else 'size' if kind == 'file' else 'link text'} differs"
            raise RigError(f"{source}: member {member.name[:200]!r} ({kind}) is not its manifest's: {listed}; the "
                           "archive and its manifest do not belong together")
        if kind != "link" and linked:
            raise RigError(f"{source}: {member.name[:200]!r} comes after a link: the links come last")
        # no resolve() per member (it was half the unpack's time): a name with no absolute start and no `..` part,
        # in a STAGING that is new and holds no link until the last members (the links), with every file created
        # new (O_EXCL | O_NOFOLLOW), cannot land outside STAGING
        if problem := _path_problem(member.name):
            raise RigError(f"{source}: member {problem} (it leads outside the venv)")
        target = staging / member.name
        try:
            if kind == "dir":
                os.mkdir(target, 0o700)  # its mode once it is filled: a directory packed read-only still takes its files
                dirs.append(target)
            elif kind == "file":
                _write(tar, member, target, entry[4], source)
            else:
                linked = True
                parts = member.name.split("/")  # a link under a link made here would be made through it, outside
                if any("/".join(parts[:end]) in links for end in range(1, len(parts))):
                    raise RigError(f"{source}: {member.name[:200]!r} lies under a link of the archive; the links of "
                                   "a venv lie in its directories")
                links.add(member.name)
                os.symlink(member.linkname, target)
                os.utime(target, (FIXED_MTIME, FIXED_MTIME), follow_symlinks=False)
        except OSError as exc:
            raise RigError(f"{source}: cannot write {member.name[:200]!r}: {exc.strerror or exc}") from None
    if (missing := next(expected, None)) is not None:
        raise RigError(f"{source}: ends before {missing[1]!r}, which its manifest lists; the archive is not whole")
    for path in [*reversed(dirs), staging]:  # innermost first: filling a directory changes its mtime
        os.chmod(path, 0o755)
        os.utime(path, (FIXED_MTIME, FIXED_MTIME), follow_symlinks=False)


def _write(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path, sha: str, source: str) -> None:
    """MEMBER's bytes into TARGET, a new file (O_EXCL, no link followed), hashed as written."""
    digest = hashlib.sha256()
    reader = tar.extractfile(member)
    assert reader is not None  # a regular file
    # created here, never opened before (O_EXCL): open_plain's checks of an existing file have nothing to look at
    made = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, member.mode)
    with os.fdopen(made, "wb") as out:
        while chunk := reader.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
        os.fchmod(out.fileno(), member.mode)
    if digest.hexdigest() != sha:
        raise RigError(f"{source}: {member.name[:200]!r} is not the file its manifest describes (sha256 differs); "
                       "the archive and its manifest do not belong together")
    os.utime(target, (FIXED_MTIME, FIXED_MTIME), follow_symlinks=False)


def _swap(staging: Path, venv: Path) -> None:
    """STAGING, whole and checked, takes VENV's place; the old venv is removed after. The two renames leave a
    moment with no venv at VENV: Python has no RENAME_EXCHANGE (renameat2), which would swap them in one step."""
    old = None
    if os.path.lexists(venv):
        old = Path(tempfile.mkdtemp(dir=venv.parent, prefix=f".{venv.name}.rig-old-"))
        try:
            os.rename(venv, old / venv.name)
        except OSError as exc:  # a venv directory its owner made read-only cannot move to another directory
            old.rmdir()
            raise RigError(f"cannot move the old venv {venv} aside: {exc.strerror or exc}; make it writable or "
                           "remove it") from None
    try:
        os.rename(staging, venv)
    except OSError:
        if old is not None:
            os.rename(old / venv.name, venv)
        raise
    if old is not None:
        _remove(old)


def _remove(path: Path) -> None:
    """PATH's tree removed, even where its owner made a directory read-only (a tree rig moved aside: nothing in
    it is followed through a link)."""
    shutil.rmtree(path, ignore_errors=True)
    if not os.path.lexists(path):
        return
    for root, dirs, _ in os.walk(path):  # top down: each directory made writable before it is listed
        for name in dirs:
            inner = os.path.join(root, name)
            if not os.path.islink(inner):
                try:
                    os.chmod(inner, 0o700)
                except OSError:
                    pass
    shutil.rmtree(path, ignore_errors=True)


def restore(manifest_from: str, venv: str | Path, archive: str | Path | None = None, lock_hash: str | None = None,
            check: bool = False, timeout: float = PULL_TIMEOUT) -> dict:
    """`rig venv unpack`: the manifest from a file (its archive beside it, or ARCHIVE) or a URL (its archive
    pulled beside the venv, resumable, removed once unpacked), or from a directory of either kind where LOCK_HASH
    names the archive; everything that can refuse without the archive refuses before it is pulled."""
    venv = _absolute(venv)
    manifest_from = _manifest_source(manifest_from, lock_hash)
    manifest = read_manifest(manifest_from)
    settled = _settled(manifest, venv, lock_hash, check)
    if settled is not None:
        return settled
    if archive is not None:
        return unpack(archive, manifest, venv, lock_hash, check)
    if not _is_url(manifest_from):
        return unpack(Path(manifest_from).with_name(f"{manifest['archive']['name']}.tar.zst"), manifest, venv,
                      lock_hash, check)
    if check:  # the pull is the run's first action: the archive is looked at once it is here
        return {"changed": True, "venv": str(venv), "msg": f"would pull {manifest['archive']['name']} from "
                f"{manifest_from} and unpack it into {venv}"}
    pulled = venv.parent / f".{venv.name}.rig-pull"
    try:
        got = pull(manifest_from, pulled, manifest, timeout)
    except BaseException:
        _drop(pulled, keep_part=True)  # a pull cut short leaves its .part to resume from, and nothing else
        raise
    try:
        result = unpack(got, manifest, venv, lock_hash)
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


def verify_against(venv: str | Path, manifest: dict) -> dict:
    """VENV compared with MANIFEST, entry by entry (kind, mode, size, sha256, link text), and what VENV holds
    beyond it, but for __pycache__: Python writes there as it imports."""
    venv = Path(venv)
    if venv.is_symlink() or not venv.is_dir():
        raise RigError(f"{venv} is not a venv directory")
    found = {path: (kind, seen) for kind, path, seen in _walk(venv)}
    differs = []
    for kind, path, mode, size, data in manifest["entries"]:
        have = found.pop(path, None)
        if have is None:
            differs.append(f"{path}: missing")
        elif have[0] != kind:
            differs.append(f"{path}: a {have[0]}, the archive has a {kind}")
        elif _mode(have[1].st_mode, kind) != mode:
            differs.append(f"{path}: mode {oct(_mode(have[1].st_mode, kind))}, the archive has {oct(mode)}")
        elif kind == "link" and os.readlink(venv / path) != data:
            differs.append(f"{path}: links to {os.readlink(venv / path)!r}, the archive to {data!r}")
        elif kind == "file":
            with os.fdopen(open_plain(venv / path, os.O_RDONLY, "the venv's file", follow=False), "rb") as handle:
                if _digest_of(handle) != (data, size):
                    differs.append(f"{path}: its bytes differ from the archive's")
    differs += [f"{path}: not in the archive" for path in sorted(found) if "__pycache__" not in path.split("/")]
    return {"ok": not differs, "differs": differs, "entries": len(manifest["entries"])}
