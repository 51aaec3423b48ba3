"""`rig testmodel`: a tiny target and draft to prove a box's serving path."""
from __future__ import annotations

from pathlib import Path

import click

from rig.cli.common import check_option, emit, json_option, venv_option
from rig.core import defaults
from rig.serving.testmodel import DRAFTS as _TESTMODEL_DRAFTS
from rig.serving.testmodel import KINDS as _TESTMODEL_KINDS


@click.command()
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Where DIR/target and DIR/draft go (replaced only when their content changes).")
@venv_option(default=defaults.VENV, show_default=True,
              help="The stack's venv: its torch, safetensors and tokenizers write the model.")
@click.option("--python", "python", help="Use this interpreter instead of the venv's.")
@click.option("--tp", type=int, default=1, show_default=True, help="GPUs the server will split it over (1, 2, 4, 8...).")
@click.option("--kind", type=click.Choice(_TESTMODEL_KINDS), default="serving", show_default=True,
              help="serving: a fixed greedy token; numerics: tokens that follow a rule every layer computes.")
@click.option("--draft", type=click.Choice(_TESTMODEL_DRAFTS),
              help="serving only: agree (default), the target accepts every proposal; random: it accepts none.")
@click.option("--context", type=int, default=8192, show_default=True, help="The model's context length in tokens.")
@check_option
@json_option
def testmodel(out_dir, venv_path, python, tp, kind, draft, context, check, as_json) -> None:
    """Write a tiny Llama target and its EAGLE-3 draft, to prove a box's serving path.

    The target always generates the same token; the `agree` draft always
    proposes it, so the accept length is the most the server's settings allow
    (speculative steps + 1), and the `random` draft never does (1.0). Heads
    divide by 8, so TP 1, 2, 4 and 8 split it. Offline, in seconds, with the
    venv's own torch. Point the stack at it with `server.model: testmodel`.

    --kind numerics writes a target whose greedy tokens follow the rule in
    rig/serving/numerics.py, computed by every layer's attention and MLP with a wide
    margin; it is checked with transformers in the venv (float32 and bfloat16)
    before it is kept. rig prove serves it and compares the tokens.
    """
    from rig.core import RigError
    from rig.serving.testmodel import build

    if kind == "numerics" and draft:
        raise RigError("--draft is for --kind serving; the numerics model's draft proposes the rule's lowest token")
    emit(build(out_dir, python or Path(venv_path) / "bin" / "python", tp, draft or "agree", context, check=check,
               kind=kind), as_json)
