#!/usr/bin/python3
"""hf_parity_phi3.py DEEPWELL — Phi-3 (Phi3ForCausalLM) on Deepwell's CPU engine against an
independent float64 PyTorch reference (plain torch: CI has no transformers).

Phi-3 is the Llama block (RoPE, RMSNorm, GQA, SwiGLU, no biases) with its checkpoints' fused
projections: self_attn.qkv_proj.weight [(H + 2 Hkv) D, C] (q rows, then k, then v) and
mlp.gate_up_proj.weight [2F, C] (gate rows first), and sliding_window on every layer (default none).
Its RoPE as transformers' Phi3 computes it: rope_scaling type longrope (Phi-3-mini-128k, the 3.5
models: 1 / (ext_factors theta^(2i/R)), ext_factors the long list when the run is longer than
original_max_position_embeddings, else the short one; cos and sin times the attention factor) and
partial_rotary_factor (Phi-4-mini: the first R = int(head_dim x factor) dims of each head rotate, the
rest pass through). Cases 0 and 1 have longrope (0 with a partial width too), 2 a partial width, the
rest either at random; T and the original positions are drawn so that runs fall on both sides.
For random tiny configs and random weights in that layout:
  - `deepwell eval --dump`: the loss, the logits and the gradients of the fused tensors (under
    their fused names) within 1e-5 of the reference (relative to each tensor's largest value);
  - `deepwell export --format hf --dtype f32` writes qkv_proj and gate_up_proj back, the same
    values, and `deepwell eval` of the export gives the same loss bit for bit;
  - `deepwell train --model DIR` starts from DIR's weights (its first logged loss is eval's), and
    cached sampling gives the recompute's tokens past the original positions (the cache recomputed
    where longrope's table changes);
  - refused by name: longrope lists of the wrong length or with an entry <= 0, partial_rotary_factor
    above 1 or leaving an odd rotary width, a fused tensor of the wrong shape, a checkpoint with split
    q_proj/k_proj/v_proj.
"""
import itertools
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import family_check  # noqa: E402  (eval, export, fine-tuning and refusal checks)
import parity  # noqa: E402  (the Llama reference, parameter shapes and weights)


def random_config(rng, longrope=False, partial=False):
    Hkv = rng.randint(1, 2)
    c = dict(model_type="phi3", architectures=["Phi3ForCausalLM"], vocab_size=rng.randint(40, 300),
             hidden_size=rng.randint(12, 64), num_hidden_layers=rng.randint(1, 3),
             num_attention_heads=Hkv * rng.randint(1, 3), num_key_value_heads=Hkv, head_dim=2 * rng.randint(2, 8),
             intermediate_size=rng.randint(8, 96), max_position_embeddings=64, original_max_position_embeddings=64,
             rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None, hidden_act="silu",
             sliding_window=rng.choice([None, rng.randint(1, 8), rng.randint(1, 8)]),
             tie_word_embeddings=rng.random() < 0.3, resid_pdrop=0.0, attention_dropout=0.0)
    c["pad_token_id"] = rng.randrange(c["vocab_size"])  # padding_idx (parity.embed); family_check puts it in the data
    D = c["head_dim"]
    if partial:  # an even rotary width of 2 .. D - 2, as a factor transformers truncates back to it
        R = 2 * rng.randint(1, D // 2 - 1)
        f = R / D
        while int(D * f) < R:
            f = math.nextafter(f, 2.0)
        c["partial_rotary_factor"] = f
    if longrope:  # runs of T in 2..40 (family_check) on both sides of the original positions
        n = rotary_dim(c) // 2
        c["original_max_position_embeddings"] = rng.randint(4, 36)
        c["rope_scaling"] = {"type": rng.choice(["longrope", "su"]),
                             "short_factor": [round(rng.uniform(0.8, 2.0), 6) for _ in range(n)],
                             "long_factor": [round(rng.uniform(1.0, 40.0), 6) for _ in range(n)]}
        if rng.random() < 0.5:
            c["rope_scaling"]["attention_factor"] = round(rng.uniform(0.8, 1.4), 6)
    return c


def rotary_dim(c):
    """transformers' int(head_dim x partial_rotary_factor)"""
    return int(c["head_dim"] * c.get("partial_rotary_factor", 1.0))


def phi3_rope(x, c):
    """x (B,H,T,D): the first R dims rotated (rotate-half over R) by position t times 1 / (ext theta^(2i/R)),
    ext 1 by default and longrope's long list when T exceeds original_max_position_embeddings, else its
    short list; cos and sin times the attention factor (given, else sqrt(1 + ln s / ln original) with s the
    positions' ratio, when s > 1); dims R.. passed through."""
    D, T, R = x.shape[-1], x.shape[-2], rotary_dim(c)
    r = c.get("rope_scaling") or {}
    inv = 1.0 / c["rope_theta"] ** (torch.arange(0, R, 2, dtype=torch.float64) / R)
    att = 1.0
    if r.get("type") in ("longrope", "su"):
        original = c["original_max_position_embeddings"]
        ext = r["long_factor"] if T > original else r["short_factor"]
        inv = inv / torch.tensor(ext, dtype=torch.float64)
        scale = c["max_position_embeddings"] / original
        att = r.get("attention_factor", 1.0 if scale <= 1 else math.sqrt(1 + math.log(scale) / math.log(original)))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang, ang], -1).cos() * att, torch.cat([ang, ang], -1).sin() * att
    xr, xp = x[..., :R], x[..., R:]
    x1, x2 = xr[..., :R // 2], xr[..., R // 2:]
    return torch.cat([xr * cos + torch.cat([-x2, x1], -1) * sin, xp], -1)


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
    """Phi3ForCausalLM: the Llama forward on the split weights, sliding_window on every layer, Phi-3's RoPE
    (phi3_rope in place of parity's for the call)."""
    as_llama = dict(c, model_type="mistral", sliding_window=c.get("sliding_window"))  # its window rule
    llama_rope, parity.rope = parity.rope, phi3_rope
    try:
        return parity.llama_forward(as_llama, split(c, w), tok)
    finally:
        parity.rope = llama_rope


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
        "sliding_window", "tie_word_embeddings", "original_max_position_embeddings", "pad_token_id")
ROPE_KEYS = ("partial_rotary_factor", "rope_scaling")  # kept by export as written here
CASES = itertools.count()


def case(rng, gen):
    i = next(CASES)
    c = random_config(rng, longrope=i < 2 or (i > 2 and rng.random() < 0.5), partial=i in (0, 2) or
                      (i > 2 and rng.random() < 0.5))
    r = c["rope_scaling"] or {}
    desc = ", ".join(f"{k}={c[k]}" for k in KEYS) + (f", rotary_dim={rotary_dim(c)}" if "partial_rotary_factor" in c
                                                     else "") + (f", rope {r['type']}" if r else "")
    if r.get("type") == "su":  # written back under its current name
        return c, random_weights(c, gen), phi3_forward, desc, ("model_type",) + KEYS + ROPE_KEYS[:1]
    return c, random_weights(c, gen), phi3_forward, desc, ("model_type",) + KEYS + ROPE_KEYS


def refusals(rng, gen):
    c = dict(random_config(rng), sliding_window=None)
    w = random_weights(c, gen)
    D = c["head_dim"]
    longer = {"type": "longrope", "short_factor": [1.0] * (D // 2 + 1), "long_factor": [2.0] * (D // 2 + 1)}
    zero = {"type": "longrope", "short_factor": [1.0] * (D // 2), "long_factor": [2.0, 0.0] + [2.0] * (D // 2 - 2)}
    short = dict(w)
    short["model.layers.0.self_attn.qkv_proj.weight"] = w["model.layers.0.self_attn.qkv_proj.weight"][1:]
    return [("longrope lists of the wrong length", dict(c, rope_scaling=longer), w,
             f"'short_factor' must be a list of {D // 2} numbers"),
            ("a longrope factor of 0", dict(c, rope_scaling=zero), w, "'long_factor'[1] must be a positive"),
            ("partial_rotary_factor 1.5", dict(c, partial_rotary_factor=1.5), w, "partial_rotary_factor 1.5"),
            ("an odd rotary width", dict(c, partial_rotary_factor=1.5 / D), w, "= 1 rotary dims"),
            ("a short qkv_proj", c, short, "tensor 'model.layers.0.self_attn.qkv_proj.weight' has shape"),
            ("split q/k/v projections", c, split(c, w), "missing tensor 'model.layers.0.self_attn.qkv_proj.weight'")]


if __name__ == "__main__":
    family_check.main("phi3", case, refusals)
