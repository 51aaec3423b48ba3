"""`rig testmodel`: a tiny target and draft to prove a box's serving path."""
from __future__ import annotations

from pathlib import Path

import click

from rig.cli.common import (
    check_option,
    emit,
    json_option,
    out_option,
    python_option,
    stack_option,
    tp_option,
    venv_of,
    venv_option,
)
from rig.cli.types import Choice, Number
from rig.core import RigError
from rig.serving.testmodel import DEVICES as _TESTMODEL_DEVICES
from rig.serving.testmodel import DRAFTS as _TESTMODEL_DRAFTS
from rig.serving.testmodel import KINDS as _TESTMODEL_KINDS
from rig.serving.testmodel import SHAPES as _TESTMODEL_SHAPES
from rig.serving.testmodel import build


@click.command()
@out_option(None, "DIR/target and DIR/draft (replaced only when their content changes).", required=True)
@venv_option(help="The stack's venv: its torch, safetensors and tokenizers write the model.")
@stack_option(required=False, help="The stack whose venv it is (when neither --venv nor --python is given).")
@python_option()
@tp_option(default=1, show_default=True, help="GPUs the server will split it over (1, 2, 4, 8...).")
@click.option("--kind", type=Choice(_TESTMODEL_KINDS), default="serving", show_default=True,
              help="serving: a fixed greedy token; numerics: tokens that follow a rule every layer computes.")
@click.option("--draft", type=Choice(_TESTMODEL_DRAFTS),
              help="serving only: agree (default), the target accepts every proposal; random: it accepts none.")
@click.option("--context", type=Number(int), default=8192, show_default=True, help="The model's context length in tokens.")
@click.option("--shape", type=Choice(list(_TESTMODEL_SHAPES)), default="tiny", show_default=True,
              help="tiny (4 layers, hidden 256: proves the path in seconds) or Llama-3.2-1B's / Llama-3-8B's shapes "
                   "(2.5 / 16 GB: what speculation is worth at a real model's cost).")
@click.option("--accept", type=Number(float), default=1.0, show_default=True,
              help="serving, agree draft: the probability the target gives the draft's token at temperature 1 "
                   "(each drafted position is accepted with it under sampling; greedy accepts every one).")
@click.option("--device", type=Choice(_TESTMODEL_DEVICES), default="auto", show_default=True,
              help="Where the 1b and 8b weights are made: the GPU when torch sees one (seconds), else the CPU.")
@check_option
@json_option
def testmodel(out_dir, venv_path, stack_path, python, tp, kind, draft, context, shape, accept, device, check,
              as_json) -> None:
    """Write a Llama target and its EAGLE-3 draft, to prove a box's serving path.

    The target always generates the same token; the `agree` draft always
    proposes it, so the accept length is the most the server's settings allow
    (speculative steps + 1), and the `random` draft never does (1.0). Heads
    divide by 8, so TP 1, 2, 4 and 8 split it. Offline, in seconds, with the
    venv's own torch. Point the stack at it with `server.model: testmodel`.

    --kind numerics writes a target whose greedy tokens follow the rule in
    rig/serving/numerics.py, computed by every layer's attention and MLP with a wide
    margin; it is checked with transformers in the venv (float32 and bfloat16)
    before it is kept. rig prove serves it and compares the tokens.

    --shape 1b / 8b write real sizes, sharded, so that `rig tune` measures a
    real model's step cost (--check says the size; a disk too small is refused
    first). --accept P makes sampled acceptance like a trained draft's: the
    record gives the expected accept length 1 + P + ... + P^steps.
    """
    if kind == "numerics" and draft:
        raise RigError("--draft is for --kind serving; the numerics model's draft proposes the rule's lowest token")
    python = python or Path(venv_of(venv_path, stack_path)) / "bin" / "python"
    emit(build(out_dir, python, tp, draft or "agree", context, check=check, kind=kind, shape=shape, accept=accept,
               device=device), as_json)
