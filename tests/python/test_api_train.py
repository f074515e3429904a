"""test_api_train.py — dw.Trainer and dw.export on the CPU: fit() lowers the loss, writes
checkpoints the `deepwell` command loads with the same loss, resumes bit-identically after
Ctrl-C (KeyboardInterrupt), trains from Python iterables of NumPy or torch batches through the
same C trainer (bit for bit the engine calls' losses; errors in the iterable re-raised, the
checkpoints intact; bad batches refused by name), and refuses bad arguments with the C message."""
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
        kw.setdefault("eval_every", 0)
        return dw.Trainer.from_engine(e, lr=1e-2, steps=steps, out=os.path.join(self.d, out), warmup=2,
                                      progress=False, **kw)

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

    def batches(self, n, seed=None):
        """n fresh (inputs, targets) [B, T] batches: the shard's windows, or random ids."""
        if seed is None:
            r = dw.data(self.shard, seq=T, vocab=256).reader()
            return [r.next(B) for _ in range(n)]
        rng = np.random.default_rng(seed)
        out = []
        for _ in range(n):
            w = rng.integers(0, 256, size=(B, T + 1))
            out.append((w[:, :-1], w[:, 1:]))
        return out

    def test_ctrl_c_with_an_iterable(self):
        def interrupt(m):
            if m["step"] == 3:
                os.kill(os.getpid(), signal.SIGINT)

        t = self.trainer("pyc", 10, dataloader=self.batches(4), callbacks=[interrupt])
        with self.assertRaises(KeyboardInterrupt):
            t.fit()
        self.assertEqual(t.checkpoint, os.path.join(self.d, "pyc", "ckpt-3"))
        self.assertEqual(len(t.history), 3)
        with open(os.path.join(t.checkpoint, "state.json")) as f:
            state = json.load(f)
        self.assertEqual(state["step"], 3)
        self.assertEqual(state["data"]["pattern"], "(next_batch)")
        self.assertEqual(int(state["data"]["position"], 16), 3)  # micro-batches taken

    def test_iterable_runs_the_c_trainer_exactly_like_the_engine_calls(self):
        """fit() over an iterable equals a hand-written loop of forward_backward and step on the
        same batches, bit for bit; validation over a val iterable is the mean of forward()."""
        seed = int(np.random.default_rng().integers(1 << 30))
        data, val = self.batches(5, seed), self.batches(3, seed + 1)
        steps, accum = 4, 2
        t = self.trainer("same", steps, dataloader=data, val=val, eval_every=2, eval_batches=2,
                         global_batch=accum * B)
        t.fit()
        e = dw.compile(self.graph, seed=11)
        it = iter(data * 4)
        for step in range(steps):
            e.zero_grad()
            loss = 0.0
            for _ in range(accum):
                x, y = next(it)
                loss += e.forward_backward(x, y, 1.0 / accum)
            lr = dw.schedule_lr("cosine", 1e-2, 1e-4, 2, steps, step)
            norm = e.step(lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, clip=1.0, step=step + 1)
            m = t.history[step]
            self.assertEqual(m["loss"], loss / accum, f"step {step + 1}")
            self.assertEqual(m["grad_norm"], norm, f"step {step + 1}")
            if (step + 1) % 2 == 0:
                self.assertEqual(m["val_loss"], (e.forward(*val[0]) + e.forward(*val[1])) / 2)
            else:
                self.assertIsNone(m["val_loss"])
        x, y = val[2]
        self.assertEqual(t.engine.forward(x, y), e.forward(x, y))

    def test_errors_inside_the_iterable_propagate_and_leave_the_checkpoint(self):
        class Boom(Exception):
            pass

        data = self.batches(3)

        def gen():
            for i in range(5):
                yield data[i % 3]
            raise Boom("the loader broke at batch 5")

        t = self.trainer("gen", 10, dataloader=gen(), ckpt_every=2)
        with self.assertRaises(Boom) as e:
            t.fit()
        self.assertIn("batch 5", str(e.exception))
        self.assertEqual([m["step"] for m in t.history], [1, 2, 3, 4, 5])
        run = os.path.join(self.d, "gen")
        self.assertEqual(sorted(os.listdir(run)), ["ckpt-2", "ckpt-4", "latest", "metrics.jsonl"])
        # the checkpoint is whole: the CLI evaluates it, and training resumes from it
        x, y = data[0]
        self.assertTrue(math.isfinite(cli_eval_loss(os.path.join(run, "ckpt-4"), self.shard, B, T)))
        more = self.trainer("gen", 6, engine=dw.compile(self.graph, weights=None), dataloader=data,
                            resume=run, ckpt_every=2)
        more.fit()
        self.assertEqual([m["step"] for m in more.history], [5, 6])

    def test_bad_batches_are_refused_by_name(self):
        good = self.batches(1)[0]
        x, y = good
        cases = [([(x[:, :-1], y[:, :-1])], ValueError, "expected (batch, seq)"),
                 ([(x.astype(np.float32), y)], TypeError, "integers"),
                 ([(x, np.full_like(y, 300))], dw.InvalidError, "outside the model's vocabulary [0, 256)"),
                 ([(x, y + (1 << 33))], ValueError, "does not fit int32"),
                 ([x], TypeError, "(inputs, targets) pairs"),
                 ([], ValueError, "yielded nothing")]
        for i, (dl, err, text) in enumerate(cases):
            t = self.trainer(f"badb{i}", 2, dataloader=dl)
            with self.assertRaises(err, msg=text) as e:
                t.fit()
            self.assertIn(text, str(e.exception))
        with self.assertRaises(TypeError):  # a file val with an iterable
            self.trainer("badv", 2, dataloader=[good], val=dw.data(self.shard)).fit()

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

        batches = self.batches(6)
        mixed = [(torch.from_numpy(x).long(), torch.from_numpy(y).long()) if i % 2 else (x, y)
                 for i, (x, y) in enumerate(batches)]
        t = self.trainer("py", 12, dataloader=mixed, ckpt_every=6, keep=0, global_batch=2 * B)
        t.fit()
        losses = [m["loss"] for m in t.history]
        self.assertLess(losses[-1], losses[0] - 1.0)
        ckpt = os.path.join(self.d, "py", "ckpt-12")
        self.assertEqual(t.checkpoint, ckpt)
        self.assertTrue(os.path.isdir(os.path.join(self.d, "py", "ckpt-6")))
        x, y = batches[0]
        self.assertAlmostEqual(cli_eval_loss(ckpt, self.shard, B, T), t.engine.forward(x, y), delta=2e-6)
        with open(os.path.join(ckpt, "state.json")) as f:
            state = json.load(f)
        self.assertEqual((state["step"], int(state["data"]["position"], 16)), (12, 24))
        # resume: weights, moments and step from the checkpoint; the iterable from where the caller
        # positions it (here: the same list from its start)
        more = self.trainer("py", 15, engine=dw.compile(self.graph, weights=None), dataloader=batches,
                            resume=os.path.join(self.d, "py"), global_batch=2 * B, ckpt_every=6)
        more.fit()
        self.assertEqual([m["step"] for m in more.history], [13, 14, 15])
        self.assertLess(more.history[0]["loss"], losses[0] - 1.0)  # it continued from the trained weights
        with self.assertRaises(dw.InvalidError) as e:  # a callback run is not resumed from files
            self.trainer("py", 16, dataloader=dw.data(self.shard), resume=os.path.join(self.d, "py"),
                         global_batch=2 * B, ckpt_every=6).fit()
        self.assertIn("(next_batch)", str(e.exception))

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

    def test_cli_flags_reach_dw_train_with_the_cli_defaults(self):
        """The keywords of `deepwell train`'s guardrail, rank and MoE flags land in dw_train_opts;
        left out, each is dw_train_opts_init's default (the CLI's)."""
        from deepwell import _lib, _structs
        import ctypes
        e = dw.compile(self.graph)
        new = ("zero", "ep", "no_overlap", "max_skips", "quant_check_every", "quant_fallback_after", "spike_zscore",
               "spike_window", "max_rollbacks", "fp8_amax_history", "moe_bias_update", "profile")
        ref = _structs.TrainOpts.new()
        _lib.lib().dw_train_opts_init(ctypes.byref(ref), ctypes.sizeof(ref))
        o, _ = self.trainer("defaults", 2, engine=e)._c_opts("builtin", None)
        self.assertEqual({k: getattr(o, k) for k in new}, {k: getattr(ref, k) for k in new})
        given = dict(zero=1, ep=2, overlap=False, max_skips=4, quant_check_every=7, quant_fallback_after=5,
                     spike_zscore=2.5, spike_window=6, max_rollbacks=1, fp8_amax_history=16, moe_bias_update=0.01,
                     profile=True)
        o, _ = self.trainer("given", 2, engine=e, **given)._c_opts("builtin", None)
        want = dict(given, no_overlap=True)
        del want["overlap"]
        self.assertEqual({k: getattr(o, k) for k in want}, want)

    def test_cli_flags_refused_with_the_c_message(self):
        e = dw.compile(self.graph)
        for kw, text in [(dict(spike_zscore=-1.0), "--spike-zscore -1"),
                         (dict(spike_zscore=2.0, spike_window=1), "--spike-window 1"),
                         (dict(spike_zscore=2.0, max_rollbacks=-2), "--max-rollbacks -2"),
                         (dict(fp8_amax_history=-3), "--fp8-amax-history -3"),
                         (dict(max_skips=-1), "--max-skips -1"), (dict(quant_check_every=-5), "--quant-check-every -5"),
                         (dict(zero=7), "--zero 7"), (dict(ep=0), "--ep 0"),
                         (dict(moe_bias_update=2.0), "--moe-bias-update 2")]:
            t = self.trainer("refused", 2, engine=e, **kw)
            with self.assertRaises(dw.DeepwellError, msg=str(kw)) as ex:
                t.fit()
            self.assertIn(text, str(ex.exception), kw)
        with self.assertRaises(ValueError):  # as `deepwell train`: the rollback's settings need it on
            self.trainer("refused", 2, engine=e, spike_window=8)
        t = self.trainer("fit_options", 2, engine=e)  # fit() takes the same keywords
        with self.assertRaises(dw.DeepwellError) as ex:
            t.fit(fp8_amax_history=-4)
        self.assertIn("--fp8-amax-history -4", str(ex.exception))
        with self.assertRaises(TypeError):
            t.fit(spike=1.0)
        t.fit(fp8_amax_history=0, steps=3, max_skips=4)
        self.assertEqual((len(t.history), t.steps, t._c_opts("builtin", None)[0].max_skips), (3, 3, 4))

    def test_spike_rollback_and_delayed_scaling_are_checkpointed(self):
        """spike_zscore and fp8_amax_history run: their state is in the checkpoint's state.json."""
        e = dw.compile(self.graph, precision="fp8_tensor", fallback="none", seed=5)
        t = self.trainer("guarded", 4, engine=e, spike_zscore=50.0, spike_window=2, max_rollbacks=0,
                         fp8_amax_history=3)
        t.fit()
        with open(os.path.join(t.checkpoint, "state.json")) as f:
            state = json.load(f)
        self.assertIn("spike", state)
        self.assertIn("fp8_amax_history", state)
        # the rest of dw_train_progress reaches the metrics: quantised layers report their counters
        self.assertTrue(all(m["quant_overflow"] is not None and m["quant_underflow"] >= 0 for m in t.history))
        self.assertTrue(all(m["skipped"] is None and m["moe_dropped"] is None for m in t.history))

    def test_fused_head_trains_the_same_loss(self):
        """dw.compile(fused_head=True): the head and the loss as one op, the same loss on the CPU;
        its logits cannot be read."""
        x, y = dw.data(self.shard, seq=T, vocab=256).reader().next(B)
        plain, fused = dw.compile(self.graph, seed=9), dw.compile(self.graph, seed=9, fused_head=True, head_chunk=32)
        self.assertEqual(plain.head_chunk, 0)
        self.assertEqual(fused.head_chunk, 32)
        self.assertAlmostEqual(fused.forward_backward(x, y), plain.forward_backward(x, y), delta=1e-5)
        with self.assertRaises(dw.DeepwellError):
            fused.forward(x, y, logits=True)
        with self.assertRaises(dw.InvalidError):
            dw.compile(self.graph, fused_head=True, head_chunk=-1)

    def test_recompute_same_bits(self):
        """dw.compile(recompute=...): selective, full and full over the first block give the loss,
        every gradient and the next step's loss of the program without recompute, bit for bit,
        with a smaller activation pool; other values are refused."""
        x, y = dw.data(self.shard, seq=T, vocab=256).reader().next(B)
        engines = {rc: dw.compile(self.graph, seed=11, recompute=rc) for rc in (None, "selective", "full", 1)}
        act = {rc: e.pool_bytes["activations"] for rc, e in engines.items()}
        for rc in ("selective", "full", 1):
            self.assertLess(act[rc], act[None], rc)
        losses = {rc: e.forward_backward(x, y) for rc, e in engines.items()}
        grads = {rc: e.grads() for rc, e in engines.items()}
        for rc in ("selective", "full", 1):
            self.assertEqual(losses[rc], losses[None], rc)
            for n, g in grads[None].items():
                np.testing.assert_array_equal(grads[rc][n], g, err_msg=f"{rc}: {n}")
        for e in engines.values():
            e.step(lr=3e-3)
            e.zero_grad()
        after = {rc: e.forward_backward(x, y) for rc, e in engines.items()}
        self.assertTrue(all(v == after[None] for v in after.values()), after)
        for bad in ("partial", 0, -2, True, 1.5):
            with self.assertRaises(ValueError):
                dw.compile(self.graph, recompute=bad)


if __name__ == "__main__":
    unittest.main()
