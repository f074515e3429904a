#!/usr/bin/python3
"""hf_parity_phi3.py DEEPWELL — Phi-3 (Phi3ForCausalLM) on Deepwell's CPU engine against an
independent float64 PyTorch reference (plain torch: CI has no transformers).

Phi-3 is the Llama block (RoPE, RMSNorm, GQA, SwiGLU, no biases) with its checkpoints' fused
projections: self_attn.qkv_proj.weight [(H + 2 Hkv) D, C] (q rows, then k, then v) and
mlp.gate_up_proj.weight [2F, C] (gate rows first), and sliding_window on every layer (default none).
For random tiny configs and random weights in that layout:
  - `deepwell eval --dump`: the loss, the logits and the gradients of the fused tensors (under
    their fused names) within 1e-5 of the reference (relative to each tensor's largest value);
  - `deepwell export --format hf --dtype f32` writes qkv_proj and gate_up_proj back, the same
    values, and `deepwell eval` of the export gives the same loss bit for bit;
  - `deepwell train --model DIR` starts from DIR's weights (its first logged loss is eval's);
  - refused by name: rope type longrope, partial_rotary_factor below 1, a fused tensor of the wrong
    shape, a checkpoint with split q_proj/k_proj/v_proj.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import family_check  # noqa: E402  (eval, export, fine-tuning and refusal checks)
import parity  # noqa: E402  (the Llama reference, parameter shapes and weights)


def random_config(rng):
    Hkv = rng.randint(1, 2)
    return dict(model_type="phi3", architectures=["Phi3ForCausalLM"], vocab_size=rng.randint(40, 300),
                hidden_size=rng.randint(12, 64), num_hidden_layers=rng.randint(1, 3),
                num_attention_heads=Hkv * rng.randint(1, 3), num_key_value_heads=Hkv, head_dim=2 * rng.randint(2, 8),
                intermediate_size=rng.randint(8, 96), max_position_embeddings=64, original_max_position_embeddings=64,
                rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None, hidden_act="silu",
                sliding_window=rng.choice([None, rng.randint(1, 8), rng.randint(1, 8)]),
                tie_word_embeddings=rng.random() < 0.3, resid_pdrop=0.0, attention_dropout=0.0)


def split(c, w):
    """The Llama names of the fused weights (views, so gradients flow back to the fused tensors)."""
    D, F = c["head_dim"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
    out = {}
    for name, t in w.items():
        if name.endswith("self_attn.qkv_proj.weight"):
            p = name[:-len("qkv_proj.weight")]
            out[p + "q_proj.weight"], out[p + "k_proj.weight"], out[p + "v_proj.weight"] = t[:q], t[q:q + kv], t[q + kv:]
        elif name.endswith("mlp.gate_up_proj.weight"):
            p = name[:-len("gate_up_proj.weight")]
            out[p + "gate_proj.weight"], out[p + "up_proj.weight"] = t[:F], t[F:]
        else:
            out[name] = t
    return out


def phi3_forward(c, w, tok):
    """Phi3ForCausalLM: the Llama forward on the split weights, sliding_window on every layer."""
    as_llama = dict(c, model_type="mistral", sliding_window=c.get("sliding_window"))  # its window rule
    return parity.llama_forward(as_llama, split(c, w), tok)


def random_weights(c, gen):
    """The Llama tensors of the config, q/k/v and gate/up concatenated into Phi-3's fused ones."""
    w = parity.random_weights(dict(c, model_type="llama", attention_bias=False, mlp_bias=False), gen)
    out = {}
    for name, t in w.items():
        for part, fused, first in (("q_proj", "qkv_proj", True), ("k_proj", None, False), ("v_proj", None, False),
                                   ("gate_proj", "gate_up_proj", True), ("up_proj", None, False)):
            if name.endswith(f".{part}.weight"):
                if first:
                    p = name[:-len(f"{part}.weight")]
                    parts = ("q_proj", "k_proj", "v_proj") if fused == "qkv_proj" else ("gate_proj", "up_proj")
                    out[p + f"{fused}.weight"] = torch.cat([w[p + f"{q}.weight"] for q in parts])
                break
        else:
            out[name] = t
    return out


KEYS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
        "sliding_window", "tie_word_embeddings")


def case(rng, gen):
    c = random_config(rng)
    return c, random_weights(c, gen), phi3_forward, ", ".join(f"{k}={c[k]}" for k in KEYS), ("model_type",) + KEYS


def refusals(rng, gen):
    c = dict(random_config(rng), sliding_window=None)
    w = random_weights(c, gen)
    D = c["head_dim"]
    longrope = {"type": "longrope", "short_factor": [1.0] * (D // 2), "long_factor": [2.0] * (D // 2)}
    short = dict(w)
    short["model.layers.0.self_attn.qkv_proj.weight"] = w["model.layers.0.self_attn.qkv_proj.weight"][1:]
    return [("longrope", dict(c, rope_scaling=longrope), w, "rope type 'longrope' is not supported"),
            ("partial_rotary_factor 0.5", dict(c, partial_rotary_factor=0.5), w, "partial_rotary_factor 0.5"),
            ("a short qkv_proj", c, short, "tensor 'model.layers.0.self_attn.qkv_proj.weight' has shape"),
            ("split q/k/v projections", c, split(c, w), "missing tensor 'model.layers.0.self_attn.qkv_proj.weight'")]


if __name__ == "__main__":
    family_check.main("phi3", case, refusals)
