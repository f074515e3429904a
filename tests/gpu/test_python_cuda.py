"""test_python_cuda.py — `import deepwell as dw` driving a CUDA engine (needs a GPU; run by
scripts/gpu-verify.sh's `tests` phase, not by ctest): dw.probe() sees the GPU; a tiny Llama compiled
for "cuda" gives the CPU engine's loss on the same weights within BF16 rounding; Trainer.fit() on
CUDA lowers the loss, writes checkpoints that the CPU `deepwell eval` loads with the CUDA engine's
loss (BF16 tolerance), stops on Ctrl-C with a checkpoint and KeyboardInterrupt, and resumes to the
end; a torch.nn.Module captured by dw.capture trains 4 AdamW steps on CUDA with torch's losses
(BF16 tolerance).
Random data and weights from DW_TEST_SEED (printed). Exit status 1 on any failure.

usage: DEEPWELL_LIB=build-gpu/libdeepwell.so python3 tests/gpu/test_python_cuda.py"""
import os
import signal
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import numpy as np  # noqa: E402
from test_api_util import cli_eval_loss, dw, tiny_llama  # noqa: E402

SEED = int(os.environ.get("DW_TEST_SEED", np.random.SeedSequence().entropy % 2**31))
B, T = 4, 32
BF16_REL = 2e-2  # BF16 activations against FP32 on a model of this size (test_engine_cuda.c's bound)


def text_shard(path, rng, n=8000):
    """Byte tokens of sentences with a learnable structure."""
    words = [b"alpha ", b"beta ", b"gamma ", b"delta "]
    out = b"".join(words[i] for i in rng.integers(0, 4, size=n // 5))
    dw.write_shard(path, np.frombuffer(out, dtype=np.uint8)[:n])


def rel(a, b):
    return abs(a - b) / abs(b)


class PythonCuda(unittest.TestCase):
    def setUp(self):
        self.rng = np.random.default_rng(SEED)
        self.tmp = tempfile.TemporaryDirectory()
        self.d = self.tmp.name
        self.shard = os.path.join(self.d, "train.bin")
        text_shard(self.shard, self.rng)
        self.graph = dw.capture(tiny_llama(), seq_len=T, batch=B)

    def tearDown(self):
        self.tmp.cleanup()

    def batch(self):
        x = self.rng.integers(0, 256, size=(B, T), dtype=np.int32)
        return x, np.roll(x, -1, axis=1)

    def test_probe_sees_the_gpu(self):
        hw = dw.probe()
        self.assertGreaterEqual(len(hw.gpus), 1)
        self.assertGreaterEqual(hw.gpus[0]["sm"], 70)
        self.assertTrue(dw.built_with_cuda())

    def test_cuda_engine_gives_the_cpu_loss(self):
        seed = int(self.rng.integers(1, 2**31))
        cpu = dw.compile(self.graph, seed=seed)
        gpu = dw.compile(self.graph, seed=seed, device="cuda")
        self.assertEqual(gpu.precision, "bf16")
        for _ in range(3):
            x, y = self.batch()
            want, got = cpu.forward(x, y), gpu.forward(x, y)
            self.assertLess(rel(got, want), BF16_REL, f"cuda {got} vs cpu {want}")
        # the same weights: the CUDA engine's parameters are the CPU engine's
        a, b = cpu.state_dict(), gpu.state_dict()
        self.assertEqual(sorted(a), sorted(b))
        for k in a:
            np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)

    def trainer(self, out, steps, **kw):
        e = dw.compile(self.graph, seed=11, device="cuda")
        return dw.Trainer.from_engine(e, lr=1e-2, steps=steps, out=os.path.join(self.d, out), warmup=2,
                                      dataloader=dw.data(self.shard), eval_every=0, progress=False, **kw)

    def test_fit_on_cuda_and_the_cpu_cli_loads_the_checkpoint(self):
        t = self.trainer("run", 20, schedule="linear")
        t.fit()
        losses = [m["loss"] for m in t.history]
        self.assertEqual(len(losses), 20)
        self.assertLess(np.mean(losses[-3:]), losses[0] - 1.0, losses)
        x, y = dw.data(self.shard, seq=T, vocab=256).reader().next(B)
        mine = t.engine.forward(x, y)
        theirs = cli_eval_loss(os.path.join(self.d, "run", "ckpt-20"), self.shard, B, T)  # the CPU, FP32
        self.assertLess(rel(mine, theirs), BF16_REL, f"cuda {mine} vs cpu eval {theirs}")

    def test_ctrl_c_on_cuda_checkpoints_and_resumes(self):
        def interrupt(m):
            if m["step"] == 4:
                os.kill(os.getpid(), signal.SIGINT)

        cut = self.trainer("cut", 10, callbacks=[interrupt])
        with self.assertRaises(KeyboardInterrupt):
            cut.fit()
        self.assertEqual(cut.checkpoint, os.path.join(self.d, "cut", "ckpt-4"))
        again = self.trainer("cut", 10)
        last = again.fit(resume=os.path.join(self.d, "cut"))
        self.assertEqual(last["step"], 10)
        self.assertTrue(os.path.isdir(os.path.join(self.d, "cut", "ckpt-10")))

    def test_torch_module_trains_on_cuda_as_in_torch(self):
        import torch
        from test_api_torch import make  # anchor_train.py's Llama module, small, captured through torch.fx

        torch.manual_seed(SEED)
        m = make("llama", tie=False)
        g = dw.capture(m, seq_len=16, batch=2)
        e = dw.compile(g, device="cuda")  # the module's own weights
        x, y = torch.randint(0, 97, (2, 16)), torch.randint(0, 97, (2, 16))
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
        for step in range(4):  # the same AdamW steps from the same weights, BF16 on the GPU
            opt.zero_grad()
            ref = m(x, y)
            ref.backward()
            opt.step()
            e.zero_grad()
            got = e.forward_backward(x, y)
            e.step(lr=1e-2, weight_decay=0.0, clip=0.0)
            self.assertLess(rel(got, float(ref)), BF16_REL, f"step {step}: cuda {got} vs torch {float(ref)}")

if __name__ == "__main__":
    print(f"DW_TEST_SEED={SEED}")
    unittest.main(verbosity=2)
