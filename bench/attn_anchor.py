#!/usr/bin/env python3
"""attn_anchor.py — PyTorch's causal scaled_dot_product_attention (BF16, flash backend where torch
picks it) forward and forward+backward times at one shape, CUDA events, median of --iters: the
anchor for Deepwell's attention kernels (bench/RESULTS.md). Layout as Deepwell: (B,T,H,D) inputs
transposed to torch's (B,H,T,D) outside the timed region. With --hkv < --h (GQA), k and v have
--hkv heads and are expanded to --h heads outside the timed region (what transformers' Llama does
before SDPA), so torch times plain flash attention; enable_gqa=True is timed too where torch has it.

Usage: python3 bench/attn_anchor.py [--b 16] [--t 1024] [--h 12] [--hkv H] [--d 64] [--iters 50]
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--b", type=int, default=16)
    ap.add_argument("--t", type=int, default=1024)
    ap.add_argument("--h", type=int, default=12)
    ap.add_argument("--hkv", type=int, default=0)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--iters", type=int, default=50)
    a = ap.parse_args()
    import torch
    import torch.nn.functional as F
    torch.manual_seed(0)
    hkv = a.hkv or a.h
    q = torch.randn(a.b, a.h, a.t, a.d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(a.b, hkv, a.t, a.d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ke, ve = (x.repeat_interleave(a.h // hkv, dim=1).detach().requires_grad_(True) for x in (k, v))
    k.requires_grad_(True)
    v.requires_grad_(True)
    g = torch.randn(a.b, a.h, a.t, a.d, device="cuda", dtype=torch.bfloat16)

    def fwd():
        return F.scaled_dot_product_attention(q, ke, ve, is_causal=True)

    def fwd_bwd():
        o = fwd()
        o.backward(g)

    def fwd_gqa():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def fwd_bwd_gqa():
        fwd_gqa().backward(g)

    def timed(fn):
        for _ in range(5):
            fn()
        ts = []
        for _ in range(a.iters):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e))
        ts.sort()
        return ts[len(ts) // 2]

    f = timed(fwd)
    fb = timed(fwd_bwd)
    flop_fwd = 4 * a.b * a.h * a.t * a.t * a.d / 2  # causal: half of QK^T and PV
    res = {"impl": "torch-sdpa", "B": a.b, "T": a.t, "H": a.h, "Hkv": hkv, "D": a.d, "fwd_ms": f,
           "fwd_bwd_ms": fb, "bwd_ms": fb - f, "fwd_tflops": flop_fwd / f / 1e9,
           "fwd_bwd_tflops": 3.5 * flop_fwd / fb / 1e9}
    if hkv != a.h:
        try:
            res["gqa_fwd_ms"], res["gqa_fwd_bwd_ms"] = timed(fwd_gqa), timed(fwd_bwd_gqa)
        except Exception as e:  # older torch: no enable_gqa
            res["gqa_error"] = str(e)[:200]
    print(json.dumps(res))


if __name__ == "__main__":
    main()
