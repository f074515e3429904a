#!/usr/bin/env python3
"""accuracy_torch.py — the PyTorch BF16 reference of bench/accuracy.sh: the byte-level Llama of a
Hugging Face config.json (accuracy_setup.py writes it) trained as `deepwell train` trains it.

The same as Deepwell: the data (raw bytes, vocab 256; windows of T+1 bytes at offsets k·T of the
train file, every epoch each window once in a seeded random order, batches running on across
epochs; validation: the first min(eval_batches, windows // B) micro-batches of B windows of the
validation file in order, the mean of their mean losses), the model (Hugging Face Llama semantics:
RMSNorm eps from the config, RoPE with rotate_half, causal attention with grouped K/V heads,
SwiGLU, untied head; module names as transformers', so the state dict is the HF checkpoint's), the
initialisation (every matrix normal(0, initializer_range), norm weights 1), AdamW (betas, eps 1e-8,
decoupled weight decay on the matrices only, FP32 masters and moments), global-norm clipping and
the schedule (linear warmup lr·(s+1)/warmup, then cosine to min-lr at the last step). Not the same:
the random draws (torch's generator, so seed S here is another initialisation and data order than
Deepwell's seed S, from the same distributions), and BF16 is torch.autocast (matmuls in BF16, norms
and the loss in FP32) rather than Deepwell's BF16 program. torch only (1.13 and later: SDPA and
fused AdamW when present), no transformers.

Usage: python3 bench/accuracy_torch.py --config DIR/config.json --train train.txt --val val.txt
         --seed S [--steps 1200 --batch 16 --seq 256 --lr 1e-3 --min-lr 1e-4 --warmup 100
         --weight-decay 0.1 --clip 1.0 --eval-batches N --device cuda|cpu]
         [--init-out FILE.pt]
Prints one JSON line: impl "pytorch", recipe "torch_bf16", seed, steps, first_loss (the first
step's loss: the initial weights on the first batch), val_loss (after the last step), init_val_loss
(the initial weights on the first validation micro-batch, FP32), tokens_per_s (training steps only)
and wall_s. --init-out saves the initial weights (the state dict: HF names, F32) with torch.save;
tests/cli/test_accuracy_bench.sh writes them as safetensors for `deepwell eval --weights`, which
then computes init_val_loss on the very same weights.
"""
import argparse
import json
import math
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):  # as transformers' LlamaRMSNorm: in FP32, then back to the input's type
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, self.h, self.hkv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = c.get("head_dim", d // self.h)
        self.q_proj = nn.Linear(d, self.h * self.hd, bias=False)
        self.k_proj = nn.Linear(d, self.hkv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, self.hkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.h * self.hd, d, bias=False)

    def forward(self, x, cos, sin):  # x (B, T, d); cos, sin (T, hd)
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.hkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.hkv, self.hd).transpose(1, 2)
        q = q * cos.to(q.dtype) + rotate_half(q) * sin.to(q.dtype)
        k = k * cos.to(k.dtype) + rotate_half(k) * sin.to(k.dtype)
        if self.hkv != self.h:  # grouped K/V: head j reads K/V head j // (h / hkv)
            k = k.repeat_interleave(self.h // self.hkv, dim=1)
            v = v.repeat_interleave(self.h // self.hkv, dim=1)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch 1.13 (CI): the same softmax(q k^T / sqrt(hd) + causal mask) v
            s = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            y = torch.softmax(s.float().masked_fill(mask, float("-inf")), dim=-1).to(v.dtype) @ v
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.h * self.hd))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, f = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):  # transformers' LlamaModel: the names under "model."
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        if c.get("tie_word_embeddings") or c.get("rope_scaling") or c.get("attention_bias") or c.get("mlp_bias"):
            sys.exit("accuracy_torch.py: the config asks for tied embeddings, RoPE scaling or biases; "
                     "this reference has none (accuracy_setup.py's config has none)")
        self.model = Body(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        hd = c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
        inv = 1.0 / (c.get("rope_theta", 10000.0) ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        f = torch.outer(torch.arange(c["max_position_embeddings"], dtype=torch.float64), inv)
        f = torch.cat((f, f), dim=-1)
        self.register_buffer("cos", f.cos().float(), persistent=False)
        self.register_buffer("sin", f.sin().float(), persistent=False)
        std = c.get("initializer_range", 0.02)
        for name, p in self.named_parameters():  # as Deepwell and transformers: matrices N(0, std)
            if p.dim() >= 2:
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx, tgt):  # idx, tgt (B, T) int64 -> mean cross-entropy
        T = idx.shape[1]
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x, self.cos[:T], self.sin[:T])
        logits = self.lm_head(self.model.norm(x))
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tgt.reshape(-1))


class Windows:
    """Windows of T+1 bytes at offsets k·T of one file: a shuffled stream (train) or in order."""

    def __init__(self, path, T, seed=None):
        with open(path, "rb") as fh:
            self.tok = torch.from_numpy(np.frombuffer(fh.read(), dtype=np.uint8).astype(np.int64))
        self.T, self.n = T, (len(self.tok) - 1) // T if len(self.tok) > T else 0
        if self.n == 0:
            sys.exit(f"accuracy_torch.py: {path}: {len(self.tok)} bytes, fewer than one window of {T} + 1")
        self.gen = torch.Generator().manual_seed(seed) if seed is not None else None
        self.pos, self.order = 0, None

    def batch(self, B):
        rows = []
        for _ in range(B):
            e, r = divmod(self.pos, self.n)
            if self.gen is not None and r == 0:
                self.order = torch.randperm(self.n, generator=self.gen)
            w = int(self.order[r]) if self.gen is not None else r
            rows.append(self.tok[w * self.T: w * self.T + self.T + 1])
            self.pos += 1
        x = torch.stack(rows)
        return x[:, :-1], x[:, 1:]


def lr_at(step, a):  # Deepwell's dw_schedule_lr (src/train/schedule.c), cosine
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    span = a.steps - 1 - a.warmup
    p = min((step - a.warmup) / span, 1.0) if span > 0 else 1.0
    return a.min_lr + (a.lr - a.min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--val", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eval-batches", type=int, default=1 << 30)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--init-out", help="write the initial weights here (torch.save of the state dict, HF names)")
    a = ap.parse_args()
    t_start = time.time()
    if a.steps < 1 or a.batch < 1 or a.seq < 1 or a.warmup < 0 or a.eval_batches < 1:
        sys.exit("accuracy_torch.py: --steps, --batch, --seq, --eval-batches must be >= 1, --warmup >= 0")
    with open(a.config) as fh:
        cfg = json.load(fh)
    if a.seq > cfg["max_position_embeddings"]:
        sys.exit(f"accuracy_torch.py: --seq {a.seq} is beyond {a.config}'s max_position_embeddings")
    dev = torch.device(a.device)
    torch.manual_seed(a.seed)
    model = Llama(cfg).to(dev)
    if a.init_out:
        torch.save({k: v.cpu() for k, v in model.state_dict().items()}, a.init_out)
    train = Windows(a.train, a.seq, seed=a.seed)
    val = Windows(a.val, a.seq)
    nb = max(1, min(a.eval_batches, val.n // a.batch))

    def validate(bf16):
        model.eval()
        val.pos, total = 0, 0.0
        with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            for _ in range(nb if bf16 else 1):
                x, y = val.batch(a.batch)
                total += float(model(x.to(dev), y.to(dev)))
        model.train()
        return total / (nb if bf16 else 1)

    init_val = validate(False)  # FP32, the first validation micro-batch: `deepwell eval`'s batch
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    extra = {"fused": True} if dev.type == "cuda" and "fused" in torch.optim.AdamW.__init__.__code__.co_varnames else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(a.beta1, a.beta2), eps=1e-8, **extra)
    first, train_s = None, 0.0
    for step in range(a.steps):
        x, y = train.batch(a.batch)
        x, y = x.to(dev), y.to(dev)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.time()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if first is None:
            first = float(loss)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        train_s += time.time() - t0
    val_loss = validate(True)
    print(json.dumps({"impl": "pytorch", "recipe": "torch_bf16", "seed": a.seed, "steps": a.steps,
                      "batch": a.batch, "seq": a.seq, "first_loss": first, "val_loss": val_loss,
                      "val_batches": nb, "init_val_loss": init_val,
                      "tokens_per_s": a.steps * a.batch * a.seq / train_s, "wall_s": time.time() - t_start,
                      "torch": torch.__version__, "device": a.device}), flush=True)


if __name__ == "__main__":
    main()
