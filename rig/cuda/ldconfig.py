"""ld.so.conf.d entries: one file per toolkit, covering every directory of it
that holds shared libraries, so sonames resolve for every process (services
included) without LD_LIBRARY_PATH."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from rig.core import RigError
from rig.core.fs import confined
from rig.core.proc import run
from rig.cuda.toolkit import tree_of

CONF_DIR = "/etc/ld.so.conf.d"
SBIN = ("/sbin/ldconfig", "/usr/sbin/ldconfig")


# Never on the loader's path: stubs are for linking only; compat holds a
# forward-compatibility libcuda that would shadow the installed driver's; the
# tools' directories hold their private copies of libraries.
PRIVATE = {"stubs", "compat", "compute-sanitizer", "nsight-compute", "nsight-systems", "libnvvp"}


def library_dirs(tree: Path) -> list[str]:
    """Directories under TREE that hold a shared object, real paths, deduplicated.

    NVRTC dlopens libnvrtc-builtins by soname at compile time, so its directory
    must be listed even when nothing links against it directly.
    """
    dirs: dict[str, None] = {}
    for lib in sorted(tree.rglob("*.so*")):
        parts = lib.relative_to(tree).parts[:-1]
        if lib.is_file() and not any(re.sub(r"-[\d.]+$", "", p) in PRIVATE for p in parts):
            dirs.setdefault(str(lib.parent.resolve()), None)
    return list(dirs)


def _loader_path(path: str) -> str:
    """PATH as one line of an ld.so.conf.d file, or a RigError: the loader splits lines on whitespace, colons
    and commas, so a prefix carrying any of them (or a newline) would add directories nobody chose."""
    if not re.fullmatch(r"/[A-Za-z0-9._+@/-]*", path):
        raise RigError(f"{path!r} cannot be a line of an ld.so.conf.d file (only letters, digits and ._+@/- "
                       "in an absolute path); install the toolkit under a plain prefix")
    return path


def conf_for(version: str, prefix: str = "/usr/local", conf_dir: str = CONF_DIR, root: str = "/") -> dict:
    """The path and content of the ld.so.conf.d file for one toolkit version.

    ROOT is where the tree is seen now (an image's staging dir): its directories are
    found under ROOT and written as the running system will see them, from /."""
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", version):  # a toolkit rig did not install may be any release
        raise RigError(f"--version {version!r}: give a CUDA release like 13.0 or 12.8.1")
    tree = tree_of(Path(prefix).absolute(), version)
    base = Path(root).resolve()
    try:  # a link in the tree is followed on this machine, not in the root: refused, never scanned or written through
        seen = confined(base, str(tree.relative_to(tree.anchor)), f"--root {root}")
    except RigError as exc:
        raise RigError(f"--root {root}: the toolkit tree {tree} there goes through a link that does not stay under "
                       f"{base}; give a root that holds the tree itself (copy the toolkit in, or run without --root)"
                       ) from exc
    dirs = ["/" + str(Path(d).relative_to(base)) for d in library_dirs(seen)] if seen.is_dir() else []
    if not dirs:  # not installed yet (e.g. under --check): the conventional layout
        dirs = [str(tree / "lib64")]
    name = tree.name.replace(".", "-")
    content = f"# Managed by rig: shared libraries of {_loader_path(str(tree))}\n" + "".join(
        f"{_loader_path(d)}\n" for d in dirs)
    return {"path": f"{conf_dir}/rig-{name}.conf", "content": content, "dirs": dirs,
            "installed": seen.is_dir()}


def ldconfig() -> str:
    """The ldconfig binary: often off a non-root user's PATH (Debian keeps it in /sbin)."""
    found = shutil.which("ldconfig") or next((p for p in SBIN if Path(p).is_file()), None)
    if not found:
        raise RigError("ldconfig not found (PATH, /sbin, /usr/sbin); install libc-bin")
    return found


def cache() -> dict[str, str]:
    """soname -> path for the x86-64/aarch64 entries of `ldconfig -p`."""
    done = run([ldconfig(), "-p"], "read the dynamic linker cache", timeout=60)
    found: dict[str, str] = {}
    for line in done.stdout.splitlines()[1:]:
        name, _, path = line.strip().partition(" => ")
        found.setdefault(name.split(" (")[0], path)
    return found
