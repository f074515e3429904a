#!/usr/bin/python3
"""parity.py DEEPWELL — whole-model parity of Deepwell's CPU engine with PyTorch.

For random tiny GPT-2, Llama (GQA, optional attention/MLP biases; RoPE of the types default,
linear, llama3 and yarn under rope_scaling or rope_parameters), Qwen2 (q/k/v biases),
Mixtral and OLMoE (softmax top-k router, renormalised or not, SwiGLU experts, OLMoE's q/k norms)
and Qwen2-MoE / Qwen3-MoE (dense layers by decoder_sparse_step and mlp_only_layers, Qwen2-MoE's
sigmoid-gated shared expert, Qwen3-MoE's per-head q/k norms) configs, the experts' weights in
transformers 5's fused or the per-expert layout: writes config.json and random weights in Hugging Face names and layouts (GPT-2 Conv1D
weights as in x out), a token shard, runs `deepwell eval --dump`, and compares logits, loss and
every parameter's gradient with a float64 PyTorch reference written here from the architectures'
definitions (plain torch, no transformers). Every Llama-like config has a pad_token_id and about one
token in six of its data is that pad: its embedding row gets no gradient from the lookup, as
transformers' nn.Embedding(padding_idx) (a tied head's part stays); GPT-2's sometimes-set pad_token_id
is read by nothing. Per-tensor abs+rel tolerances; any mismatch fails.
Also checks that missing, unexpected and mis-shaped weight tensors are refused by name.
"""
import json
import math
import os
import random
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

torch.set_grad_enabled(True)

# ---- safetensors (the format is small enough to write here) --------------------------------


def st_write(path, tensors):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        b = np.ascontiguousarray(t.detach().to(torch.float32).numpy()).tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def st_read(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        assert v["dtype"] == "F32", (name, v["dtype"])
        a, b = v["data_offsets"]
        arr = np.frombuffer(data[8 + n + a:8 + n + b], dtype=np.float32).reshape(v["shape"])
        out[name] = torch.from_numpy(arr.copy()).double()
    return out


# ---- reference models (float64) -------------------------------------------------------------


def gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def causal_attention(q, k, v, window=None):
    """q (B,H,T,D), k, v (B,H,T,D) -> (B,H,T,D); with a window W query t sees keys t-W+1..t"""
    T, D = q.shape[2], q.shape[3]
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    if window:
        mask &= ~torch.ones(T, T, dtype=torch.bool).tril(-window)  # drop keys j <= t - W
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def embed(c, table, tok):
    """The token embedding as transformers builds it: nn.Embedding(vocab, hidden, padding_idx=
    config.pad_token_id) in the Llama-like families, so row pad_token_id gets no gradient from the lookup
    (a tied head's part stays); GPT-2's wte has no padding_idx."""
    pad = None if c["model_type"] == "gpt2" else c.get("pad_token_id")
    return torch.nn.functional.embedding(tok, table, padding_idx=pad)


def add_pads(c, stream, rng):
    """About one token in six replaced by pad_token_id (when the config has one), so the padding row shows."""
    pad = c.get("pad_token_id")
    return stream if pad is None else [pad if rng.random() < 0.17 else t for t in stream]


def gpt2_forward(c, w, tok):
    B, T = tok.shape
    C, H, L = c["n_embd"], c["n_head"], c["n_layer"]
    D = C // H
    ln = lambda x, p: torch.nn.functional.layer_norm(x, (C,), w[p + ".weight"], w[p + ".bias"],
                                                    c["layer_norm_epsilon"])
    x = embed(c, w["transformer.wte.weight"], tok) + w["transformer.wpe.weight"][:T]
    for l in range(L):
        p = f"transformer.h.{l}."
        h = ln(x, p + "ln_1")
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]  # Conv1D: in x out
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = ln(x, p + "ln_2")
        h = gelu_tanh(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = ln(x, "transformer.ln_f")
    head = w["transformer.wte.weight"] if c.get("tie_word_embeddings", True) else w["lm_head.weight"]
    return x @ head.T


def rope_inv_freq(c, D):
    """The inverse frequencies (D/2) of c's rope type, transformers' formulas over whole tables:
    default, linear, llama3 and yarn (then also its attention factor), rope_parameters over
    rope_scaling."""
    r = c.get("rope_parameters") or c.get("rope_scaling") or {}
    kind = r.get("rope_type", r.get("type", "default"))
    theta = r.get("rope_theta", c["rope_theta"])
    inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / r["factor"], 1.0
    if kind == "llama3":
        f, lo, hi, old = r["factor"], r["low_freq_factor"], r["high_freq_factor"], r["original_max_position_embeddings"]
        wl = 2 * math.pi / inv
        lla = torch.where(wl > old / lo, inv / f, inv)
        smooth = (old / wl - lo) / (hi - lo)
        medium = ~(wl < old / hi) * ~(wl > old / lo)
        return torch.where(medium, (1 - smooth) * lla / f + smooth * lla, lla), 1.0
    assert kind == "yarn", kind
    old = r.get("original_max_position_embeddings", c["max_position_embeddings"])
    f = r.get("factor") or c["max_position_embeddings"] / old
    att = r.get("attention_factor")
    if att is None:
        att = 1.0 if f <= 1 else 0.1 * math.log(f) + 1.0

    def corr(rot):
        return D * math.log(old / (rot * 2 * math.pi)) / (2 * math.log(theta))
    lo, hi = corr(r.get("beta_fast") or 32), corr(r.get("beta_slow") or 1)
    if r.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, D - 1)
    hi = hi + 0.001 if lo == hi else hi
    ramp = ((torch.arange(D // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
    return inv / f * ramp + inv * (1 - ramp), att


def rope(x, c):
    """x (B,H,T,D), rotate-half convention (HF Llama), c's rope type"""
    D, T = x.shape[-1], x.shape[-2]
    inv, att = rope_inv_freq(c, D)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return (x * emb.cos() + torch.cat([-x2, x1], dim=-1) * emb.sin()) * att


QWEN_MOE = ("qwen2_moe", "qwen3_moe")


def moe_layer(c, l):
    """Whether layer l is a mixture of experts: every layer of Mixtral and OLMoE; for the Qwen
    families, when not in mlp_only_layers and (l + 1) is a multiple of decoder_sparse_step."""
    if c["model_type"] not in QWEN_MOE:
        return c["model_type"] in ("mixtral", "olmoe")
    return l not in c.get("mlp_only_layers", []) and c["num_experts"] > 0 and \
        (l + 1) % c.get("decoder_sparse_step", 1) == 0


def expert_weights(c, w, p, e):
    """Expert e's gate, up (F,C) and down (C,F) weights of layer prefix p, from either layout."""
    F = c["moe_intermediate_size"] if c["model_type"] in QWEN_MOE else c["intermediate_size"]
    if p + "mlp.experts.gate_up_proj" in w:  # transformers 5: fused, the gate rows first
        gu = w[p + "mlp.experts.gate_up_proj"][e]
        return gu[:F], gu[F:], w[p + "mlp.experts.down_proj"][e]
    if c["model_type"] != "mixtral":
        q = p + f"mlp.experts.{e}."
        return w[q + "gate_proj.weight"], w[q + "up_proj.weight"], w[q + "down_proj.weight"]
    q = p + f"block_sparse_moe.experts.{e}."
    return w[q + "w1.weight"], w[q + "w3.weight"], w[q + "w2.weight"]


def moe_block(c, w, p, h, router_logits):
    """The sparse MoE block: softmax router, top-k (Mixtral: renormalised; the others when
    norm_topk_prob), SwiGLU experts; Qwen2-MoE adds its shared expert times sigmoid(shared_expert_gate).
    Appends the router logits (B*T, E) to router_logits."""
    B, T, C = h.shape
    x = h.reshape(B * T, C)
    router = w[p + "mlp.gate.weight"] if p + "mlp.gate.weight" in w else w[p + "block_sparse_moe.gate.weight"]
    router_logits.append(x @ router.T)
    probs = torch.softmax(router_logits[-1], dim=-1)
    top, idx = torch.topk(probs, c["num_experts_per_tok"], dim=-1)
    if c["model_type"] == "mixtral" or c.get("norm_topk_prob", False):
        top = top / top.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for e in range(c.get("num_local_experts", c.get("num_experts"))):
        rows, slot = torch.where(idx == e)
        if rows.numel() == 0:
            continue
        g, u, d = expert_weights(c, w, p, e)
        xe = x[rows]
        y = (torch.nn.functional.silu(xe @ g.T) * (xe @ u.T)) @ d.T
        out = out.index_add(0, rows, y * top[rows, slot][:, None])
    if c["model_type"] == "qwen2_moe":
        q = p + "mlp.shared_expert."
        y = (torch.nn.functional.silu(x @ w[q + "gate_proj.weight"].T) * (x @ w[q + "up_proj.weight"].T)) \
            @ w[q + "down_proj.weight"].T
        out = out + torch.sigmoid(x @ w[p + "mlp.shared_expert_gate.weight"].T) * y
    return out.view(B, T, C)


def load_balancing(c, router_logits):
    """The load-balancing loss over all MoE layers' rows at once: E x sum over (k, e) of the fraction
    of rows whose k-th choice is e times expert e's mean probability."""
    E = c.get("num_local_experts", c.get("num_experts"))
    p = torch.softmax(torch.cat(router_logits, 0), dim=-1)
    chosen = torch.nn.functional.one_hot(torch.topk(p, c["num_experts_per_tok"], dim=-1)[1], E).to(p.dtype)
    return E * (chosen.mean(0) * p.mean(0)[None]).sum()


def layer_window(c, l):
    """The sliding window of layer l as transformers reads the config (None: full attention)."""
    t = c["model_type"]
    if t in ("mistral", "mixtral"):
        return c.get("sliding_window", 4096 if t == "mistral" else None)
    if t in ("qwen2", "qwen3") + QWEN_MOE and c.get("use_sliding_window", False):
        w = c.get("sliding_window", 4096)
        if "layer_types" in c:
            return w if c["layer_types"][l] == "sliding_attention" else None
        return w if l >= c.get("max_window_layers", 28) else None
    return None


def llama_forward(c, w, tok, router_logits=None):
    B, T = tok.shape
    router_logits = [] if router_logits is None else router_logits
    H, Hkv, D, L = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["num_hidden_layers"]
    qwen = c["model_type"] in ("qwen2", "qwen2_moe")  # q, k, v biased, o never
    qkv_bias = c.get("qkv_bias", True) if qwen else c.get("attention_bias", False)
    o_bias = (not qwen) and c.get("attention_bias", False)
    mlp_bias = c.get("mlp_bias", False)

    def rms(x, p):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c["rms_norm_eps"]) * w[p + ".weight"]

    def lin(x, p, bias):
        y = x @ w[p + ".weight"].T
        return y + w[p + ".bias"] if bias else y

    x = embed(c, w["model.embed_tokens.weight"], tok)
    for l in range(L):
        p = f"model.layers.{l}."
        h = rms(x, p + "input_layernorm")
        q, k = lin(h, p + "self_attn.q_proj", qkv_bias), lin(h, p + "self_attn.k_proj", qkv_bias)
        if c["model_type"] == "olmoe":  # RMSNorm over the whole projections, before RoPE
            q, k = rms(q, p + "self_attn.q_norm"), rms(k, p + "self_attn.k_norm")
        q, k = q.view(B, T, H, D), k.view(B, T, Hkv, D)
        if c["model_type"] in ("qwen3", "qwen3_moe"):  # RMSNorm over each head's D channels, before RoPE
            q, k = rms(q, p + "self_attn.q_norm"), rms(k, p + "self_attn.k_norm")
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = lin(h, p + "self_attn.v_proj", qkv_bias).view(B, T, Hkv, D).transpose(1, 2)
        q, k = rope(q, c), rope(k, c)
        k = k.repeat_interleave(H // Hkv, dim=1)  # HF repeat_kv: query head h uses kv head h // rep
        v = v.repeat_interleave(H // Hkv, dim=1)
        y = causal_attention(q, k, v, layer_window(c, l)).transpose(1, 2).reshape(B, T, H * D)
        x = x + lin(y, p + "self_attn.o_proj", o_bias)
        h = rms(x, p + "post_attention_layernorm")
        if moe_layer(c, l):
            x = x + moe_block(c, w, p, h, router_logits)
            continue
        g = lin(h, p + "mlp.gate_proj", mlp_bias)
        x = x + lin(torch.nn.functional.silu(g) * lin(h, p + "mlp.up_proj", mlp_bias), p + "mlp.down_proj", mlp_bias)
    x = rms(x, "model.norm")
    head = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings", False) else w["lm_head.weight"]
    return x @ head.T


# ---- random configs and weights ---------------------------------------------------------------


def random_config(family, rng, layout=None, rope_kind=None):
    V, L = rng.randint(40, 300), rng.randint(1, 3)
    if family == "gpt2":
        H = rng.randint(1, 4)
        return dict(model_type="gpt2", vocab_size=V, n_embd=H * 2 * rng.randint(2, 8), n_layer=L,
                    n_head=H, n_inner=rng.randint(8, 96), n_positions=64, layer_norm_epsilon=1e-5,
                    activation_function="gelu_new", tie_word_embeddings=rng.random() < 0.7,
                    pad_token_id=rng.choice([None, rng.randrange(V)]))  # read by no padding_idx
    Hkv = rng.randint(1, 2)
    H = Hkv * rng.randint(2, 3)  # GQA: more query than KV heads
    c = dict(model_type=family, vocab_size=V, hidden_size=rng.randint(12, 64), num_hidden_layers=L,
             num_attention_heads=H, num_key_value_heads=Hkv, head_dim=2 * rng.randint(2, 8),
             intermediate_size=rng.randint(8, 96), max_position_embeddings=64,
             rms_norm_eps=1e-6, rope_theta=rng.choice([10000.0, 500000.0]), hidden_act="silu",
             tie_word_embeddings=rng.random() < 0.5, pad_token_id=rng.randrange(V))
    if family == "llama":
        c["attention_bias"] = rng.random() < 0.5
        c["mlp_bias"] = rng.random() < 0.5
    if family == "qwen3":
        c["attention_bias"] = rng.random() < 0.3
    if family in ("mistral", "qwen2", "qwen3"):  # a sliding window, mostly shorter than the sequence
        c.update(random_window(family, rng, L))
    if rope_kind or (family in ("llama", "qwen2") and rng.random() < 0.6):  # a scaled RoPE, either spelling
        c.update(random_rope(rng, c["rope_theta"], rope_kind))
    if family == "mixtral":
        c["num_local_experts"] = E = rng.randint(2, 6)
        c["num_experts_per_tok"] = rng.randint(1, E)
        c["layout"] = rng.choice(["fused", "per_expert"])  # of the weights file (not a config key)
    if family == "olmoe":
        c["num_experts"] = E = rng.randint(2, 8)
        c["num_experts_per_tok"] = rng.randint(1, E)
        c["norm_topk_prob"] = rng.random() < 0.5
        c["rms_norm_eps"] = 1e-5
        c["layout"] = rng.choice(["fused", "per_expert"])
    if family in QWEN_MOE:
        c["num_hidden_layers"] = L = rng.randint(2, 4)
        c["num_experts"] = E = rng.randint(2, 6)
        c["num_experts_per_tok"] = rng.randint(1, E)
        c["norm_topk_prob"] = rng.random() < 0.5
        c["moe_intermediate_size"] = rng.randint(4, 40)
        c["decoder_sparse_step"] = rng.choice([1, 1, 2])
        c["mlp_only_layers"] = sorted(rng.sample(range(L), rng.randint(0, L - 1)))
        c["layout"] = layout or rng.choice(["fused", "per_expert"])
    if family in ("mixtral", "olmoe") + QWEN_MOE and rng.random() < 0.5:  # trained with the load-balancing loss
        c["output_router_logits"] = True
        c["router_aux_loss_coef"] = rng.choice([0.001, 0.02, 0.5])  # large ones make its gradient show
    if family in ("mixtral", "olmoe") + QWEN_MOE and rng.random() < 0.4:  # Deepwell's router z-loss option
        c["router_z_loss_coef"] = rng.choice([0.001, 0.1])
    if family in QWEN_MOE:
        if family == "qwen2_moe":
            c["shared_expert_intermediate_size"] = rng.randint(4, 40)
            if rng.random() < 0.3:
                c["qkv_bias"] = False
        else:
            c["attention_bias"] = rng.random() < 0.3
    return c


def random_window(family, rng, L):
    """The family's sliding-window keys: none, or a window of 1..8 keys on every layer (mistral) or on
    the layers from max_window_layers, or as layer_types says (the Qwen families)."""
    if rng.random() < 0.2:
        return {"sliding_window": None} if family == "mistral" else {"use_sliding_window": False}
    W = rng.randint(1, 8)
    if family == "mistral":
        return {"sliding_window": W}
    c = {"use_sliding_window": True, "sliding_window": W, "max_window_layers": rng.randint(0, L)}
    if rng.random() < 0.3:
        c["layer_types"] = [rng.choice(["full_attention", "sliding_attention"]) for _ in range(L)]
    return c


def random_rope(rng, theta, kind=None):
    """rope_scaling (transformers 4) or rope_parameters (5) of a random type, its bands inside the
    tiny heads (original positions 8..64)."""
    kind = kind or rng.choice(["linear", "llama3", "yarn"])
    r = {"rope_type": kind, "factor": rng.choice([2.0, 4.0, 8.0, 32.0])}
    if kind == "llama3":
        r.update(low_freq_factor=1.0, high_freq_factor=rng.choice([2.0, 4.0]),
                 original_max_position_embeddings=rng.choice([8, 16, 64]))
    if kind == "yarn":
        r.update(original_max_position_embeddings=rng.choice([8, 16, 64]), beta_fast=rng.choice([4, 32]),
                 beta_slow=rng.choice([0.5, 1]), truncate=rng.random() < 0.5)
        if rng.random() < 0.3:
            r["attention_factor"] = 1.3
    if rng.random() < 0.5:
        return {"rope_parameters": dict(r, rope_theta=theta)}
    if rng.random() < 0.3:
        r["type"] = r.pop("rope_type")  # the old key
    return {"rope_scaling": r}


def param_shapes(c):
    """HF names and HF shapes, in an order like transformers' state_dict."""
    s = {}
    if c["model_type"] == "gpt2":
        C, F = c["n_embd"], c["n_inner"]
        s["transformer.wte.weight"] = (c["vocab_size"], C)
        s["transformer.wpe.weight"] = (c["n_positions"], C)
        for l in range(c["n_layer"]):
            p = f"transformer.h.{l}."
            for n, shp in [("ln_1.weight", (C,)), ("ln_1.bias", (C,)), ("attn.c_attn.weight", (C, 3 * C)),
                           ("attn.c_attn.bias", (3 * C,)), ("attn.c_proj.weight", (C, C)),
                           ("attn.c_proj.bias", (C,)), ("ln_2.weight", (C,)), ("ln_2.bias", (C,)),
                           ("mlp.c_fc.weight", (C, F)), ("mlp.c_fc.bias", (F,)),
                           ("mlp.c_proj.weight", (F, C)), ("mlp.c_proj.bias", (C,))]:
                s[p + n] = shp
        s["transformer.ln_f.weight"] = (C,)
        s["transformer.ln_f.bias"] = (C,)
        if not c["tie_word_embeddings"]:
            s["lm_head.weight"] = (c["vocab_size"], C)
        return s
    C, F, D = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
    qwen = c["model_type"] in ("qwen2", "qwen2_moe")
    qkv_bias = c.get("qkv_bias", True) if qwen else c.get("attention_bias", False)
    s["model.embed_tokens.weight"] = (c["vocab_size"], C)
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        s[p + "input_layernorm.weight"] = (C,)
        for n, o in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)]:
            s[p + f"self_attn.{n}.weight"] = (o, C)
            if qkv_bias:
                s[p + f"self_attn.{n}.bias"] = (o,)
        s[p + "self_attn.o_proj.weight"] = (C, q)
        if not qwen and c.get("attention_bias", False):
            s[p + "self_attn.o_proj.bias"] = (C,)
        s[p + "post_attention_layernorm.weight"] = (C,)
        if c["model_type"] == "olmoe":
            s[p + "self_attn.q_norm.weight"] = (q,)
            s[p + "self_attn.k_norm.weight"] = (kv,)
        if c["model_type"] in ("qwen3", "qwen3_moe"):
            s[p + "self_attn.q_norm.weight"] = (D,)
            s[p + "self_attn.k_norm.weight"] = (D,)
        if moe_layer(c, l):
            E = c.get("num_local_experts", c.get("num_experts"))
            if c["model_type"] in QWEN_MOE:
                F = c["moe_intermediate_size"]
            if c["model_type"] == "qwen2_moe":
                Fs = c["shared_expert_intermediate_size"]
                for n, shp in [("gate_proj", (Fs, C)), ("up_proj", (Fs, C)), ("down_proj", (C, Fs))]:
                    s[p + f"mlp.shared_expert.{n}.weight"] = shp
                s[p + "mlp.shared_expert_gate.weight"] = (1, C)
            mod, names = ("block_sparse_moe", ("w1", "w2", "w3")) if c["model_type"] == "mixtral" else \
                ("mlp", ("gate_proj", "down_proj", "up_proj"))
            if c["layout"] == "fused":
                s[p + "mlp.gate.weight"] = (E, C)
                s[p + "mlp.experts.gate_up_proj"] = (E, 2 * F, C)
                s[p + "mlp.experts.down_proj"] = (E, C, F)
            else:
                s[p + f"{mod}.gate.weight"] = (E, C)
                for e in range(E):
                    for n, shp in zip(names, [(F, C), (C, F), (F, C)]):
                        s[p + f"{mod}.experts.{e}.{n}.weight"] = shp
            F = c["intermediate_size"]
            continue
        for n, shp in [("gate_proj", (F, C)), ("up_proj", (F, C)), ("down_proj", (C, F))]:
            s[p + f"mlp.{n}.weight"] = shp
            if c.get("mlp_bias", False):
                s[p + f"mlp.{n}.bias"] = (shp[0],)
    s["model.norm.weight"] = (C,)
    if not c["tie_word_embeddings"]:
        s["lm_head.weight"] = (c["vocab_size"], C)
    return s


def random_weights(c, gen):
    w = {}
    for name, shp in param_shapes(c).items():
        if len(shp) == 1 and name.endswith(".weight"):  # norms: around one
            t = 1 + 0.2 * torch.randn(shp, generator=gen, dtype=torch.float64)
        else:  # large enough that every path matters
            t = (0.3 if len(shp) == 1 else 0.15) * torch.randn(shp, generator=gen, dtype=torch.float64)
        w[name] = t.float().double()  # exactly representable in FP32, as Deepwell stores them
    return w


def write_shard(path, tokens):
    hdr = np.zeros(256, dtype=np.int32)
    hdr[0], hdr[1], hdr[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(hdr.tobytes() + np.asarray(tokens, dtype=np.uint16).tobytes())


# ---- comparison -----------------------------------------------------------------------------


def compare(name, got, ref, rtol, atol_frac, failures):
    """|got - ref| <= atol + rtol |ref| elementwise, atol = atol_frac * max|ref| (per tensor)."""
    if tuple(got.shape) != tuple(ref.shape):
        failures.append(f"{name}: shape {tuple(got.shape)} != {tuple(ref.shape)}")
        return 0.0
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    atol = atol_frac * scale + 1e-12
    err = (got - ref).abs()
    bad = err > atol + rtol * ref.abs()
    if not torch.isfinite(got).all() or bad.any():
        i = int(torch.argmax((err - atol - rtol * ref.abs()).flatten()))
        failures.append(f"{name}: {int(bad.sum())} of {ref.numel()} elements off, worst at {i}: "
                        f"got {float(got.flatten()[i]):.8g}, ref {float(ref.flatten()[i]):.8g} "
                        f"(atol {atol:.3g}, rtol {rtol})")
    return float(err.max() / (scale + 1e-30)) if ref.numel() else 0.0


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def parity_case(dw, family, rng, gen, tmp, layout=None, rope_kind=None):
    c = random_config(family, rng, layout, rope_kind)
    d = tempfile.mkdtemp(prefix=family + "-", dir=tmp)
    json.dump({k: v for k, v in c.items() if k != "layout"}, open(os.path.join(d, "config.json"), "w"))
    w = random_weights(c, gen)
    st_write(os.path.join(d, "model.safetensors"), w)
    B, T = rng.randint(1, 3), rng.randint(2, 48)
    stream = add_pads(c, [rng.randrange(c["vocab_size"]) for _ in range(B * T + 1 + rng.randint(0, 50))], rng)
    write_shard(os.path.join(d, "tokens.bin"), stream)
    dump = os.path.join(d, "dump.safetensors")
    r = run([dw, "eval", d, "--data", os.path.join(d, "tokens.bin"), "--batch", str(B),
             "--seq", str(T), "--dump", dump])
    if r.returncode != 0:
        return [f"{family}: deepwell eval failed ({r.returncode}): {r.stderr.strip()}"]
    got = st_read(dump)

    params = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    tok = torch.tensor(stream[:B * T]).view(B, T)
    tgt = torch.tensor(stream[1:B * T + 1]).view(B, T)
    router_logits = []
    logits = gpt2_forward(c, params, tok) if family == "gpt2" else llama_forward(c, params, tok, router_logits)
    loss = torch.nn.functional.cross_entropy(logits.view(B * T, -1), tgt.view(-1))
    if c.get("output_router_logits", False) and router_logits:
        loss = loss + c["router_aux_loss_coef"] * load_balancing(c, router_logits)
    if c.get("router_z_loss_coef", 0) > 0 and router_logits:  # ST-MoE: each layer's mean lse^2, summed
        loss = loss + c["router_z_loss_coef"] * sum(torch.logsumexp(z, -1).pow(2).mean() for z in router_logits)
    loss.backward()

    failures = []
    worst = {}
    worst["logits"] = compare(f"{family} logits", got.pop("logits"), logits.detach(), 1e-4, 2e-5, failures)
    worst["loss"] = compare(f"{family} loss", got.pop("loss").reshape(()), loss.detach(), 1e-5, 0, failures)
    g_worst = 0.0
    for name, p in params.items():
        if name not in got:
            failures.append(f"{family}: no gradient for '{name}' in the dump")
            continue
        ref = p.grad if p.grad is not None else torch.zeros_like(p)  # an expert no token chose
        g_worst = max(g_worst, compare(f"{family} grad {name}", got.pop(name), ref, 2e-4, 2e-5, failures))
    for name in got:
        failures.append(f"{family}: unexpected tensor '{name}' in the dump")
    desc = ", ".join(f"{k}={v}" for k, v in c.items() if k in (
        "n_layer", "n_head", "n_embd", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "hidden_size", "tie_word_embeddings", "attention_bias", "mlp_bias",
        "num_local_experts", "num_experts", "num_experts_per_tok", "norm_topk_prob", "moe_intermediate_size",
        "shared_expert_intermediate_size", "decoder_sparse_step", "mlp_only_layers", "qkv_bias", "layout",
        "router_aux_loss_coef", "router_z_loss_coef", "rope_scaling", "rope_parameters", "sliding_window",
        "use_sliding_window", "max_window_layers", "layer_types", "pad_token_id"))
    print(f"{'ok' if not failures else 'FAIL'}: {family} parity ({desc}; B={B} T={T}): loss "
          f"{float(loss):.6f}, worst relative error logits {worst['logits']:.2e}, "
          f"grads {g_worst:.2e} over {len(params)} tensors")
    return failures


def weight_errors(dw, rng, gen, tmp):
    """Missing, unexpected and mis-shaped tensors are refused with their names."""
    failures = []
    c = random_config("llama", rng)
    c["tie_word_embeddings"] = False
    d = os.path.join(tmp, "bad")
    os.makedirs(d)
    json.dump({k: v for k, v in c.items() if k != "layout"}, open(os.path.join(d, "config.json"), "w"))
    write_shard(os.path.join(tmp, "bad.bin"), [1] * 200)
    good = random_weights(c, gen)
    cases = []
    w = dict(good); del w["model.layers.0.mlp.up_proj.weight"]
    cases.append((w, "missing tensor 'model.layers.0.mlp.up_proj.weight'"))
    w = dict(good); w["model.layers.0.mlp.extra.weight"] = torch.zeros(3)
    cases.append((w, "unexpected tensor 'model.layers.0.mlp.extra.weight'"))
    w = dict(good); w["lm_head.weight"] = torch.zeros(c["vocab_size"] + 1, c["hidden_size"])
    cases.append((w, "tensor 'lm_head.weight' has shape"))
    for w, needle in cases:
        st_write(os.path.join(d, "model.safetensors"), w)
        r = run([dw, "eval", d, "--data", os.path.join(tmp, "bad.bin"), "--batch", "1", "--seq", "8"])
        if r.returncode == 0 or needle not in r.stderr:
            failures.append(f"weights: expected failure with \"{needle}\", got {r.returncode}: {r.stderr.strip()}")
        else:
            print(f"ok: refused: {needle}")
    return failures


def main():
    dw = sys.argv[1]
    seed = int(os.environ.get("DW_TEST_SEED", random.randrange(1 << 30)))
    print(f"test seed: DW_TEST_SEED={seed}")
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in ["gpt2", "llama", "qwen2", "qwen2", "mistral", "mistral", "qwen3", "qwen3", "mixtral", "mixtral",
                       "olmoe", "olmoe"]:
            failures += parity_case(dw, family, rng, gen, tmp)
        for kind in ("llama3", "yarn"):  # each scaled RoPE at least once
            failures += parity_case(dw, "llama", rng, gen, tmp, rope_kind=kind)
        for family in QWEN_MOE:  # each in both expert layouts
            for layout in ("fused", "per_expert"):
                failures += parity_case(dw, family, rng, gen, tmp, layout)
        failures += weight_errors(dw, rng, gen, tmp)
    for f in failures:
        print("FAIL:", f)
    print(f"{len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
