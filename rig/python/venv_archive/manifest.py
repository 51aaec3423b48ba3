"""The archive's format: its name, its manifest read and checked whole, whether it fits this host, and the
tools every part uses (zstd, the sha256 and size the manifest records)."""
from __future__ import annotations

import hashlib
import io
import os
import platform
import re
import shutil
import sys
import tarfile
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from rig.core import RigError, http
from rig.core.documents import parse_json
from rig.core.fs import open_regular, read_bytes
from rig.core.schema import Field, distribution, feature, sha256

FORMAT = 1
FIXED_MTIME = 1_577_836_800  # 2020-01-01: every entry's time in the tar, so that the same venv packs to the same bytes
MANIFEST_LIMIT = 128 << 20  # bytes: a CUDA venv lists ~100k entries at ~120 bytes each
MANIFEST_TIMEOUT = 120.0
KINDS = ("dir", "file", "link")
MODES = {"dir": (0o755,), "file": (0o644, 0o755), "link": (0o777,)}  # never a set-id bit, never world-writable
# a control character (a NUL, a newline, an escape that rewrites the terminal) or a lone surrogate (a name that is
# not UTF-8): no name or link text rig packs holds one
UNSAFE = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")


def archive_name(lock_hash: str, python: str, arch: str) -> str:
    """NAME of the two files: venv-LOCK-pyX.Y-ARCH (PYTHON may be X.Y.Z)."""
    return f"venv-{lock_hash[:16]}-py{'.'.join(python.split('.')[:2])}-{arch}"


def kept_dir(cache: str | Path, lock_hash: str, venv: str) -> Path:
    """Where a controller keeps LOCK_HASH's archive of the venv at VENV: the python_stack role fetches what its
    first host packed there (its _python_stack_archive_dir names the same), and `rig image build` takes it."""
    return Path(cache) / "venv-archive" / f"{lock_hash}-{hashlib.sha256(venv.encode()).hexdigest()[:12]}"


def host_glibc() -> str:
    lib, version = platform.libc_ver()
    return version if lib == "glibc" else ""


def _one_of(pattern: str, said: str):
    return lambda value: None if re.fullmatch(pattern, value) else f"{value[:80]!r} is not {said}"


def path_problem(path: Any) -> str | None:
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
    if problem := path_problem(path):
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
    if link_problem(data):
        return f"{path}: a link's entry ends with its link text, one line of UTF-8 with no control character"
    return None


def link_problem(text: Any) -> bool:
    """Whether TEXT is no link text rig packs (empty, longer than a path, a control character, not UTF-8)."""
    return not isinstance(text, str) or not text or len(text) > 4096 or bool(UNSAFE.search(text))


TAR_TYPES = {"dir": tarfile.DIRTYPE, "file": tarfile.REGTYPE, "link": tarfile.SYMTYPE}


def member_of(kind: str, path: str, mode: int, size: int | None = None, link: str | None = None) -> tarfile.TarInfo:
    """The tar member an entry is packed as: its KIND, PATH, MODE, SIZE (a file's) and LINK text (a link's), and
    nothing else (root's, FIXED_MTIME): the same venv packs to the same bytes, and the tar an image is built from,
    written anew from the checked entries, tells mksquashfs only what the manifest vouches for."""
    info = tarfile.TarInfo(path)
    info.type, info.mode, info.mtime = TAR_TYPES[kind], mode, FIXED_MTIME
    info.size, info.linkname = size or 0, link or ""
    return info


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


# the rig patch set the venv carries (rig.patches.patchset.identity, checked by rig.patches.actions.carried when it
# was packed), null where it was packed without one: a host asking for another set takes neither archive nor image
PATCHES_SPEC = Field((dict, type(None)), fields={
    "ids": Field(list, required=True, item=Field(check=distribution)),
    "opt_in": Field(list, required=True, item=Field(check=feature)),
    "sha256": Field(required=True, check=sha256)})
ANY_PATCHES = "any"  # fits(): the patch set is not asked about

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
    "patches": PATCHES_SPEC,
    "entries": Field(list, required=True, check=_tree, item=Field(list, check=_entry)),
})


def absolute(path: str | Path) -> Path:
    """PATH absolute and normalised as `python -m venv` writes it into the venv's scripts (os.path.abspath)."""
    return Path(os.path.abspath(path))


def lies_inside(path: str | Path, directory: str | Path) -> bool:
    """Whether PATH is DIRECTORY or lies under it, as written or once links are followed."""
    pairs = ((absolute(path), absolute(directory)), (Path(os.path.realpath(path)), Path(os.path.realpath(directory))))
    return any(inner == outer or outer in inner.parents for inner, outer in pairs)


def is_url(source: str) -> bool:
    try:
        return urllib.parse.urlsplit(source).scheme.lower() in ("http", "https", "file")
    except ValueError as exc:  # an unclosed [ of an IPv6 host
        raise RigError(f"{source[:200]!r} is neither a file nor a URL rig reads ({exc}); give a path or an "
                       "http(s):// or file:// URL") from None


def read_bytes_of(source: bytes | str | Path, what: str) -> tuple[str, str]:
    """(where, text) of a manifest given as its bytes, a file, or an http(s):// or file:// URL: at most
    MANIFEST_LIMIT bytes of UTF-8, never a FIFO or a device."""
    if isinstance(source, bytes):
        where, data = what, source
    elif isinstance(source, str) and is_url(source):
        taken = io.BytesIO()
        http.download(source, taken, what, MANIFEST_LIMIT, MANIFEST_TIMEOUT)
        where, data = source, taken.getvalue()
    else:
        where, data = str(source), read_bytes(source, what, MANIFEST_LIMIT)
    try:
        return where, data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RigError(f"{where}: not UTF-8 (byte {exc.start}); not a manifest rig wrote") from None


def named(manifest: dict, where: str, field: str) -> dict:
    """MANIFEST, once its FIELD.name (the archive's or the image's) is the name its lock, Python and arch give."""
    wanted = archive_name(manifest["lock_hash"], manifest["python"], manifest["arch"])
    if manifest[field]["name"] != wanted:
        raise RigError(f"{where}: {field}.name {manifest[field]['name'][:80]!r} is not {wanted!r}, the name its "
                       "lock, Python and arch give; not a manifest rig wrote")
    return manifest


def read_manifest(source: bytes | str | Path, what: str = "venv archive manifest") -> dict:
    """A manifest (its bytes, a file, or an http(s):// or file:// URL), checked whole: its fields, every entry's
    path confined to the venv, and its archive's name what its fields make it. Anything else is one RigError."""
    where, text = read_bytes_of(source, what)
    return named(parse_json(text, where, MANIFEST_SPEC), where, "archive")


class Artifact(NamedTuple):
    """What a pull fetches: a file beside its manifest (NAME + MANIFEST_SUFFIX), read by READ, whose FIELD
    ({"name", "sha256", "size"}) names the file NAME + SUFFIX."""
    what: str
    manifest_suffix: str
    suffix: str
    field: str
    read: Callable[[bytes | str | Path, str], dict]


ARCHIVE = Artifact("the venv archive", ".manifest.json", ".tar.zst", "archive", read_manifest)


def already_made(artifact: Artifact, manifest_path: Path, made: Path, wanted: dict) -> dict | None:
    """The manifest at MANIFEST_PATH where it says WANTED (its fields' values) and MADE, the file it describes, is
    there with the sha256 and size it records: what a pack or an image finds already done. Hashed whole: a file
    of its size whose bytes changed is made again. Neither is read through a link."""
    try:
        raw = read_bytes(manifest_path, f"{artifact.what}'s manifest", MANIFEST_LIMIT, follow=False)
        old = artifact.read(raw, str(manifest_path))
        recorded = old[artifact.field]
        if any(old[key] != value for key, value in wanted.items()) or os.lstat(made).st_size != recorded["size"]:
            return None  # a file of another size is not hashed
        with open_regular(made, artifact.what, follow=False) as handle:
            return old if digest_of(handle) == (recorded["sha256"], recorded["size"]) else None
    except (RigError, OSError):  # missing, a link, a FIFO, not a manifest rig wrote: made again
        return None


def interpreter_of(manifest: dict) -> str | None:
    """The absolute path the venv's bin/python leads to: an image's manifest records it, an archive's links lead
    to it (None where it leads nowhere outside the venv)."""
    if "entries" not in manifest:
        return manifest["interpreter"] or None
    return _interpreter(manifest)


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


def fits(manifest: dict, lock_hash: str | None, venv: str | Path, patches: dict | str | None = ANY_PATCHES) -> str | None:
    """Why MANIFEST's archive (or image) cannot be this host's venv at VENV (of lock LOCK_HASH, when given, carrying
    the patch set PATCHES, when not ANY_PATCHES: None for none), or None."""
    here_python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    glibc, theirs = host_glibc(), manifest["glibc"]
    base = interpreter_of(manifest)
    if lock_hash is not None and lock_hash != manifest["lock_hash"]:
        return f"it holds lock {manifest['lock_hash'][:16]}, not {lock_hash[:16]}, the lock given"
    if str(absolute(venv)) != manifest["venv"]:
        return (f"it was packed at {manifest['venv']}, not {absolute(venv)} (a venv's scripts name its path): "
                "pack one at that path")
    if patches != ANY_PATCHES and _sha(manifest["patches"]) != _sha(patches):
        asked = patch_set(patches if isinstance(patches, dict) else None)
        return (f"it carries {patch_set(manifest['patches'])}, the host asks for {asked} (a venv patched with another "
                "set would need writing over): pack one with the stack's patches")
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


def _sha(patches: Any) -> str | None:
    return patches["sha256"] if isinstance(patches, dict) else None


def patch_set(patches: dict | None) -> str:
    """A patch set as the messages name it."""
    if patches is None:
        return "no rig patch set"
    opted = f", opt-in {', '.join(patches['opt_in'])}" if patches["opt_in"] else ""
    return f"rig patch set {patches['sha256'][:12]} ({len(patches['ids'])} patches{opted})"


def zstd_binary() -> str:
    found = shutil.which("zstd")
    if not found:
        raise RigError("zstd is not on PATH (venv archives are zstd tars): install zstd (apt-get install zstd)")
    return found


def digest_of(handle) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    while block := handle.read(1 << 20):
        digest.update(block)
        size += len(block)
    return digest.hexdigest(), size


def manifest_source(source: str, lock_hash: str | None, artifact: Artifact = ARCHIVE) -> str:
    """SOURCE where it names a manifest; where it names a directory (a URL not ending in the manifest's suffix, or a
    local directory), the manifest in it of LOCK_HASH's archive (or image) for this host's Python and arch."""
    local = not is_url(source)
    ending = artifact.manifest_suffix
    if source.endswith(ending) or (local and not Path(source).is_dir()):
        return source
    if not lock_hash:
        raise RigError(f"{source} is a directory, not a manifest: give its NAME{ending}, or the lock (--lock) "
                       f"whose {artifact.what.removeprefix('the ')} to take from it")
    name = archive_name(lock_hash, f"{sys.version_info[0]}.{sys.version_info[1]}", platform.machine())
    return str(Path(source) / f"{name}{ending}") if local else \
        urllib.parse.urljoin(source.rstrip("/") + "/", f"{name}{ending}")
