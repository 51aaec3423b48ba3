"""`rig image sbom` and the `rig image` group: the venv's SBOM and the stack's serving image."""
from __future__ import annotations

import os

import click

from rig.cli.common import (
    cache_option,
    check_option,
    emit,
    group,
    json_option,
    judged,
    output_option,
    patches_option,
    stack_option,
    to_file_or_stdout,
    venv_of,
    venv_option,
    whose_stack,
)
from rig.cli.types import PathArg
from rig.core import RigError
from rig.core.documents import dump_json
from rig.image import build, verify
from rig.image.sbom import cyclonedx


@click.command()
@venv_option()
@whose_stack
@click.option("--requirements", required=True, multiple=True, type=PathArg(exists=True, dir_okay=False), metavar="FILE",
              help="The hash-pinned requirements the venv was installed from (the wheels' sha256); "
                   "repeat it for the wheels rig built.")
@click.option("--name", default="", metavar="NAME", help="What the SBOM describes (default: the venv's name).")
@output_option()
@json_option
def sbom(venv_path, stack_path, requirements, name, output, as_json) -> None:
    """A CycloneDX 1.5 SBOM of the venv: every distribution, with its locked wheel's sha256.

    The SBOM is one JSON document with or without --json.
    """
    document = cyclonedx(venv_of(venv_path, stack_path), list(requirements), name)
    to_file_or_stdout(dump_json(document, "the SBOM", indent=1, sort_keys=True) + "\n", output)


@group()
def image() -> None:
    """The stack's serving image, built from its lock (Docker)."""


image.add_command(sbom)


@image.command("build")
@stack_option(help="Its lock must be complete.")
@click.option("--base", default=lambda: os.environ.get("RIG_BASE_IMAGE", ""), metavar="IMAGE",
              help="The base image: NVIDIA's CUDA 13 image by digest where a registry answers, else rig's "
                   "bootstrapped base (scripts/base-image.sh prints it; default $RIG_BASE_IMAGE).")
@patches_option(help="Build with this patch set (a directory) instead of rig's own.")
@click.option("--ca-cert", "ca_certs", multiple=True, type=PathArg(exists=True, dir_okay=False), metavar="FILE",
              help="An extra CA certificate for the builder stage only (its apt and git); repeat.")
@click.option("--no-cache", is_flag=True, help="Rebuild every layer.")
@click.option("--no-archive", is_flag=True, help="Install the lock's wheels even where CACHE keeps the lock's venv "
              "archive (which the python_stack role packs once a host has installed the lock).")
@cache_option(help="Controller cache (wheels, CUDA wheels, built wheels, venv archives).")
@check_option
@json_option
def image_build(stack_path, base, patch_dir, ca_certs, no_cache, no_archive, cache, check, as_json) -> None:
    """Build the stack's image, tagged rig/NAME:LOCKHASH, with OCI labels and an SBOM inside.

    Stages: the CUDA toolkit from NVIDIA's wheels and its ldconfig file (a base
    that brings its own CUDA tree keeps it); the stack (the lock's venv archive where CACHE keeps one that fits,
    unpacked and checked against its manifest, else the locked wheels, bound from the controller's wheelhouse into
    the one step that installs them, hash-checked); a builder that compiles
    the lock's source builds missing from CACHE/built, whose audited wheels come
    back to that cache; and the runtime (the built wheels, the stack's
    environment, a CycloneDX SBOM, the patch set last). The server runs as the
    non-root user sglang; the HEALTHCHECK waits for /health_generate.
    """
    if not base:
        raise RigError("no base image: give --base (e.g. the output of scripts/base-image.sh) or set RIG_BASE_IMAGE")
    emit(build(stack_path, cache, base, patch_dir, ca_certs, no_cache, check, archive=not no_archive), as_json)


@image.command("verify")
@click.argument("tag", metavar="TAG")
@json_option
def image_verify(tag, as_json) -> None:
    """Run rig doctor and rig patch status inside the image; exit 1 on a failed check."""
    result = verify(tag)
    emit(result, as_json)
    judged(result["ok"])
