"""feedforward.py — dw.capture and dw.optimize of a feed-forward torch module (ffn_capture.py): its
graph for batch x seq rows, checked against the module in FP32 on the CPU, with the module's weights
in a temporary model.safetensors the Graph owns (dw.compile loads them, in the module's names). The
compiled Engine takes float activations [..., C_in] and gives [..., C_out] (Engine.forward_float)."""
import copy
import os
import shutil
import tempfile

import numpy as np
import torch

from . import safetensors
from ._core import default_context
from .engine import compile_graph
from .ffn_capture import CaptureError, build, read
from .graph import graph_from_json

CHECK_ROWS = 8

# The band of each precision: the relative Frobenius error ||y - y_torch|| / ||y_torch|| of the
# output against the module in FP32 that tests/python/test_api_optimize.py and
# examples/quick_start.py hold (measured on the quick start's 768 -> 3072 -> 768 GELU network with
# torch's default initialisation and N(0, 1) inputs: bf16 0.0044, fp8_block, fp8_block2d 0.052,
# mxfp8 0.054, fp8_tensor and fp8_row 0.053, mxfp8_e5m2 0.11, nvfp4 0.21, mxfp4 0.22 — E4M3's 3
# mantissa bits, E5M2's 2, E2M1's 1). FP32 ("fp32", None) is held to the largest |output| instead.
TOLERANCE = {None: 1e-5, "fp32": 1e-5, "bf16": 0.015, "fp8_tensor": 0.08, "fp8_row": 0.08, "fp8_block": 0.08,
             "fp8_block2d": 0.08, "mxfp8": 0.08, "mxfp8_e5m2": 0.15, "nvfp4": 0.30, "mxfp4": 0.30}


def _graph(module, rows, ctx):
    """The module's Graph for `rows` rows, owning a temporary directory with its model.safetensors."""
    text, values = build(module, rows)
    tmp = tempfile.mkdtemp(prefix="deepwell-ffn-")
    try:
        safetensors.write(os.path.join(tmp, "model.safetensors"), values)
        return graph_from_json(text, ctx=ctx, what=f"{type(module).__name__} (feed-forward capture)", weights=tmp,
                               tmpdir=tmp)
    except BaseException:
        shutil.rmtree(tmp, True)
        raise


def _describe(module):
    """"linear(0) -> gelu_erf(1) -> ..." of the module as read."""
    steps, _, _ = read(module)
    return " -> ".join(f"{op}({name})" for op, name, _, _ in steps)


def check(module, seed=0):
    """Refuses (CaptureError) unless the captured graph's FP32 CPU output on a random input equals
    the module's (eval mode, FP32) within 1e-4 of the output's largest magnitude."""
    probe = copy.deepcopy(module).float().eval()
    g = _graph(probe, CHECK_ROWS, default_context("cpu"))
    try:
        with compile_graph(g) as e:
            x = np.random.default_rng(seed).standard_normal((CHECK_ROWS, g.input_width)).astype(np.float32)
            got = e.forward_float(x)
    finally:
        g.close()
    with torch.no_grad():
        want = probe(torch.from_numpy(x)).numpy()
    err, scale = float(np.max(np.abs(got - want))), float(np.max(np.abs(want)))
    if not err <= 1e-4 * max(scale, 1e-6):
        raise CaptureError(f"it was read as {_describe(probe)}, but on a random input its output differs from the "
                           f"module's by up to {err:.3g} (largest |output| {scale:.3g}): some operation differs")


def capture(module, rows, ctx):
    """The checked Graph of a feed-forward module for `rows` rows, with its weights."""
    check(module)
    return _graph(module, rows, ctx)
