"""test_api_torch.py — dw.capture of torch modules: a transformers-style module (a .config with
to_dict() and model_type, parameters under Hugging Face names, GPT-2's Conv1D layout) built here on
fresh random configs and weights from tests/python/parity.py's reference models captures to the
graph of its config with its weights: the engine's loss equals the module's (float64 reference),
weights round-trip module -> engine -> export -> module exactly, and training in Deepwell then
loading the export into the module gives the engine's loss. Unknown modules are refused by name."""
import math
import os
import random
import tempfile
import unittest

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

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


# ---- plain modules, captured through torch.fx -------------------------------------------------


def make(kind, V=97, C=32, L=2, NH=4, NKV=2, FF=48, T=16, tie=True, theta=500000.0, act="gelu", causal=True, P=None):
    """anchor_train.py's nanoGPT-style GPT-2 and Llama modules, small, for torch 1.13 (no SDPA)."""
    HD = C // NH
    class RMS(nn.Module):
        def __init__(s): super().__init__(); s.w = nn.Parameter(1 + 0.1 * torch.randn(C)); s.eps = 1e-5
        def forward(s, x): return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s.eps) * s.w
    def rope(x, cos, sin):
        x1, x2 = x[..., : HD // 2], x[..., HD // 2:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin
    def attend(q, k, v):
        s = q @ k.transpose(-1, -2) / math.sqrt(HD)
        mask = torch.ones(T, T, dtype=torch.bool).tril() if causal else torch.ones(T, T, dtype=torch.bool)
        return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v
    class GPTBlock(nn.Module):
        def __init__(s):
            super().__init__()
            s.ln1 = nn.LayerNorm(C); s.qkv = nn.Linear(C, 3 * C); s.proj = nn.Linear(C, C)
            s.ln2 = nn.LayerNorm(C); s.fc = nn.Linear(C, FF); s.fc2 = nn.Linear(FF, C)
        def forward(s, x, cos=None, sin=None):
            B = x.shape[0]
            q, k, v = s.qkv(s.ln1(x)).split(C, dim=2)
            q, k, v = [t.view(B, T, NH, HD).transpose(1, 2) for t in (q, k, v)]
            y = attend(q, k, v).transpose(1, 2).reshape(B, T, C)
            x = x + s.proj(y)
            h = s.fc(s.ln2(x))
            h = F.gelu(h, approximate="tanh") if act == "gelu" else F.gelu(h) if act == "gelu_exact" else torch.relu(h)
            return x + s.fc2(h)
    class LlamaBlock(nn.Module):
        def __init__(s):
            super().__init__()
            s.n1 = RMS(); s.q = nn.Linear(C, C, bias=False); s.k = nn.Linear(C, NKV * HD, bias=False)
            s.v = nn.Linear(C, NKV * HD, bias=False); s.o = nn.Linear(C, C, bias=False)
            s.n2 = RMS(); s.g = nn.Linear(C, FF, bias=False); s.u = nn.Linear(C, FF, bias=False)
            s.d = nn.Linear(FF, C, bias=False)
        def forward(s, x, cos, sin):
            B = x.shape[0]
            h = s.n1(x)
            q = s.q(h).view(B, T, NH, HD).transpose(1, 2); k = s.k(h).view(B, T, NKV, HD).transpose(1, 2)
            v = s.v(h).view(B, T, NKV, HD).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            k, v = k.repeat_interleave(NH // NKV, dim=1), v.repeat_interleave(NH // NKV, dim=1)
            y = attend(q, k, v)
            x = x + s.o(y.transpose(1, 2).reshape(B, T, C))
            h = s.n2(x)
            return x + s.d(F.silu(s.g(h)) * s.u(h))
    class Model(nn.Module):
        def __init__(s):
            super().__init__()
            s.emb = nn.Embedding(V, C)
            s.pos = nn.Embedding(P or T, C) if kind == "gpt2" else None
            blk = GPTBlock if kind == "gpt2" else LlamaBlock
            s.layers = nn.ModuleList([blk() for _ in range(L)])
            s.nf = nn.LayerNorm(C) if kind == "gpt2" else RMS()
            s.head = nn.Linear(C, V, bias=False)
            if tie: s.head.weight = s.emb.weight
            inv = 1.0 / (theta ** (torch.arange(0, HD, 2).float() / HD))
            f = torch.outer(torch.arange(T).float(), inv); f = torch.cat((f, f), dim=-1)
            s.register_buffer("cos", f.cos()); s.register_buffer("sin", f.sin())
        def forward(s, idx, tgt):
            x = s.emb(idx)
            if s.pos is not None: x = x + s.pos(torch.arange(T))
            for b in s.layers: x = b(x, s.cos, s.sin)
            return F.cross_entropy(s.head(s.nf(x)).float().view(-1, V), tgt.view(-1))
    return Model()


class FxCapture(unittest.TestCase):
    def test_anchor_style_modules_capture_and_train_alike(self):
        seed = int.from_bytes(os.urandom(4), "little")
        torch.manual_seed(seed)
        rng = random.Random(seed)
        for kind in ("gpt2", "llama"):
            with self.subTest(kind=kind, seed=seed):
                tie = rng.random() < 0.5
                m = make(kind, tie=tie, theta=rng.choice([10000.0, 500000.0]))
                g = dw.capture(m, seq_len=16, batch=2)
                self.assertEqual(g.model_type, kind)
                self.assertEqual(g.params, sum(p.numel() for p in m.parameters()))  # tied: once
                self.assertEqual(g.config["tie_word_embeddings"], tie)
                e = dw.compile(g)
                x = torch.randint(0, 97, (2, 16))
                y = torch.randint(0, 97, (2, 16))
                opt = torch.optim.AdamW(m.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
                losses = []
                for step in range(4):  # the same AdamW steps from the same weights: the same losses
                    opt.zero_grad()
                    ref = m(x, y)
                    ref.backward()
                    opt.step()
                    e.zero_grad()
                    got = e.forward_backward(x, y)
                    e.step(lr=1e-2, weight_decay=0.0, clip=0.0)
                    self.assertAlmostEqual(got, float(ref), delta=2e-5 * max(1.0, float(ref)), msg=f"step {step}")
                    losses.append(got)
                self.assertEqual(len(set(losses)), 4)  # the weights moved

    def test_preset_shapes_give_the_presets_graphs(self):
        for kind, preset, shape in [("gpt2", "gpt2-tiny", dict(V=256, C=128, L=4, NH=4, NKV=4, FF=512, P=256)),
                                    ("llama", "llama-tiny", dict(V=256, C=128, L=4, NH=4, NKV=2, FF=384,
                                                                 tie=False, theta=10000.0))]:
            with self.subTest(kind=kind):
                g = dw.capture(make(kind, **shape), seq_len=16)
                ref = dw.capture(preset, seq_len=16)
                self.assertEqual(g.params, ref.params)
                strip = lambda d: [(n["name"], n["op"]) for n in d["nodes"]]  # noqa: E731
                self.assertEqual(strip(g.to_dict()), strip(ref.to_dict()))

    def test_unmapped_ops_and_other_functions_are_refused(self):
        with self.assertRaises(TypeError) as e:
            dw.capture(make("gpt2", act="relu"), seq_len=16)
        self.assertIn("relu", str(e.exception))
        self.assertIn("node", str(e.exception))
        with self.assertRaises(TypeError) as e:
            dw.capture(make("gpt2", act="gelu_exact"), seq_len=16)
        self.assertIn("approximate='tanh'", str(e.exception))
        with self.assertRaises(TypeError) as e:  # traced fine, read as GPT-2, but computes something else
            dw.capture(make("gpt2", causal=False), seq_len=16)
        self.assertIn("loss on a random batch", str(e.exception))


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

    def test_optimize_is_called_like_the_module(self):
        c, m = self.case("llama")
        fast = dw.optimize(m, batch_size=2, seq_len=12)
        x = torch.randint(0, c["vocab_size"], (2, 12))
        with torch.no_grad():
            want = m(x)
        got = fast(x)
        self.assertIsInstance(got, torch.Tensor)
        self.assertTrue(torch.allclose(got.double(), want, rtol=1e-4, atol=1e-5 * want.abs().max()))
        with self.assertRaisesRegex(TypeError, "Tanh"):  # feed-forward nets: test_api_optimize.py
            dw.optimize(nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8)), batch_size=2, seq_len=4)

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
        self.assertIn("torch.fx", msg)  # refused by the fx reader: no token embedding feeds a decoder
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
