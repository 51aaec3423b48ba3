"""The CUDA 13 environment of the stack's venv, set at every interpreter start.

rig renders the environment into a module in the venv's site-packages and
loads it from a .pth file. A file named sitecustomize.py there would not do:
Debian's and Ubuntu's system Python put /usr/lib/python3.X/sitecustomize.py
ahead of the venv on sys.path, so the venv's copy is never imported. Loaded
from a .pth, rig's module runs first and any sitecustomize already there
(the system's, or one in the venv) still runs after it: the chain is kept.
Only that venv's interpreter reads its site-packages, so no other one sees it.

A venv that is a read-only image (`rig venv mount`) cannot be written, and its environment is not its lock's (a
stack's environment changes without its lock): the image carries only a hook, HOOK, a .pth that adds the venv
path's own writable site directory (env_site(), outside the image) as a site dir, and `rig env install` writes
the module and its .pth there. The hook goes into a venv before it is packed (`rig env hook`, with the module
taken out, so the image never carries an environment of its own); in a directory venv it names a directory
that does not exist, which Python skips.
"""
from __future__ import annotations

import hashlib
import importlib.resources
import json
import os
from pathlib import Path

from rig.core import RigError
from rig.core.cuda_releases import series
from rig.core.documents import converge_file
from rig.core.fs import MissingFile, confined, plain_dir, private_dir, read_bytes, sha256_data
from rig.core.hints import CREATE_VENV
from rig.core.proc import ask
from rig.python.venv import BUILT_MARKER
from rig.python.venv import MARKER as VENV_MARKER
from rig.python.venv_archive.place import rig_link, store_of

MODULE = "rig_sitecustomize"
PTH = f"{MODULE}.pth"
HOOK = "rig_env_site.pth"  # sorts before PTH: the writable site dir is on sys.path when PTH imports MODULE
ENV_SITE_ROOT = Path("/var/lib/rig/venv-env")  # one site dir per venv path, as the image store names them
# An image venv's run-time caches, in a directory of the user's own under RUNTIME_CACHE (the role makes it
# like /tmp: mode 1777), never in the read-only venv or a home the server's user may not have. Each is what
# its package reads (checked upstream):
RUNTIME_CACHE = "/var/cache/rig/venv-runtime"
IMAGE_CACHES = {
    "TRITON_CACHE_DIR": "triton",  # triton/runtime/cache.py default_cache_dir(): else ~/.triton/cache
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",  # torch/_inductor/runtime/cache_dir_utils.py: else /tmp/torchinductor_USER
}
# FLASHINFER_WORKSPACE_BASE (flashinfer/jit/env.py: else ~/.cache/flashinfer) moves there from HOME: jit_cache().
# Not PYTHONPYCACHEPREFIX: with a prefix set, Python reads bytecode only under it, never the image's own
# __pycache__ (importlib's cache_from_source), so every module would compile again; a module the image holds no
# bytecode for is compiled in memory and its write refused quietly (SourceLoader._cache_bytecode).

# PCIe-only boxes: no InfiniBand to probe, no NVLink SHARP (multicast needs NVLink),
# and peer-to-peer allowed across the CPU root complex, which NCCL otherwise refuses.
NCCL_PCIE_ONLY = {"NCCL_IB_DISABLE": "1", "NCCL_NVLS_ENABLE": "0", "NCCL_P2P_LEVEL": "SYS"}


def arch_env(archs: list[str]) -> dict:
    """The arch lists torch's and flashinfer's compilers read, at build time and at JIT time."""
    return {"TORCH_CUDA_ARCH_LIST": ";".join(archs),       # torch.utils.cpp_extension
            "FLASHINFER_CUDA_ARCH_LIST": " ".join(archs)}  # flashinfer JIT / AOT


def cuda_env(cuda_version: str, archs: list[str], prefix: str = "/usr/local") -> dict:
    """What pins the venv's compilers to the stack's toolkit; set even over an inherited value."""
    home = f"{prefix.rstrip('/')}/cuda-{series(cuda_version)}"
    # Triton's bundled ptxas may predate the GPU ("Value 'sm_120' is not defined for option 'gpu-name'")
    return {"CUDA_HOME": home, "TRITON_PTXAS_PATH": f"{home}/bin/ptxas", **arch_env(archs)}


def jit_cache(cuda_version: str, flashinfer_version: str | None) -> dict:
    """Where flashinfer JIT-compiles, under the home of the user a process runs as (the server's user must
    write there), keyed by the toolkit and flashinfer releases: an upgrade of either never loads kernels the
    old one built. flashinfer 0.6.3 to 0.7.2 read FLASHINFER_WORKSPACE_BASE (flashinfer/jit/env.py) and put
    their cache under it, in .cache/flashinfer/VERSION/ARCH."""
    if not flashinfer_version:
        return {}
    return {"FLASHINFER_WORKSPACE_BASE": f".cache/rig/flashinfer-jit/cuda-{cuda_version}-flashinfer-{flashinfer_version}"}


def environment(stack: dict, prefix: str = "/usr/local") -> dict:
    """{"pinned": ..., "defaults": ..., "home": ...}: defaults give way to a value the process already has;
    home holds defaults that are paths under the user's home, joined to it at each interpreter start."""
    env = stack["environment"]
    defaults = {**(NCCL_PCIE_ONLY if env["nccl_pcie_only"] else {}),
                **{name: str(value) for name, value in env["vars"].items()}}
    return {"pinned": cuda_env(stack["cuda"]["version"], stack["archs"], prefix), "defaults": defaults,
            "home": jit_cache(stack["cuda"]["version"], stack["flashinfer"].get("version"))}


def render(env: dict, stack_name: str) -> str:
    import jinja2

    text = (importlib.resources.files("rig") / "templates" / "sitecustomize.py.j2").read_text()  # a zipapp too
    renderer = jinja2.Environment(keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    # a Python string literal: JSON's escapes mean the same in Python, but not its \uD83D\uDE00 pairs (Python
    # keeps two lone surrogates), so characters beyond the BMP are written as they are
    renderer.filters["literal"] = lambda value: json.dumps(value, ensure_ascii=False)
    template = renderer.from_string(text)
    home, caches = env.get("home", {}), env.get("caches", {})
    _refuse_unwritable(env["pinned"], env["defaults"], {**home, **caches})
    return template.render(stack=stack_name, pinned=env["pinned"], defaults=env["defaults"], home=home,
                           caches=caches, cache_root=RUNTIME_CACHE)


def _refuse_unwritable(pinned: dict, defaults: dict, home: dict) -> None:
    """What the module cannot hold: a name os.environ refuses (every Python start of the venv would raise), a
    value that is not text or holds a NUL or a lone surrogate, a home path that leaves the home, a name in two sections."""
    from rig.stack.spec import env_name

    seen: set[str] = set()
    for section in (pinned, defaults, home):
        for name, value in section.items():
            problem = (env_name(name) if isinstance(name, str) else f"{name!r} is not an environment variable name")
            if problem or name in seen:
                raise RigError(f"environment: {problem or f'{name} is set twice (pinned, defaults, home)'}; fix "
                               "the stack's environment (or the --env-json that rig env show printed)")
            if not isinstance(value, str) or "\0" in value:
                raise RigError(f"environment {name}: {value!r} is not a text value")
            try:  # os.environ encodes every value at each start: a lone surrogate would stop them all
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise RigError(f"environment {name}: {value[:60]!r} holds a lone surrogate "
                               f"({value[exc.start]!r}), which no environment value can; give UTF-8 text in the "
                               "stack's environment (or the --env-json)") from None
            seen.add(name)
    for name, value in home.items():
        if value.startswith("/") or ".." in value.split("/") or not value.strip() or any(ord(c) < 32 for c in value):
            raise RigError(f"environment {name}: {value!r} is not a path under the user's home (relative, no ..)")


def site_packages(venv: str | Path) -> Path:
    found = sorted(Path(venv).glob("lib/python3*/site-packages"))
    if len(found) != 1:
        raise RigError(f"{venv} is not a virtualenv (no single lib/python3.X/site-packages)",
                       hint=f"give --venv the stack's venv, or {CREATE_VENV}")
    return confined(venv, str(found[0].relative_to(venv)), "the venv's site-packages")  # never a link out


def env_site(venv: str | Path) -> Path:
    """The writable site directory of the venv at VENV's path, which its HOOK adds (an image venv's environment)."""
    return store_of(Path(os.path.abspath(venv)), ENV_SITE_ROOT)


def hook_text(venv: str | Path) -> str:
    return f"import site; site.addsitedir({str(env_site(venv))!r})\n"



def hook_problem(manifest: dict) -> str | None:
    """Why a venv archive's MANIFEST cannot become an image rig sets the environment of (None: it can): its
    site-packages must hold HOOK naming the writable site dir of its venv path, and no module of rig's."""
    site = f"lib/python{'.'.join(manifest['python'].split('.')[:2])}/site-packages"
    files = {path: data for kind, path, _, _, data in manifest["entries"] if kind == "file"}
    if files.get(f"{site}/{HOOK}") != sha256_data(hook_text(manifest["venv"]).encode()):
        return f"its {site}/{HOOK} is not rig's environment hook for {manifest['venv']} (packed before `rig env hook`?)"
    if f"{site}/{MODULE}.py" in files:
        return f"it carries rig's environment module ({site}/{MODULE}.py), which an image would fix in place"
    return None

def image_env(env: dict) -> dict:
    """ENV for a venv that is a read-only image: its home paths and run-time caches under RUNTIME_CACHE. A cache
    the stack's environment sets itself (pinned or a default) is the stack's: a name in two sections is refused."""
    moved = {name: value.removeprefix(".cache/rig/") for name, value in env.get("home", {}).items()}
    taken = {*env.get("pinned", {}), *env.get("defaults", {})}
    caches = {name: value for name, value in IMAGE_CACHES.items() if name not in taken}
    return {**env, "home": {}, "caches": {**caches, **moved}}


def _site_for(venv: str | Path) -> tuple[Path, bool]:
    """Where VENV's environment module goes: its site-packages, or (an image rig mounted) its writable site dir,
    whose hook the image must carry and whose own site-packages must hold no module of rig's."""
    if rig_link(venv, None) is None:
        return site_packages(venv), False
    inner = site_packages(venv)
    if read_if(inner / HOOK) != hook_text(venv) or os.path.lexists(inner / f"{MODULE}.py"):
        raise RigError(f"{venv} is a read-only venv image without rig's hook ({inner / HOOK} naming "
                       f"{env_site(venv)}), or with an environment module of its own; its environment cannot be "
                       "set", hint="pack the venv again after `rig env hook --venv VENV` (the python_stack role "
                       "does), image it and mount that image")
    return _own_site(venv), True


def _own_site(venv: str | Path) -> Path:
    """VENV's writable site dir (env_site), refused where it or its parent is a link or no directory, or where
    someone but root may change it: its .pth runs at every start of the venv, and rig writes and removes there."""
    site = env_site(venv)
    for path in (site.parent, site):
        plain_dir(path, "rig writes a venv's environment only in a directory of its own")
    private_dir(site, "the venv's environment site dir")
    return site


def _runtime_cache(check: bool) -> str | None:
    """RUNTIME_CACHE made as /tmp is (root's, 1777: each user makes a directory of its own in it, and the module
    takes only one that is its user's); what was done, or None where it already is."""
    root = Path(RUNTIME_CACHE)
    plain_dir(root, "an image venv's run-time caches go only in a directory of rig's")
    # ROOT itself is sticky and open to all, as /tmp is; above it, whoever may write could swap it for their own
    private_dir(root.parent, "the run-time caches' directory")
    if root.is_dir() and (root.stat().st_mode & 0o7777, root.stat().st_uid) == (0o1777, 0):
        return None
    if not check:
        root.mkdir(parents=True, exist_ok=True)
        os.chown(root, 0, 0)
        os.chmod(root, 0o1777)
    return f"{'would make' if check else 'made'} {root} (mode 1777) for the run-time caches"


def read_if(path: Path) -> str | None:
    """PATH's text where it is a regular file (never through a link), else None."""
    return path.read_text() if path.is_file() and not path.is_symlink() else None


def start_digest(venv: str | Path, records: tuple[str, ...] = ()) -> str:
    """sha256 of what VENV's Python takes from rig at its start: the venv's lock (its marker and the built wheels'
    list), rig's environment module, where it lives (an image venv's writable site dir), and RECORDS, files at the
    venv's top named by the caller (rig server args: the patch record rig patch writes there, which this layer
    does not read). Only read, each a regular file or nothing: a server started before any changed still runs the
    old ones; its unit names this."""
    venv = Path(venv)
    site = env_site(venv) if rig_link(venv, None) else site_packages(venv)
    digest = hashlib.sha256()
    for path in (venv / VENV_MARKER, venv / BUILT_MARKER, site / f"{MODULE}.py",
                 *(confined(venv, name, "a record in the venv", follow=False) for name in records)):
        try:
            data = read_bytes(path, "a file the venv's Python reads at start", follow=False)
        except MissingFile:
            data = b""
        digest.update(hashlib.sha256(data).digest())
    return digest.hexdigest()


def install(venv: str | Path, env: dict, stack_name: str, check: bool = False) -> dict:
    """Write the module and its .pth (into an image venv's writable site dir); unchanged files are left alone.
    A directory venv's former site dir (it was an image before) is emptied: one environment per venv."""
    site, image = _site_for(venv)
    env = image_env(env) if image else env
    said = [made] if image and (made := _runtime_cache(check)) else []
    if image and not check:  # made once every refusal is behind
        site.mkdir(mode=0o755, parents=True, exist_ok=True)
    if not image and (emptied := _empty_former_site(venv, check)):
        said.append(emptied)
    wanted = {site / f"{MODULE}.py": render(env, stack_name), site / PTH: f"import {MODULE}\n"}
    written = {path: converge_file(path, text, "the environment module", check) for path, text in wanted.items()}
    stale = [path for path, result in written.items() if result["changed"]]
    diff = "".join(result["diff"] for result in written.values())
    if stale and not check:
        _drop_bytecode(site)
    if stale:
        said.insert(0, f"{'would write' if check else 'wrote'} {', '.join(p.name for p in stale)} in {site}")
    return {"changed": bool(said), "files": [str(p) for p in stale], "diff": diff,
            "msg": "; ".join(said) if said else f"{site} already has the stack's environment"}


def _empty_former_site(venv: str | Path, check: bool) -> str | None:
    """A directory VENV's environment files in the site dir it had as an image, removed: what was, or None."""
    left = [p for p in _env_files(env_site(venv)) if os.path.lexists(p)]
    if not left:
        return None
    _own_site(venv)  # removed only from a directory of rig's, never through a link to another one
    if not check:
        for path in left:
            path.unlink()
    return f"{'would remove' if check else 'removed'} {', '.join(map(str, left))} ({venv} is a directory)"


def _drop_bytecode(site: Path) -> None:
    """Python trusts a module's cached bytecode while the source's size and mtime (in seconds) match: a module
    rewritten within the second, at the same size (13.0.2 -> 13.0.3), would still run the old one."""
    cache = site / "__pycache__"
    if cache.is_dir() and not cache.is_symlink():
        for compiled in cache.glob(f"{MODULE}.*.pyc"):
            compiled.unlink(missing_ok=True)


def _env_files(site: Path) -> list[Path]:
    return [site / PTH, site / f"{MODULE}.py"]


def hook(venv: str | Path, check: bool = False) -> dict:
    """VENV (a directory) made ready to pack into an image: the HOOK in its site-packages and rig's module out of
    it (the environment is each host's, written after: `rig env install`)."""
    if rig_link(venv, None) is not None:
        raise RigError(f"{venv} is a venv image, read-only; the hook goes into a venv directory before it is packed")
    site = site_packages(venv)
    written = converge_file(site / HOOK, hook_text(venv), "the environment hook", check)
    taken = [path for path in _env_files(site) if os.path.lexists(path)]
    if not check:
        for path in taken:
            path.unlink()
        _drop_bytecode(site)
    steps = ([f"write {site / HOOK}"] if written["changed"] else []) + [f"remove {p}" for p in taken]
    return {"changed": bool(steps), "diff": written["diff"],
            "msg": ("would " if check else "did: ") + "; ".join(steps) if steps else f"{site} has the hook alone"}


def remove(venv: str | Path, check: bool = False) -> dict:
    site, _ = _site_for(venv)
    present = [p for p in _env_files(site) if p.exists()]
    if not check:
        for path in present:
            path.unlink()
    return {"changed": bool(present), "files": [str(p) for p in present],
            "msg": f"{'would remove' if check else 'removed'} {', '.join(p.name for p in present)}" if present
                   else f"{site} has no rig environment"}


def seen_by(python: str | Path) -> dict:
    """What a fresh interpreter sees: rig's module (if it loaded) and the environment it left.

    Run with an empty environment, so only what startup sets can show up.
    """
    return ask(python, "startup_env", [MODULE], "start and report its environment", env={},
               timeout=120)
