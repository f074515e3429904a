"""test_api_core.py — the Python API's probe, hardware, capture, plan, compile, engine, dryrun and
data calls against the C library and the `deepwell` command: same numbers, same documents, the C
message in every exception. Runs on the CPU (ctest: DEEPWELL_LIB, DEEPWELL_CLI)."""
import json
import os
import tempfile
import unittest

import numpy as np

from test_api_util import cli, dw, tiny_llama


class Probe(unittest.TestCase):
    def test_library_is_the_one_named(self):
        self.assertEqual(os.path.realpath(dw.library_path()), os.path.realpath(os.environ["DEEPWELL_LIB"]))
        self.assertRegex(dw.version(), r"^\d+\.\d+\.\d+ ")

    def test_probe_without_gpu_says_why(self):
        hw = dw.probe()
        self.assertEqual(hw.gpu_count, len(hw.gpus))
        self.assertEqual(hw.info["source"], "probe")
        if hw.gpu_count == 0:
            self.assertTrue(hw.notice)
            self.assertEqual(hw.features, [])

    def test_presets_match_the_cli_json(self):
        names = dw.presets()
        self.assertIn("h100-sxm", names)
        for name in names:
            hw = dw.hardware(name)
            rc, out, err = cli("probe", "--preset", name, "--json")
            self.assertEqual(rc, 0, err)
            self.assertEqual(hw.to_dict(), json.loads(out), name)
        h = dw.hardware("h100-sxm")
        g = h.gpus[0]
        self.assertEqual((g["sm"], h.gpu_count), (90, 8))
        self.assertEqual((g.name, g.is_hopper, g.is_blackwell), (g["name"], True, False))
        self.assertTrue(dw.hardware("b200").gpus[0].is_blackwell)
        self.assertIn("fp8", h.features)
        self.assertNotIn("tcgen05", h.features)
        self.assertIn("tcgen05", dw.hardware("b200").features)
        peers = h.peers
        self.assertEqual(len(peers), 8)
        self.assertIsNone(peers[3][3])
        self.assertIn("access", peers[0][1])

    def test_keep_gpus_and_nodes(self):
        h = dw.hardware("h200", nodes=2, gpus=1)
        self.assertEqual((h.gpu_count, h.info["nodes"]), (1, 2))
        with self.assertRaises(dw.InvalidError) as e:
            h.keep_gpus(4)
        self.assertIn("4", str(e.exception))
        with self.assertRaises(dw.IOFailure) as e:
            dw.hardware("/nonexistent/hw.json")
        self.assertIn("/nonexistent/hw.json", str(e.exception))


class Capture(unittest.TestCase):
    def test_presets_params_are_the_c_counts(self):
        for name in dw.model_presets():
            info = dw.model_info(name)
            if info["planning_only"]:
                with self.assertRaises(dw.UnsupportedError):
                    dw.capture(name, seq_len=16)
                continue
            g = dw.capture(name, seq_len=16, batch=2)
            rc, out, err = cli("capture", name, "--json", "--seq", 16, "--batch", 2)
            self.assertEqual(rc, 0, err)
            doc = json.loads(out)
            self.assertEqual(g.params, doc["params"], name)
            self.assertEqual(g.params, info["params"], name)
            self.assertEqual((g.batch, g.seq, g.model_type), (2, 16, info["model_type"]))
            self.assertAlmostEqual(g.flops_per_token, doc["flops_per_token"], delta=1e-6 * doc["flops_per_token"])

    def test_dict_and_directory_give_one_graph(self):
        cfg = tiny_llama(num_hidden_layers=3)
        a = dw.capture(cfg, seq_len=24, batch=3)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cfg, f)
            b = dw.capture(d, seq_len=24, batch=3)
            c = dw.capture(os.path.join(d, "config.json"), seq_len=24, batch=3)
            self.assertEqual(a.to_dict()["nodes"], b.to_dict()["nodes"])
            self.assertEqual(b.to_dict(), c.to_dict())
        self.assertEqual(a.config["num_hidden_layers"], 3)
        self.assertIn("model.layers.2.mlp.down_proj", a.listing())
        src = a.source
        self.assertTrue(os.path.isfile(os.path.join(src, "config.json")))
        a.close()
        self.assertFalse(os.path.exists(src), "the temporary config outlived its graph")
        self.assertTrue(a.closed)
        with self.assertRaises(ValueError):
            a.params

    def test_graph_json_round_trip(self):
        g = dw.capture("gpt2-tiny", seq_len=32)
        h = dw.graph_from_json(g.to_json())
        self.assertEqual((h.params, h.node_count, h.seq), (g.params, g.node_count, g.seq))

    def test_errors_carry_the_c_message(self):
        rc, _, err = cli("capture", "no-such-model")
        self.assertNotEqual(rc, 0)
        with self.assertRaises(dw.DeepwellError) as e:
            dw.capture("no-such-model")
        self.assertIn(str(e.exception), err)  # the CLI prints the library's message after its prefix
        self.assertIn("gpt2-tiny", str(e.exception))
        with self.assertRaises(dw.DeepwellError) as e:
            dw.capture(tiny_llama(num_hidden_layers=0))
        self.assertIn("num_hidden_layers", str(e.exception))
        with self.assertRaises(dw.DeepwellError) as e:
            dw.capture(tiny_llama(), seq_len=65)
        self.assertIn("65", str(e.exception))
        with self.assertRaises(ValueError):
            dw.capture("gpt2-tiny", batch=0)
        with self.assertRaises(ValueError):
            dw.capture("gpt2-tiny", seq_len=2.5)
        with self.assertRaises(TypeError) as e:
            dw.capture(object())
        self.assertIn("llama", str(e.exception))


class Planning(unittest.TestCase):
    def test_autoplan_is_the_cli_plan(self):
        hw = dw.hardware("h100-sxm")
        p = dw.autoplan("llama-1b", hw=hw, seq_len=2048, global_batch=64, precision="fp8_block")
        rc, out, err = cli("plan", "llama-1b", "--hw", "h100-sxm", "--seq", 2048, "--global-batch", 64,
                           "--precision", "fp8_block", "--json")
        self.assertEqual(rc, 0, err)
        best = json.loads(out)["best"]
        self.assertEqual(p.summary, best["summary"])
        self.assertAlmostEqual(p.cost["step"], best["step_time_s"], delta=1e-9 + 1e-9 * best["step_time_s"])
        self.assertLessEqual(p.memory["total"], p.memory["limit"])
        self.assertLessEqual(p.world_size, 8)
        self.assertEqual(p.layout["recipe"], "fp8_block")
        self.assertTrue(p.checks["constraints_ok"])
        self.assertEqual(p.to_dict()["summary"], p.summary)

    def test_autoplan_from_graph_and_moe(self):
        g = dw.capture("mixtral-tiny", seq_len=64, batch=8)
        p = dw.autoplan(g, hw=dw.hardware("h100-sxm", gpus=2), moe={"experts": 8, "top_k": 2,
                                                                     "capacity_factor": 1.25})
        self.assertEqual(p.info["experts"], 8)
        self.assertEqual(p.info["moe_capacity"], 1.25)
        self.assertEqual((p.layout["seq"], p.layout["global_batch"]), (64, 8))
        with self.assertRaises(ValueError) as e:
            dw.autoplan(g, hw=dw.hardware("h100-sxm"), moe={"expert": 8})
        self.assertIn("expert", str(e.exception))
        with self.assertRaises(ValueError) as e:
            dw.autoplan(g, hw=dw.hardware("h100-sxm"), precision="fp9")
        self.assertIn("bf16", str(e.exception))

    def test_autoplan_for_an_architecture(self):
        p = dw.autoplan("gpt2-124m", arch="blackwell", seq_len=1024, global_batch=32)
        self.assertIn("B200", p.info["gpu"])
        with self.assertRaises(ValueError) as e:
            dw.autoplan("gpt2-124m", arch="ampere", seq_len=1024, global_batch=32)
        self.assertIn("blackwell", str(e.exception))

    def test_autoplan_without_gpus_is_refused_by_c(self):
        hw = dw.probe()
        if hw.gpu_count:
            self.skipTest("this machine has a GPU")
        with self.assertRaises(dw.InvalidError) as e:
            dw.autoplan("llama-tiny", hw=hw, seq_len=64, global_batch=8)
        self.assertIn("GPU", str(e.exception))

    def test_single_plan_has_no_predictions(self):
        p = dw.single_plan(2, 32)
        self.assertEqual(p.layout["micro_batch"], 2)
        with self.assertRaises(dw.InvalidError):
            p.cost


class EngineCalls(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.g = dw.capture(tiny_llama(), seq_len=16, batch=2)
        rng = np.random.default_rng(7)
        cls.x = rng.integers(0, 256, size=(2, 16))
        cls.y = rng.integers(0, 256, size=(2, 16))

    def test_forward_logits_and_loss(self):
        e = dw.compile(self.g, seed=3)
        loss, logits = e.forward(self.x, self.y, logits=True)
        self.assertEqual(logits.shape, (2, 16, 256))
        z = logits.astype(np.float64)
        lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
        ref = np.mean(lse - np.take_along_axis(z, self.y[..., None], -1)[..., 0])
        self.assertAlmostEqual(loss, ref, delta=1e-5)
        self.assertIsNone(e.forward(self.x))
        np.testing.assert_array_equal(e(self.x), logits)  # the engine is callable: logits
        e.close()
        self.assertTrue(e.closed)

    def test_state_dict_round_trip_and_steps(self):
        e = dw.compile(self.g, seed=5)
        sd = e.state_dict(torch_tensors=False)
        self.assertEqual(list(sd), e.param_names())
        self.assertEqual(sum(v.size for v in sd.values()), self.g.params)
        f = dw.compile(self.g, weights=None)
        self.assertEqual(float(np.abs(f.state_dict(torch_tensors=False)["model.norm.weight"]).sum()), 0.0)
        f.load_state_dict(sd)
        self.assertEqual(f.forward(self.x, self.y), e.forward(self.x, self.y))
        with self.assertRaises(KeyError):
            f.load_state_dict({"model.norm.weight": sd["model.norm.weight"]})
        with self.assertRaises(ValueError):
            f.load_state_dict({**sd, "model.norm.weight": np.ones(3)})
        first = e.forward(self.x, self.y)
        for _ in range(5):
            e.zero_grad()
            e.forward_backward(self.x, self.y)
            norm = e.step(lr=1e-2)
            self.assertGreater(norm, 0)
        self.assertEqual(e.step_count, 5)
        self.assertLess(e.forward(self.x, self.y), first - 0.1)
        self.assertTrue(any(np.abs(g).sum() > 0 for g in e.grads().values()))

    def test_engine_errors_carry_the_c_message(self):
        e = dw.compile(self.g)
        bad = self.x.copy()
        bad[1, 3] = 256
        with self.assertRaises(dw.InvalidError) as ex:
            e.forward(bad, self.y)
        self.assertIn("outside the vocabulary", str(ex.exception))
        with self.assertRaises(dw.InvalidError) as ex:
            e.forward(np.zeros((3, 16), dtype=np.int64), np.zeros((3, 16), dtype=np.int64))
        self.assertIn("capacity", str(ex.exception))
        with self.assertRaises(TypeError):
            e.forward(np.zeros((2, 16)), None)
        with self.assertRaises(dw.DeepwellError) as ex:
            e.load_weights("/nonexistent/model.safetensors")
        self.assertIn("/nonexistent/model.safetensors", str(ex.exception))

    def test_precision_policies(self):
        e = dw.compile(self.g, precision="fp8_block", fallback="safe")
        self.assertEqual(e.precision, "fp8_block")
        self.assertIn("fp8_block", e.report())
        pol = {"default": "mxfp8", "rules": [{"match": "*.self_attn.*", "recipe": "bf16"}]}
        e2 = dw.compile(self.g, policy=pol)
        self.assertEqual(e2.policy.to_dict()["default"], "mxfp8")
        self.assertTrue(np.isfinite(e2.forward(self.x, self.y)))
        with self.assertRaises(dw.DeepwellError) as ex:
            dw.compile(self.g, policy={"default": "fp9"})
        self.assertIn("fp9", str(ex.exception))
        # a rule's bf16_passes (docs/precision.md) survives the round trip; a bad pass name is refused
        pw = {"default": "fp8_block", "rules": [{"op": "linear", "recipe": "fp8_block", "bf16_passes": ["wgrad"]}]}
        self.assertEqual(dw.make_policy(policy=pw).to_dict()["rules"][0]["bf16_passes"], ["wgrad"])
        # an explicit [] (the MoE experts' wgrad quantised too, not BF16 as by default) stays apart from no field
        pe = {"default": "fp8_block", "rules": [{"op": "moe_linear", "recipe": "fp8_block", "bf16_passes": []},
                                                {"op": "linear", "recipe": "fp8_block"}]}
        rules = dw.make_policy(policy=pe).to_dict()["rules"]
        self.assertEqual(rules[0]["bf16_passes"], [])
        self.assertNotIn("bf16_passes", rules[1])
        with self.assertRaises(dw.DeepwellError) as ex:
            dw.make_policy(policy={"default": "fp8_block", "rules": [{"op": "linear", "recipe": "fp8_block",
                                                                     "bf16_passes": ["bwd"]}]})
        self.assertIn("bf16_passes", str(ex.exception))
        with self.assertRaises(ValueError):
            dw.compile(self.g, policy=pol, precision="bf16")
        with self.assertRaises(ValueError):
            dw.compile(self.g, precision="bf16", fallback="always")

    def test_generate_and_tokenizers(self):
        e = dw.compile(self.g)
        out = e.generate([1, 2, 3], 5, temperature=0)
        self.assertEqual(out[:3], [1, 2, 3])
        self.assertEqual(len(out), 8)
        self.assertEqual(out, e.generate([1, 2, 3], 5, temperature=0))
        self.assertEqual(dw.tokenize("a+b"), [97, 43, 98])
        self.assertEqual(dw.detokenize([104, 105]), "hi")
        with self.assertRaises(dw.InvalidError) as ex:
            dw.tokenize("1 2 300", tokenizer="ids", vocab=256)
        self.assertIn("300", str(ex.exception))


class Dryrun(unittest.TestCase):
    def test_report_pools_prediction_and_measurement(self):
        g = dw.capture(tiny_llama(), seq_len=32, batch=2)
        e = dw.compile(g)
        r = dw.dryrun(e, hw=dw.hardware("h100-sxm", gpus=1), steps=1)
        self.assertEqual(r["pools"], e.pool_bytes)
        self.assertEqual(r["total_bytes"], sum(e.pool_bytes.values()))
        self.assertGreater(r["pools"]["weights"], 4 * g.params - 1)
        p = r["predicted"]
        self.assertGreater(p["step_time_s"], 0)
        self.assertIn("H100", p["gpu"])
        self.assertTrue(r["checks"]["memory_ok"])
        self.assertGreater(r["measured"]["step_time_s"], 0)
        self.assertIn("predicted on one", str(r))
        whole = dw.dryrun(e, hw=dw.hardware("h100-sxm", nodes=2))  # predicted for one of its GPUs
        self.assertEqual(whole["predicted"]["step_time_s"], p["step_time_s"])
        plan = dw.autoplan(g, hw=dw.hardware("h100-sxm", gpus=1))
        rp = dw.dryrun(plan)
        self.assertEqual(rp["total_bytes"], plan.memory["total"])
        if dw.probe().gpu_count == 0:
            self.assertIsNone(dw.dryrun(e)["predicted"])
        with self.assertRaises(TypeError):
            dw.dryrun("llama-tiny")


class Data(unittest.TestCase):
    def test_shards_round_trip_and_reader(self):
        rng = np.random.default_rng(1)
        with tempfile.TemporaryDirectory() as d:
            small = rng.integers(0, 65536, size=1000)
            big = rng.integers(0, 200000, size=1000)
            self.assertEqual(dw.write_shard(os.path.join(d, "a.bin"), small), 2)
            self.assertEqual(dw.write_shard(os.path.join(d, "b.bin"), big), 4)
            self.assertEqual(dw.write_shard(os.path.join(d, "c.bin"), small[:10], vocab=70000), 4)
            np.testing.assert_array_equal(dw.read_shard(os.path.join(d, "a.bin")), small)
            np.testing.assert_array_equal(dw.read_shard(os.path.join(d, "b.bin")), big)
            r = dw.data(os.path.join(d, "b.bin")).reader(seq=10, vocab=200000)
            self.assertEqual(r.windows, (1000 - 1) // 10)
            x, y = r.next(3)
            np.testing.assert_array_equal(x.reshape(-1), big[:30])
            np.testing.assert_array_equal(y.reshape(-1), big[1:31])
            with self.assertRaises(dw.FormatError) as e:
                dw.data(os.path.join(d, "a.bin")).reader(seq=10, vocab=256)
            self.assertIn("a.bin", str(e.exception))
            self.assertIn("byte offset", str(e.exception))
            with self.assertRaises(ValueError):
                dw.write_shard(os.path.join(d, "z.bin"), [1, 2, 300], vocab=256)
            batches = list(zip(range(2), dw.data(os.path.join(d, "a.bin"), seq=8, batch=2, vocab=65536)))
            self.assertEqual(batches[1][1][0].shape, (2, 8))


if __name__ == "__main__":
    unittest.main()
