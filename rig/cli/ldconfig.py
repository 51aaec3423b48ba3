"""`rig cuda ldconfig-conf`: the ld.so.conf.d file of a toolkit."""
from __future__ import annotations

import click

from rig.cli.common import check_option, emit, json_option, prefix_option, root_option, toolkit_version_option
from rig.cli.types import DIR, OutDir
from rig.core.documents import converge_file
from rig.core.fs import atomic_write, confined
from rig.cuda.ldconfig import conf_for


@click.command("ldconfig-conf")
@toolkit_version_option()
@prefix_option
@click.option("--conf-dir", default="/etc/ld.so.conf.d", show_default=True, type=DIR, metavar="DIR")
@root_option(default="/", show_default=True,
             help="Where the tree is seen now (an image's staging dir); paths are written as seen from /.")
@click.option("--write-under", type=OutDir(), metavar="DIR",
              help="Write the file under this dir (ROOT/etc/ld.so.conf.d/...) instead of printing it.")
@click.option("--write", is_flag=True,
              help="Write the file in place (a host's own toolkit), leaving one already right alone: `changed` and "
                   "a diff say what changed; the dynamic linker's cache is the caller's to refresh.")
@check_option
@json_option
def ldconfig_conf(version, prefix, conf_dir, root, write_under, write, check, as_json) -> None:
    """Print the ld.so.conf.d file (path, content) that covers a toolkit's libraries, or write it."""
    result = conf_for(version, prefix, conf_dir, root)
    if write:
        if write_under or root != "/":
            raise click.UsageError("--write writes the host's own file: it takes neither --write-under nor --root")
        result.update(converge_file(result["path"], result["content"], "the ld.so.conf.d file", check))
        result["msg"] = (f"{'would write' if check else 'wrote'} {result['path']}" if result["changed"]
                         else f"{result['path']} already lists the toolkit's libraries")
    elif write_under:
        # follow=False: a link left at the file's place is replaced, never written through
        atomic_write(confined(write_under, result["path"].lstrip("/"), "--write-under", follow=False),
                     result["content"])
    if as_json:
        emit(result, True)
    else:
        click.echo(f"# {result['path']}\n{result['content']}", nl=False)
