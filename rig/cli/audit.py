"""`rig audit`: audit wheels, installed packages or shared objects."""
from __future__ import annotations

import click

from rig.cli.common import json_option, judged, junit_option, stack_option, venv_option, write_junit
from rig.cli.types import PathArg
from rig.core.documents import dump_json
from rig.kernels import audit as audits
from rig.stack.spec import load


@click.command()
@click.argument("paths", nargs=-1, required=True, type=PathArg())
@stack_option(help="The CUDA major and target archs to hold the files to.")
@venv_option(optional="torch from --torch, or none (the torch symbols are not checked).",
             help="Take torch from this venv, and audit PATHS that are its installed distributions (e.g. "
                  "sglang-kernel).")
@click.option("--torch", "torch_path", type=PathArg(), metavar="PATH",
              help="Take torch from this torch wheel or torch/lib directory instead.")
@junit_option
@json_option
def audit(paths, stack_path, venv_path, torch_path, junit, as_json) -> None:
    """Audit wheels, installed packages or shared objects before anything loads them.

    For every shared object: the CUDA sonames it needs against the stack's CUDA
    major (and whether this host resolves them), the torch symbols it expects
    against those the given torch exports (demangled when missing), the torch its
    metadata pins, its cubin and PTX archs against the stack's archs (read by rig
    from each object's fat binaries, no cuobjdump; a target with neither is "no
    kernel image" before it happens), and the C++ string ABI.
    With --venv, every needed soname must also resolve where it will load (the
    venv's torch and NVIDIA libraries, RUNPATH, this host's loader cache).
    Exit 1 when any artifact fails; WARN names what could not be read.
    """
    common, installed = audits.context(load(stack_path), venv_path, torch_path, list(paths))
    reports = [audits.audit_path(p, installed, common) for p in paths]
    write_junit(junit, [audits.as_check(r) for r in reports], "rig audit")
    click.echo(dump_json(reports, "the audit", indent=2) if as_json else audits.render(reports))
    judged(all(r["ok"] for r in reports))
