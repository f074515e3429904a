"""test_api_fx.py — dw.capture of plain nn.Modules through torch.fx beyond the GPT-2/Llama presets'
shapes: fresh random modules with untied heads, other MLP ratios, no biases or biases on some
projections only (Qwen-style q/k/v), separate or packed q/k/v, LayerNorms without affine
parameters, GQA, RoPE theta, returning logits or the loss. Each must give the captured model the
module's own loss on the same weights and a fresh random batch; parallel attention + MLP blocks
and unmapped functions are refused naming the node."""
import math
import os
import random
import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F

from test_api_util import dw


def build(kind, rng, V=61, C=32, L=2, NH=4, NKV=2, FF=48, T=8, tie=False, bias="none", packed=True, affine=True,
          theta=10000.0, returns="loss", parallel=None, extra=None):
    """A random decoder module. kind gpt2|llama; bias none|all|qkv (llama) or none|all (gpt2);
    parallel None|"shared" (one norm feeds attention and MLP)|"two" (two norms of the block input);
    extra: a function applied to the MLP's hidden state (an unmapped op)."""
    HD = C // NH

    class RMS(nn.Module):
        def __init__(s):
            super().__init__()
            s.w = nn.Parameter(1 + 0.1 * torch.randn(C))

        def forward(s, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * s.w

    def norm():
        return nn.LayerNorm(C, elementwise_affine=affine) if kind == "gpt2" else RMS()

    def rope(x, cos, sin):
        x1, x2 = x[..., : HD // 2], x[..., HD // 2:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    def attend(q, k, v):
        s = q @ k.transpose(-1, -2) / math.sqrt(HD)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v

    def lin(i, o, on):
        return nn.Linear(i, o, bias=on)

    class Block(nn.Module):
        def __init__(s):
            super().__init__()
            s.n1 = norm()
            s.n2 = norm() if parallel != "shared" else None
            ab = bias == "all" or bias == "qkv"
            kv = NKV * HD if kind == "llama" else C
            if kind == "gpt2" and packed:
                s.qkv = lin(C, 3 * C, bias == "all")
            else:
                s.q, s.k, s.v = lin(C, C, ab), lin(C, kv, ab), lin(C, kv, ab)
            s.o = lin(C, C, bias == "all")
            if kind == "gpt2":
                s.fc, s.fc2 = lin(C, FF, bias == "all"), lin(FF, C, bias == "all")
            else:
                s.g, s.u, s.d = lin(C, FF, bias == "all"), lin(C, FF, bias == "all"), lin(FF, C, bias == "all")

        def attn(s, h, cos, sin):
            B = h.shape[0]
            if kind == "gpt2" and packed:
                q, k, v = s.qkv(h).split(C, dim=2)
            else:
                q, k, v = s.q(h), s.k(h), s.v(h)
            nkv = NKV if kind == "llama" else NH
            q = q.view(B, T, NH, HD).transpose(1, 2)
            k, v = k.view(B, T, nkv, HD).transpose(1, 2), v.view(B, T, nkv, HD).transpose(1, 2)
            if kind == "llama":
                q, k = rope(q, cos, sin), rope(k, cos, sin)
                k, v = k.repeat_interleave(NH // NKV, dim=1), v.repeat_interleave(NH // NKV, dim=1)
            return s.o(attend(q, k, v).transpose(1, 2).reshape(B, T, C))

        def mlp(s, h):
            if kind == "gpt2":
                a = F.gelu(s.fc(h), approximate="tanh")
                return s.fc2(extra(a) if extra else a)
            a = F.silu(s.g(h)) * s.u(h)
            return s.d(extra(a) if extra else a)

        def forward(s, x, cos, sin):
            if parallel == "shared":
                h = s.n1(x)
                return x + s.attn(h, cos, sin) + s.mlp(h)
            if parallel == "two":
                return x + s.attn(s.n1(x), cos, sin) + s.mlp(s.n2(x))
            x = x + s.attn(s.n1(x), cos, sin)
            return x + s.mlp(s.n2(x))

    class Model(nn.Module):
        def __init__(s):
            super().__init__()
            s.emb = nn.Embedding(V, C)
            s.pos = nn.Embedding(T, C) if kind == "gpt2" else None
            s.blocks = nn.ModuleList([Block() for _ in range(L)])
            s.nf = norm()
            s.head = nn.Linear(C, V, bias=False)
            if tie:
                s.head.weight = s.emb.weight
            inv = 1.0 / (theta ** (torch.arange(0, HD, 2).float() / HD))
            f = torch.outer(torch.arange(T).float(), inv)
            f = torch.cat((f, f), dim=-1)
            s.register_buffer("cos", f.cos())
            s.register_buffer("sin", f.sin())

        def forward(s, idx, tgt):
            x = s.emb(idx)
            if s.pos is not None:
                x = x + s.pos(torch.arange(T))
            for b in s.blocks:
                x = b(x, s.cos, s.sin)
            logits = s.head(s.nf(x))
            if returns == "logits":
                return logits
            return F.cross_entropy(logits.float().view(-1, V), tgt.view(-1))

    m = Model()
    with torch.no_grad():  # visible biases and norm weights: a misplaced one changes the loss
        for n, p in m.named_parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn(p.shape))
    return m


class FxShapes(unittest.TestCase):
    def setUp(self):
        self.seed = int.from_bytes(os.urandom(4), "little")
        torch.manual_seed(self.seed)
        self.rng = random.Random(self.seed)

    def same_loss(self, m, kind, T=8, V=61):
        g = dw.capture(m, seq_len=T, batch=2)
        self.assertEqual(g.model_type, kind)
        e = dw.compile(g)
        x, y = torch.randint(0, V, (2, T)), torch.randint(0, V, (2, T))
        with torch.no_grad():
            out = m(x, y)
            ref = float(out if out.dim() == 0 else F.cross_entropy(out.reshape(-1, V), y.reshape(-1)))
        got = e.forward(x, y)
        self.assertAlmostEqual(got, ref, delta=2e-5 * max(1.0, ref), msg=f"seed {self.seed}")
        return g

    def test_llama_shapes(self):
        for bias in ("none", "qkv", "all"):
            FF = self.rng.choice([24, 40, 72, 96])  # MLP ratios other than the presets'
            NKV = self.rng.choice([1, 2, 4])
            tie = self.rng.random() < 0.3
            theta = self.rng.choice([10000.0, 500000.0])
            returns = self.rng.choice(["loss", "logits"])
            with self.subTest(bias=bias, FF=FF, NKV=NKV, tie=tie, returns=returns, seed=self.seed):
                m = build("llama", self.rng, FF=FF, NKV=NKV, tie=tie, bias=bias, theta=theta, returns=returns)
                g = self.same_loss(m, "llama")
                c = g.config
                self.assertEqual((c["intermediate_size"], c["num_key_value_heads"], c["tie_word_embeddings"]),
                                 (FF, NKV, tie))
                self.assertEqual(c["attention_bias"], bias != "none")
                self.assertEqual(c["mlp_bias"], bias == "all")
                # the captured parameters: the module's, plus zero biases where the config asks for them
                zeros = 2 * 32 if bias == "qkv" else 0  # o_proj's bias in each of the 2 blocks
                self.assertEqual(g.params, sum(p.numel() for p in m.parameters()) + zeros)

    def test_gpt2_shapes(self):
        for bias, packed, affine in [("all", False, True), ("none", True, True), ("none", False, False)]:
            FF = self.rng.choice([40, 64, 100])
            tie = self.rng.random() < 0.5
            with self.subTest(bias=bias, packed=packed, affine=affine, FF=FF, tie=tie, seed=self.seed):
                m = build("gpt2", self.rng, FF=FF, tie=tie, bias=bias, packed=packed, affine=affine)
                g = self.same_loss(m, "gpt2")
                self.assertEqual((g.config["n_inner"], g.config["tie_word_embeddings"]), (FF, tie))

    def test_parallel_blocks_and_unmapped_nodes_are_refused_by_name(self):
        for kind in ("gpt2", "llama"):
            with self.subTest(kind=kind, parallel="shared"):
                with self.assertRaises(TypeError) as e:
                    dw.capture(build(kind, self.rng, parallel="shared"), seq_len=8)
                self.assertIn("parallel attention + MLP block", str(e.exception))
                self.assertIn("norm node 'blocks_0_n1'", str(e.exception))
            with self.subTest(kind=kind, parallel="two"):
                with self.assertRaises(TypeError) as e:
                    dw.capture(build(kind, self.rng, parallel="two"), seq_len=8)
                self.assertIn("parallel attention + MLP block", str(e.exception))
                self.assertIn("'blocks_0_n1' and 'blocks_0_n2'", str(e.exception))
        with self.assertRaises(TypeError) as e:  # the first unmapped node, by name
            dw.capture(build("llama", self.rng, extra=torch.tanh), seq_len=8)
        self.assertIn("node 'tanh' (call_function tanh)", str(e.exception))
        with self.assertRaises(TypeError) as e:
            dw.capture(build("gpt2", self.rng, extra=lambda a: a.exp()), seq_len=8)
        self.assertIn("(call_method exp)", str(e.exception))


if __name__ == "__main__":
    unittest.main()
