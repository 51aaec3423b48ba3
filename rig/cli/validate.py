"""`rig validate`: gate a stack in CI."""
from __future__ import annotations

import click

from rig.ci.validate import run
from rig.cli.common import (
    cache_option,
    emit,
    json_option,
    judged,
    junit_option,
    patches_option,
    stack_option,
    venv_option,
    write_junit,
)
from rig.core.check import Check


@click.command("validate")
@stack_option(positional=True, help="The stack to gate.")
@junit_option
@venv_option(optional="the server line is checked by rig's own rules only.",
             help="A venv of the stack (its image's): its sglang parses the server line.")
@cache_option(help="The wheelhouse (missing wheels are fetched).")
@patches_option()
@json_option
def validate_cmd(stack_path, junit, venv_path, cache, patch_dir, as_json) -> None:
    """Gate a stack in CI, with no GPU: every check, every problem, in one run.

    The schema; the locks current and complete; every pin conflict; the locked
    kernel wheels audited against the locked torch, the CUDA major and the archs;
    the patch plan read from the locked sglang and flashinfer wheels; the server
    command line (with --venv); the environment module. Exit 1 when a check fails,
    2 on bad input.
    """
    result = run(stack_path, cache, venv_path, patch_dir)
    write_junit(junit, [Check(**c) for c in result["checks"]], result["suite"])
    emit(result, as_json)
    judged(result["ok"])
