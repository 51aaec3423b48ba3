"""The controller's wheelhouse: every locked wheel downloaded once, kept by hash.

Wheels live at CACHE/wheels/<sha256>/<filename>. A wheel is trusted only while
its bytes hash to what the lock says: a file that no longer does (tampered,
truncated) is dropped and fetched again; a fresh download that does not match
is refused. `export` lays a lock's wheels out flat with a hash-pinned
requirements file, for `pip install --no-index --require-hashes` on targets.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from rig.core import RigError, progress
from rig.core.fs import atomic_write, confined, link_or_copy, sha256_data, sha256_file
from rig.python.pip import download, index_args, pinned, target_args

REQUIREMENTS = "requirements.txt"


def cached_path(cache: str | Path, wheel: dict) -> Path:
    """CACHE/wheels/SHA256/FILENAME; the lock's fields are input (its hash anyone can recompute)."""
    return confined(Path(cache) / "wheels", f"{wheel['sha256']}/{wheel['filename']}", f"lock entry {wheel['name']}")


def _intact(path: Path, sha256: str) -> bool:
    """PATH is a regular file (never a link, which is replaced rather than trusted) with that sha256."""
    return path.is_file() and not path.is_symlink() and sha256_file(path) == sha256


def wanted(lock: dict) -> list[dict]:
    """The lock's wheels and the installer's (uv, pinned by rig): what a host pulls."""
    from rig.python.installer import uv_wheel

    return lock["wheels"] + [uv_wheel("x86_64")]


def fetch(lock: dict, cache: str | Path, check: bool = False) -> dict:
    """Make every wheel of LOCK (and the installer's) present and intact in the cache; download only what is not.
    CHECK: say what would be fetched, change nothing."""
    if not lock["complete"]:
        progress("the lock is partial: fetching only the wheels it could lock")
    reused, refetched, missing = 0, [], []
    for wheel in wanted(lock):
        path = cached_path(cache, wheel)
        if _intact(path, wheel["sha256"]):
            reused += 1
            continue
        if path.exists():
            refetched.append(wheel["filename"])
            if not check:
                progress(f"{path.name}: sha256 differs from the lock; dropping it and fetching again")
                path.unlink()
        missing.append(wheel)
    if check:
        return {"changed": bool(missing), "wheels": len(wanted(lock)), "reused": reused, "fetched": 0,
                "refetched": refetched, "would_fetch": [w["filename"] for w in missing], "bytes_downloaded": 0,
                "msg": f"would fetch {len(missing)} wheels ({len(refetched)} of them altered in the cache), "
                       f"{reused} already in the cache"}
    downloaded = _download(missing, lock, Path(cache)) if missing else 0
    return {"changed": bool(missing), "wheels": len(wanted(lock)), "reused": reused,
            "fetched": len(missing), "refetched": refetched, "bytes_downloaded": downloaded,
            "msg": f"{len(missing)} wheels fetched ({downloaded / 1e6:.1f} MB), {reused} already in the cache"}


def _download(wheels: list[dict], lock: dict, cache: Path) -> int:
    by_index: dict[str, list[dict]] = {}
    for wheel in wheels:
        by_index.setdefault(wheel["index"], []).append(wheel)
    target = target_args(lock["python"], "x86_64", lock["glibc"])
    total = 0
    (cache / "wheels").mkdir(parents=True, exist_ok=True)
    for index, group in by_index.items():
        progress(f"downloading {len(group)} wheels from {'the default index' if index == 'default' else index}")
        with tempfile.TemporaryDirectory(dir=cache / "wheels", prefix=".fetch-") as tmp:
            download([f"{w['name']}=={w['version']}" for w in group], Path(tmp), target,
                     index_args("" if index == "default" else index))
            for wheel in group:
                got = Path(tmp) / wheel["filename"]
                if not got.exists():
                    raise RigError(f"the index served no {wheel['filename']} for {wheel['name']}=={wheel['version']}; "
                                   "the lock no longer matches the index: run `rig lock` again")
                actual = sha256_file(got)
                if actual != wheel["sha256"]:
                    raise RigError(f"{wheel['filename']} from the index has sha256 {actual}, the lock says "
                                   f"{wheel['sha256']}; refusing it")
                total += got.stat().st_size
                dest = cached_path(cache, wheel)
                dest.parent.mkdir(parents=True, exist_ok=True)
                got.replace(dest)
    return total


def requirements(wheels: list[dict]) -> str:
    """WHEELS (lock entries: name, version, sha256) as a hash-pinned requirements file, for pip's
    --require-hashes."""
    return "\n".join(sorted(pinned(w["name"], w["version"], w["sha256"]) for w in wheels)) + "\n"


def lay_out(wheels: list[tuple[Path, dict]], dest: Path, requirements_file: Path,
            listed: list[dict] | None = None, check: bool = False) -> dict:
    """The one export: each (source, entry) wheel placed in DEST as its entry's filename (a hard link where
    the filesystem allows, else a copy; a link or a differing file there is replaced, never written through),
    and REQUIREMENTS_FILE pinning LISTED (default: every wheel placed). changed: whether DEST or the file now
    differs from before (with CHECK: would, and nothing is written); placed: the files written (or to be)."""
    for path in [requirements_file] + [dest / entry["filename"] for _, entry in wheels]:
        if path.is_dir() and not path.is_symlink():
            raise RigError(f"{path} is a directory where the export puts a file; remove it (nothing was exported)")
    if not check:
        dest.mkdir(parents=True, exist_ok=True)
    placed = []
    for src, entry in wheels:
        target = confined(dest, entry["filename"], f"wheel {entry['name']}", follow=False)
        if not _intact(target, entry["sha256"]):
            placed.append(entry["filename"])
            if check:
                continue
            if target.is_symlink() or target.is_file():
                target.unlink()
            link_or_copy(src, target)
    text = requirements(listed if listed is not None else [entry for _, entry in wheels])
    if not _intact(requirements_file, sha256_data(text)):
        placed.append(requirements_file.name)
        if not check:
            requirements_file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(requirements_file, text)
    return {"changed": bool(placed), "dir": str(dest), "wheels": [entry["filename"] for _, entry in wheels],
            "placed": placed, "requirements_sha256": sha256_data(text)}


def export(lock: dict, cache: str | Path, dest: str | Path, check: bool = False) -> dict:
    """Lay the lock's wheels (and the installer's) out in DEST with a hash-pinned requirements file; with CHECK,
    say what would be placed and write nothing."""
    placed = []
    for wheel in wanted(lock):
        src = cached_path(cache, wheel)
        if not _intact(src, wheel["sha256"]):
            raise RigError(f"{wheel['filename']} is missing from the wheelhouse or altered; "
                           "run `rig wheelhouse fetch` first")
        placed.append((src, wheel))
    # the requirements pin the lock's wheels only: the installer's wheel is served, not installed
    laid = lay_out(placed, Path(dest), Path(dest) / REQUIREMENTS, listed=lock["wheels"], check=check)
    return {**laid, "lock_hash": lock["lock_hash"], "msg": exported(laid, dest, check)}


def exported(laid: dict, dest: str | Path, check: bool) -> str:
    """What an export did, or with CHECK would do, to DEST."""
    if not laid["placed"]:
        return f"{dest} already holds the {len(laid['wheels'])} wheel(s) and their requirements"
    return f"{'would place' if check else 'placed'} {len(laid['placed'])} file(s) in {dest} " \
        f"({len(laid['wheels'])} wheel(s) in all)"
