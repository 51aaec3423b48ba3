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
their work on real shapes: only the result is fixed. rig passes the shape (tiny, or
Llama-3.2-1B's or Llama-3-8B's); the real ones have grouped KV heads, vocab 128256
(the tokenizer's own tokens come first, the rest is never sampled) and a draft vocab
of 32000, and are written sharded with an index, on the GPU when there is one.

Acceptance under sampling (spec "accept" = P): every lm_head row but T's is zero (the
tokenizer's specials and the ids past it get a logit of -30, so they are never sampled),
and T's row is set so that at temperature 1 the target gives T probability P. SGLang
accepts a deterministic draft token with the target's probability of it, so a draft that
always proposes T is accepted at P per position; greedy requests accept it always.

The numerics target (kind "numerics") computes instead: its greedy token follows the
rule table rig passes in (rig/serving/numerics.py), and every layer's attention and MLP takes
part, so a wrong value anywhere changes the tokens. The residual stream holds four
parts: A, the current token's one-hot (rule tokens only); a constant 1; B, the one-hot
of the highest-ranked token so far, which each layer's heads add a quarter of
(attention over a key that grows with the rank, on RoPE's slowest pair so position
barely matters); C, the answer's one-hot, written by the MLP unit of the pair
(current, highest). lm_head reads C; two decoys win where C's magnitude is off by a
third (rig/serving/numerics.py). The builder then checks its own model with
transformers on the CPU, in float32 and bfloat16, and records the smallest margin.
"""
import json
import math
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


DEVICE = "cpu"
SALT = [0]


def rand(*shape, device=None):
    """Small pseudo-random weights, the same bytes on any device (an integer hash of each element's index and the
    call's order, uniform with standard deviation 0.02): a GPU writes 8 GB of them in seconds, a CPU in a minute."""
    SALT[0] += 1
    count = math.prod(shape)
    mixed = (torch.arange(count, device=device or DEVICE, dtype=torch.int64) + SALT[0] * 0x9E3779B1) & 0xFFFFFFFF
    for multiplier in (0x7FEB352D, 0x2C1B3C6D):  # two rounds of xor-shift-multiply: 32 x 31 bits, inside int64
        mixed = ((mixed ^ (mixed >> 16)) * multiplier) & 0xFFFFFFFF
    mixed = mixed ^ (mixed >> 15)
    return ((mixed.to(torch.float32) / 2.0 ** 32 - 0.5) * (0.02 * math.sqrt(12))).reshape(shape)


def layer_weights(i: int, q, k, v, o, gate, up, down) -> dict:
    p = f"model.layers.{i}."
    hidden = o.shape[0]
    return {p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k, p + "self_attn.v_proj.weight": v,
            p + "self_attn.o_proj.weight": o, p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
            p + "mlp.down_proj.weight": down, p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden)}


NEVER = -30.0  # the logit of tokens that must never be sampled: e^-30 per token is nothing even over 128k of them
SURE = 40.0  # T's logit without --accept: every other token's probability at temperature 1 is below 1e-12


def t_logit(accept: float, others: int) -> float:
    """T's logit that gives it probability ACCEPT at temperature 1 beside OTHERS tokens at logit 0."""
    return SURE if accept >= 1 else math.log(accept * others / (1 - accept))


def serving_target(shape: dict, vocab: int, greedy: int, never: list, accept: float):
    """(the target's (name, tensor) pairs, layer by layer, so an 8B shape never sits in memory whole; the
    direction of its final hidden state; T's logit and probability as stored). Every output projection is zero:
    the greedy token is GREEDY whatever the input (the module docstring); at temperature 1 it has probability
    ACCEPT, every token in NEVER about none."""
    heads, kv, head_dim, hidden, inter = (shape[k] for k in ("heads", "kv_heads", "head_dim", "hidden", "inter"))
    # any direction: the residual stream holds it whatever the input; made on the CPU, so its norm (a float sum)
    # is the same bytes wherever the rest is written
    e = (rand(hidden, device="cpu") * 50).to(torch.bfloat16)
    n = rms_normed(e.float())
    others = vocab - 1 - len(never)
    # row . n = logit, with |n|^2 = hidden; bf16 rounds the row, so the logit is taken back from the stored bytes
    row = (n * (t_logit(accept, others) / hidden)).to(torch.bfloat16)
    logit = float(row.float() @ n.to(torch.bfloat16).float())
    lm_head = torch.zeros(vocab, hidden, dtype=torch.bfloat16)
    lm_head[never] = (n * (NEVER / hidden)).to(torch.bfloat16).to(lm_head.device)
    lm_head[greedy] = row.to(lm_head.device)
    realized = {"t_logit": round(logit, 4), "t_probability": round(
        1.0 / (1.0 + others * math.exp(-logit) + len(never) * math.exp(NEVER - logit)), 6)}

    def tensors():
        yield "model.embed_tokens.weight", e.to(lm_head.device).expand(vocab, hidden)
        yield "model.norm.weight", torch.ones(hidden)
        for i in range(shape["layers"]):
            yield from layer_weights(i, rand(heads * head_dim, hidden), rand(kv * head_dim, hidden),
                                     rand(kv * head_dim, hidden), torch.zeros(hidden, heads * head_dim),
                                     rand(inter, hidden), rand(inter, hidden), torch.zeros(hidden, inter)).items()
        yield "lm_head.weight", lm_head

    return tensors(), n, realized


# the numerics target's design values (the module docstring): the attention score between neighbouring
# ranks, a matching MLP unit's gate (silu(10) = 10, a half match's silu(-10) = -0.00045), C's value,
# and the chosen token's logit (every other logit is about 0)
SCORE_GAP, GATE, ANSWER, LOGIT = 16.0, 20.0, 0.1, 24.0
# the decoys' logits with the answer's magnitude right: the low one's is fixed, the high one's is
# 2 x LOGIT x (answer / ANSWER) - 32, so the answer wins by 8 only while its magnitude is within a third
DECOY_LOW, DECOY_HIGH_OFFSET = 16.0, 32.0


def numerics_target(shape: dict, vocab: int, rule: dict) -> tuple[dict, torch.Tensor]:
    heads, head_dim, hidden, inter, layers = (shape[k] for k in ("heads", "head_dim", "hidden", "inter", "layers"))
    ids, follows = rule["ids"], rule["next"]
    ranks = len(ids)
    a, one, b, c = 0, ranks, ranks + 1, 2 * ranks + 1  # where A, the constant, B and C start
    assert ranks <= head_dim and c + ranks <= hidden and max(ids + rule["decoys"]) < vocab

    def norm_factor(squared: float) -> float:  # what RMSNorm multiplies a residual of that squared norm by
        return math.sqrt(hidden / squared)

    embed = torch.zeros(vocab, hidden)
    embed[:, one] = 1.0
    for r, t in enumerate(ids):
        embed[t, a + r] = 1.0
    weights = {"model.embed_tokens.weight": embed, "model.norm.weight": torch.ones(hidden)}
    share = 1.0 / layers
    pairs = [(cur, top) for top in range(1, ranks + 1) for cur in range(1, top + 1)]
    slow = head_dim // 2 - 1  # RoPE's slowest pair is (slow, slow + head_dim / 2)
    for i in range(layers):
        seen, after = i * share, (i + 1) * share  # B's value before and after this layer's attention
        n = norm_factor(2 + seen ** 2)
        w = math.sqrt(SCORE_GAP * math.sqrt(head_dim)) / n
        q, k = torch.zeros(heads * head_dim, hidden), torch.zeros(heads * head_dim, hidden)
        v, o = torch.zeros(heads * head_dim, hidden), torch.zeros(hidden, heads * head_dim)
        for h in range(heads):
            q[h * head_dim + slow, one] = w
            for r in range(ranks):
                k[h * head_dim + slow, a + r] = w * (r + 1)
                v[h * head_dim + r, a + r] = 1.0 / n
                o[b + r, h * head_dim + r] = share / heads  # each head a part: the all-reduce sums them
        n = norm_factor(2 + after ** 2)
        gate, up, down = torch.zeros(inter, hidden), torch.zeros(inter, hidden), torch.zeros(hidden, inter)
        mine = pairs[i::layers]
        stride = inter // len(mine)  # spread over the intermediate size, so every TP rank holds units
        for u, (cur, top) in enumerate(mine):
            col = u * stride
            gate[col, a + cur - 1] = GATE / n
            gate[col, b + top - 1] = GATE / (n * after)
            gate[col, one] = -1.5 * GATE / n
            up[col, one] = 1.0 / n
            down[c + follows[top - 1][cur - 1] - 1, col] = ANSWER / torch.nn.functional.silu(torch.tensor(GATE / 2))
        weights.update(layer_weights(i, q, k, v, o, gate, up, down))
    lm_head = torch.zeros(vocab, hidden)
    final = norm_factor(3 + ANSWER ** 2)
    for r, t in enumerate(ids):
        lm_head[t, c + r] = LOGIT / (ANSWER * final)
    low, high = rule["decoys"]
    lm_head[low, one] = DECOY_LOW / final
    lm_head[high, c:c + ranks] = 2 * LOGIT / (ANSWER * final)
    lm_head[high, one] = -DECOY_HIGH_OFFSET / final
    weights["lm_head.weight"] = lm_head
    direction = torch.zeros(hidden)
    direction[one] = 1.0  # every residual holds the constant: the draft's head follows it
    return weights, direction


def reference(target_dir: Path, prompts: list, expected: list, device: str = "cpu") -> dict:
    """The numerics target run by transformers (on the CPU unless DEVICE says): greedy tokens against the rule,
    and the margins."""
    try:
        from transformers import LlamaForCausalLM
    except ImportError as exc:
        return {"skipped": f"transformers does not import: {exc}"}
    report = {}
    torch.set_num_threads(1)  # a model this small decodes fastest on one thread, and a busy box stays usable
    for dtype in ("float32", "bfloat16"):
        model = LlamaForCausalLM.from_pretrained(str(target_dir), dtype=getattr(torch, dtype)).to(device).eval()
        matched, margins, first = 0, [], None
        with torch.no_grad():
            for n, (prompt, want) in enumerate(zip(prompts, expected, strict=True)):
                step, got = model(torch.tensor([prompt], device=device), use_cache=True), []
                for _ in want:  # one token at a time over the KV cache, as a server decodes
                    top = torch.topk(step.logits[0, -1].float(), 2)
                    margins.append(float(top.values[0] - top.values[1]))
                    got.append(int(top.indices[0]))
                    step = model(torch.tensor([[got[-1]]], device=device), past_key_values=step.past_key_values,
                                 use_cache=True)
                if got == want:
                    matched += 1
                elif first is None:
                    at = next(j for j, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
                    first = {"prompt": n, "position": at, "token": got[at], "expected": want[at]}
        report[dtype] = {"matched": matched, "prompts": len(prompts), "min_margin": round(min(margins), 3),
                         "first_difference": first}
    return report


SHARD_BYTES = 2 * 1000 ** 3  # an 8B shape in 8 shards, as released checkpoints are split


def save_tensors(directory: Path, tensors) -> int:
    """(name, tensor) pairs as safetensors (floats in bf16): model.safetensors when they fit one shard, else
    model-0000i-of-0000N.safetensors and the index transformers and SGLang read; the bytes. On the meta device
    (rig's size check) nothing is written and only the bytes are counted."""
    shards: list[dict] = [{}]
    sizes, total = [0], 0
    for name, tensor in tensors:
        if tensor.is_floating_point():
            tensor = tensor.to(torch.bfloat16)
        size = tensor.numel() * tensor.element_size()
        if shards[-1] and sizes[-1] + size > SHARD_BYTES:
            if DEVICE != "meta":
                save_file(shards[-1], str(directory / f"shard-{len(shards)}"), metadata={"format": "pt"})
            shards.append({})
            sizes.append(0)
        shards[-1][name] = None if DEVICE == "meta" else tensor.contiguous().cpu()
        sizes[-1] += size
        total += size
    if DEVICE == "meta":
        return total
    if len(shards) == 1:
        save_file(shards[0], str(directory / "model.safetensors"), metadata={"format": "pt"})
        return total
    save_file(shards[-1], str(directory / f"shard-{len(shards)}"), metadata={"format": "pt"})
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        (directory / f"shard-{i}").rename(directory / name)
        weight_map.update(dict.fromkeys(shard, name))
    write_json(directory / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})
    return total


def pick_device(wanted: str, shape: dict) -> str:
    """The GPU when there is one (random bf16 is written there in seconds), with room for the largest tensors
    the writer holds at once; else the CPU. The bytes are the same on either."""
    if wanted == "cpu" or (wanted == "auto" and not torch.cuda.is_available()):
        return "cpu"
    if not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no GPU here; give --device cpu or auto")
    need = 4 * (shape["vocab"] or 1) * shape["hidden"] + 24 * shape["inter"] * shape["hidden"]
    free = torch.cuda.mem_get_info()[0]
    if free < need:
        sys.exit(f"the GPU has {free / 2 ** 30:.1f} GiB free; writing this shape there needs about "
                 f"{need / 2 ** 30:.1f} GiB: free it, or give --device cpu")
    return "cuda"


def main(spec: dict) -> dict:
    global DEVICE
    out = Path(spec["out"])
    target_dir, draft_dir = out / "target", out / "draft"
    target_dir.mkdir(parents=True)
    draft_dir.mkdir(parents=True)
    numerics = spec.get("kind") == "numerics"
    shape = dict(spec["shape"])
    SALT[0] = spec["seed"] * 1_000_003
    DEVICE = "meta" if spec.get("sizes_only") else pick_device(spec.get("device", "auto"), shape)
    torch.set_default_device(DEVICE)  # every zero, one and eye below is made there too
    context = spec["context"]
    tok = tokenizer(spec["vocab"], context, target_dir)
    words = tok.get_vocab_size()
    vocab = shape["vocab"] = shape["vocab"] or words  # a real shape's vocab is larger: the rest is never sampled
    bos, eos, pad = (tok.token_to_id(t) for t in (BOS, EOS, PAD))
    greedy = tok.token_to_id("Ġthe")  # byte-level BPE spells " the" so: a visible, ordinary token
    common = {"hidden_size": shape["hidden"], "intermediate_size": shape["inter"],
              "num_attention_heads": shape["heads"], "num_key_value_heads": shape["kv_heads"],
              "head_dim": shape["head_dim"], "max_position_embeddings": context, "rms_norm_eps": 1e-5,
              "rope_theta": 1e8 if numerics else shape.get("rope_theta", 10000.0), "hidden_act": "silu",
              "vocab_size": vocab, "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16", "attention_bias": False}
    write_json(target_dir / "config.json", {**common, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                            "num_hidden_layers": shape["layers"]})
    write_json(target_dir / "generation_config.json", {"bos_token_id": bos, "eos_token_id": eos, "do_sample": False})
    realized = {}
    if numerics:
        weights, direction = numerics_target(shape, vocab, spec["rule"])
        tensors = iter(weights.items())
        proposal = spec["rule"]["ids"][0]  # the lowest rank: accepted where the rule comes back to it
    else:
        # the specials end requests early or mean nothing; ids past the tokenizer's have no text
        never = [bos, eos, pad, *range(words, vocab)]
        tensors, direction, realized = serving_target(shape, vocab, greedy, never, spec.get("accept", 1.0))
        proposal = greedy if spec["draft"] == "agree" else next(t for t in range(words - 1, 0, -1)
                                                                if t not in (greedy, bos, eos, pad))
    size = save_tensors(target_dir, tensors)
    size += draft(draft_dir, common, shape, vocab, direction, proposal)
    info = {"greedy_token": greedy, "greedy_text": tok.decode([greedy]), "draft_proposes": proposal,
            "vocab_size": vocab, "draft_vocab_size": min(shape["draft_vocab"], vocab), "hidden_size": shape["hidden"],
            "heads": shape["heads"], "layers": shape["layers"], "context_length": context, "torch": torch.__version__,
            "bytes": size, "device": DEVICE, **realized}
    if numerics:
        info.pop("greedy_token")
        info["greedy_text"] = "the rule's token (rig/serving/numerics.py)"
        info["reference"] = reference(target_dir, spec["prompts"], spec["expected"])
    return info


def aux_layers(layers: int) -> list:
    """The layer ids the draft reads. SGLang captures the hidden state entering layer id + 1 for each id given, and
    enters [2, L // 2, L - 3] when none is: the ids that capture the same are [1, L // 2 - 1, L - 4]. A tiny model
    takes the first two and L - 2 (ids stop there)."""
    return [1, layers // 2 - 1, layers - 4] if layers >= 6 else [0, 1, layers - 2]


def draft(draft_dir: Path, common: dict, shape: dict, vocab: int, direction: torch.Tensor, proposal: int) -> int:
    """An EAGLE-3 draft that always proposes PROPOSAL: its head's first row follows DIRECTION, which every
    hidden state it is given holds; one layer of the target's width, as real EAGLE-3 drafts are. The bytes."""
    heads, kv, head_dim, hidden, inter = (shape[k] for k in ("heads", "kv_heads", "head_dim", "hidden", "inter"))
    draft_vocab = min(shape["draft_vocab"], vocab)
    hot = [proposal] + [t for t in range(vocab) if t != proposal][:draft_vocab - 1]
    write_json(draft_dir / "config.json", {
        **common, "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
        "draft_vocab_size": draft_vocab,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux_layers(shape["layers"])}})
    draft_head = torch.zeros(draft_vocab, hidden)
    draft_head[0] = direction.to(draft_head.device)
    fc = torch.zeros(hidden, 3 * hidden)
    fc[:, :hidden] = torch.eye(hidden)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[hot] = True
    return save_tensors(draft_dir, iter({
        "fc.weight": fc, "norm.weight": torch.ones(hidden), "lm_head.weight": draft_head,
        "midlayer.self_attn.q_proj.weight": rand(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": rand(kv * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": rand(kv * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": torch.zeros(hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": rand(inter, hidden), "midlayer.mlp.up_proj.weight": rand(inter, hidden),
        "midlayer.mlp.down_proj.weight": torch.zeros(hidden, inter),
        "midlayer.input_layernorm.weight": torch.ones(hidden), "midlayer.hidden_norm.weight": torch.ones(hidden),
        "midlayer.post_attention_layernorm.weight": torch.ones(hidden),
        "d2t": torch.tensor(hot, dtype=torch.int64) - torch.arange(draft_vocab, dtype=torch.int64),
        "t2d": t2d}.items()))


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
