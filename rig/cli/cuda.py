"""The `rig cuda` group: CUDA toolkits side by side and the /usr/local/cuda link."""
from __future__ import annotations

import click

from rig.cli.common import (
    cache_option,
    check_option,
    components_option,
    emit,
    group,
    json_option,
    method_option,
    prefix_option,
    runfile_sha256_option,
    state_dir_option,
    toolkit_version_option,
    url_option,
)
from rig.cli.ldconfig import ldconfig_conf
from rig.cli.types import PathArg, Url
from rig.core.documents import dump_json
from rig.core.escape import terminal
from rig.cuda import toolkit as engine


@group()
def cuda() -> None:
    """Install CUDA toolkits side by side and manage the /usr/local/cuda link."""


cuda.add_command(ldconfig_conf)


@cuda.command("fetch")
@toolkit_version_option()
@components_option()
@method_option()
@url_option(type=Url(("https", "http", "file")), default="", show_default=False, help="Runfile URL (runfile method).")
@runfile_sha256_option()
@click.option("--platform", default="x86_64", show_default=True, metavar="MACHINE", help="Target machine (uname -m).")
@cache_option(help="Controller-side download cache.")
@check_option
@json_option
def cuda_fetch(version, components, method, url, sha256, platform, cache, check, as_json) -> None:
    """Download a toolkit's artifacts once into the controller cache (verified)."""
    engine.check_method(method)
    if method == "runfile":
        result = engine.fetch_runfile(url, sha256, cache, check)
    else:
        result = engine.fetch_wheels(version, list(components or engine.COMPONENTS), cache, platform, check)
    emit(result, as_json)


@cuda.command("install")
@toolkit_version_option()
@method_option()
@components_option()
@click.option("--source", type=PathArg(), metavar="PATH",
              help="The fetched wheel dir or its archive (wheels), or the runfile (runfile).")
@runfile_sha256_option()
@prefix_option
@check_option
@json_option
def cuda_install(version, method, components, source, sha256, prefix, check, as_json) -> None:
    """Install a toolkit into PREFIX/cuda-X.Y, staged and renamed into place."""
    emit(engine.install(version, prefix, method, list(components or engine.COMPONENTS),
                        source, sha256, check), as_json)


@cuda.command("default")
@toolkit_version_option(help="Toolkit release or series, e.g. 13.0.")
@prefix_option
@state_dir_option()
@check_option
@click.option("--installing", is_flag=True,
              help="With --check: this run installs the toolkit first, so it need not exist yet.")
@json_option
def cuda_default(version, prefix, state_dir, check, installing, as_json) -> None:
    """Point PREFIX/cuda at cuda-X.Y atomically, remembering the old target."""
    emit(engine.set_default(version, prefix, state_dir, check, installing), as_json)


@cuda.command("rollback")
@prefix_option
@state_dir_option()
@check_option
@json_option
def cuda_rollback(prefix, state_dir, check, as_json) -> None:
    """Restore PREFIX/cuda to the target it had before `rig cuda default`."""
    emit(engine.rollback_default(prefix, state_dir, check), as_json)


@cuda.command("list")
@prefix_option
@json_option
def cuda_list(prefix, as_json) -> None:
    """List the toolkits under PREFIX and the version each nvcc reports."""
    found = engine.toolkits(prefix)
    if as_json:
        click.echo(dump_json(found, "the toolkits found", indent=2))
    for t in [] if as_json else found:
        click.echo(terminal(f"{t['tree']}  nvcc {t['nvcc'] or '-'}  {'rig' if t['installed_by_rig'] else 'other'}"))
