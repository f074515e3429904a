#!/usr/bin/python3
"""hf_parity_gemma2.py DEEPWELL — Gemma 2 (Gemma2ForCausalLM) on Deepwell's CPU engine against an
independent float64 PyTorch reference written here from transformers' model definition (plain
torch: CI has no transformers).

For random tiny configs (GQA, explicit head_dim, query_pre_attn_scalar, attention and final logit
soft-capping or null, a sliding window on the even layers or as layer_types says, tied or untied
embeddings, attention_bias, a pad_token_id: padding_idx, pads in the data) and random weights in Hugging Face names:
  - `deepwell eval --dump`: the loss and every parameter's gradient within 1e-5 of the reference
    (relative to the tensor's largest value), the logits within 1e-5 too;
  - `deepwell export --format hf --dtype f32` writes the model back (config.json's model_type and
    Gemma keys, the same tensor names and shapes), and `deepwell eval` of the export gives the
    same loss bit for bit;
  - `deepwell train --model DIR` starts from DIR's weights: its first logged loss is eval's;
  - bad config values are refused naming config.json and the key.
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import family_check  # noqa: E402  (eval, export, fine-tuning and refusal checks)
import parity  # noqa: E402  (RoPE, the Llama parameter shapes and weights)


def windowed(c, l):
    """transformers: layer_types when given, else the even layers (is_sliding = not l % 2)."""
    if c.get("sliding_window") is None:
        return None
    if "layer_types" in c:
        return c["sliding_window"] if c["layer_types"][l] == "sliding_attention" else None
    return c["sliding_window"] if l % 2 == 0 else None


def gemma2_forward(c, w, tok):
    """Gemma2ForCausalLM's forward in float64: embeddings times sqrt(hidden); per layer
    x += post_attention_norm(attn(input_norm(x))), x += post_ff_norm(mlp(pre_ff_norm(x))), the norms
    x rsqrt(mean x^2 + eps) (1 + w); scores q k^T qpas^-1/2, soft-capped, masked, softmax; GeGLU
    with tanh GELU; final norm, head, soft-capped logits."""
    B, T = tok.shape
    H, Hkv, D, L = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["num_hidden_layers"]
    bias = c.get("attention_bias", False)

    def rms(x, p):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c["rms_norm_eps"]) * (1 + w[p + ".weight"])

    def lin(x, p, b=False):
        y = x @ w[p + ".weight"].T
        return y + w[p + ".bias"] if b else y

    x = parity.embed(c, w["model.embed_tokens.weight"], tok) * math.sqrt(c["hidden_size"])
    for l in range(L):
        p = f"model.layers.{l}."
        h = rms(x, p + "input_layernorm")
        q = lin(h, p + "self_attn.q_proj", bias).view(B, T, H, D).transpose(1, 2)
        k = lin(h, p + "self_attn.k_proj", bias).view(B, T, Hkv, D).transpose(1, 2)
        v = lin(h, p + "self_attn.v_proj", bias).view(B, T, Hkv, D).transpose(1, 2)
        q, k = parity.rope(q, c), parity.rope(k, c)
        k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
        s = q @ k.transpose(-1, -2) * c["query_pre_attn_scalar"] ** -0.5
        if c.get("attn_logit_softcapping"):
            s = torch.tanh(s / c["attn_logit_softcapping"]) * c["attn_logit_softcapping"]
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        W = windowed(c, l)
        if W:
            mask &= ~torch.ones(T, T, dtype=torch.bool).tril(-W)  # keys t-W+1..t
        y = torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v
        h = lin(y.transpose(1, 2).reshape(B, T, H * D), p + "self_attn.o_proj", bias)
        x = x + rms(h, p + "post_attention_layernorm")
        h = rms(x, p + "pre_feedforward_layernorm")
        h = lin(parity.gelu_tanh(lin(h, p + "mlp.gate_proj")) * lin(h, p + "mlp.up_proj"), p + "mlp.down_proj")
        x = x + rms(h, p + "post_feedforward_layernorm")
    x = rms(x, "model.norm")
    head = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings", True) else w["lm_head.weight"]
    logits = x @ head.T
    if c.get("final_logit_softcapping"):
        logits = torch.tanh(logits / c["final_logit_softcapping"]) * c["final_logit_softcapping"]
    return logits


def random_config(rng):
    Hkv = rng.randint(1, 2)
    H, L, D = Hkv * rng.randint(1, 3), rng.randint(1, 4), 2 * rng.randint(2, 8)
    c = dict(model_type="gemma2", architectures=["Gemma2ForCausalLM"], vocab_size=rng.randint(40, 300),
             hidden_size=rng.randint(12, 64), num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=Hkv,
             head_dim=D, intermediate_size=rng.randint(8, 96), max_position_embeddings=64, rms_norm_eps=1e-6,
             rope_theta=rng.choice([10000.0, 500000.0]), hidden_activation="gelu_pytorch_tanh",
             hidden_act="gelu_pytorch_tanh", query_pre_attn_scalar=rng.choice([D, rng.randint(4, 64)]),
             # caps small enough that tanh bends the tiny models' scores and logits
             attn_logit_softcapping=rng.choice([None, 0.5, 1.0, 3.0]),
             final_logit_softcapping=rng.choice([None, 0.7, 2.0, 5.0]),
             sliding_window=rng.choice([None, rng.randint(1, 8), rng.randint(1, 8)]),
             tie_word_embeddings=rng.random() < 0.7, attention_bias=rng.random() < 0.3)
    c["pad_token_id"] = rng.randrange(c["vocab_size"])  # padding_idx (parity.embed); family_check puts it in the data
    if c["sliding_window"] and rng.random() < 0.4:  # transformers 5's spelling, here not the even layers
        c["layer_types"] = [rng.choice(["full_attention", "sliding_attention"]) for _ in range(L)]
    return c


def random_weights(c, gen):
    """The Llama tensors of the config (attention_bias on q, k, v and o) plus the two feed-forward
    norms per layer; every norm's w around 0 (applied as 1 + w), exactly representable in FP32."""
    w = parity.random_weights(dict(c, model_type="llama", mlp_bias=False), gen)
    norms = [k for k in w if k.endswith("norm.weight")] + [f"model.layers.{l}.{n}.weight"
                                                             for l in range(c["num_hidden_layers"])
                                                             for n in ("pre_feedforward_layernorm",
                                                                       "post_feedforward_layernorm")]
    for k in norms:
        w[k] = (0.2 * torch.randn(c["hidden_size"], generator=gen, dtype=torch.float64)).float().double()
    return w


KEYS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "query_pre_attn_scalar",
        "attn_logit_softcapping", "final_logit_softcapping", "sliding_window", "tie_word_embeddings", "attention_bias",
        "pad_token_id")


def case(rng, gen):
    c = random_config(rng)
    desc = ", ".join(f"{k}={c[k]}" for k in KEYS) + (f", layer_types={c['layer_types']}" if "layer_types" in c else "")
    kept = ("model_type", "num_attention_heads", "num_key_value_heads", "head_dim", "query_pre_attn_scalar",
            "attn_logit_softcapping", "final_logit_softcapping", "tie_word_embeddings", "attention_bias",
            "pad_token_id")
    return c, random_weights(c, gen), gemma2_forward, desc, kept


def refusals(rng, gen):
    """Bad values, each refused naming config.json and the key."""
    base = dict(random_config(rng), sliding_window=4)
    w = random_weights(base, gen)
    bad = [("attn_logit_softcapping", "fifty"), ("final_logit_softcapping", -3.0), ("query_pre_attn_scalar", 0),
           ("hidden_activation", "relu"), ("sliding_window", -4),
           ("layer_types", ["full_attention"] * (base["num_hidden_layers"] + 1))]
    return [(f"{k} = {v!r}", dict(base, **{k: v}), w, f"config.json: field '{k}'") for k, v in bad]


if __name__ == "__main__":
    family_check.main("gemma2", case, refusals)
