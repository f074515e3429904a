#!/usr/bin/env python3
"""anchor_fsdp2.py — PyTorch FSDP2 the way torchtitan trains a Llama, the multi-GPU anchor of
issue 29: a Llama-3.2-1B-shaped model (the `llama-1b` preset's shape: vocab 128256, width 2048,
16 layers, 32 heads, 8 KV heads, FFN 8192, tied head, RoPE theta 500000), every block wrapped by
`fully_shard` and then the root, MixedPrecisionPolicy(param BF16, reduce FP32), each block
compiled (torchtitan's per-block torch.compile), SDPA flash attention, fused AdamW, clipping 1.0.

Usage: torchrun --nproc-per-node N bench/anchor_fsdp2.py [B] [T]   (B sequences per GPU, default 8 x 2048)
Prints one JSON line (rank 0): total tokens/s (median step after warm-up), step ms, peak GiB per GPU.
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

B = int(sys.argv[1]) if len(sys.argv) > 1 else 8
T = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
V, C, L, NH, NKV, FF, THETA = 128256, 2048, 16, 32, 8, 8192, 500000.0
HD = C // NH


def rotate(x, cos, sin):  # x [B, H, T, HD]; cos, sin [T, HD]
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm, self.mlp_norm = nn.RMSNorm(C, eps=1e-5), nn.RMSNorm(C, eps=1e-5)
        self.wqkv = nn.Linear(C, (NH + 2 * NKV) * HD, bias=False)
        self.wo = nn.Linear(C, C, bias=False)
        self.w13 = nn.Linear(C, 2 * FF, bias=False)
        self.w2 = nn.Linear(FF, C, bias=False)

    def forward(self, x, cos, sin):  # x [B, T, C]
        q, k, v = self.wqkv(self.attn_norm(x)).split([NH * HD, NKV * HD, NKV * HD], dim=-1)
        q, k, v = (t.view(B, T, -1, HD).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, is_causal=True,
                                           enable_gqa=True)
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, C))
        g, u = self.w13(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(g) * u)


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, C)
        self.layers = nn.ModuleList(Block() for _ in range(L))
        self.norm = nn.RMSNorm(C, eps=1e-5)
        self.head = nn.Linear(C, V, bias=False)
        self.head.weight = self.emb.weight
        inv = 1.0 / THETA ** (torch.arange(0, HD, 2).float() / HD)
        f = torch.outer(torch.arange(T).float(), inv)
        self.register_buffer("cos", torch.cat((f, f), -1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat((f, f), -1).sin(), persistent=False)

    def forward(self, idx, tgt):  # idx, tgt [B, T]
        x = self.emb(idx)
        for blk in self.layers:
            x = blk(x, self.cos.to(x.dtype), self.sin.to(x.dtype))
        return F.cross_entropy(self.head(self.norm(x)).float().view(-1, V), tgt.view(-1))


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(0)
    m = Llama().cuda()
    nn.init.normal_(m.emb.weight, std=0.02)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for i, blk in enumerate(m.layers):
        m.layers[i] = torch.compile(blk)
        fully_shard(m.layers[i], mp_policy=mp, reshard_after_forward=True)
    fully_shard(m, mp_policy=mp)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    x = torch.randint(0, V, (B, T), device="cuda")
    y = torch.randint(0, V, (B, T), device="cuda")
    ts, t_start = [], time.perf_counter()
    for step in range(25):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = m(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
        if step == 4:
            torch.cuda.reset_peak_memory_stats()
    t = sorted(ts[10:])[len(ts[10:]) // 2]
    if rank == 0:
        print(json.dumps({"model": "llama-1b", "impl": f"pytorch-fsdp2-compile-x{world}", "batch": B, "seq": T,
                          "tokens_per_s": round(world * B * T / t), "step_ms": round(1000 * t, 2),
                          "peak_alloc_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                          "loss": round(loss.item(), 3), "wall_s": round(time.perf_counter() - t_start, 1)}),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
