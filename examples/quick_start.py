#!/usr/bin/python3
"""quick_start.py — the origin README's quick start with `import deepwell as dw`: an nn.Sequential
768 -> 3072 -> 768 with GELU, optimised for a precision and called like the module.

    python3 examples/quick_start.py [--precision mxfp8] [--batch-size 32] [--device cpu]

dw.optimize captures the module through torch.fx (a feed-forward graph: float input, float output),
compiles it with the precision's recipe on its linears and loads the module's weights; the result
takes torch or NumPy float input [..., 768]. Prints the output's relative error against the module
in FP32 and exits non-zero when it is outside the precision's band (deepwell.feedforward.TOLERANCE;
docs/python.md). --precision fp32 runs the exact FP32 program (the CPU's reference kernels).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))  # from a clone

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import deepwell as dw  # noqa: E402
from deepwell.feedforward import TOLERANCE  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precision", default="mxfp8", help="fp32, bf16, fp8_block, mxfp8 (default), nvfp4, ...")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    a = ap.parse_args()
    precision = None if a.precision == "fp32" else a.precision

    # Create your model
    model = nn.Sequential(
        nn.Linear(768, 3072),
        nn.GELU(),
        nn.Linear(3072, 768),
    )

    # Optimize it (the origin README called this dw.optimize_for_blackwell)
    t0 = time.time()
    optimized_model = dw.optimize(model, precision=precision, batch_size=a.batch_size, device=a.device)
    t1 = time.time()

    # Use like normal PyTorch model
    input_tensor = torch.randn(a.batch_size, 768)
    output = optimized_model(input_tensor)
    t2 = time.time()

    with torch.no_grad():
        want = model(input_tensor)
    if precision is None:
        err = float((output - want).abs().max() / want.abs().max())
        what = "max |error| / max |output|"
    else:
        err = float((output - want).norm() / want.norm())
        what = "relative error (Frobenius)"
    band = TOLERANCE.get(precision, TOLERANCE["fp8_block"])
    print(f"{optimized_model}")
    print(f"output {tuple(output.shape)} {output.dtype}; {what} against torch FP32 {err:.3g} (band {band:g}); "
          f"optimize {t1 - t0:.2f} s, call {t2 - t1:.3f} s")
    if not err <= band:
        print(f"quick_start: the {a.precision} output is outside its band", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
