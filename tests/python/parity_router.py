#!/usr/bin/python3
"""parity_router.py DEEPWELL — DeepSeek-V3's router variants in whole-model parity with PyTorch.

Random tiny Mixtral, OLMoE, Qwen2-MoE and Qwen3-MoE models (tests/python/parity.py's configs,
weights and float64 reference) whose config.json adds DeepSeek-V3's routing keys: n_group and
topk_group (group-limited selection), scoring_func softmax or sigmoid, routed_scaling_factor, and
for half of them a selection bias in the weights file (model.layers.N.mlp.gate.
e_score_correction_bias). The router here is written from DeepSeek-V3's definition (its inference
code's Gate and transformers' DeepseekV3TopkRouter: keys = scores + bias, a group's key the sum of
its two largest keys, the topk_group best groups kept, the others' keys masked to -inf as DeepSeek's
Gate does (transformers masks to 0: the same choice unless a kept expert's key is negative), top-k
of the keys, weights the unbiased scores gathered, renormalised when norm_topk_prob, times
routed_scaling_factor); `deepwell eval
--dump` must give the same logits, loss and every parameter's gradient (parity.py's tolerances).
The bias gets no gradient and is not a parameter of the dump. Exit status 1 on any mismatch.
"""
import json
import os
import random
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity  # noqa: E402  (configs, weights, the float64 model and the comparison)


def deepseek_router(c, x, router, bias):
    """Experts (N, K) and weights (N, K) of rows x (N, C) as DeepSeek-V3's gate chooses them."""
    E, K = router.shape[0], c["num_experts_per_tok"]
    G, TG = c["n_group"], c["topk_group"]
    logits = x @ router.T
    scores = torch.sigmoid(logits) if c["scoring_func"] == "sigmoid" else torch.softmax(logits, dim=-1)
    keys = scores.detach() + (bias if bias is not None else 0)  # the selection has no gradient
    grouped = keys.view(-1, G, E // G)
    gkey = grouped.topk(min(2, E // G), dim=-1)[0].sum(-1)
    kept = torch.zeros_like(gkey).scatter_(1, gkey.topk(TG, dim=-1)[1], 1.0)
    mask = kept.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
    idx = keys.masked_fill(mask == 0, -float("inf")).topk(K, dim=-1)[1]
    w = scores.gather(1, idx)
    if c["model_type"] == "mixtral" or c.get("norm_topk_prob", False):
        w = w / w.sum(-1, keepdim=True)
    return logits, idx, w * c["routed_scaling_factor"]


def grouped_moe_block(c, w, p, h, router_logits):
    """parity.moe_block with DeepSeek-V3's router (the experts and Qwen2-MoE's shared expert as there)."""
    B, T, C = h.shape
    x = h.reshape(B * T, C)
    router = w[p + "mlp.gate.weight"] if p + "mlp.gate.weight" in w else w[p + "block_sparse_moe.gate.weight"]
    logits, idx, top = deepseek_router(c, x, router, c["_bias"].get(p))
    router_logits.append(logits)
    out = torch.zeros_like(x)
    for e in range(router.shape[0]):
        rows, slot = torch.where(idx == e)
        if rows.numel() == 0:
            continue
        g, u, d = parity.expert_weights(c, w, p, e)
        xe = x[rows]
        y = (torch.nn.functional.silu(xe @ g.T) * (xe @ u.T)) @ d.T
        out = out.index_add(0, rows, y * top[rows, slot][:, None])
    if c["model_type"] == "qwen2_moe":
        q = p + "mlp.shared_expert."
        y = (torch.nn.functional.silu(x @ w[q + "gate_proj.weight"].T) * (x @ w[q + "up_proj.weight"].T)) \
            @ w[q + "down_proj.weight"].T
        out = out + torch.sigmoid(x @ w[p + "mlp.shared_expert_gate.weight"].T) * y
    return out.view(B, T, C)


parity.moe_block = grouped_moe_block


def grouped_config(family, rng):
    """parity.py's random config of the family with E in {4, 6, 8}, a divisor n_group > 1 and
    topk_group below it, top-k within the kept groups; no router losses (DeepSeek-V3 has none)."""
    c = parity.random_config(family, rng)
    E = rng.choice([4, 6, 8])
    G = rng.choice([g for g in range(2, E + 1) if E % g == 0])
    c["num_local_experts" if family == "mixtral" else "num_experts"] = E
    c["n_group"], c["topk_group"] = G, rng.randint(1, G - 1)
    c["num_experts_per_tok"] = rng.randint(1, c["topk_group"] * (E // G))
    c["scoring_func"] = rng.choice(["softmax", "sigmoid"])
    c["routed_scaling_factor"] = rng.choice([1.0, 2.5, 0.7])
    c.pop("output_router_logits", None), c.pop("router_aux_loss_coef", None), c.pop("router_z_loss_coef", None)
    return c


def case(dw, family, rng, gen, tmp, biased):
    c = grouped_config(family, rng)
    d = tempfile.mkdtemp(prefix=family + "-", dir=tmp)
    json.dump({k: v for k, v in c.items() if k != "layout"}, open(os.path.join(d, "config.json"), "w"))
    w = parity.random_weights(c, gen)
    E = c.get("num_local_experts", c.get("num_experts"))
    c["_bias"] = {}
    stored = dict(w)
    for l in range(c["num_hidden_layers"]) if biased else []:
        if parity.moe_layer(c, l):
            b = (0.2 * torch.randn(E, generator=gen, dtype=torch.float64)).float().double()
            c["_bias"][f"model.layers.{l}."] = b
            stored[f"model.layers.{l}.mlp.gate.e_score_correction_bias"] = b
    parity.st_write(os.path.join(d, "model.safetensors"), stored)
    B, T = rng.randint(1, 3), rng.randint(2, 32)
    stream = [rng.randrange(c["vocab_size"]) for _ in range(B * T + 1 + rng.randint(0, 50))]
    parity.write_shard(os.path.join(d, "tokens.bin"), stream)
    dump = os.path.join(d, "dump.safetensors")
    r = parity.run([dw, "eval", d, "--data", os.path.join(d, "tokens.bin"), "--batch", str(B), "--seq", str(T),
                    "--dump", dump])
    if r.returncode != 0:
        return [f"{family}: deepwell eval failed ({r.returncode}): {r.stderr.strip()}"]
    got = parity.st_read(dump)
    params = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    tok = torch.tensor(stream[:B * T]).view(B, T)
    tgt = torch.tensor(stream[1:B * T + 1]).view(B, T)
    logits = parity.llama_forward(c, params, tok, [])
    loss = torch.nn.functional.cross_entropy(logits.view(B * T, -1), tgt.view(-1))
    loss.backward()
    failures = []
    wl = parity.compare(f"{family} logits", got.pop("logits"), logits.detach(), 1e-4, 2e-5, failures)
    parity.compare(f"{family} loss", got.pop("loss").reshape(()), loss.detach(), 1e-5, 0, failures)
    wg = 0.0
    for name, p in params.items():
        if name not in got:
            failures.append(f"{family}: no gradient for '{name}' in the dump")
            continue
        ref = p.grad if p.grad is not None else torch.zeros_like(p)
        wg = max(wg, parity.compare(f"{family} grad {name}", got.pop(name), ref, 2e-4, 2e-5, failures))
    failures += [f"{family}: unexpected tensor '{n}' in the dump" for n in got]
    desc = ", ".join(f"{k}={c[k]}" for k in ("num_experts_per_tok", "n_group", "topk_group", "scoring_func",
                                             "routed_scaling_factor", "norm_topk_prob", "layout") if k in c)
    print(f"{'ok' if not failures else 'FAIL'}: {family} grouped parity (E={E}, {desc}, bias={biased}; "
          f"B={B} T={T}): loss {float(loss):.6f}, worst relative error logits {wl:.2e}, grads {wg:.2e}")
    return failures


def main():
    dw = sys.argv[1]
    seed = int(os.environ.get("DW_TEST_SEED", random.randrange(1 << 30)))
    print(f"test seed: DW_TEST_SEED={seed}")
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in ("mixtral", "olmoe", "qwen2_moe", "qwen3_moe"):
            for biased in (False, True):
                failures += case(dw, family, rng, gen, tmp, biased)
    for f in failures:
        print("FAIL:", f)
    print(f"{len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
