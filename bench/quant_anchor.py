#!/usr/bin/env python3
"""quant_anchor.py — what a PyTorch user gets for `deepwell bench quant`'s work, in the same device call.

Times, on a random BF16 [R, C] tensor (default 8192 x 8192), with the bytes counted as `deepwell
bench quant` counts them (input read once, codes and scales written once, whatever the kernels
really move):
  copy            x.clone() (device-to-device copy, read + write)
  transpose       x.t().contiguous() (BF16 transpose, read + write)
  fp8_block(+T)   torch.compile of the fp8_block recipe (FORMATS.md: one FP32 scale amax/448 per
                  1x128 block, E4M3 codes, saturating), row-wise and with the column-wise copy
  mxfp8(+T)       torch.compile of the MX rule with rceil (e = ceil(log2(amax / 448)), UE8M0),
                  row-wise and with the column-wise copy (scales kept as FP32 powers of two)
Inductor decides how many kernels and passes each takes. Median of 50 batches of 10 calls timed
with CUDA events after warm-up. Prints one line per case: name, us per call, GB/s, ratio to copy.
Not bit-checked against Deepwell (the reference is the CPU quantiser); this is a speed anchor.
Usage: python3 bench/quant_anchor.py [--rows R] [--cols C]
"""
import argparse

import torch

F8 = torch.float8_e4m3fn


def fp8_block(x):
    r, c = x.shape
    xb = x.float().view(r, c // 128, 128)
    s = xb.abs().amax(-1, keepdim=True) / 448.0
    s = torch.where(s == 0, torch.ones_like(s), s)
    codes = (xb / s).clamp(-448.0, 448.0).to(F8).view(r, c)
    return codes, s.view(r, c // 128)


def mxfp8(x):
    r, c = x.shape
    xb = x.float().view(r, c // 32, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    e = torch.ceil(torch.log2(amax / 448.0)).clamp(-127, 127)
    s = torch.where(amax == 0, torch.zeros_like(e), torch.exp2(e))
    codes = (xb / torch.where(amax == 0, torch.ones_like(s), s)).to(F8).view(r, c)
    return codes, s.view(r, c // 32)


def with_t(f):
    def both(x):
        return f(x), f(x.t())
    return both


def time_us(fn, x, iters=50, batch=10):
    for _ in range(5):
        for _ in range(batch):
            fn(x)
    torch.cuda.synchronize()
    res = []
    for _ in range(iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(batch):
            fn(x)
        e1.record()
        e1.synchronize()
        res.append(e0.elapsed_time(e1) * 1000.0 / batch)
    res.sort()
    return res[len(res) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--cols", type=int, default=8192)
    a = ap.parse_args()
    r, c = a.rows, a.cols
    x = torch.randn(r, c, device="cuda", dtype=torch.bfloat16)
    n = r * c
    cases = [
        ("copy", lambda t: t.clone(), 4 * n),
        ("transpose", lambda t: t.t().contiguous(), 4 * n),
        ("fp8_block", torch.compile(fp8_block), 2 * n + n + 4 * n // 128),
        ("fp8_block+T", torch.compile(with_t(fp8_block)), 2 * n + 2 * (n + 4 * n // 128)),
        ("mxfp8", torch.compile(mxfp8), 2 * n + n + n // 32),
        ("mxfp8+T", torch.compile(with_t(mxfp8)), 2 * n + 2 * (n + n // 32)),
    ]
    copy_gbs = None
    print("%-12s %9s %9s %6s" % ("case", "us", "GB/s", "ratio"))
    for name, fn, nbytes in cases:
        us = time_us(fn, x)
        gbs = nbytes / us / 1e3
        if copy_gbs is None:
            copy_gbs = gbs
        print("%-12s %9.1f %9.1f %6.3f" % (name, us, gbs, gbs / copy_gbs))


if __name__ == "__main__":
    main()
