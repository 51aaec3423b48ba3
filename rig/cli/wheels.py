"""The `rig wheels` group: kernel wheels built against the venv's torch."""
from __future__ import annotations

from pathlib import Path

import click

from rig.cli.common import (
    cache_option,
    check_option,
    cuda_home_option,
    emit,
    group,
    jobs_option,
    json_option,
    lock_hash_option,
    prefix_option,
    root_option,
    stack_option,
    venv_of,
    venv_option,
)
from rig.cli.types import DIR, HostPath, PathOrUrl
from rig.core import RigError
from rig.core.cuda_releases import major, series
from rig.core.fs import confined
from rig.kernels import wheels as builds
from rig.kernels.builder import stage_for_host
from rig.stack.spec import load


@group()
def wheels() -> None:
    """Build kernel wheels against the venv's own torch."""


# what pip builds: a source dir, an sdist, or git+URL@REF
SOURCE = PathOrUrl(("git+https", "git+http", "git+ssh"))


@wheels.command("build")
@click.argument("source", required=False, type=SOURCE)
@click.option("--from-stack", "from_stack", metavar="KEY",
              help="Build from the stack's own source entry (git+ref or path, subdirectory): kernel, "
                   "flashinfer, sglang, or the package name of one of its extensions.")
@venv_option(help="The venv whose torch the build links against.")
@stack_option(help="Target archs and CUDA major; its lock's hash keys the built wheel.")
@cuda_home_option()
@prefix_option
@jobs_option()
@cache_option(help="Controller cache; wheels go to built/KEY/.")
@lock_hash_option(help="The stack lock's hash (default: read from the stack's lock file).")
@json_option
def wheels_build(source, from_stack, venv_path, stack_path, cuda_home, prefix, jobs, cache, lock_hash,
                 as_json) -> None:
    """Build SOURCE (a source dir, an sdist, or git+URL@REF) into an audited wheel.

    No build isolation: the build sees the venv's torch. The stack's archs reach
    every build system (TORCH_CUDA_ARCH_LIST, FLASHINFER_CUDA_ARCH_LIST, CUDAARCHS),
    MAX_JOBS is sized from cores and memory, and ccache is used when on PATH. The
    wheel is kept under CACHE/built/KEY (KEY: the stack lock's hash and the archs)
    only if `rig audit` passes it against that venv.
    """
    stack = load(stack_path)
    if bool(source) == bool(from_stack):
        raise RigError("give SOURCE or --from-stack PACKAGE (one of them)")
    source = source or builds.stack_source(stack, from_stack, stack_path)
    version = stack["cuda"]["version"]
    lock_hash = lock_hash or builds.stack_lock_hash(stack_path)
    home = Path(cuda_home) if cuda_home else Path(prefix) / f"cuda-{series(version)}"
    emit(builds.build(source, Path(venv_of(venv_path, stack_path)), stack["archs"], major(version), home, Path(cache),
                      lock_hash, jobs), as_json)


@wheels.command("plan")
@click.argument("source", type=SOURCE)
@stack_option()
@cache_option()
@json_option
def wheels_plan(source, stack_path, cache, as_json) -> None:
    """Say whether the controller's wheelhouse already holds SOURCE built for the stack."""
    emit(builds.plan(source, load(stack_path)["archs"], Path(cache), builds.stack_lock_hash(stack_path)), as_json)


@wheels.command("stage")
@click.argument("source", type=SOURCE)
@stack_option()
@cache_option(help="The staged dir is CACHE/staged/KEY.")
@root_option(type=HostPath(), metavar="PATH", required=True,
             help="The absolute path at which the builder will see the staged dir.")
@venv_option(help="The builder's venv whose torch the build links against.")
@cuda_home_option(type=HostPath(), metavar="PATH",
                  help="The builder's CUDA toolkit with nvcc (default: PREFIX/cuda-X.Y there).")
@jobs_option(help="Parallel compile jobs on the builder (default: sized there).")
@check_option
@json_option
def wheels_stage(source, stack_path, cache, root, venv_path, cuda_home, jobs, check, as_json) -> None:
    """Lay out what a builder host needs to build SOURCE (the stack file, a clean copy of the
    source) and say the `rig wheels build` argv it runs there; the wheel_build role copies the dir over."""
    emit(stage_for_host(source, stack_path, load(stack_path)["archs"], cache, root, venv_of(venv_path, stack_path),
                        cuda_home, jobs, check),
         as_json)


@wheels.command("export")
@click.argument("key", metavar="KEY")
@click.argument("dest", type=DIR)
@cache_option()
@check_option
@json_option
def wheels_export(key, dest, cache, check, as_json) -> None:
    """Lay the wheels kept under CACHE/built/KEY out in DEST with a hash-pinned requirements file."""
    emit(builds.export([confined(Path(cache) / "built", key, "KEY")], Path(dest), check), as_json)
