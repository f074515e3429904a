"""test_api_optimize.py — dw.optimize of feed-forward torch modules (the origin README's quick start,
nn.Sequential 768 -> 3072 -> 768 with GELU, and random others: nested Sequentials, residual blocks,
LayerNorm with and without affine parameters, an RMSNorm module, exact and tanh GELU, SiLU, ReLU,
linears without bias, Dropout/Identity) on the CPU engine. Fresh random weights and inputs each run
(the seed is printed). FP32: the module's output within 1e-5 of its largest magnitude, for NumPy and
torch inputs of [B, C_in] and [B, T, C_in], fewer and more rows than batch_size; quantised recipes
within docs/python.md's bands (relative Frobenius error against FP32 torch) and measurably worse
than BF16, so the recipe is applied; refusals: wrong width, integer input, an unmapped module or
function named by its node, bad batch_size, a module of two inputs, a Trainer of such an engine; dw.capture then dw.compile of such a
module (its parameters under the module's names)."""
import os
import random
import unittest

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from test_api_util import dw
from deepwell.feedforward import TOLERANCE  # noqa: E402

SEED = int.from_bytes(os.urandom(4), "little")
print(f"test_api_optimize seed {SEED}")
torch.manual_seed(SEED)
RNG = random.Random(SEED)

# relative Frobenius error of the output against FP32 torch: the package's bands (docs/python.md)
BANDS = {r: TOLERANCE[r] for r in ("bf16", "fp8_block", "mxfp8", "nvfp4")}


def max_rel(got, want):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


class RMS(nn.Module):
    def __init__(self, c, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(c))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Residual(nn.Module):
    def __init__(self, c, f, act, norm, bias):
        super().__init__()
        self.norm, self.up, self.act, self.down = norm, nn.Linear(c, f, bias=bias), act, nn.Linear(f, c, bias=bias)

    def forward(self, x):
        return x + self.down(self.act(self.up(self.norm(x))))


class FunctionalMLP(nn.Module):
    def __init__(self, c, f):
        super().__init__()
        self.fc, self.proj = nn.Linear(c, f), nn.Linear(f, c)

    def forward(self, x):
        h = F.gelu(self.fc(x), approximate="tanh")
        return self.proj(F.silu(h)).relu() + x


def random_module():
    c, f, out = RNG.randint(3, 48), RNG.randint(4, 96), RNG.randint(1, 40)
    act = RNG.choice([nn.GELU(), nn.GELU(approximate="tanh"), nn.SiLU(), nn.ReLU()])
    norm = RNG.choice([nn.LayerNorm(c), nn.LayerNorm(c, elementwise_affine=False), RMS(c), nn.Identity()])
    if isinstance(norm, nn.LayerNorm) and norm.weight is not None:
        with torch.no_grad():
            norm.weight.add_(0.2 * torch.randn(c)), norm.bias.add_(0.2 * torch.randn(c))
    return nn.Sequential(nn.Sequential(Residual(c, f, act, norm, RNG.random() < 0.5), nn.Dropout(0.1)),
                         FunctionalMLP(c, f), nn.LayerNorm(c), nn.Linear(c, out, bias=RNG.random() < 0.5))


def quick_start():
    return nn.Sequential(nn.Linear(768, 3072), nn.GELU(), nn.Linear(3072, 768))


class TestOptimize(unittest.TestCase):
    def test_quick_start_fp32(self):
        model = quick_start()
        fast = dw.optimize(model, batch_size=32)
        self.assertEqual((fast.graph.input_width, fast.graph.output_width), (768, 3072 // 4))
        x = torch.randn(32, 768)
        with torch.no_grad():
            want = model(x)
        got = fast(x)
        self.assertIsInstance(got, torch.Tensor)
        self.assertEqual((got.dtype, tuple(got.shape)), (torch.float32, (32, 768)))
        self.assertLess(max_rel(got, want), 1e-5)
        got = fast(x.numpy()[:5])  # NumPy in, NumPy out; fewer rows than batch_size
        self.assertIsInstance(got, np.ndarray)
        self.assertLess(max_rel(got, want[:5]), 1e-5)

    def test_random_modules_fp32(self):
        for _ in range(6):
            model = random_module().eval()
            B, T = RNG.randint(1, 5), RNG.randint(1, 4)
            fast = dw.optimize(model, batch_size=B, seq_len=T)
            c = model[0][0].up.in_features
            for shape in ((B, T, c), (RNG.randint(1, B * T), c), (2 * B * T + 1, c), (B, 1, T, c)):
                x = torch.randn(*shape) * 2
                with torch.no_grad():
                    want = model(x)
                got = fast(x)
                self.assertEqual(tuple(got.shape), tuple(want.shape))
                self.assertLess(max_rel(got, want), 1e-5, f"{model} on {shape}")
            x = np.random.default_rng(SEED).standard_normal((B, T, c))  # float64 in, float64 out
            got = fast(x)
            self.assertEqual(got.dtype, np.float64)
            with torch.no_grad():
                self.assertLess(max_rel(got, model(torch.from_numpy(x).float())), 1e-5)

    def test_quantised_recipes_in_band(self):
        model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 384), nn.SiLU(), nn.Linear(384, 256))
        x = torch.randn(16, 256)
        with torch.no_grad():
            want = model(x)
        err = {}
        for recipe, band in BANDS.items():
            fast = dw.optimize(model, precision=recipe, batch_size=16)
            self.assertEqual(fast.precision, recipe)
            got = fast(x)
            err[recipe] = float((got - want).norm() / want.norm())
            self.assertLess(err[recipe], band, f"{recipe}: relative error {err[recipe]:.4f} over its band {band}")
        for recipe in ("fp8_block", "mxfp8", "nvfp4"):  # the linears really are quantised
            self.assertGreater(err[recipe], 2 * err["bf16"], f"{recipe} {err[recipe]:.4f} vs bf16 {err['bf16']:.4f}")

    def test_capture_then_compile(self):
        model = random_module().eval()
        c = model[0][0].up.in_features
        g = dw.capture(model, seq_len=3, batch=2)
        self.assertEqual((g.model_type, g.batch, g.seq, g.input_width), ("feedforward", 6, 1, c))
        self.assertEqual(g.params, sum(p.numel() for p in model.parameters()) + 2 * c * sum(
            isinstance(m, torch.nn.LayerNorm) and m.weight is None for m in model.modules()))
        e = dw.compile(g)  # loads the module's weights from the Graph's model.safetensors
        sd = {k: v for k, v in e.state_dict().items()}
        for name, p in model.state_dict().items():
            self.assertTrue(torch.equal(sd[name], p.float()), name)
        x = torch.randn(7, c)
        with torch.no_grad():
            self.assertLess(max_rel(e(x), model(x)), 1e-5)
        tmp = g.weights
        self.assertTrue(os.path.isfile(os.path.join(tmp, "model.safetensors")))
        e.close(), g.close()
        self.assertFalse(os.path.exists(tmp))

    def test_bad_inputs(self):
        fast = dw.optimize(nn.Sequential(nn.Linear(12, 20), nn.ReLU(), nn.Linear(20, 7)), batch_size=4)
        with self.assertRaisesRegex(ValueError, r"\[\.\.\., 12\].*\(4, 11\)"):
            fast(torch.randn(4, 11))
        with self.assertRaisesRegex(TypeError, "int64"):
            fast(np.ones((4, 12), dtype=np.int64))
        with self.assertRaisesRegex(TypeError, "torch.int32"):
            fast(torch.ones(4, 12, dtype=torch.int32))
        with self.assertRaisesRegex(ValueError, "no rows"):
            fast(np.zeros((0, 12), dtype=np.float32))
        with self.assertRaises(dw.UnsupportedError):  # a feed-forward engine takes no tokens
            fast.forward(np.zeros((1, 4), dtype=np.int32))
        with self.assertRaisesRegex(ValueError, "feed-forward graph .*width 12.*forward only"):
            dw.Trainer.from_engine(fast, dataloader="builtin", steps=2)  # no loss to train

    def test_unsupported_named(self):
        class Tanh(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(6, 6)

            def forward(self, x):
                return torch.tanh(self.fc(x)) * 2

        cases = [(Tanh(), r"node 'tanh' \(call_function tanh\)"),
                 (nn.Sequential(nn.Linear(6, 6), nn.Conv1d(6, 6, 1)), r"call_module 1.*Conv1d"),
                 (nn.Sequential(nn.Linear(6, 6), nn.LayerNorm([2, 3])), r"LayerNorm over \(2, 3\)"),
                 (nn.Sequential(nn.Linear(6, 5), nn.Linear(6, 6)), r"takes 6 features but its input '0' has 5")]
        for module, pattern in cases:
            with self.assertRaisesRegex(TypeError, pattern):
                dw.optimize(module, batch_size=2)

        class Two(nn.Module):
            def forward(self, a, b):
                return a + b

        with self.assertRaisesRegex(TypeError, "takes 2 inputs"):
            dw.optimize(Two())
        for bad in (0, -1, 1.5, True):
            with self.assertRaisesRegex(ValueError, "batch_size"):
                dw.optimize(quick_start(), batch_size=bad)


if __name__ == "__main__":
    unittest.main()
