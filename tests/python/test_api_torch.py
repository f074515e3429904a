"""test_api_torch.py — dw.capture of torch modules: a transformers-style module (a .config with
to_dict() and model_type, parameters under Hugging Face names, GPT-2's Conv1D layout) built here on
fresh random configs and weights from tests/python/parity.py's reference models captures to the
graph of its config with its weights: the engine's loss equals the module's (float64 reference),
weights round-trip module -> engine -> export -> module exactly, and training in Deepwell then
loading the export into the module gives the engine's loss. Unknown modules are refused by name."""
import os
import random
import tempfile
import unittest

import numpy as np
import torch

from test_api_util import dw

import parity  # tests/python/parity.py: reference models, random configs and weights
from deepwell import safetensors


class Config:
    """The part of transformers.PretrainedConfig that capture reads."""

    def __init__(self, d):
        self._d = dict(d)
        self.model_type = d["model_type"]

    def to_dict(self):
        return dict(self._d)


class HFLike(torch.nn.Module):
    """Parameters under Hugging Face names (nested modules), a tied LM head when configured,
    GPT-2's attention buffers; forward(tok) -> logits by parity.py's reference."""

    def __init__(self, c, weights):
        super().__init__()
        self.config = Config({k: v for k, v in c.items() if k != "layout"})  # layout: of the weights
        self.c = c
        for name, t in weights.items():
            self._module(name).register_parameter(name.rsplit(".", 1)[1], torch.nn.Parameter(t.float()))
        if c["model_type"] == "gpt2":  # transformers' non-parameter buffers, ignorable by name
            self._module("transformer.h.0.attn.x").register_buffer("masked_bias", torch.tensor(-1e4))
            self._module("transformer.h.0.attn.x").register_buffer("bias", torch.ones(1, 1, 4, 4, dtype=torch.bool))
        elif c.get("tie_word_embeddings"):
            self._module("lm_head.weight").weight = self.get_parameter("model.embed_tokens.weight")

    def _module(self, name):
        m = self
        for part in name.split(".")[:-1]:
            if not hasattr(m, part):
                m.add_module(part, torch.nn.Module())
            m = getattr(m, part)
        return m

    def forward(self, tok):
        w = {n: p.double() for n, p in self.named_parameters()}
        if self.c["model_type"] == "gpt2":
            return parity.gpt2_forward(self.c, w, tok)
        return parity.llama_forward(self.c, w, tok)


def loss_of(module, x, y):
    with torch.no_grad():
        logits = module(torch.from_numpy(x).long())
        return float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                       torch.from_numpy(y).long().reshape(-1)))


class TorchCapture(unittest.TestCase):
    def setUp(self):
        self.seed = int.from_bytes(os.urandom(4), "little")
        self.rng = random.Random(self.seed)
        self.gen = torch.Generator().manual_seed(self.seed)

    def case(self, family):
        c = parity.random_config(family, self.rng)
        for k in ("output_router_logits", "router_aux_loss_coef", "router_z_loss_coef"):
            c.pop(k, None)
        if family == "llama":
            c["tie_word_embeddings"] = True  # a tied head: both names in state_dict
        return c, HFLike(c, parity.random_weights(c, self.gen))

    def test_module_captures_trains_and_round_trips(self):
        for family in ("gpt2", "llama", "qwen2", "mixtral"):
            with self.subTest(family=family, seed=self.seed):
                c, m = self.case(family)
                B, T = 2, self.rng.randint(4, 24)
                nrng = np.random.default_rng(self.seed)
                x = nrng.integers(0, c["vocab_size"], size=(B, T))
                y = nrng.integers(0, c["vocab_size"], size=(B, T))
                g = dw.capture(m, seq_len=T, batch=B)
                self.assertEqual(g.model_type, family)
                self.assertEqual(g.params, sum(p.numel() for p in m.parameters()))  # tied: counted once
                e = dw.compile(g)
                ref = loss_of(m, x, y)
                self.assertAlmostEqual(e.forward(x, y), ref, delta=1e-5 * max(1.0, abs(ref)))
                out = e(torch.from_numpy(x))  # called like the module: its logits, as torch
                with torch.no_grad():
                    want = m(torch.from_numpy(x).long())
                self.assertTrue(torch.allclose(out.double(), want, rtol=1e-4, atol=1e-5 * want.abs().max()))
                with tempfile.TemporaryDirectory() as d:
                    dw.export(e, d)  # module -> engine -> file: the module's tensors, bit for bit
                    st = safetensors.read(os.path.join(d, "model.safetensors"))
                    for name, t in m.state_dict().items():
                        if name in st:
                            np.testing.assert_array_equal(st[name], t.float().numpy(), err_msg=name)
                    missing = {n for n, _ in m.named_parameters()} - set(st)
                    self.assertEqual(missing, set())
                    for _ in range(4):  # train in Deepwell, then load the export into the module
                        e.zero_grad()
                        e.forward_backward(x, y)
                        e.step(lr=1e-2)
                    dw.export(e, d)
                    st = safetensors.read(os.path.join(d, "model.safetensors"))
                    m.load_state_dict({n: torch.from_numpy(v) for n, v in st.items()}, strict=False)
                trained = e.forward(x, y)
                self.assertLess(trained, ref)
                self.assertAlmostEqual(loss_of(m, x, y), trained, delta=1e-5 * max(1.0, abs(trained)))

    def test_engine_state_dict_layouts(self):
        c, m = self.case("gpt2")
        e = dw.compile(dw.capture(m, seq_len=8))
        sd = e.state_dict()
        w = m.get_parameter("transformer.h.0.attn.c_attn.weight")  # Conv1D: in x out
        self.assertTrue(torch.equal(sd["transformer.h.0.attn.c_attn.weight"], w.detach().T))
        self.assertTrue(torch.equal(sd["transformer.wte.weight"], m.get_parameter("transformer.wte.weight").detach()))

    def test_unknown_modules_are_refused_by_name(self):
        seq = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10))
        with self.assertRaises(TypeError) as e:
            dw.capture(seq)
        msg = str(e.exception)
        self.assertIn("Sequential", msg)
        self.assertIn("torch.fx", msg)
        for t in ("gpt2", "llama", "mixtral"):
            self.assertIn(t, msg)

        class Bert(torch.nn.Module):
            config = Config({"model_type": "bert"})

        with self.assertRaises(TypeError) as e:
            dw.capture(Bert())
        self.assertIn("'bert'", str(e.exception))

    def test_wrong_weights_name_the_tensor(self):
        c, m = self.case("llama")
        m.model.layers.register_parameter("stray", torch.nn.Parameter(torch.zeros(3)))
        with self.assertRaises(dw.FormatError) as e:
            dw.compile(dw.capture(m, seq_len=8))
        self.assertIn("model.layers.stray", str(e.exception))


if __name__ == "__main__":
    unittest.main()
