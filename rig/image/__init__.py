"""`rig image build` and `rig image verify`: the stack's serving image from its lock.

The build context holds the engine (without the patch set), the CUDA wheels, the
lock's requirements file and pip's wheel, the sources of the builds rig's cache
lacks, the patch set and the environment; the 4 GB of locked wheels (and the built
ones) are served to the build over HTTP from the controller's cache instead, so
they are never a layer. Extra CA certificates go to the throwaway builder stage
only. Nothing secret is ever a build argument: build arguments are visible in
`docker history`.
"""
from __future__ import annotations

import importlib.resources
import json
import shlex
import shutil
import tarfile
import tempfile
from pathlib import Path

from rig.core import RigError, defaults, progress
from rig.core.cuda_releases import series
from rig.core.documents import read_text
from rig.core.fs import atomic_write, sha256_data
from rig.engine.container import client as _client
from rig.engine.container import report, run_image_engine
from rig.python.wheel_serving import WheelServer, bridge_gateway

DOCKERFILE = importlib.resources.files("rig.image") / "Dockerfile"  # package data
LABEL = "dev.rig"


def tag_for(stack: dict, lock: dict) -> str:
    return f"rig/{stack['name']}:{lock['lock_hash'][:12]}"


def expected_patches(lock: dict, patch_dir: str | None) -> list[str]:
    """The patches the lock's versions need: what `rig patch apply` will apply in the image."""
    from rig.patches import load

    versions = {w["name"]: w["version"] for w in lock["wheels"]}
    return sorted(p.id for p in load(patch_dir) if p.package in versions and p.needs(versions[p.package]))


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


def _context(root: Path, stack: dict, lock: dict, cache: Path, patch_dir: str | None, ca_certs: list[str]) -> Path:
    """Lay the build context out under ROOT; the wheels go to ROOT/served, outside it."""
    from rig.cuda import toolkit as cuda
    from rig.engine import bundle
    from rig.patches import patch_files
    from rig.python.runtime_env import environment
    from rig.python.wheelhouse import export

    ctx = root / "context"
    (ctx / "engine").mkdir(parents=True)
    built = bundle.build(cache / "engine" / "rig-image.pyz", with_patches=False)
    shutil.copyfile(built["path"], ctx / "engine" / "rig.pyz")
    fetched = cuda.fetch_wheels(stack["cuda"]["version"], stack["cuda"]["components"], cache, "x86_64")
    shutil.copytree(fetched["dir"], ctx / "cuda")
    served = root / "served"
    export(lock, cache, served)
    (ctx / "wheelhouse").mkdir()
    shutil.copyfile(served / "requirements.txt", ctx / "wheelhouse" / "requirements.txt")
    for pip_wheel in served.glob("pip-*.whl"):
        shutil.copyfile(pip_wheel, ctx / "wheelhouse" / pip_wheel.name)
    (ctx / "patches").mkdir()
    for path in patch_files(patch_dir):
        (ctx / "patches" / path.name).write_bytes(path.read_bytes())
    (ctx / "env.json").write_text(json.dumps({**environment(stack), "stack": stack["name"]}, sort_keys=True))
    (ctx / "ca").mkdir()
    for cert in ca_certs:
        text = read_text(cert, "CA certificate")
        if "PRIVATE KEY" in text or "BEGIN CERTIFICATE" not in text:
            raise RigError(f"{cert} is not a PEM certificate (or holds a private key): give only CA certificates")
        (ctx / "ca" / (sha256_data(text)[:16] + ".crt")).write_text(text)
    (ctx / "Dockerfile").write_bytes(DOCKERFILE.read_bytes())
    return ctx


BUILD_ROOT = f"{defaults.IMAGE_ROOT}/build"  # the builder stage's scratch: sources, stack file, cuobjdump, its cache


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


def _take_back(client, image: str, cache: Path) -> None:
    """Copy the builder's kept wheels and audits into the controller's cache (built/KEY/)."""
    container = client.containers.create(image, entrypoint=["true"])  # never started: only read from
    try:
        stream, _ = container.get_archive(f"{BUILD_ROOT}/cache/built")
        with tempfile.TemporaryFile() as spool:
            for chunk in stream:
                spool.write(chunk)
            spool.seek(0)
            with tarfile.open(fileobj=spool) as tar:
                for member in tar.getmembers():
                    parts = Path(member.name).parts  # built/KEY/FILE
                    if member.isfile() and len(parts) == 3 and ".." not in parts:
                        source = tar.extractfile(member)
                        if source is not None:  # a killed build leaves no torn wheel that plan() would trust
                            atomic_write(cache / "built" / parts[1] / parts[2], source.read())
    finally:
        container.remove(force=True)


def _built_context(ctx: Path, served: Path, builds: list[dict], cache: Path) -> None:
    """built/: the hash-pinned list of the wheels rig built (empty for none); the wheels are served."""
    from rig.kernels.wheels import export
    from rig.python.venv import BUILT_REQUIREMENTS

    (ctx / "built").mkdir()
    if builds:
        export([cache / "built" / b["key"] for b in builds], served, requirements_dir=ctx / "built")
    else:
        (ctx / "built" / BUILT_REQUIREMENTS).write_text("")


def probe_base(client, base: str, python: str, cuda_series: str) -> dict:
    """What the base brings, before anything builds: the python3 rig's steps run on (it must be
    the lock's), and whether it has its own CUDA tree (NVIDIA's images), which the image keeps."""
    from docker.errors import DockerException

    script = ("python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])' 2>/dev/null || echo none; "
              f"test -e /usr/local/cuda-{cuda_series} && echo base || echo wheels")
    try:
        out = client.containers.run(base, ["sh", "-c", script], entrypoint=[], remove=True).decode().split()
    except DockerException as exc:
        raise RigError(f"cannot run the base image {base}: {exc}; build it (scripts/base-image.sh) or pull it") from exc
    found = {"python": out[0], "toolkit": out[1]}
    if found["python"] == "none":
        raise RigError(f"the base image {base} has no python3, which rig's build steps run on; use a base "
                       f"with Python {python} (for NVIDIA's CUDA images, one derived with python3 and python3-venv)")
    if found["python"] != python:
        raise RigError(f"the base image {base} has Python {found['python']}, the stack's lock is for Python {python}; "
                       f"lock the stack for {found['python']} (python: in the stack) or use a base with {python}")
    return found


def build(stack_path: str, cache: str | Path, base: str, patch_dir: str | None = None, ca_certs: tuple = (),
          no_cache: bool = False) -> dict:
    from rig.python import lock as locking
    from rig.stack.spec import load

    stack = load(stack_path)
    lock_file = locking.lock_path(stack_path)
    if not lock_file.exists():
        raise RigError(f"{lock_file} is missing: run `rig lock {stack_path}` first")
    lock = locking.read(lock_file)
    if not lock.get("complete"):
        raise RigError(f"{lock_file} is a partial lock; an image is built only from a complete one")
    cache = Path(cache)
    builds = source_builds(stack_path, stack, lock, cache)
    missing = [b for b in builds if not b["kept"]]
    client = _client()
    tag = tag_for(stack, lock)
    builder_tag = f"{tag}-builder"
    patch_ids = expected_patches(lock, patch_dir)
    gateway = bridge_gateway(client.networks.get("bridge").attrs["IPAM"]["Config"][0])
    cuda_series = series(stack["cuda"]["version"])
    found = probe_base(client, base, lock["python"], cuda_series)
    if found["toolkit"] == "base":
        progress(f"the base brings /usr/local/cuda-{cuda_series}; the image keeps it instead of rig's toolkit")
    with tempfile.TemporaryDirectory(prefix="rig-image-") as tmp:
        progress("fetching the lock's wheels and the CUDA wheels into the cache")
        from rig.python.wheelhouse import fetch

        fetch(lock, cache)
        ctx = _context(Path(tmp), stack, lock, cache, patch_dir, list(ca_certs))
        _builder_context(ctx, stack_path, lock, missing, cache, f"/usr/local/cuda-{cuda_series}")
        with WheelServer(Path(tmp) / "served", gateway, lock["lock_hash"]) as house:
            args = {"BASE": base, "CUDA_VERSION": stack["cuda"]["version"],
                    "TOOLKIT": found["toolkit"],
                    "LOCK_HASH": lock["lock_hash"], "PYTHON_VERSION": stack["python"], "WHEELHOUSE_URL": house.url,
                    "SERVER_PORT": str(stack["server"]["port"])}
            steps = []
            try:
                if missing:  # compile first, and keep the wheels as the wheel_build role does
                    progress(f"compiling {', '.join(b['name'] for b in missing)} in the builder stage")
                    steps += _stream_build(client, str(ctx), builder_tag, args, {}, no_cache, "builder")
                    _take_back(client, builder_tag, cache)
                    builds = source_builds(stack_path, stack, lock, cache)
                    lost = [b["name"] for b in builds if not b["kept"]]
                    if lost:
                        raise RigError(f"the builder stage built {', '.join(lost)} but no wheel came back under "
                                       "the keys the controller expects; did the source change during the build?")
                _built_context(ctx, Path(tmp) / "served", builds, cache)
                steps += _stream_build(client, str(ctx), tag, args, labels(stack, lock, patch_ids), no_cache,
                                       "runtime")
            finally:
                if missing and client.images.list(name=builder_tag):  # its own layers go; shared ones stay
                    client.images.remove(builder_tag, force=True)
    image = client.images.get(tag)
    return {"changed": True, "tag": tag, "id": image.id, "size": image.attrs["Size"], "patches": patch_ids,
            "toolkit": found["toolkit"],
            "compiled": [b["name"] for b in missing], "builds": [b["key"] for b in builds],
            "steps": steps, "msg": f"built {tag} ({image.attrs['Size'] / 1e9:.2f} GB)"}


def _stream_build(client, ctx: str, tag: str, args: dict, image_labels: dict, no_cache: bool,
                  target: str) -> list[dict]:
    """Run the build up to TARGET, relaying each step; returns the steps with whether each came from the cache."""
    steps: list[dict] = []
    tail: list[str] = []
    for chunk in client.api.build(path=ctx, tag=tag, buildargs=args, labels=image_labels, rm=True, forcerm=True,
                                  nocache=no_cache, decode=True, pull=False, target=target):
        if "error" in chunk:
            raise RigError(f"the image build failed: {chunk['error'].strip()}\n" + "".join(tail[-30:]))
        line = chunk.get("stream", "")
        if not line:
            continue
        tail.append(line)
        if line.startswith("Step "):
            progress(line.strip())
            steps.append({"step": line.strip(), "cached": False})
        elif "Using cache" in line and steps:
            steps[-1]["cached"] = True
    return steps


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
