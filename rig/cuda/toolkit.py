"""Install CUDA toolkits side by side, each in its own PREFIX/cuda-X.Y tree.

Every install is assembled in a hidden staging directory next to its final
place and renamed into place only once it is complete and verified, so an
interrupted run never leaves a half-installed tree behind, and a re-run cleans
the leftovers and completes it. A tree rig did not install is never modified.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from rig.core import RigError, defaults, progress, wheelfile
from rig.core.cuda_releases import COMPONENTS, RELEASES, major, series
from rig.core.documents import dump_json, load_json
from rig.core.fs import atomic_write, confined, held, sha256_data, sha256_file
from rig.core.proc import run
from rig.core.schema import Field, sha256
from rig.cuda.wheel_archive import ARCHIVE_MEMBERS as ARCHIVE_MEMBERS  # re-exported: its bound, as callers read it
from rig.cuda.wheel_archive import MANIFEST, pack, unpack
from rig.python.pip import download, target_args

MARKER = ".rig-toolkit.json"
DEFAULT_STATE_DIR = defaults.STATE_DIR


def check_release(version: str) -> None:
    if version not in RELEASES:
        raise RigError(f"unknown CUDA version {version!r}; known: {', '.join(RELEASES)}. "
                       "Fix the cuda.version key of the stack.")


# The stack schema's methods (rig.stack.spec.METHODS): rig installs two itself; apt is NVIDIA's packages from
# NVIDIA's repository, installed by apt through the cuda_toolkit role (roles/cuda_toolkit/tasks/apt.yml), the one
# place that mechanism lives: nothing to fetch on the controller and nothing for rig to stage.
METHODS = ("wheels", "runfile")


def check_method(method: str) -> None:
    if method == "apt":
        raise RigError("the apt method is installed by apt through the cuda_toolkit role (playbooks/cuda.yml, with "
                       "the stack's cuda.apt.repo_url and cuda.apt.keyring_url set), not by rig cuda fetch or "
                       "install, which install the wheels and runfile methods")
    if method not in METHODS:
        raise RigError(f"unknown CUDA install method {method!r}; rig installs {' and '.join(METHODS)}")


def check_components(components: list[str]) -> None:
    unknown = sorted(set(components) - set(COMPONENTS))
    if unknown:
        raise RigError(f"unknown CUDA component {unknown[0]!r}; known: {', '.join(COMPONENTS)}")


def tool_release(tool: str | Path) -> str | None:
    """The CUDA release (X.Y) a toolkit program (nvcc, ptxas) reports, or None when it cannot say."""
    try:
        out = run([str(tool), "--version"], f"asking {tool} its release", ok=None, timeout=60).stdout
    except RigError:  # it cannot run here, or hangs
        return None
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else None


def tree_of(prefix: str | Path, version: str) -> Path:
    return Path(prefix) / f"cuda-{series(version)}"


# ---------------------------------------------------------------- controller side

def fetch_wheels(version: str, components: list[str], cache: str | Path,
                 platform: str = "x86_64", check: bool = False) -> dict:
    """Download the release's component wheels once into the controller cache; with CHECK, say whether they are
    there, verified, or would be downloaded, and download and write nothing."""
    check_release(version)
    check_components(components)
    dest = Path(cache) / "cuda" / f"{version}-{platform}-{'-'.join(sorted(components))}"
    if check:
        requirement = f"cuda-toolkit[{','.join(components)}]=={RELEASES[version]}"
        try:
            record = verify_manifest(dest) if (dest / MANIFEST).exists() else None
        except RigError as exc:
            record, why = None, f"{exc}: "
        else:
            why = ""
        if record:
            return {"changed": False, "dir": str(dest), **record, "msg": f"{dest} holds CUDA {version}'s wheels"}
        return {"changed": True, "dir": str(dest), "version": version, "components": sorted(components),
                "msg": f"{why}would download {requirement} into {dest}"}
    with _locked(dest.parent / f".{dest.name}.lock"):
        return _fetch_wheels_locked(version, components, dest, platform)


@contextmanager
def _locked(path: Path):
    """Serialise runs that share a place: many hosts, one download; two installs into one prefix,
    one after the other (each would otherwise clean the other's staging as leftovers)."""
    _mkdir(path.parent)
    with held(path):
        yield


def _prefix_lock(prefix: str | Path) -> Path:
    return Path(prefix) / ".rig-cuda.lock"


def _fetch_wheels_locked(version: str, components: list[str], dest: Path, platform: str) -> dict:
    manifest = dest / MANIFEST
    if manifest.exists():
        try:
            record = verify_manifest(dest)
            return {"changed": False, "dir": str(dest), "archive": str(pack(dest, record)), **record}
        except RigError as exc:
            progress(f"{exc}; fetching again")
    progress(f"downloading CUDA {version} wheels ({', '.join(components)}) into {dest}")
    staging = Path(tempfile.mkdtemp(prefix=".fetch-", dir=_mkdir(dest.parent)))
    try:
        requirement = f"cuda-toolkit[{','.join(components)}]=={RELEASES[version]}"
        download([requirement], staging, target_args(None, platform), [], no_deps=False)
        wheels = {p.name: sha256_file(p) for p in sorted(staging.glob("*.whl"))}
        record = {"version": version, "components": sorted(components), "wheels": wheels}
        (staging / MANIFEST).write_text(dump_json(record, str(MANIFEST), indent=2) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"changed": True, "dir": str(dest), "archive": str(pack(dest, record)), **record}


RUNFILE_LIMIT = 16 << 30  # bytes: CUDA 13.0's runfile is 4.3 GB
RUNFILE_TIMEOUT = 4 * 3600.0  # seconds for the whole runfile: a slow mirror, not a stalled one (http.IDLE)


def fetch_runfile(url: str, sha256: str, cache: str | Path, check: bool = False) -> dict:
    """Download a runfile into the controller cache, refusing one whose hash differs; with CHECK, say whether it
    is there or would be downloaded."""
    from rig.core import http

    if not url or not sha256:
        raise RigError("the runfile method needs both cuda.runfile.url and cuda.runfile.sha256")
    dest = Path(cache) / "runfile" / f"{sha256}.run"
    if dest.exists() and sha256_file(dest) == sha256:
        return {"changed": False, "path": str(dest), "sha256": sha256}
    if check:
        return {"changed": True, "path": str(dest), "sha256": sha256, "msg": f"would download {url} into {dest}"}
    tmp = Path(tempfile.mkstemp(prefix=".download-", dir=_mkdir(dest.parent))[1])
    try:
        progress(f"downloading {url}")
        with open(tmp, "wb") as out:
            http.download(url, out, "the CUDA runfile", RUNFILE_LIMIT, timeout=RUNFILE_TIMEOUT)
        actual = sha256_file(tmp)
        if actual != sha256:
            raise RigError(f"runfile {url} has sha256 {actual}, expected {sha256}; "
                           "refusing it. Fix cuda.runfile.sha256 or the URL.")
        tmp.rename(dest)
    finally:
        tmp.unlink(missing_ok=True)
    return {"changed": True, "path": str(dest), "sha256": sha256}


MANIFEST_SPEC = Field(dict, open=True, fields={"wheels": Field(dict, required=True, values=Field(check=sha256))})
MARKER_SPEC = Field(dict, open=True, fields={"version": Field(required=True), "method": Field(required=True),
                                             "components": Field(list, required=True, item=Field())})


def verify_manifest(wheel_dir: str | Path) -> dict:
    wheel_dir = Path(wheel_dir)
    try:
        record = load_json(wheel_dir / MANIFEST, "CUDA wheel manifest", MANIFEST_SPEC)
    except RigError as exc:
        raise RigError(f"{exc}; fetch the wheels again (rig cuda fetch)") from exc
    for name in record["wheels"]:
        confined(wheel_dir, name, f"{wheel_dir / MANIFEST}: wheel")
    for name, expected in record["wheels"].items():
        path = wheel_dir / name
        if not path.exists() or sha256_file(path) != expected:
            raise RigError(f"{path}: missing or sha256 differs from {MANIFEST}")
    return record


# ---------------------------------------------------------------- target side

def install(version: str, prefix: str | Path, method: str, components: list[str],
            source: str | None = None, sha256: str = "", check: bool = False) -> dict:
    """Install one toolkit into PREFIX/cuda-X.Y; a no-op when it is already there."""
    check_method(method)
    if not check and not source:
        raise RigError("--source is required: the fetched wheel dir or runfile")
    check_release(version)
    check_components(components)
    if check:
        return _install(version, prefix, method, components, source, sha256, check)
    with _locked(_prefix_lock(prefix)):
        return _install(version, prefix, method, components, source, sha256, check)


def _install(version: str, prefix: str | Path, method: str, components: list[str],
             source: str | None, sha256: str, check: bool) -> dict:
    tree = tree_of(prefix, version)
    wanted = {"version": version, "method": method, "components": sorted(components)}
    current = read_marker(tree)
    if current is not None and all(current.get(k) == v for k, v in wanted.items()):
        return {"changed": False, "tree": str(tree), "msg": f"CUDA {version} already at {tree}"}
    if tree.exists() and current is None:
        raise RigError(f"{tree} exists and was not installed by rig; refusing to modify it. "
                       "Move it away or install into another prefix.")
    result = {"changed": True, "tree": str(tree),
              "msg": f"{'would install' if check else 'installed'} CUDA {version} at {tree}"}
    if check:
        return result
    assert source, "install() refuses a missing source before anything"
    if method == "runfile":  # verify before anything on the host changes
        actual = sha256_file(Path(source))
        if actual != sha256:
            raise RigError(f"runfile {source} has sha256 {actual}, expected {sha256}; refusing it.")
    _clean_leftovers(tree)
    staging = Path(tempfile.mkdtemp(prefix=f".{tree.name}.rig-staging-", dir=_mkdir(tree.parent)))
    staging.chmod(0o755)  # mkdtemp's 0700 would become the tree's: only root could use the toolkit
    unpacked = None
    try:
        if method == "wheels":
            wheels = Path(source)
            if wheels.is_file():  # the archive pack() made: its wheels beside the staging, removed below
                wheels = unpacked = Path(tempfile.mkdtemp(prefix=f".{tree.name}.rig-wheels-", dir=tree.parent))
                unpack(Path(source), wheels)
            record = verify_manifest(wheels)
            _assemble_from_wheels(wheels, record, staging)
            artifacts = record["wheels"]
        else:
            _run_runfile(Path(source), staging, tree.parent / "cuda")
            artifacts = {Path(source).name: sha256}
        _verify_tree(staging, version, components)
        (staging / MARKER).write_text(dump_json({**wanted, "artifacts": artifacts}, str(MARKER), indent=2) + "\n")
        _promote(staging, tree)
    finally:
        for scratch in (staging, unpacked):
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
    return result


def read_marker(tree: Path) -> dict | None:
    """What rig installed in TREE; None where rig did not (no marker, or one that is not rig's)."""
    if not (tree / MARKER).is_file():
        return None
    try:
        return load_json(tree / MARKER, "toolkit marker", MARKER_SPEC)
    except RigError as exc:
        progress(f"{exc}: treating {tree} as not installed by rig")
        return None


def default_release(prefix: str | Path) -> str:
    """The release PREFIX/cuda points at, as its tree's marker says; "" where there is no link, or the tree
    carries no marker (NVIDIA's packages' trees). A link that leads nowhere a toolkit is, round a loop, or to
    a marker that is not rig's, is an error naming it."""
    prefix = Path(prefix)
    link = prefix / "cuda"
    if not link.is_symlink():
        return ""
    try:
        target = _link_target(prefix.resolve(), os.readlink(link), str(link)) or ""  # a link's text: never None
        tree = (prefix.resolve() / target).resolve(strict=True)
    except FileNotFoundError:  # a link to nothing: no toolkit is the default
        return ""
    except (RuntimeError, OSError) as exc:  # a loop of links (RuntimeError before Python 3.13, ELOOP after)
        raise RigError(f"{link} cannot be followed ({exc}): point it at a toolkit with `rig cuda default`") from None
    marker = tree / MARKER
    if not os.path.lexists(marker):
        return ""
    version = load_json(marker, "toolkit marker", MARKER_SPEC)["version"]  # a FIFO or a link there is refused
    if version not in RELEASES:
        raise RigError(f"{marker} names CUDA {version!r}, no release rig installs: it is not rig's marker; remove it")
    return version


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _clean_leftovers(tree: Path) -> None:
    for stale in tree.parent.glob(f".{tree.name}.rig-*"):
        progress(f"removing leftovers of an interrupted run: {stale}")
        shutil.rmtree(stale, ignore_errors=True)


def _wheel_target(member: str) -> str | None:
    """Map a wheel member to its place in a CUDA tree, or None to skip it.

    CUDA 13 wheels put files under nvidia/cu13/{bin,include,lib,nvvm}; CUDA 12
    wheels under nvidia/<component>/{bin,include,lib,nvvm}. Both drop the first
    two parts; lib becomes lib64 as in NVIDIA's own trees.
    """
    parts = member.split("/")
    if len(parts) < 3 or parts[0] != "nvidia" or member.endswith("/"):
        return None
    rel = parts[2:]
    if rel[0].startswith(".") or rel[-1] == "__init__.py" or "__pycache__" in rel:
        return None
    if rel[0] == "lib":
        rel[0] = "lib64"
    return "/".join(rel)


def _assemble_from_wheels(wheel_dir: Path, record: dict, staging: Path) -> None:
    wheels = [n for n in record["wheels"] if n.startswith("nvidia_")]
    for index, name in enumerate(wheels, 1):
        progress(f"unpacking {name} ({index}/{len(wheels)})")
        with wheelfile.opened(wheel_dir / name) as archive:
            for info in archive.infolist():
                target = _wheel_target(info.filename)
                if target is not None:  # as pip does: NVIDIA ships nvcc and ptxas 0744, which only root could run
                    wheelfile.unpack(archive, info, staging, target)
    _add_development_links(staging)


def _add_development_links(tree: Path) -> None:
    """Wheels ship only versioned sonames; linkers look for libX.so."""
    for libdir in (tree / "lib64", tree / "nvvm" / "lib64"):
        for lib in sorted(libdir.glob("lib*.so.*")) if libdir.is_dir() else []:
            match = re.match(r"^(lib.+?\.so)\.[\d.]+$", lib.name)
            if match and not (libdir / match.group(1)).exists():
                (libdir / match.group(1)).symlink_to(lib.name)


def _run_runfile(runfile: Path, staging: Path, link: Path) -> None:
    before = os.readlink(link) if link.is_symlink() else None
    progress(f"running {runfile.name} into {staging}")
    cmd = ["sh", str(runfile), "--silent", "--toolkit", f"--toolkitpath={staging}",
           "--no-man-page", "--override"]
    done = run(cmd, f"running {runfile.name}", ok=None, timeout=1800)  # it unpacks a few GB
    # The installer may repoint the default link; only make_default may do that.
    if before is not None and os.readlink(link) != before:
        _atomic_symlink(before, link)
    if done.returncode != 0:
        raise RigError(f"the CUDA runfile failed ({done.returncode}): {done.stdout[-1500:]}{done.stderr[-1500:]}")


def _verify_tree(tree: Path, version: str, components: list[str]) -> None:
    expected = {
        "cudart": f"lib64/libcudart.so.{major(version)}",
        "nvrtc": f"lib64/libnvrtc.so.{major(version)}",
        "nvcc": "bin/ptxas",
    }
    for component, rel in expected.items():
        if component in components and not (tree / rel).exists():
            raise RigError(f"the assembled CUDA {version} tree lacks {rel} ({component}); "
                           "the wheels do not match the release")
    nvcc = tree / "bin" / "nvcc"
    if nvcc.exists():  # CUDA 12 wheels ship ptxas but no nvcc driver
        release = tool_release(nvcc)
        if release != series(version):
            raise RigError(f"{nvcc} does not report release {series(version)} (it says {release})")


def _promote(staging: Path, tree: Path) -> None:
    """Rename the finished tree into place; an older rig tree is swapped out."""
    if tree.exists():
        old = tree.parent / f".{tree.name}.rig-old"
        tree.rename(old)
        staging.rename(tree)
        shutil.rmtree(old)
    else:
        staging.rename(tree)


# ---------------------------------------------------------------- the default link

def _atomic_symlink(target: str, link: Path) -> None:
    tmp = link.parent / f".{link.name}.rig-link"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)  # rename(2) over the old link: readers never see it missing


def _state_file(state_dir: str | Path, prefix: str | Path) -> Path:
    """One record per prefix: a rollback of PREFIX B never reads what PREFIX A remembered."""
    return Path(state_dir) / f"cuda-default-{sha256_data(str(Path(prefix).resolve()))[:16]}.json"


def _link_target(prefix: Path, value, what: str) -> str | None:
    """A link target rig may write back: None (there was no link), or a path that leads to a CUDA toolkit
    (a cuda-X.Y tree, or /etc/alternatives/cuda as NVIDIA's packages set it up); anything else is refused.
    A target that is gone is left to the rollback, which refuses to leave a dangling link."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or any(ord(c) < 32 for c in value):
        raise RigError(f"{what}: {value!r} is not a link target; remove the file if it is not rig's")
    tree = (prefix / value).resolve()  # a relative target is relative to the link's directory
    markers = ("bin/nvcc", "bin/ptxas", "lib64", "version.json", MARKER)
    if tree.exists() and not any((tree / marker).exists() for marker in markers):
        raise RigError(f"{what}: {value!r} does not lead to a CUDA toolkit (no bin/nvcc, lib64 or version.json "
                       f"under {tree}); remove the file if it is not rig's")
    return value


def _read_state(state_dir: str | Path, prefix: Path) -> dict | None:
    path = _state_file(state_dir, prefix)
    if not path.exists():
        return None
    try:
        state = load_json(path, "rollback record")
    except RigError as exc:
        raise RigError(f"{exc}; remove it to start afresh") from exc
    if not isinstance(state, dict) or state.get("prefix") != str(prefix.resolve()) or "previous" not in state:
        raise RigError(f"{path}: not rig's rollback record for {prefix}; remove it to start afresh")
    return {**state, "previous": _link_target(prefix.resolve(), state["previous"], f"{path}: previous")}


def set_default(version: str, prefix: str | Path, state_dir: str | Path = DEFAULT_STATE_DIR,
                check: bool = False, installing: bool = False) -> dict:
    """Point PREFIX/cuda at cuda-X.Y, remembering the previous target for rollback.

    INSTALLING (check mode only): the same run installs the tree first, so a dry run
    may not find it yet; without it a dry run refuses what the real run would refuse."""
    prefix = Path(prefix)
    tree = tree_of(prefix, version)
    link = prefix / "cuda"
    if link.exists() and not link.is_symlink():
        raise RigError(f"{link} is a real directory, not a link; rig will not replace it")
    if not tree.is_dir() and not (check and installing):
        raise RigError(f"{tree} does not exist; install CUDA {version} before making it the default")
    previous = os.readlink(link) if link.is_symlink() else None
    if previous == tree.name or previous == str(tree):
        return {"changed": False, "link": str(link), "target": previous, "msg": f"{link} already leads to {tree}"}
    if not check:
        with _locked(_prefix_lock(prefix)):
            previous = os.readlink(link) if link.is_symlink() else None  # again, now that no other run moves it
            record = {"prefix": str(prefix.resolve()), "previous": previous, "current": tree.name}
            atomic_write(_state_file(state_dir, prefix), dump_json(record, "the toolkit's state") + "\n")
            _atomic_symlink(tree.name, link)
    return {"changed": True, "link": str(link), "target": tree.name, "previous": previous,
            "msg": f"{'would point' if check else 'pointed'} {link} at {tree.name} (was {previous or 'no link'})"}


def rollback_default(prefix: str | Path, state_dir: str | Path = DEFAULT_STATE_DIR,
                     check: bool = False) -> dict:
    """Restore PREFIX/cuda to the target it had before the last set_default."""
    prefix = Path(prefix)
    link = prefix / "cuda"
    state = _read_state(state_dir, prefix)
    if state is None:
        return {"changed": False, "link": str(link), "msg": f"nothing to roll back in {prefix}"}
    previous = state["previous"]
    current = os.readlink(link) if link.is_symlink() else None
    if current == previous:
        return {"changed": False, "link": str(link), "target": current}
    if link.exists() and not link.is_symlink():
        raise RigError(f"{link} is a real directory, not a link; rig will not replace it")
    if previous is not None and not (prefix.resolve() / previous).is_dir():
        raise RigError(f"{prefix / previous} no longer exists; rolling back would leave {link} dangling. "
                       f"Choose a toolkit with `rig cuda default --version X.Y --prefix {prefix}`")
    if not check:
        with _locked(_prefix_lock(prefix)):
            if previous is None:
                link.unlink(missing_ok=True)
            else:
                _atomic_symlink(previous, link)
            _state_file(state_dir, prefix).unlink()
    return {"changed": True, "link": str(link), "target": previous, "previous": current}


def toolkits(prefix: str | Path = "/usr/local") -> list[dict]:
    """Every cuda-X.Y tree under PREFIX with the version its nvcc reports."""
    found = []
    for tree in sorted(Path(prefix).glob("cuda-*")):
        if not tree.is_dir() or tree.name.startswith("."):
            continue
        nvcc = tree / "bin" / "nvcc"
        release = tool_release(nvcc) if nvcc.exists() else None
        marker = read_marker(tree)
        found.append({"tree": str(tree), "nvcc": release,
                      "installed_by_rig": marker is not None,
                      "version": (marker or {}).get("version")})
    return found
