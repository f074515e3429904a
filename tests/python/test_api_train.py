"""test_api_train.py — dw.Trainer and dw.export on the CPU: fit() lowers the loss, writes
checkpoints the `deepwell` command loads with the same loss, resumes bit-identically after
Ctrl-C (KeyboardInterrupt), trains from Python iterables of NumPy or torch batches, and refuses
bad arguments with the C message."""
import json
import math
import os
import signal
import tempfile
import unittest

import numpy as np

from test_api_util import cli_eval_loss, dw, tiny_llama

from deepwell import safetensors

B, T = 4, 32


def text_shard(path, n=6000, seed=0):
    """Byte tokens of sentences with a learnable structure."""
    rng = np.random.default_rng(seed)
    words = [b"alpha ", b"beta ", b"gamma ", b"delta "]
    out = b"".join(words[i] for i in rng.integers(0, 4, size=n // 5))
    dw.write_shard(path, np.frombuffer(out, dtype=np.uint8)[:n])


class TrainerTests(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.d = self.tmp.name
        self.shard = os.path.join(self.d, "train.bin")
        text_shard(self.shard)
        self.graph = dw.capture(tiny_llama(), seq_len=T, batch=B)

    def tearDown(self):
        self.tmp.cleanup()

    def trainer(self, out, steps, engine=None, **kw):
        e = engine or dw.compile(self.graph, seed=11)
        kw.setdefault("dataloader", dw.data(self.shard))
        return dw.Trainer.from_engine(e, lr=1e-2, steps=steps, out=os.path.join(self.d, out), warmup=2,
                                      eval_every=0, progress=False, **kw)

    def test_fit_lowers_loss_and_the_cli_loads_the_checkpoint(self):
        t = self.trainer("run", 16, schedule="linear")
        last = t.fit()
        losses = [m["loss"] for m in t.history]
        self.assertEqual(len(losses), 16)
        self.assertLess(np.mean(losses[-3:]), losses[0] - 1.0)
        ckpt = os.path.join(self.d, "run", "ckpt-16")
        self.assertEqual(t.checkpoint, ckpt)
        self.assertEqual(last["checkpoint"], ckpt)
        for m in t.history:  # the C trainer's schedule is the one dw.schedule_lr computes
            self.assertAlmostEqual(m["lr"], dw.schedule_lr("linear", 1e-2, 1e-4, 2, 16, m["step"] - 1), delta=1e-12)
        x, y = dw.data(self.shard, seq=T, vocab=256).reader().next(B)
        mine = t.engine.forward(x, y)
        self.assertAlmostEqual(cli_eval_loss(ckpt, self.shard, B, T), mine, delta=2e-6)
        with open(os.path.join(self.d, "run", "metrics.jsonl")) as f:
            self.assertEqual(len(f.readlines()), 16)
        again = dw.compile(dw.capture(os.path.join(self.d, "run"), seq_len=T, batch=B))  # the run: its newest
        self.assertEqual(again.forward(x, y), mine)

    def test_ctrl_c_checkpoints_raises_and_resumes_bit_identically(self):
        whole = self.trainer("whole", 8)
        whole.fit()

        def interrupt(m):
            if m["step"] == 3:
                os.kill(os.getpid(), signal.SIGINT)

        cut = self.trainer("cut", 8, callbacks=[interrupt])
        with self.assertRaises(KeyboardInterrupt):
            cut.fit()
        self.assertEqual(len(cut.history), 3)
        self.assertEqual(cut.checkpoint, os.path.join(self.d, "cut", "ckpt-3"))
        self.assertIs(signal.getsignal(signal.SIGINT), signal.default_int_handler)
        rest = self.trainer("cut", 8, engine=dw.compile(self.graph, weights=None), resume=os.path.join(self.d, "cut"))
        rest.fit()
        got = [m["loss"] for m in cut.history + rest.history]
        self.assertEqual(got, [m["loss"] for m in whole.history])

    def test_ctrl_c_in_the_python_loop(self):
        r = dw.data(self.shard, seq=T, vocab=256).reader()
        batches = [r.next(B) for _ in range(4)]

        def interrupt(m):
            if m["step"] == 3:
                os.kill(os.getpid(), signal.SIGINT)

        t = self.trainer("pyc", 10, dataloader=batches, callbacks=[interrupt])
        with self.assertRaises(KeyboardInterrupt):
            t.fit()
        self.assertEqual(t.checkpoint, os.path.join(self.d, "pyc", "step-3"))
        self.assertEqual(len(t.history), 3)
        with open(os.path.join(t.checkpoint, "trainer.json")) as f:
            self.assertEqual(json.load(f)["step"], 3)

    def test_callback_errors_stop_training_and_propagate(self):
        def boom(m):
            if m["step"] == 2:
                raise RuntimeError("callback says stop")

        t = self.trainer("boom", 10, callbacks=[boom])
        with self.assertRaises(RuntimeError) as e:
            t.fit()
        self.assertIn("callback says stop", str(e.exception))
        self.assertEqual(len(t.history), 2)

    def test_iterable_of_numpy_and_torch_batches(self):
        import torch

        r = dw.data(self.shard, seq=T, vocab=256).reader()
        batches = [r.next(B) for _ in range(6)]
        mixed = [(torch.from_numpy(x).long(), torch.from_numpy(y).long()) if i % 2 else (x, y)
                 for i, (x, y) in enumerate(batches)]
        t = self.trainer("py", 12, dataloader=mixed, ckpt_every=6, keep=0, global_batch=2 * B)
        t.fit()
        losses = [m["loss"] for m in t.history]
        self.assertLess(losses[-1], losses[0] - 1.0)
        ckpt = os.path.join(self.d, "py", "step-12")
        self.assertEqual(t.checkpoint, ckpt)
        self.assertTrue(os.path.isdir(os.path.join(self.d, "py", "step-6")))
        x, y = batches[0]
        self.assertAlmostEqual(cli_eval_loss(ckpt, self.shard, B, T), t.engine.forward(x, y), delta=2e-6)
        with open(os.path.join(ckpt, "trainer.json")) as f:
            self.assertEqual(json.load(f)["step"], 12)
        more = self.trainer("py", 15, engine=dw.compile(self.graph, weights=None), dataloader=batches,
                            resume=os.path.join(self.d, "py"), global_batch=2 * B)
        more.fit()
        self.assertEqual([m["step"] for m in more.history], [13, 14, 15])
        self.assertLess(more.history[0]["loss"], losses[0] - 1.0)  # it continued from the trained weights

    def test_export_hf_round_trip(self):
        e = dw.compile(self.graph, seed=4)
        t = self.trainer("ex", 3, engine=e)
        t.fit()
        out = dw.export(t, os.path.join(self.d, "hf"), format="hf")
        with open(os.path.join(out, "config.json")) as f:
            self.assertEqual(json.load(f), self.graph.config)
        st = safetensors.read(os.path.join(out, "model.safetensors"))
        sd = e.state_dict(torch_tensors=False)
        self.assertEqual(set(st), set(sd))  # llama: Hugging Face names and layouts are Deepwell's
        for n in sd:
            np.testing.assert_array_equal(st[n], sd[n])
        x, y = dw.data(self.shard, seq=T, vocab=256).reader().next(B)
        self.assertAlmostEqual(cli_eval_loss(out, self.shard, B, T), e.forward(x, y), delta=2e-6)
        again = dw.compile(dw.capture(out, seq_len=T, batch=B))  # the exported directory's weights
        self.assertEqual(again.forward(x, y), e.forward(x, y))
        with self.assertRaises(ValueError):
            dw.export(t, os.path.join(self.d, "x"), format="gguf")
        dw.export(e, path=os.path.join(self.d, "p"))  # the origin documents' spelling
        self.assertTrue(os.path.isfile(os.path.join(self.d, "p", "model.safetensors")))

    def test_bad_arguments(self):
        e = dw.compile(self.graph)
        for kw, err in [(dict(steps=0), ValueError), (dict(schedule="step"), ValueError),
                        (dict(optimizer="sgd"), ValueError), (dict(min_lr=1.0), ValueError),
                        (dict(dataloader=None), ValueError)]:
            args = dict(lr=1e-3, dataloader=dw.data(self.shard), steps=2, out=os.path.join(self.d, "bad"))
            args.update(kw)
            with self.assertRaises(err, msg=str(kw)):
                dw.Trainer.from_engine(e, **args)
        with self.assertRaises(TypeError):
            dw.Trainer.from_engine("engine", dataloader="builtin", steps=2, out=self.d)
        t = self.trainer("nodata", 2, engine=e, dataloader=os.path.join(self.d, "missing-*.bin"))
        with self.assertRaises(dw.DeepwellError) as ex:
            t.fit()
        self.assertIn("missing-*.bin", str(ex.exception))
        t = self.trainer("big", 2, engine=e, batch=B + 1)
        with self.assertRaises(dw.InvalidError) as ex:
            t.fit()
        self.assertTrue(str(ex.exception))
        self.assertTrue(math.isfinite(e.forward(np.zeros((1, 4), dtype=np.int32), np.zeros((1, 4), dtype=np.int32))))


if __name__ == "__main__":
    unittest.main()
