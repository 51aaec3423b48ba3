"""The stack's virtualenv on a target, installed only from a copied wheelhouse.

No package index is used: pip runs from its own wheel in the wheelhouse with
--no-index --require-hashes, so a target needs python3 alone and a wheel whose
bytes differ from the lock is refused. A marker records the lock installed.
"""
from __future__ import annotations

import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

from packaging.utils import canonicalize_name

from rig.core import RigError, progress
from rig.core.documents import dump_json, load_json, read_text
from rig.core.fs import atomic_write, read_bytes, sha256_data, sha256_file
from rig.core.proc import run, script, venv_python
from rig.core.schema import Field, sha256
from rig.python.introspect import held
from rig.python.pip import read_pinned
from rig.python.wheelhouse import REQUIREMENTS

MARKER = ".rig-stack.json"


MARKER_SPEC = Field(dict, open=True, fields={
    "lock_hash": Field(required=True, check=sha256),
    "packages": Field(list, required=True, item=Field(check=lambda pin: None if pin.count("==") == 1 else
                                                     f"{pin!r} is not NAME==VERSION"))})


def read_marker(venv: str | Path) -> dict | None:
    """The lock rig installed into VENV; None where there is none. A marker rig did not write is an error:
    installing over it or verifying against it would trust what it says, and so is a link or a FIFO there."""
    marker = Path(venv) / MARKER
    if not os.path.lexists(marker):
        return None
    if marker.is_symlink():
        raise RigError(f"{marker} is a link; rig writes its venv marker as a plain file: remove it and install "
                       "the lock again")
    return load_json(marker, "venv marker", MARKER_SPEC)


def install(venv: str | Path, lock_hash: str, python_version: str, wheelhouse: str | None = None,
            check: bool = False, find_links: str | None = None, lock: dict | None = None,
            installer: str = "pip", byte_compile: bool = True) -> dict:
    """Install an exported wheelhouse; FIND_LINKS (a URL) serves its wheels when only its
    requirements file and pip wheel are local (an image build, which should not copy 4 GB in).
    With LOCK instead of a wheelhouse, everything comes from the lock and FIND_LINKS: a host pulls.
    INSTALLER: pip (from the wheelhouse) or uv (its pinned wheel, from the wheelhouse too). BYTE_COMPILE
    false leaves the modules to be compiled by whoever imports them."""
    venv = Path(venv)
    here = ".".join(platform.python_version_tuple()[:2])
    if here != python_version:
        raise RigError(f"this host's python3 is {here}, the stack's lock is for Python {python_version}; "
                       "install that Python, or lock the stack for this one too (pythons: in the stack)")
    marker = read_marker(venv)
    if marker and marker.get("lock_hash") == lock_hash:
        return {"changed": False, "venv": str(venv), "msg": f"{venv} already has lock {lock_hash[:12]}"}
    result = {"changed": True, "venv": str(venv),
              "msg": f"{'would install' if check else 'installed'} lock {lock_hash[:12]} into {venv} with {installer}"}
    if check:
        return result
    made = [path for path in (venv.parent, venv) if not path.exists()]
    emptied = venv.is_dir() and not venv.is_symlink() and not any(venv.iterdir())  # a directory made for it
    venv.parent.mkdir(parents=True, exist_ok=True)
    try:
        return _install(venv, lock_hash, wheelhouse, find_links, lock, installer, byte_compile, result)
    except BaseException:
        for path in made:  # a refused or interrupted first install leaves the host as it found it
            shutil.rmtree(path, ignore_errors=True)
        if emptied:
            for child in venv.iterdir():
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        raise


def _install(venv: Path, lock_hash: str, wheelhouse: str | None, find_links: str | None, lock: dict | None,
             installer: str, byte_compile: bool, result: dict) -> dict:
    # scratch beside the venv: uv's unpacked wheels are hard-linked into it, not copied across filesystems
    with tempfile.TemporaryDirectory(dir=venv.parent, prefix=".rig-install-") as scratch_dir:
        scratch = Path(scratch_dir)
        house = Path(wheelhouse) if wheelhouse else _pull(lock, find_links, scratch, installer)
        requirements = house / REQUIREMENTS
        if not requirements.exists():
            raise RigError(f"{house} is not an exported wheelhouse (needs {REQUIREMENTS})")
        if find_links:  # only now: what is left is to fetch, and the hashes check every byte
            progress(f"taking the wheels from {find_links}")
        if not (venv / "bin" / "python").exists():
            progress(f"creating {venv}")
            # the interpreter running the engine is the one whose version was checked above
            run([sys.executable, "-m", "venv", "--without-pip", str(venv)], f"could not create the venv {venv}",
                timeout=300)
        pinned_text = read_text(requirements, "wheelhouse requirements")
        progress(f"installing {len(pinned_text.splitlines())} wheels into {venv} with {installer} "
                 "(offline, hash-checked)")
        for step in _installer_steps(installer, venv, house, scratch, find_links, byte_compile):
            run(step, f"could not install the wheels into {venv}", timeout=3600)  # torch alone is GBs
        pins = [f"{name}=={version}" for name, version, _ in read_pinned(pinned_text)]
    atomic_write(venv / MARKER, dump_json({"lock_hash": lock_hash, "packages": pins}, "the venv's marker", indent=1) + "\n")
    return result


def _installer_steps(installer: str, venv: Path, house: Path, scratch: Path, find_links: str | None,
                     byte_compile: bool) -> list[list]:
    """Either installer, offline from the wheelhouse, every wheel checked against its pinned hash, no
    dependency resolution, every module byte-compiled in parallel (unless BYTE_COMPILE is false)."""
    from rig.python.installer import uv_binary, uv_wheel

    offline = ["--no-index", "--require-hashes", "--no-deps", "--quiet", "--find-links", find_links or str(house),
               "-r", str(house / REQUIREMENTS)]
    if installer == "uv":
        uv = uv_binary(house / uv_wheel()["filename"], scratch)
        return [[str(uv), "pip", "install", "--python", str(venv / "bin" / "python"),
                 *(["--compile-bytecode"] if byte_compile else []), "--cache-dir", str(scratch / "uv-cache"),
                 *offline]]
    pip_wheels = sorted(house.glob("pip-*.whl"))
    if not pip_wheels:
        raise RigError(f"{house} has no pip wheel to install with (rig wheelhouse export puts one there)")
    python = str(venv / "bin" / "python")
    return [[python, f"{pip_wheels[-1]}/pip", "install", "--no-cache-dir", "--no-compile",
             "--disable-pip-version-check", *offline, *_trusted(find_links)],
            *([[python, "-c", script("compile_tree"), str(venv / "lib")]] if byte_compile else [])]


PULL_LIMIT = 64 << 20  # pip's wheel is 2 MB, uv's 17 MB


def _pull(lock: dict | None, find_links: str | None, scratch: Path, installer: str) -> Path:
    """The requirements file (from the lock) and the installer's wheel (pulled from FIND_LINKS and checked
    against the lock, or rig's pin for uv) into SCRATCH, which then serves as the wheelhouse."""
    import io
    import urllib.parse

    from rig.core import http
    from rig.python.installer import uv_wheel
    from rig.python.wheelhouse import requirements

    if lock is None or not find_links or not find_links.startswith(("http://", "https://")):
        raise RigError("give --wheelhouse DIR, or --lock LOCK with --find-links URL where its wheels are served")
    wheel = uv_wheel() if installer == "uv" else next((w for w in lock["wheels"] if w["name"] == "pip"), None)
    if wheel is None:
        raise RigError("the lock has no pip wheel to install with; lock the stack again with this rig")
    url = find_links.rstrip("/") + "/" + urllib.parse.quote(wheel["filename"])
    progress(f"taking {installer} from {url}")
    taken = io.BytesIO()
    try:
        http.download(url, taken, wheel["filename"], PULL_LIMIT, timeout=120)
    except RigError as exc:
        hint = ("; a wheelhouse exported by an older rig has no uv wheel: export it again, or install with pip "
                "(python_stack_installer: pip)") if installer == "uv" else ""
        raise RigError(f"{exc}{hint}") from exc
    data = taken.getvalue()
    if sha256_data(data) != wheel["sha256"]:
        raise RigError(f"{url} is not the pinned {wheel['filename']} (sha256 differs): the server at {find_links} "
                       "does not serve this lock's wheels")
    (scratch / wheel["filename"]).write_bytes(data)
    (scratch / REQUIREMENTS).write_text(requirements(lock["wheels"]))
    return scratch


def _trusted(find_links: str | None) -> list[str]:
    """Plain HTTP is the build host's own wheelhouse; --require-hashes still checks every byte."""
    from urllib.parse import urlparse

    if find_links and find_links.startswith("http://"):
        host = urlparse(find_links).hostname
        if not host:  # e.g. "http:///srv/wheels": nothing to trust, and pip could not fetch from it
            raise RigError(f"--find-links {find_links}: an http:// URL needs a host name")
        return ["--trusted-host", host]
    return []


def installed(venv: str | Path) -> dict[str, str]:
    """Every distribution the venv's Python sees: canonical name -> version (its metadata, read by that Python)."""
    found: dict[str, str] = {}
    for name, version in held(venv_python(venv), every=True).every:  # in sys.path order: the first is imported
        found.setdefault(canonicalize_name(name), version)
    return found


def verify(venv: str | Path, lock: dict | None = None) -> dict:
    """Compare what the venv holds with what its marker says was installed; with no marker (a venv rig did not
    install, e.g. one built over a machine's own torch), with the pins of LOCK, where one is given. installed_by_rig
    says which."""
    marker = read_marker(venv)
    if marker is None and lock is None:
        raise RigError(f"{venv} was not installed by rig (no {MARKER})")
    if marker is not None:
        lock_hash, wanted = marker["lock_hash"], dict(pin.split("==") for pin in marker["packages"])
    else:
        assert lock is not None
        lock_hash, wanted = lock["lock_hash"], lock_pins(lock)
    held = installed(venv)
    wanted = {canonicalize_name(n): v for n, v in wanted.items()}
    wrong = {n: (v, held.get(n)) for n, v in sorted(wanted.items()) if held.get(n) != v}
    return {"ok": not wrong, "lock_hash": lock_hash, "packages": len(wanted), "installed_by_rig": marker is not None,
            "mismatched": {n: {"locked": v, "installed": i} for n, (v, i) in wrong.items()}}


def lock_pins(lock: dict) -> dict[str, str]:
    """What installing LOCK puts into a venv, as its marker records it: name -> version."""
    from rig.python.wheelhouse import requirements

    return {name: version for name, version, _ in read_pinned(requirements(lock["wheels"]), "the lock's pins")}


def differences(result: dict) -> list[str]:
    """verify()'s mismatches in words: each name, the version wanted, the version found."""
    return [f"{name}: wanted {pair['locked']}, found {pair['installed'] or 'not installed'}"
            for name, pair in result["mismatched"].items()]


BUILT_MARKER = ".rig-built.json"
BUILT_REQUIREMENTS = "built-requirements.txt"  # written by `rig wheels export` beside the built wheels


def add(venv: str | Path, wheelhouse: str | Path | None, requirements_sha256: str, check: bool = False,
        find_links: str | None = None) -> dict:
    """Install wheels built by rig (a `rig wheels export` dir) into a stack venv, hash-checked.

    REQUIREMENTS_SHA256 names the export's hash-pinned list, so a host can tell
    whether it already holds those wheels without anything being copied to it."""

    venv = Path(venv)
    try:
        current = sha256_file(venv / BUILT_MARKER)
    except FileNotFoundError:
        current = None
    if current == requirements_sha256:
        return {"changed": False, "venv": str(venv), "msg": f"{venv} already holds the built wheels"}
    result = {"changed": True, "venv": str(venv),
              "msg": f"{'would install' if check else 'installed'} the wheels rig built into {venv}"}
    if check:
        return result
    venv_python(venv)
    requirements = Path(wheelhouse or "") / BUILT_REQUIREMENTS
    if not requirements.is_file() or sha256_file(requirements) != requirements_sha256:
        raise RigError(f"{wheelhouse} is not the `rig wheels export` dir whose {BUILT_REQUIREMENTS} has sha256 "
                       f"{requirements_sha256}")
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index", "--require-hashes", "--no-deps",
          "--force-reinstall", "--no-cache-dir", "--disable-pip-version-check", "--quiet", "--find-links",
          find_links or str(wheelhouse), "-r", str(requirements), *_trusted(find_links)],
        f"could not install the built wheels into {venv}", timeout=3600)
    atomic_write(venv / BUILT_MARKER, read_bytes(requirements, "built requirements"))
    return result
