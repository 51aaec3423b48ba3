"""`rig testmodel`: a Llama target and an EAGLE-3 draft whose outcome is known in advance.

They prove a box's whole serving path (EAGLE-3, CUDA graphs, tensor parallelism,
NCCL) in minutes, before hundreds of GB of weights arrive. The weights are made by
rig/foreign/testmodel_build.py in the stack venv's own Python (its torch, safetensors and
tokenizers), offline and deterministically: the same options give the same bytes,
so a second run changes nothing.

Shapes: `tiny` (4 layers, hidden 256: a step is kernel-launch overhead, so it proves
the path but not what speculation is worth) and Llama-3.2-1B's and Llama-3-8B's (grouped
KV heads, vocab 128256, a one-layer draft of the target's width with draft vocab 32000):
a step costs what a real model's does, so speculation's crossover shows. `accept` sets
the probability P the target gives the draft's token at temperature 1: SGLang accepts a
deterministic draft token with the target's probability of it, so each drafted position
is accepted with P and a request's accept length is 1 + P + ... + P^steps.
"""
from __future__ import annotations

import filecmp
import os
import shutil
import tempfile
from pathlib import Path

from rig.core import RigError, numbers, progress
from rig.core.documents import dump_json, load_json
from rig.core.fs import output_dir
from rig.core.proc import interpreter, last_json, run, script
from rig.core.schema import Field, between, validate
from rig.serving import numerics

DRAFTS = ("agree", "random")
KINDS = ("serving", "numerics")
DEVICES = ("auto", "cpu", "cuda")
MARKER = "testmodel.json"
MIN_MARGIN = 4.0  # logits: half the numerics model's designed margin (testmodel_build.py)
HEADS = 8  # divisible by every TP size up to 8; larger TP sizes get one head per rank
# Llama-3.2-1B's and Llama-3-8B's shapes (their config.json); tiny's heads follow --tp, its vocab the tokenizer's
SHAPES: dict[str, dict] = {
    # tiny's head dim is the smallest every attention backend takes: flashinfer 0.6.15's ragged prefill has no kernel
    # for 32 (run 14), FA3's smallest is 64
    "tiny": {"layers": 4, "head_dim": 64, "vocab": 0, "draft_vocab": 256},
    "1b": {"layers": 16, "heads": 32, "kv_heads": 8, "head_dim": 64, "hidden": 2048, "inter": 8192, "vocab": 128256,
           "draft_vocab": 32000, "rope_theta": 500000.0},
    "8b": {"layers": 32, "heads": 32, "kv_heads": 8, "head_dim": 128, "hidden": 4096, "inter": 14336,
           "vocab": 128256, "draft_vocab": 32000, "rope_theta": 500000.0},
}
MAX_STEPS = 8  # the expected accept lengths the record lists


def shape_of(name: str, tp: int, kind: str) -> dict:
    """The shape rig asks the builder for."""
    if name not in SHAPES:
        raise RigError(f"--shape {name!r}: choose one of {', '.join(SHAPES)}")
    shape: dict = dict(SHAPES[name])
    if name == "tiny":
        heads = max(HEADS, tp)
        # the numerics target's MLP units (528 pairs over 4 layers) need the wider intermediate size
        shape.update(heads=heads, kv_heads=heads, hidden=heads * shape["head_dim"],
                     inter=(4 if kind == "numerics" else 2) * heads * 32)
    elif kind == "numerics":
        raise RigError(f"--shape {name} is for --kind serving: the numerics model is tiny by design")
    elif tp > shape["kv_heads"]:
        raise RigError(f"--tp {tp}: the {name} shape has {shape['kv_heads']} KV heads, so it splits over at most "
                       f"{shape['kv_heads']} GPUs; give --tp {shape['kv_heads']} or fewer")
    return shape


def expected_accept_lengths(accept: float) -> dict[str, float]:
    """Tokens per verify step with each step count, when every drafted position is accepted with ACCEPT."""
    return {str(k): round(sum(accept ** j for j in range(k + 1)), 4) for k in range(1, MAX_STEPS + 1)}


def _accept(accept: float, kind: str, draft: str) -> None:
    if not (isinstance(accept, (int, float)) and 0 < accept <= 1):
        raise RigError(f"--accept {accept!r}: give the probability of the draft's token at temperature 1, above 0 "
                       "and at most 1")
    if accept < 1 and (kind != "serving" or draft != "agree"):
        raise RigError("--accept is for --kind serving with --draft agree: it sets how often the target takes the "
                       "draft's token")
    if accept < 0.001:
        raise RigError(f"--accept {accept}: below 0.001 the draft's token would no longer be the greedy one; give "
                       "0.001 or more")


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
        if numbers.problem(margin, MIN_MARGIN):
            raise RigError(f"the numerics model follows its rule in {dtype} but by a margin of {margin} (designed 8, "
                           f"at least {MIN_MARGIN:g}); report this with the venv's torch and transformers versions")


def _room(out: Path, size: int) -> None:
    """Refuse before writing when the file system under OUT cannot take the model (staged beside it)."""
    parent = next(p for p in [out, *out.parents] if p.exists())
    free = shutil.disk_usage(parent).free
    if free < size * 1.05:
        raise RigError(f"--out {out}: the model takes {size / 1e9:.1f} GB and {parent} has {free / 1e9:.1f} GB free; "
                       "free space or give an --out on a larger disk")


# What rig reads of the builder's answer, by what was asked: another Python may answer anything, so the answer
# is checked whole before it is used, and before anything is moved into --out (a value the message needs
# and lacks would otherwise fail only after the model replaced what was there).
SIZES = Field(dict, open=True, fields={"bytes": Field(int, required=True, check=between(0, 1 << 50))})
SERVING = Field(dict, open=True, fields={
    **SIZES.fields, "greedy_text": Field(str, required=True), "greedy_token": Field((int, type(None))),
    # the builder gives T's probability whatever --accept is; the message reads it when --accept is below 1
    "t_probability": Field((int, float), required=True, check=between(0.0, 1.0))})
NUMERICS = Field(dict, open=True, fields={
    **SIZES.fields, "greedy_text": Field(str, required=True), "reference": Field(dict, required=True, open=True)})


def _write(python: Path, spec: dict, into: Path, timeout: float) -> dict:
    request = dump_json({**spec, "out": str(into)}, "the test model's spec")
    done = run([str(python), "-c", script("testmodel_build"), request],
               "rig testmodel", timeout=timeout, env={**os.environ, "PYTHONHASHSEED": "0"})
    answer = last_json(done.stdout, "rig testmodel")
    wanted = SIZES if spec.get("sizes_only") else SERVING if spec["kind"] == "serving" else NUMERICS
    checked = validate(answer, wanted, f"the answer of {python} writing the test model")
    if wanted is NUMERICS:
        _reference_holds(checked["reference"])
    return checked


def build(out: str | Path, python: str | Path, tp: int = 1, draft: str = "agree", context: int = 8192,
          seed: int = 0, check: bool = False, kind: str = "serving", shape: str = "tiny", accept: float = 1.0,
          device: str = "auto") -> dict:
    out, python = Path(out).absolute(), interpreter(python)
    _check(out, python, tp, draft, context)
    if kind not in KINDS:
        raise RigError(f"--kind {kind!r}: choose one of {', '.join(KINDS)}")
    if device not in DEVICES:
        raise RigError(f"--device {device!r}: choose one of {', '.join(DEVICES)}")
    _accept(accept, kind, draft)
    dims = shape_of(shape, tp, kind)
    # the tiny model is written on the CPU: seconds either way, and its reference check runs there
    spec = {"kind": kind, "draft": draft, "seed": seed, "heads": dims["heads"], "context": context, "vocab": 1024,
            "shape": dims, "shape_name": shape, "accept": accept, "device": "cpu" if shape == "tiny" else device}
    if kind == "numerics":  # the rule, its prompts and their answers, for the build and its own reference check
        prompts = numerics.prompts()
        spec.update(draft="numerics", rule=numerics.table(), prompts=prompts,
                    expected=[numerics.continuation(p) for p in prompts])
    if not check:  # staged beside --out, so the finished tree is renamed into place
        out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=None if check else out.parent))
    try:
        if shape != "tiny":  # its size first, from the builder's own tensor list on torch's meta device
            sized = _write(python, {**spec, "sizes_only": True}, staging / "sizes", 300)
            if check:
                return {"changed": True, "target": str(out / "target"), "draft": str(out / "draft"), "kind": draft,
                        "model": kind, "shape": shape, "bytes": sized["bytes"],
                        "msg": f"would write the {shape} test model ({sized['bytes'] / 1e9:.1f} GB) to {out}"}
            _room(out, sized["bytes"])
        progress(f"writing the {shape} test model with {python}")
        info = _write(python, spec, staging / "model", 600 if shape == "tiny" else 7200)
        if kind == "serving":
            info.update(shape=shape, accept=accept, temperature=1.0,
                        expected_accept_length={"greedy": "steps + 1", **expected_accept_lengths(accept)})
        made = staging / "model"
        # rig's own keys last: an answer's "spec" must not stand in for rig's record
        (made / MARKER).write_text(dump_json({**info, "spec": spec}, MARKER, indent=2, sort_keys=True) + "\n")
        _readable(made)
        changed = not _same_tree(made, out)
        if changed and not check:
            if out.exists():
                out.rename(staging / "old")
            made.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    verb = ("would write" if check else "wrote") if changed else "unchanged:"
    return {**info, "changed": changed, "target": str(out / "target"), "draft": str(out / "draft"),
            "kind": spec["draft"], "model": kind, "msg": _said(verb, out, kind, shape, draft, accept, info)}


def _said(verb: str, out: Path, kind: str, shape: str, draft: str, accept: float, info: dict) -> str:
    """What build() wrote (or would, or found), in a line."""
    if kind == "numerics":
        margin = min(info["reference"][d]["min_margin"] for d in ("float32", "bfloat16"))
        return (f"{verb} {out}/target (numerics: transformers follows the rule in float32 and bfloat16, smallest "
                f"logit margin {margin}) and {out}/draft (it proposes the rule's lowest token)")
    msg = (f"{verb} {out}/target ({shape}, {info['bytes'] / 1e9:.2f} GB; greedy token {info['greedy_text']!r}) and "
           f"{out}/draft ({draft}: the draft proposes {'that token' if draft == 'agree' else 'another token'})")
    if accept < 1:
        msg += (f"; at temperature 1 the target gives it probability {info['t_probability']:.3f} (asked "
                f"{accept:g}): expected accept length {info['expected_accept_length']['3']:.2f} with 3 steps")
    return msg


def ensure(server: dict, python: str | Path, check: bool = False) -> dict | None:
    """The serving test model a stack's server section asks for (server.model: testmodel): its shape and
    acceptance (server.testmodel_shape, testmodel_accept), split for server.tp. Kept when rig's record in
    server.testmodel_dir says it is that model (an 8B shape is not rewritten to be compared), else written;
    None when the stack serves a model of its own."""
    if server["model"] != "testmodel":
        return None
    root = Path(server["testmodel_dir"])
    wanted = {"kind": "serving", "draft": "agree", "shape_name": server["testmodel_shape"],
              "accept": server["testmodel_accept"], "heads": shape_of(server["testmodel_shape"], server["tp"],
                                                                     "serving")["heads"]}
    found = made_by_rig(root) or {}
    if all(found.get(k) == v for k, v in wanted.items()):
        record = load_json(root / MARKER, "test model record")
        return {"changed": False, "msg": f"the {wanted['shape_name']} test model in {root} is the one asked for",
                **{k: record[k] for k in ("shape", "accept", "t_probability", "expected_accept_length") if k in record}}
    if check:
        return {"changed": True, "msg": f"would write the {wanted['shape_name']} test model (accept "
                                        f"{wanted['accept']:g}) to {root} first"}
    return build(root, python, tp=server["tp"], shape=wanted["shape_name"], accept=wanted["accept"])
