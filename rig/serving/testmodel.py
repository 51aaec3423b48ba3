"""`rig testmodel`: a tiny Llama target and an EAGLE-3 draft whose outcome is known in advance.

They prove a box's whole serving path (EAGLE-3, CUDA graphs, tensor parallelism,
NCCL) in minutes, before hundreds of GB of weights arrive. The weights are made by
rig/foreign/testmodel_build.py in the stack venv's own Python (its torch, safetensors and
tokenizers), offline and deterministically: the same options give the same bytes,
so a second run changes nothing.
"""
from __future__ import annotations

import filecmp
import json
import os
import shutil
import tempfile
from pathlib import Path

from rig.core import RigError, progress
from rig.core.documents import load_json
from rig.core.fs import output_dir
from rig.core.proc import interpreter, last_json, run, script
from rig.serving import numerics

DRAFTS = ("agree", "random")
KINDS = ("serving", "numerics")
MARKER = "testmodel.json"
MIN_MARGIN = 4.0  # logits: half the numerics model's designed margin (testmodel_build.py)
HEADS = 8  # divisible by every TP size up to 8; larger TP sizes get one head per rank


def _check(out: Path, python: Path, tp: int, draft: str, context: int) -> None:
    if draft not in DRAFTS:
        raise RigError(f"--draft {draft!r}: choose one of {', '.join(DRAFTS)}")
    if tp < 1 or tp > 64 or tp & (tp - 1):
        raise RigError(f"--tp {tp}: give a power of two from 1 to 64 (the GPUs the server splits the model over)")
    if not 256 <= context <= 1 << 20:
        raise RigError(f"--context {context}: give a context length from 256 to 1048576 tokens")
    output_dir(out, "--out")
    if out.is_dir() and any(out.iterdir()) and made_by_rig(out) is None:
        raise RigError(f"--out {out} holds files that are not a rig test model; give an empty or new directory")
    interpreter(python)


def made_by_rig(out: Path) -> dict | None:
    """The spec of the test model rig wrote in OUT, or None: its marker must hold rig's record and both trees
    be there, since mere existence of a testmodel.json is anyone's to fake (and their files would go when
    rig replaces the tree whole)."""
    try:
        record = load_json(out / MARKER, "test model record")
    except RigError:
        return None
    spec = record.get("spec") if isinstance(record, dict) else None
    if isinstance(spec, dict) and {"draft", "seed", "heads"} <= spec.keys() and \
            all((out / part).is_dir() for part in ("target", "draft")):
        return spec
    return None


def _same_tree(a: Path, b: Path) -> bool:
    if not b.is_dir():
        return False
    files_a = sorted(p.relative_to(a) for p in a.rglob("*"))
    files_b = sorted(p.relative_to(b) for p in b.rglob("*"))
    return files_a == files_b and all(filecmp.cmp(a / f, b / f, shallow=False) for f in files_a if (a / f).is_file())


def _readable(root: Path) -> None:
    """The server runs as its own user: directories 0755, files 0644 (safetensors writes 0600)."""
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def _reference_holds(report: object) -> None:
    """The numerics target, run by transformers in the venv, must generate the rule's tokens in float32 and
    bfloat16: a model that does not is never installed."""
    if not isinstance(report, dict) or "skipped" in report:
        why = report.get("skipped") if isinstance(report, dict) else "no report"
        raise RigError(f"the numerics model's reference check could not run ({why}); the stack's venv needs "
                       "transformers, as sglang does")
    for dtype in ("float32", "bfloat16"):
        run_ = report.get(dtype)
        margin = run_.get("min_margin") if isinstance(run_, dict) else None
        if not isinstance(run_, dict) or not run_.get("matched") == run_.get("prompts") == numerics.PROMPTS:
            raise RigError(f"the numerics model does not follow its rule under transformers in {dtype}: {run_}; "
                           "report this with the venv's torch and transformers versions")
        if not isinstance(margin, (int, float)) or isinstance(margin, bool) or margin < MIN_MARGIN:
            raise RigError(f"the numerics model follows its rule in {dtype} but by a margin of {margin} (designed 8, "
                           f"at least {MIN_MARGIN:g}); report this with the venv's torch and transformers versions")


def build(out: str | Path, python: str | Path, tp: int = 1, draft: str = "agree", context: int = 8192,
          seed: int = 0, check: bool = False, kind: str = "serving") -> dict:
    out, python = Path(out).absolute(), Path(python)
    _check(out, python, tp, draft, context)
    if kind not in KINDS:
        raise RigError(f"--kind {kind!r}: choose one of {', '.join(KINDS)}")
    spec = {"kind": kind, "draft": draft, "seed": seed, "heads": max(HEADS, tp), "context": context, "vocab": 1024}
    if kind == "numerics":  # the rule, its prompts and their answers, for the build and its own reference check
        prompts = numerics.prompts()
        spec.update(draft="numerics", rule=numerics.table(), prompts=prompts,
                    expected=[numerics.continuation(p) for p in prompts])
    if not check:  # staged beside --out, so the finished tree is renamed into place
        out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=None if check else out.parent))
    try:
        progress(f"writing the test model with {python}")
        done = run([str(python), "-c", script("testmodel_build"), json.dumps({**spec, "out": str(staging / "model")})],
                   "rig testmodel", timeout=600, env={**os.environ, "PYTHONHASHSEED": "0"})
        info = last_json(done.stdout, "rig testmodel")
        if kind == "numerics":
            _reference_holds(info.get("reference"))
        made = staging / "model"
        (made / MARKER).write_text(json.dumps({"spec": spec, **info}, indent=2, sort_keys=True) + "\n")
        _readable(made)
        changed = not _same_tree(made, out)
        if changed and not check:
            if out.exists():
                out.rename(staging / "old")
            made.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    verb = ("would write" if check else "wrote") if changed else "unchanged:"
    if kind == "numerics":
        margin = min(info["reference"][d]["min_margin"] for d in ("float32", "bfloat16"))
        msg = (f"{verb} {out}/target (numerics: transformers follows the rule in float32 and bfloat16, smallest "
               f"logit margin {margin}) and {out}/draft (it proposes the rule's lowest token)")
    else:
        msg = (f"{verb} {out}/target (greedy token {info['greedy_text']!r}) and {out}/draft "
               f"({draft}: the draft proposes {'that token' if draft == 'agree' else 'another token'})")
    return {"changed": changed, "target": str(out / "target"), "draft": str(out / "draft"), "kind": spec["draft"],
            "model": kind, **info, "msg": msg}
