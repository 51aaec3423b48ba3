"""rig testmodel in the default stack's real venv (torch 2.14.1, transformers, sglang 0.5.23), on the CPU:
the target loads with transformers and generates its one token, sglang's own ModelConfig parses both configs,
and the draft, computed by hand from its weights, proposes that token (agree) or another (random)."""
from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
from harness.commands import ok, rig
from harness.paths import REPO

pytestmark = pytest.mark.venv

CHECK = r"""
import json, sys
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer
from sglang.srt.configs.model_config import ModelConfig

root = sys.argv[1]
tok = AutoTokenizer.from_pretrained(root + "/target")
model = AutoModelForCausalLM.from_pretrained(root + "/target")
ids = tok("List three prime numbers:", return_tensors="pt").input_ids
out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
target = ModelConfig(root + "/target")
draft = ModelConfig(root + "/draft", is_draft_model=True, speculative_algorithm="EAGLE3")
# the draft by hand: its captured inputs are the shared embedding e; with o_proj and down_proj zero
# the midlayer adds nothing, so its logits are lm_head @ rmsnorm(fc @ [e, e, e]) * norm
w = load_file(root + "/draft/model.safetensors")
e = load_file(root + "/target/model.safetensors")["model.embed_tokens.weight"][0].float()
h = w["fc.weight"].float() @ torch.cat([e, e, e])
n = h / h.pow(2).mean().sqrt() * w["norm.weight"].float()
best = int((w["lm_head.weight"].float() @ n).argmax())
print(json.dumps({
    "generated": out[0, ids.shape[1]:].tolist(), "chat": tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True),
    "target": [target.hf_config.architectures, target.context_len, target.num_attention_heads],
    "draft": [draft.hf_config.architectures, draft.hf_config.draft_vocab_size,
              draft.hf_config.eagle_config["eagle_aux_hidden_state_layer_ids"], draft.hf_config.num_hidden_layers],
    "zero_projections": bool(w["midlayer.self_attn.o_proj.weight"].abs().sum() == 0 and
                             w["midlayer.mlp.down_proj.weight"].abs().sum() == 0),
    "proposal": best + int(w["d2t"][best])}))
"""


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file()}


def inspect(venv, root) -> dict:
    done = ok(subprocess.run([str(venv / "bin" / "python"), "-c", CHECK, str(root)], capture_output=True, text=True,
                             check=False))
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("draft", ["agree", "random"])
def test_the_test_model_serves_its_token_and_the_draft_proposes_as_told(lab, tmp_path, draft):
    root = tmp_path / "testmodel"
    made = json.loads(ok(rig("testmodel", "--out", str(root), "--venv", str(lab["v23"]), "--tp", "8",
                             "--draft", draft, "--json")).stdout)
    assert made["changed"] and made["heads"] == 8 and made["kind"] == draft
    seen = inspect(lab["v23"], root)
    assert seen["generated"] == [made["greedy_token"]] * 12
    assert seen["chat"] == "<|user|>\nhi\n<|assistant|>\n"
    assert seen["target"] == [["LlamaForCausalLM"], 8192, 8]
    assert seen["draft"] == [["LlamaForCausalLMEagle3"], 256, [0, 1, 2], 1]  # aux ids <= layers - 2
    assert seen["zero_projections"]
    if draft == "agree":
        assert seen["proposal"] == made["greedy_token"]
    else:
        assert seen["proposal"] != made["greedy_token"]
    # the same options give the same bytes: a second run (and its check) changes nothing
    again = json.loads(ok(rig("testmodel", "--out", str(root), "--venv", str(lab["v23"]), "--tp", "8",
                              "--draft", draft, "--json")).stdout)
    assert not again["changed"]
    other = "random" if draft == "agree" else "agree"
    written = digests(root)
    check = json.loads(ok(rig("testmodel", "--out", str(root), "--venv", str(lab["v23"]), "--tp", "8",
                              "--draft", other, "--check", "--json")).stdout)
    assert check["changed"] and digests(root) == written  # --check wrote nothing: every file's bytes as they were
    assert sorted(p.name for p in tmp_path.iterdir()) == ["testmodel"]  # no scratch left beside it


# The numerics target with one tensor changed as a wrong kernel would change its output, then checked by the
# builder's own reference (transformers on the CPU) against the rule's tokens: every way in one process (torch
# and transformers imported once), each from a fresh copy of the unchanged target.
HOWS = ["half-the-heads", "mlp-sign", "uniform-attention", "zero-gemm", "doubled-all-reduce", "noise"]
PERTURB = r"""
import json, runpy, shutil, sys
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file


def perturbed(target, how):
    w = load_file(target / "model.safetensors")
    torch.manual_seed(1)
    if how == "half-the-heads":  # layer 0's all-reduce loses the ranks holding heads 4..7 (TP 2 losing one)
        o = w["model.layers.0.self_attn.o_proj.weight"]
        o[:, o.shape[1] // 2:] = 0
    elif how == "mlp-sign":  # one layer's down projection with its sign flipped
        w["model.layers.2.mlp.down_proj.weight"] *= -1
    elif how == "uniform-attention":  # scores lost: every head averages the context
        for i in range(4):
            w[f"model.layers.{i}.self_attn.k_proj.weight"].zero_()
    elif how == "zero-gemm":  # a GEMM that returns zeros (flashinfer#2577): one layer's gate projection
        w["model.layers.1.mlp.gate_proj.weight"].zero_()
    elif how == "doubled-all-reduce":  # every layer's MLP all-reduce counts its ranks twice
        for i in range(4):
            w[f"model.layers.{i}.mlp.down_proj.weight"] *= 2
    elif how == "noise":  # 0.25% relative noise on every weight, twice bf16 rounding's spread (2^-9 at most): no fault
        w = {k: (v.float() * (1 + 0.0025 * torch.randn_like(v.float()))).to(v.dtype) for k, v in w.items()}
    save_file({k: v.contiguous() for k, v in w.items()}, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


builder, root, work, rule, *hows = sys.argv[1:]
rule = json.loads(rule)
reference = runpy.run_path(builder)["reference"]
seen = {}
for how in hows:
    target = Path(work) / how / "target"
    shutil.copytree(Path(root) / "target", target)
    try:  # one case that fails says so in its own test, not in all six
        seen[how] = reference(perturbed(target, how), rule["prompts"], rule["expected"])
    except Exception as exc:
        seen[how] = {"error": repr(exc)}
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def numerics_model(lab, tmp_path_factory):
    root = tmp_path_factory.mktemp("numerics") / "model"
    made = json.loads(ok(rig("testmodel", "--kind", "numerics", "--out", str(root), "--venv", str(lab["v23"]),
                             "--tp", "8", "--json")).stdout)
    return root, made


def test_the_numerics_target_follows_its_rule_under_transformers_with_a_wide_margin(numerics_model, lab):
    root, made = numerics_model
    assert made["model"] == "numerics" and made["heads"] == 8
    for dtype in ("float32", "bfloat16"):
        assert made["reference"][dtype]["matched"] == made["reference"][dtype]["prompts"] == 8, made["reference"]
        # by design the answer beats every other token (the decoys) by 8 logits; bf16 rounding costs under 1
        assert made["reference"][dtype]["min_margin"] > 6
    config = json.loads((root / "target" / "config.json").read_text())
    assert config["num_attention_heads"] == 8 and config["intermediate_size"] % 8 == 0
    done = rig("testmodel", "--kind", "numerics", "--draft", "agree", "--out", str(root), "--venv", str(lab["v23"]))
    assert done.returncode == 2 and "--draft is for --kind serving" in done.stderr


@pytest.fixture(scope="module")
def perturbed(numerics_model, lab, tmp_path_factory) -> dict:
    """What the builder's reference reads from the numerics target changed each way in HOWS."""
    from rig.serving import numerics

    root, _ = numerics_model
    asked = numerics.prompts()
    rule = json.dumps({"prompts": asked, "expected": [numerics.continuation(p) for p in asked]})
    builder = str(REPO / "rig" / "foreign" / "testmodel_build.py")
    done = ok(subprocess.run([str(lab["v23"] / "bin" / "python"), "-c", PERTURB, builder, str(root),
                              str(tmp_path_factory.mktemp("perturbed")), rule, *HOWS],
                             capture_output=True, text=True, check=False))
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("how", HOWS)
def test_a_wrong_kernel_changes_the_numerics_tokens_and_noise_does_not(perturbed, how):
    seen = perturbed[how]
    assert "error" not in seen, seen["error"]
    for dtype in ("float32", "bfloat16"):
        if how == "noise":
            assert seen[dtype]["matched"] == 8 and seen[dtype]["min_margin"] > 4, seen
        else:
            assert seen[dtype]["matched"] < 8 and seen[dtype]["first_difference"], seen


# The 1b shape on the CPU (transformers in bf16), and the 8b shape's configs as SGLang's loader reads them
REAL = r"""
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from sglang.srt.configs.model_config import ModelConfig

root, configs_8b = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(root + "/target")
model = AutoModelForCausalLM.from_pretrained(root + "/target", dtype=torch.bfloat16).eval()
ids = tok("List three prime numbers:", return_tensors="pt").input_ids
with torch.no_grad():
    logits = model(ids).logits[0, -1].float()
p = torch.softmax(logits, -1)  # temperature 1
draws = torch.multinomial(p, 4000, replacement=True, generator=torch.Generator().manual_seed(0))
greedy = int(logits.argmax())
seen = {"greedy": greedy, "p": float(p[greedy]), "frequency": float((draws == greedy).float().mean())}
for name, base in (("1b", root), ("8b", configs_8b)):
    target = ModelConfig(base + "/target")
    draft = ModelConfig(base + "/draft", is_draft_model=True, speculative_algorithm="EAGLE3")
    seen[name] = [target.hf_config.architectures, target.num_attention_heads, target.get_num_kv_heads(1),
                  target.hf_config.vocab_size, draft.hf_config.draft_vocab_size,
                  draft.hf_config.eagle_config["eagle_aux_hidden_state_layer_ids"]]
print(json.dumps(seen))
"""


def test_real_shapes_load_in_transformers_and_sglang_and_sample_the_draft_token_at_the_asked_rate(lab, tmp_path):
    from rig.core.proc import script
    from rig.serving.testmodel import shape_of

    root = tmp_path / "1b"
    made = json.loads(ok(rig("testmodel", "--out", str(root), "--venv", str(lab["v23"]), "--shape", "1b",
                             "--accept", "0.7", "--device", "cpu", "--json")).stdout)
    assert made["shape"] == "1b" and made["accept"] == 0.7 and made["temperature"] == 1.0
    assert made["expected_accept_length"]["3"] == pytest.approx(2.533, abs=1e-3)
    assert abs(made["t_probability"] - 0.7) < 0.01  # bf16 rounds T's row: the stored logit, read back
    index = json.loads((root / "target" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 2  # 3.0 GB in 2 GB shards
    # the 8b shape's tensors are only counted (torch's meta device); its configs are written as for the real thing
    configs = tmp_path / "8b"
    spec = {"kind": "serving", "draft": "agree", "seed": 0, "context": 8192, "vocab": 1024, "accept": 0.7,
            "shape": shape_of("8b", 1, "serving"), "sizes_only": True, "out": str(configs)}
    sized = json.loads(ok(subprocess.run([str(lab["v23"] / "bin" / "python"), "-c", script("testmodel_build"),
                                          json.dumps(spec)], capture_output=True, text=True, check=False))
                       .stdout.strip().splitlines()[-1])
    assert 15.5e9 < sized["bytes"] < 17.5e9  # Llama-3-8B's 8.0 B parameters in bf16, plus a 0.4 B draft
    done = ok(subprocess.run([str(lab["v23"] / "bin" / "python"), "-c", REAL, str(root), str(configs)],
                             capture_output=True, text=True, check=False))
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["greedy"] == made["greedy_token"] == made["draft_proposes"]
    assert abs(seen["p"] - 0.7) < 0.01
    assert abs(seen["frequency"] - 0.7) < 4 * (0.7 * 0.3 / 4000) ** 0.5  # within sampling noise (4 sigma)
    # the ids that make SGLang capture what it captures by default, [2, L // 2, L - 3] (it captures id + 1)
    assert seen["1b"] == [["LlamaForCausalLM"], 32, 8, 128256, 32000, [1, 7, 12]]
    assert seen["8b"] == [["LlamaForCausalLM"], 32, 8, 128256, 32000, [1, 15, 28]]
