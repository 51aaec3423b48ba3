"""rig testmodel in the default stack's real venv (torch 2.14.1, transformers, sglang 0.5.23), on the CPU:
the target loads with transformers and generates its one token, sglang's own ModelConfig parses both configs,
and the draft, computed by hand from its weights, proposes that token (agree) or another (random)."""
from __future__ import annotations

import json
import subprocess

import pytest

from conftest import ok, rig

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
    check = json.loads(ok(rig("testmodel", "--out", str(root), "--venv", str(lab["v23"]), "--tp", "8",
                              "--draft", other, "--check", "--json")).stdout)
    assert check["changed"] and inspect(lab["v23"], root)["proposal"] == seen["proposal"]  # --check wrote nothing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["testmodel"]  # no scratch left beside it
