#!/usr/bin/env python3
"""grouped_anchor.py — the anchor of `deepwell bench grouped`: torch._grouped_mm (BF16, as
torchtitan's MoE and ../shared/anchors/anchor_moe.py run their experts) on the same shapes, routings
and passes, each group padded to 16 rows as those do; and, where this PyTorch has it,
torch._scaled_grouped_mm on FP8 E4M3 with row-wise scales (fprop only). Prints one JSON line per
case: {shape, routing, pass, recipe, rows, experts, k, m, max_rows, dtype, ms, tflops} with TFLOP/s
over the unpadded rows (2 rows K M / time), as deepwell prints them; recipe is "bf16", or "fp8_row"
for the row-wise FP8 cases (deepwell's fp8_block cases come from `bench grouped --recipe
fp8_block`).

usage: python3 bench/grouped_anchor.py [--shapes LIST] [--routing LIST] [--passes LIST]
                                        [--iters N] [--zipf S]
"""
import argparse
import json
import math

import torch

SHAPES = {  # rows x K -> M over E experts (src/bench/grouped.c)
    "e8": (16384, 8, 4096, 14336), "e64": (32768, 64, 2048, 1408),
    "moe-e8": (32768, 8, 2048, 5632), "moe-e8-down": (32768, 8, 5632, 2048),
    "moe-e64": (65536, 64, 2048, 1024), "moe-e64-down": (65536, 64, 1024, 2048),
}
ALIGN = 16


def counts_of(rows, experts, routing, s):
    """dw_bench_grouped_counts: equal shares, or Zipf floors with the remainder to expert 0."""
    if routing == "balanced":
        return [rows // experts + (e < rows % experts) for e in range(experts)]
    w = [(e + 1) ** -s for e in range(experts)]
    c = [math.floor(rows * x / sum(w)) for x in w]
    c[0] += rows - sum(c)
    return c


def timed(fn, iters):
    """ms per call: the median of 5 batches of iters calls after 2 warm-up calls (CUDA events)."""
    for _ in range(2):
        fn()
    out = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / iters)
    return sorted(out)[2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--routing", default="balanced,zipf")
    ap.add_argument("--passes", default="fprop,dgrad,wgrad")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--zipf", type=float, default=1.0)
    a = ap.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    for name in a.shapes.split(","):
        R, E, K, M = SHAPES[name]
        for routing in a.routing.split(","):
            cnt = counts_of(R, E, routing, a.zipf)
            padded = [(c + ALIGN - 1) // ALIGN * ALIGN for c in cnt]
            P = sum(padded)
            offs = torch.tensor(padded, device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)
            x = torch.rand(P, K, device=dev, generator=g, dtype=torch.bfloat16) * 2 - 1
            dy = torch.rand(P, M, device=dev, generator=g, dtype=torch.bfloat16) * 2 - 1
            w = torch.rand(E, M, K, device=dev, generator=g, dtype=torch.bfloat16) * 2 - 1
            cases = {
                "fprop": lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs),   # (P,K) x (E,K,M)
                "dgrad": lambda: torch._grouped_mm(dy, w, offs=offs),                    # (P,M) x (E,M,K)
                "wgrad": lambda: torch._grouped_mm(dy.t(), x, offs=offs),                # (M,P) x (P,K) -> (E,M,K)
            }
            for p in a.passes.split(","):
                ms = timed(cases[p], a.iters)
                print(json.dumps({"shape": name, "routing": routing, "pass": p, "recipe": "bf16", "rows": R,
                                  "experts": E, "k": K,
                                  "m": M, "max_rows": max(cnt), "dtype": "bf16", "impl": "torch._grouped_mm",
                                  "ms": round(ms, 4), "tflops": round(2 * R * K * M / (ms * 1e9), 1)}), flush=True)
            if "fprop" in a.passes.split(",") and hasattr(torch, "_scaled_grouped_mm"):
                try:
                    xq = x.to(torch.float8_e4m3fn)
                    wq = w.to(torch.float8_e4m3fn).transpose(-2, -1)   # (E,K,M), column-major per expert
                    sx = torch.ones(P, device=dev, dtype=torch.float32)
                    sw = torch.ones(E, M, device=dev, dtype=torch.float32)
                    f = lambda: torch._scaled_grouped_mm(xq, wq, sx, sw, offs=offs, out_dtype=torch.bfloat16)
                    ms = timed(f, a.iters)
                    print(json.dumps({"shape": name, "routing": routing, "pass": "fprop", "recipe": "fp8_row",
                                      "rows": R, "experts": E,
                                      "k": K, "m": M, "max_rows": max(cnt), "dtype": "fp8_rowwise",
                                      "impl": "torch._scaled_grouped_mm", "ms": round(ms, 4),
                                      "tflops": round(2 * R * K * M / (ms * 1e9), 1)}), flush=True)
                except (RuntimeError, TypeError) as err:  # not on this card or version: say so
                    print(json.dumps({"shape": name, "routing": routing, "pass": "fprop", "recipe": "fp8_row",
                                      "dtype": "fp8_rowwise",
                                      "impl": "torch._scaled_grouped_mm", "skipped": str(err)[:200]}), flush=True)
            del x, dy, w
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
