#!/usr/bin/env python3
"""gemm_anchor.py — PyTorch anchors for `deepwell bench-gemm`, run in the same device call.

Times cuBLAS through PyTorch for the shapes of the GEMM issue: BF16 torch.matmul, FP8 tensorwise
and (when this PyTorch accepts it) FP8 1x128 x 128x128 block-scaled torch._scaled_mm, D = A B^T with
A [m, k], B [n, k], BF16 output. Inputs are random (never zeros), rotated among up to 4 copies.
Median of 5 batches timed with CUDA events. Prints the same JSON list as `deepwell bench-gemm
--json` ({m,n,k,recipe,backend,tflops,ms}) with backend "torch:<op>"; a recipe PyTorch refuses is
reported on stderr and left out.
Usage: python3 bench/gemm_anchor.py [--shapes square,gpt2,llama] [--iters 20]
"""
import argparse
import json
import sys

import torch


def shapes(sel):
    out = []
    if "square" in sel:
        out.append((8192, 8192, 8192))
    if "gpt2" in sel:
        for n in (768, 2304, 3072):
            for k in (768, 2304, 3072):
                out.append((16384, n, k))
    if "llama" in sel:
        out += [(16384, 14336, 4096), (16384, 4096, 14336)]
    return out


def time_ms(fn, nsets, iters):
    for i in range(3):
        fn(i % nsets)
    torch.cuda.synchronize()
    res = []
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for i in range(iters):
            fn(i % nsets)
        e1.record()
        e1.synchronize()
        res.append(e0.elapsed_time(e1) / iters)
    res.sort()
    return res[2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="square,gpt2,llama")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    dev = torch.device("cuda")
    out = []
    for (m, n, k) in shapes(args.shapes.split(",")):
        setb = (m + n) * k * 2
        nsets = max(1, min(4, (2 << 30) // setb))
        A = [torch.randn(m, k, device=dev, dtype=torch.bfloat16) for _ in range(nsets)]
        B = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(nsets)]
        flops = 2.0 * m * n * k

        def rec(recipe, op, ms):
            out.append({"m": m, "n": n, "k": k, "recipe": recipe, "backend": "torch:" + op,
                        "tflops": round(flops / (ms * 1e-3) / 1e12, 1), "ms": round(ms, 4)})
            print(f"{m:6d} {n:6d} {k:6d} {recipe:11s} torch:{op:14s} {ms:9.4f} ms "
                  f"{flops / (ms * 1e-3) / 1e12:8.1f} TFLOP/s", file=sys.stderr, flush=True)

        rec("bf16", "matmul", time_ms(lambda i: torch.matmul(A[i], B[i].t()), nsets, args.iters))
        A8 = [a.to(torch.float8_e4m3fn) for a in A]
        B8 = [b.to(torch.float8_e4m3fn) for b in B]
        del A, B
        one = torch.tensor(1.0, device=dev)
        try:
            rec("fp8_tensor", "_scaled_mm", time_ms(
                lambda i: torch._scaled_mm(A8[i], B8[i].t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                nsets, args.iters))
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"fp8_tensor {m}x{n}x{k}: refused: {e}", file=sys.stderr)
        sa = torch.rand(k // 128, m, device=dev).add_(0.5).t()          # [m, k/128], m fastest
        variants = [torch.rand(n // 128, k // 128, device=dev).add_(0.5),
                    torch.rand(k // 128, n // 128, device=dev).add_(0.5).t()]
        done = False
        for sb in variants:
            if done:
                break
            try:
                rec("fp8_block", "_scaled_mm", time_ms(
                    lambda i: torch._scaled_mm(A8[i], B8[i].t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16),
                    nsets, args.iters))
                done = True
            except Exception as e:  # noqa: BLE001
                err = e
        if not done:
            print(f"fp8_block {m}x{n}x{k}: refused: {str(err)[:300]}", file=sys.stderr)
        del A8, B8
        torch.cuda.empty_cache()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
