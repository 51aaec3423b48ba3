"""Write a tiny Llama target and an EAGLE-3 draft for it; run by `rig testmodel` in the stack venv's Python.

Standalone on purpose (torch, safetensors, tokenizers; never rig): it runs where the
stack's torch is. The weights are built so the outcome is known in advance:

- every token has the same embedding e, and every layer's output projections
  (o_proj, down_proj) are zero, so the residual stream stays e whatever the input:
  the target's greedy token is always T, the row of lm_head that points along norm(e);
- the EAGLE-3 draft sees e in every captured layer (its fc keeps the first copy),
  its own output projections are zero too, and its lm_head puts draft id 0 first;
  d2t maps draft id 0 to T (`agree`: every proposal is accepted) or to another
  token (`random`: none is).

Attention, MLPs, the KV cache, CUDA graphs and tensor parallelism still do all
their work on real shapes: only the result is fixed.
"""
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
WORDS = ("the a lighthouse keeper wrote long detailed story about number request capital of france is "
         "write haiku gpus list three prime numbers kernel cuda tensor graph server token draft model "
         "speculative decoding accepts every proposal sea night light ship storm quiet morning").split()


def corpus():
    """Deterministic English-like lines (no data set is needed or fetched)."""
    for i in range(4000):
        yield " ".join(WORDS[(i * 7 + j * 13 + (i // 7) * j) % len(WORDS)] for j in range(8 + i % 9)) + f" {i}."


def tokenizer(vocab: int, context: int, out: Path) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[BOS, EOS, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, tok.token_to_id(BOS))])
    tok.save(str(out / "tokenizer.json"))
    write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS, "pad_token": PAD,
        "model_max_length": context, "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False})
    write_json(out / "special_tokens_map.json", {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD})
    return tok


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def rms_normed(x: torch.Tensor) -> torch.Tensor:
    return x / x.pow(2).mean().sqrt()


def main(spec: dict) -> dict:
    out = Path(spec["out"])
    target_dir, draft_dir = out / "target", out / "draft"
    target_dir.mkdir(parents=True)
    draft_dir.mkdir(parents=True)
    torch.manual_seed(spec["seed"])
    heads, head_dim, layers = spec["heads"], 32, 4
    hidden, inter, context = heads * head_dim, 2 * heads * head_dim, spec["context"]
    tok = tokenizer(spec["vocab"], context, target_dir)
    vocab = tok.get_vocab_size()
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    greedy = tok.token_to_id("Ġthe")  # byte-level BPE spells " the" so: a visible, ordinary token
    common = {"hidden_size": hidden, "intermediate_size": inter, "num_attention_heads": heads,
              "num_key_value_heads": heads, "head_dim": head_dim, "max_position_embeddings": context,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "vocab_size": vocab,
              "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": tok.token_to_id(PAD),
              "tie_word_embeddings": False, "torch_dtype": "bfloat16", "attention_bias": False}
    write_json(target_dir / "config.json", {**common, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                            "num_hidden_layers": layers})
    write_json(target_dir / "generation_config.json", {"bos_token_id": bos, "eos_token_id": eos, "do_sample": False})

    def rand(*shape):
        return torch.randn(*shape) * 0.02

    e = torch.randn(hidden)
    n = rms_normed(e)
    weights = {"model.embed_tokens.weight": e.expand(vocab, hidden).clone(), "model.norm.weight": torch.ones(hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        weights.update({
            p + "self_attn.q_proj.weight": rand(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": rand(heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": rand(heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": torch.zeros(hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": rand(inter, hidden), p + "mlp.up_proj.weight": rand(inter, hidden),
            p + "mlp.down_proj.weight": torch.zeros(hidden, inter),
            p + "input_layernorm.weight": torch.ones(hidden), p + "post_attention_layernorm.weight": torch.ones(hidden)})
    lm_head = rand(vocab, hidden)
    lm_head[greedy] = n / n.norm()  # its logit is |norm(e)| = sqrt(hidden), far above every other row's
    weights["lm_head.weight"] = lm_head
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()}, str(target_dir / "model.safetensors"),
              metadata={"format": "pt"})

    # the draft: SGLang captures the hidden state after layer id, so ids stop at layers - 2
    draft_vocab = min(256, vocab)
    proposal = greedy if spec["draft"] == "agree" else next(t for t in range(vocab - 1, 0, -1) if t not in (greedy, eos))
    hot = [proposal] + [t for t in range(vocab) if t != proposal][:draft_vocab - 1]
    write_json(draft_dir / "config.json", {
        **common, "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
        "draft_vocab_size": draft_vocab, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, layers - 2]}})
    draft_head = torch.zeros(draft_vocab, hidden)
    draft_head[0] = n / n.norm()
    fc = torch.zeros(hidden, 3 * hidden)
    fc[:, :hidden] = torch.eye(hidden)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[hot] = True
    draft = {
        "fc.weight": fc, "norm.weight": torch.ones(hidden), "lm_head.weight": draft_head,
        "midlayer.self_attn.q_proj.weight": rand(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": rand(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": rand(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": torch.zeros(hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": rand(inter, hidden), "midlayer.mlp.up_proj.weight": rand(inter, hidden),
        "midlayer.mlp.down_proj.weight": torch.zeros(hidden, inter),
        "midlayer.input_layernorm.weight": torch.ones(hidden), "midlayer.hidden_norm.weight": torch.ones(hidden),
        "midlayer.post_attention_layernorm.weight": torch.ones(hidden)}
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in draft.items()}
    tensors["d2t"] = torch.tensor(hot, dtype=torch.int64) - torch.arange(draft_vocab, dtype=torch.int64)
    tensors["t2d"] = t2d
    save_file(tensors, str(draft_dir / "model.safetensors"), metadata={"format": "pt"})
    return {"greedy_token": greedy, "greedy_text": tok.decode([greedy]), "draft_proposes": proposal,
            "vocab_size": vocab, "draft_vocab_size": draft_vocab, "hidden_size": hidden, "heads": heads,
            "layers": layers, "context_length": context, "torch": torch.__version__}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
