"""`rig image build` and `rig image verify`: the stack's serving image from its lock.

The build context holds the engine (without the patch set), the CUDA wheels, the
lock's wheelhouse, the sources of the builds rig's cache lacks and the wheels it
built, the patch set and the environment. BuildKit builds it (rig.engine.buildkit):
the wheels are bound into the steps that install them, so no layer holds them; extra
CA certificates are a secret of the builder's step; the builder runs only when a
build is missing, and hands back nothing but its wheels. The context sits at one
place per lock under the cache, hard-linked from it: BuildKit sends only what
changed since the last build from there. Nothing secret is ever a build argument:
build arguments are visible in `docker history`.
"""
from __future__ import annotations

import importlib.resources
import os
import shlex
import shutil
import stat
import tempfile
from pathlib import Path

from rig.core import RigError, defaults, progress
from rig.core.cuda_releases import series
from rig.core.documents import dump_json, read_text
from rig.core.fs import atomic_copy, atomic_write, confined, held, link_or_copy, read_bytes
from rig.engine import buildkit
from rig.engine.container import client as _client
from rig.engine.container import report, run_image_engine

DOCKERFILE = importlib.resources.files("rig.image") / "Dockerfile"  # package data
LABEL = "dev.rig"
ARCH = "x86_64"  # the image's: its CUDA wheels are fetched for it


def tag_for(stack: dict, lock: dict) -> str:
    return f"rig/{stack['name']}:{lock['lock_hash'][:12]}"


def expected_patches(lock: dict, patch_dir: str | None, opt_in: list[str]) -> list[str]:
    """The patches the lock's versions need, and the opt-in ones of OPT_IN (the stack's patches.opt_in): what
    `rig patch apply` will apply in the image."""
    from rig.patches.patchset import asked, load

    found = load(patch_dir)
    opted = asked(found, opt_in)
    versions = {w["name"]: w["version"] for w in lock["wheels"]}
    return sorted(p.id for p in found if p.package in versions and p.needs(versions[p.package])
                  and p.wanted(opted))


def labels(stack: dict, lock: dict, patch_ids: list[str]) -> dict:
    versions = {w["name"]: w["version"] for w in lock["wheels"]}
    pick = {k: versions.get(stack[k]["package"], "")
            for k in ("sglang", "kernel", "flashinfer")}
    return {
        "org.opencontainers.image.title": stack["name"],
        "org.opencontainers.image.description": stack["description"],
        "org.opencontainers.image.version": lock["lock_hash"][:12],
        f"{LABEL}.lock-hash": lock["lock_hash"],
        f"{LABEL}.cuda": stack["cuda"]["version"],
        f"{LABEL}.archs": " ".join(stack["archs"]),
        f"{LABEL}.python": stack["python"],
        f"{LABEL}.torch": versions.get("torch", ""),
        **{f"{LABEL}.{k}": v for k, v in pick.items()},
        f"{LABEL}.patches": ",".join(patch_ids),
        f"{LABEL}.builds": ",".join(f"{b['name']}=={b['version']}" for b in lock["source_builds"]),
        f"{LABEL}.sbom": f"{defaults.IMAGE_ROOT}/sbom.cdx.json",
    }


def _context(ctx: Path, stack: dict, lock: dict, cache: Path, patch_dir: str | None, kept: dict | None) -> None:
    """Lay the build context out in CTX (emptied first): large files hard-linked from the cache, so that
    their size and times, which BuildKit compares to send only what changed, stay those of the cache's. With
    KEPT (kept_venv), the venv's archive instead of the wheels: the wheelhouse holds only their requirements."""
    from rig.cuda import toolkit as cuda
    from rig.engine import bundle
    from rig.patches.patchset import patch_files
    from rig.python.runtime_env import environment
    from rig.python.wheelhouse import REQUIREMENTS, export, lay_out

    if ctx.is_dir() and not ctx.is_symlink():
        shutil.rmtree(ctx)
    elif ctx.is_symlink() or ctx.exists():  # never emptied through a link
        ctx.unlink()
    (ctx / "engine").mkdir(parents=True)
    built = bundle.build(cache / "engine" / "rig-image.pyz", with_patches=False)
    shutil.copyfile(built["path"], ctx / "engine" / "rig.pyz")
    fetched = cuda.fetch_wheels(stack["cuda"]["version"], stack["cuda"]["components"], cache, ARCH)
    shutil.copytree(fetched["dir"], ctx / "cuda", symlinks=True, copy_function=link_or_copy)
    (ctx / "venv-archive").mkdir()
    if kept:
        lay_out([], ctx / "wheelhouse", ctx / "wheelhouse" / REQUIREMENTS, listed=lock["wheels"])
        link_or_copy(kept["archive"], ctx / "venv-archive" / kept["archive"].name)
        # the bytes checked here: the unpack checks the archive against them
        (ctx / "venv-archive" / f"{kept['name']}.manifest.json").write_bytes(kept["manifest"])
    else:
        export(lock, cache, ctx / "wheelhouse")
    (ctx / "patches").mkdir()
    for path in patch_files(patch_dir):
        (ctx / "patches" / path.name).write_bytes(path.read_bytes())
    (ctx / "env.json").write_text(dump_json({**environment(stack), "stack": stack["name"]}, "env.json", sort_keys=True))
    (ctx / "Dockerfile").write_bytes(DOCKERFILE.read_bytes())


def ca_bundle(certs: list[str], dest: Path) -> Path | None:
    """The extra CA certificates, checked and joined into DEST (readable by its owner alone), for the
    builder's secret mount; None for none."""
    texts = []
    for cert in certs:
        text = read_text(cert, "CA certificate")
        if "PRIVATE KEY" in text or "BEGIN CERTIFICATE" not in text:
            raise RigError(f"{cert} is not a PEM certificate (or holds a private key): give only CA certificates")
        texts.append(text.strip() + "\n")
    if not texts:
        return None
    atomic_write(dest, "".join(texts), mode=0o600)
    return dest


BUILD_ROOT = f"{defaults.IMAGE_ROOT}/build"  # the builder stage's scratch: sources, stack file, its cache


def source_builds(stack_path: str, stack: dict, lock: dict, cache: Path) -> list[dict]:
    """The lock's source builds: each one's source, its key, and the wheel the cache keeps for it."""
    from rig.kernels.wheels import plan, source_of

    builds = []
    for entry in lock["source_builds"]:
        if not (entry.get("git") or entry.get("path")):
            raise RigError(f"{entry['name']} {entry['version']} is a source build without a git or path source "
                           "(flashinfer's jit_cache), which images do not build yet; set jit_cache: false in the "
                           "stack to build the image")
        spec = source_of(entry, stack_path)
        kept = plan(spec, stack["archs"], cache, lock["lock_hash"])
        builds.append({"name": entry["name"], "version": entry["version"], "spec": spec, "key": kept["key"],
                       "kept": kept["wheels"]})
    return builds


def _builder_context(ctx: Path, stack_path: str, lock: dict, missing: list[dict], cache: Path, cuda_home: str) -> None:
    """build/: what the builds the cache lacks need, staged as for a builder host, and build.sh, their
    `rig wheels build` commands (a no-op when none is missing)."""
    from rig.kernels.builder import stage

    build = ctx / "build"
    lines = ["# written by rig image build: the lock's source builds the controller's cache lacks"]
    if missing:
        staged = stage(missing, stack_path, lock["lock_hash"], cache, build, BUILD_ROOT, defaults.VENV, cuda_home)
        tools = " ".join(staged["tools"])
        lines.append(f"dpkg -s {tools} >/dev/null 2>&1 || {{ apt-get update && "
                     f"apt-get install -y --no-install-recommends {tools}; }}")
        lines += [shlex.join(["python3", f"{defaults.IMAGE_ROOT}/rig.pyz", *b["argv"]]) for b in staged["builds"]]
    else:
        build.mkdir()
    (build / "build.sh").write_text("\n".join(lines) + "\n")


def _take_back(out: Path, keys: list[str], cache: Path) -> None:
    """Copy the builder's wheels and their audits (OUT/KEY/FILE, the wheels target's output) into the
    controller's cache (built/KEY/), for KEYS alone (the builds that were missing): a build's own scripts ran
    in the builder, so nothing else it left there (another lock's key, a link, a stray file) is taken."""
    for key in keys:
        kept = out / key
        if kept.is_symlink() or not kept.is_dir():
            continue
        for item in sorted(kept.iterdir()):
            if item.name.endswith((".whl", ".whl.audit.json")) and stat.S_ISREG(item.lstat().st_mode):
                atomic_copy(item, cache / "built" / key / item.name)


def _built_context(ctx: Path, builds: list[dict], cache: Path) -> None:
    """built/: the wheels rig built for the lock and their hash-pinned list (an empty list for none)."""
    from rig.kernels.wheels import export
    from rig.python.venv import BUILT_REQUIREMENTS

    (ctx / "built").mkdir()
    if builds:
        export([cache / "built" / b["key"] for b in builds], ctx / "built")
    else:
        (ctx / "built" / BUILT_REQUIREMENTS).write_text("")


def kept_venv(cache: Path, lock: dict, base: dict) -> tuple[dict | None, str]:
    """The lock's venv archive the controller keeps for the image's venv path (the python_stack role packs it
    where a host first installed the lock), where it fits the base: {"name", "archive", "manifest" (its bytes,
    as checked here)}; else None. And what the image's venv comes from, or why not from the archive."""
    from rig.python.venv_archive.manifest import MANIFEST_LIMIT, archive_name, kept_dir, read_manifest

    where = kept_dir(cache, lock["lock_hash"], defaults.VENV)
    name = archive_name(lock["lock_hash"], lock["python"], ARCH)
    manifest_path, archive = where / f"{name}.manifest.json", where / f"{name}.tar.zst"
    if not os.path.lexists(manifest_path):
        return None, f"the lock's wheels (the controller keeps no archive of its venv at {where})"
    try:
        data = read_bytes(manifest_path, "venv archive manifest", MANIFEST_LIMIT, follow=False)
        manifest = read_manifest(data)
    except RigError as exc:
        return None, f"the lock's wheels ({exc})"
    theirs, ours = (tuple(map(int, g.split("."))) if g else () for g in (manifest["glibc"], base["glibc"]))
    if (manifest["lock_hash"], manifest["archive"]["name"]) != (lock["lock_hash"], name):
        why = "it holds another lock"
    elif manifest["venv"] != defaults.VENV:
        why = f"it was packed at {manifest['venv']}"
    elif not theirs or not ours or theirs > ours:  # its compiled wheels need at most the glibc they were packed on
        why = f"it was packed on glibc {manifest['glibc'] or 'none'}, the base has {base['glibc'] or 'none'}"
    elif not base["zstd"]:
        why = "the base has no zstd, which unpacks it"
    elif archive.is_symlink() or not archive.is_file() or archive.stat().st_size != manifest["archive"]["size"]:
        why = f"{archive} is a link, missing, or not the size its manifest gives"
    else:
        return {"name": name, "archive": archive, "manifest": data}, f"the controller's archive {archive}"
    return None, f"the lock's wheels (the archive {manifest_path} does not fit: {why})"


def probe_base(client, base: str, python: str, cuda_series: str) -> dict:
    """What the base brings, before anything builds: the python3 rig's steps run on (it must be
    the lock's) and its glibc, whether it has its own CUDA tree (NVIDIA's images), which the image keeps, and
    zstd (a venv archive needs it)."""
    from docker.errors import DockerException

    script = ("python3 -c 'import platform, sys; print(\"%d.%d\" % sys.version_info[:2], platform.libc_ver()[1] "
              "or \"-\")' 2>/dev/null || echo none -; "
              f"test -e /usr/local/cuda-{cuda_series} && echo base || echo wheels; "
              "command -v zstd >/dev/null && echo zstd || echo -")
    try:
        out = client.containers.run(base, ["sh", "-c", script], entrypoint=[], remove=True).decode().split()
    except DockerException as exc:
        raise RigError(f"cannot run the base image {base}: {exc}; build it (scripts/base-image.sh) or pull it") from exc
    found = {"python": out[0], "glibc": out[1].strip("-"), "toolkit": out[2], "zstd": out[3] == "zstd"}
    if found["python"] == "none":
        raise RigError(f"the base image {base} has no python3, which rig's build steps run on; use a base "
                       f"with Python {python} (for NVIDIA's CUDA images, one derived with python3 and python3-venv)")
    if found["python"] != python:
        raise RigError(f"the base image {base} has Python {found['python']}, the stack's lock is for Python {python}; "
                       f"lock the stack for {found['python']} (python: in the stack) or use a base with {python}")
    return found


def build(stack_path: str, cache: str | Path, base: str, patch_dir: str | None = None, ca_certs: tuple = (),
          no_cache: bool = False, check: bool = False, archive: bool = True) -> dict:
    from rig.python.wheelhouse import fetch
    from rig.stack.spec import load

    stack = load(stack_path)
    lock = _complete_lock(stack_path)
    cache = Path(cache)
    builds = source_builds(stack_path, stack, lock, cache)
    missing = [b for b in builds if not b["kept"]]
    client = _client()
    tag = tag_for(stack, lock)
    patch_ids = expected_patches(lock, patch_dir, stack["patches"]["opt_in"])
    cuda_series = series(stack["cuda"]["version"])
    found = probe_base(client, base, lock["python"], cuda_series)
    # the venv a host already installed and compiled, where the controller keeps it: 10 GB not installed again
    kept, venv_from = kept_venv(cache, lock, found) if archive else (None, "the lock's wheels (--no-archive)")
    if check:  # the lock, the base and the cache are read; nothing is fetched, staged or built
        return _would_build(client, tag, base, lock, found, patch_ids, missing, venv_from)
    if found["toolkit"] == "base":
        progress(f"the base brings /usr/local/cuda-{cuda_series}; the image keeps it instead of rig's toolkit")
    place = confined(cache, f"image/{lock['lock_hash'][:16]}", "the image build's place", follow=False)
    if place.is_symlink():
        raise RigError(f"{place} is a link; rig keeps the build context there itself: remove the link")
    with held(place.with_suffix(".lock")), tempfile.TemporaryDirectory(prefix="rig-image-") as tmp:
        secrets = {"rig-ca": ca} if (ca := ca_bundle(list(ca_certs), Path(tmp) / "ca.crt")) else {}
        if not kept:
            progress("fetching the lock's wheels into the cache")
            fetch(lock, cache)
        progress(f"the venv from {venv_from}")
        ctx = place / "context"
        _context(ctx, stack, lock, cache, patch_dir, kept)
        _builder_context(ctx, stack_path, lock, missing, cache, f"/usr/local/cuda-{cuda_series}")
        args = {"BASE": base, "CUDA_VERSION": stack["cuda"]["version"], "TOOLKIT": found["toolkit"],
                "LOCK_HASH": lock["lock_hash"], "PYTHON_VERSION": stack["python"],
                "SERVER_PORT": str(stack["server"]["port"]),
                # feature names (the schema's: lowercase words and hyphens), split into --opt-in options there
                "PATCH_OPT_IN": " ".join(stack["patches"]["opt_in"])}
        steps: list[dict] = []
        if missing:  # compile first, and keep the wheels as the wheel_build role does
            steps, builds = _compiled(ctx, args, secrets, no_cache, Path(tmp) / "wheels", missing, stack_path, stack,
                                      lock, cache)
        _built_context(ctx, builds, cache)
        # --no-cache: the wheels target has just built the shared stages anew in this run; the runtime takes them
        steps += buildkit.build(ctx, "runtime", tag=tag, args=args, labels=labels(stack, lock, patch_ids),
                                no_cache=no_cache and not missing)
    image = client.images.get(tag)
    return {"changed": True, "tag": tag, "id": image.id, "size": image.attrs["Size"], "patches": patch_ids,
            "toolkit": found["toolkit"], "venv_from": venv_from,
            "compiled": [b["name"] for b in missing], "builds": [b["key"] for b in builds],
            "steps": steps, "msg": f"built {tag} ({image.attrs['Size'] / 1e9:.2f} GB)"}


def _complete_lock(stack_path: str) -> dict:
    """The stack's lock, which must be there and complete."""
    from rig.python import lock as locking

    lock_file = locking.lock_path(stack_path)
    if not lock_file.exists():
        raise RigError(f"{lock_file} is missing: run `rig lock --stack {stack_path}` first")
    lock = locking.read(lock_file)
    if not lock.get("complete"):
        raise RigError(f"{lock_file} is a partial lock; an image is built only from a complete one")
    return lock


def _would_build(client, tag: str, base: str, lock: dict, found: dict, patch_ids: list[str], missing: list[dict],
                 venv_from: str) -> dict:
    """build()'s --check answer: whether TAG is built from this lock and patch set, else what a build would do."""
    from docker.errors import ImageNotFound

    try:
        built = client.images.get(tag).labels
        have = (built.get(f"{LABEL}.lock-hash"), built.get(f"{LABEL}.patches")) == (lock["lock_hash"],
                                                                                   ",".join(patch_ids))
    except ImageNotFound:
        have = False
    return {"changed": not have, "tag": tag, "toolkit": found["toolkit"], "patches": patch_ids,
            "compiled": [b["name"] for b in missing], "venv_from": venv_from,
            "msg": (f"{tag} is already built from this lock and patch set" if have else
                    f"would build {tag} from {base} (toolkit: {found['toolkit']}; venv: {venv_from}" +
                    (f"; would compile {', '.join(b['name'] for b in missing)} in the builder stage" if missing
                     else "") + ")")}


def _compiled(ctx: Path, args: dict, secrets: dict, no_cache: bool, out: Path, missing: list[dict], stack_path: str,
              stack: dict, lock: dict, cache: Path) -> tuple[list[dict], list[dict]]:
    """The builder stage's wheels for MISSING, compiled into OUT and kept in the cache as the wheel_build role keeps
    them: (its steps, the source builds as they now are)."""
    progress(f"compiling {', '.join(b['name'] for b in missing)} in the builder stage")
    steps = buildkit.build(ctx, "wheels", output=out, args=args, secrets=secrets, no_cache=no_cache)
    _take_back(out, [b["key"] for b in missing], cache)
    builds = source_builds(stack_path, stack, lock, cache)
    lost = [b["name"] for b in builds if not b["kept"]]
    if lost:
        raise RigError(f"the builder stage built {', '.join(lost)} but no wheel came back under "
                       "the keys the controller expects; did the source change during the build?")
    return steps, builds


def verify(tag: str) -> dict:
    """rig doctor and rig patch status inside the image, against what its labels say."""
    from docker.errors import ImageNotFound

    client = _client()
    try:
        image = client.images.get(tag)
    except ImageNotFound as exc:
        raise RigError(f"no image {tag}; build it with `rig image build`") from exc
    meta = image.labels
    if f"{LABEL}.lock-hash" not in meta:
        raise RigError(f"{tag} was not built by rig (no {LABEL}.lock-hash label)")
    archs = meta[f"{LABEL}.archs"].split()

    def inside(*args: str) -> dict:
        return report(run_image_engine(tag, f"{defaults.IMAGE_ROOT}/rig.pyz", list(args)),
                      f"`rig {' '.join(args[:2])}` in {tag}")

    doctor = inside("doctor", "--json", "--cuda", meta[f"{LABEL}.cuda"], "--venv", defaults.VENV,
                    *[f"--arch={a}" for a in archs])
    patches = inside("patch", "status", "--json", "--venv", defaults.VENV, "--patches", f"{defaults.IMAGE_ROOT}/patches")
    applied = sorted(r["id"] for r in patches["patches"] if r["status"] == "applied")
    pending = sorted(r["id"] for r in patches["patches"] if r["status"] in ("needed", "drifted"))
    wanted = sorted(filter(None, meta[f"{LABEL}.patches"].split(",")))
    problems = [f"doctor: {c['name']}: {c['detail']}" for c in doctor["checks"]
                if c["status"] == "fail" and c["required"]]
    if pending:
        problems.append(f"patches not applied: {', '.join(pending)}")
    if applied != wanted:
        problems.append(f"applied patches {applied} differ from the label's {wanted}")
    return {"ok": not problems, "tag": tag, "doctor": doctor, "patches": patches["patches"], "problems": problems,
            "msg": f"{tag}: doctor passed, patches applied: {', '.join(applied) or 'none'}" if not problems
                   else f"{tag}: FAILED: " + "; ".join(problems)}
