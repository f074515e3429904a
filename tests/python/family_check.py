"""family_check.py — what tests/python/hf_parity_gemma2.py and hf_parity_phi3.py check of a family,
given its random config, weights in its Hugging Face layout and a float64 reference forward:
  - `deepwell eval --dump`: loss, logits and every stored tensor's gradient within TOL of the
    reference (relative to each tensor's largest value);
  - `deepwell export --format hf --dtype f32`: the same tensors back, the config keys named kept,
    and `deepwell eval` of the export giving the same loss bit for bit;
  - (first case) `deepwell train --model DIR`: its first logged loss is eval's (fine-tuning starts
    from the directory's weights); `deepwell sample` gives the same tokens with the K/V cache as with
    a full recompute per token (DW_KV_CACHE=0), and the cache was used;
  - refusals: a model directory that `deepwell eval` must refuse with a given phrase.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import finetune  # noqa: E402  (eval_loss, train, same, Checks)
import parity  # noqa: E402  (safetensors, shards, comparison)

TOL = 1e-5  # loss, logits and gradients within 1e-5 of the reference


def write_model(d, c, w):
    os.makedirs(d)
    json.dump(c, open(os.path.join(d, "config.json"), "w"))
    parity.st_write(os.path.join(d, "model.safetensors"), w)


def check_case(dw, chk, family, c, w, forward, rng, tmp, i, desc, config_keys):
    """One random model of the family: parity, export -> eval, and for i == 0 fine-tuning."""
    d = os.path.join(tmp, f"{family}-{i}")
    write_model(d, c, w)
    B, T = rng.randint(1, 3), rng.randint(2, 40)
    stream = parity.add_pads(c, [rng.randrange(c["vocab_size"]) for _ in range(B * T + 1)], rng)  # exactly B windows
    data = os.path.join(d, "tokens.bin")
    parity.write_shard(data, stream)
    dump = os.path.join(d, "dump.safetensors")
    r = parity.run([dw, "eval", d, "--data", data, "--batch", str(B), "--seq", str(T), "--dump", dump])
    if r.returncode != 0:
        chk.ok(False, f"{family} ({desc}): deepwell eval", f"rc {r.returncode}: {r.stderr.strip()}")
        return
    got = parity.st_read(dump)
    params = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    tok = torch.tensor(stream[:B * T]).view(B, T)
    tgt = torch.tensor(stream[1:B * T + 1]).view(B, T)
    logits = forward(c, params, tok)
    loss = torch.nn.functional.cross_entropy(logits.view(B * T, -1), tgt.view(-1))
    loss.backward()
    failures = []
    e_logits = parity.compare("logits", got.pop("logits"), logits.detach(), TOL, TOL, failures)
    e_loss = parity.compare("loss", got.pop("loss").reshape(()), loss.detach(), TOL, 0, failures)
    e_grad = 0.0
    for name, p in params.items():
        if name not in got:
            failures.append(f"no gradient for '{name}' in the dump")
            continue
        e_grad = max(e_grad, parity.compare(f"grad {name}", got.pop(name), p.grad, 0, TOL, failures))
    failures += [f"unexpected tensor '{n}' in the dump" for n in got]
    chk.ok(not failures, f"{family} parity ({desc}; B={B} T={T}): loss {float(loss):.6f}, worst relative error "
           f"logits {e_logits:.1e}, loss {e_loss:.1e}, grads {e_grad:.1e} over {len(params)} tensors",
           "; ".join(failures[:5]))

    out = os.path.join(tmp, f"{family}-{i}-export")
    r = parity.run([dw, "export", d, "--out", out, "--format", "hf", "--dtype", "f32"])
    if r.returncode != 0:
        chk.ok(False, f"{family} export", f"rc {r.returncode}: {r.stderr.strip()}")
        return
    cfg = json.load(open(os.path.join(out, "config.json")))
    kept = all(cfg.get(k) == c.get(k) for k in config_keys)
    exported = parity.st_read(os.path.join(out, "model.safetensors"))
    same_w = exported.keys() == w.keys() and all(torch.equal(exported[k], w[k]) for k in w)
    want = finetune.eval_loss(dw, d, data, B, T)
    back = finetune.eval_loss(dw, out, data, B, T)
    chk.ok(kept and same_w and back == want, f"{family} export --dtype f32 -> eval: loss {back:.6f} = {want:.6f}, "
           f"{len(w)} tensors in the family's names and layout, config keys kept",
           f"keys kept {kept} ({ {k: cfg.get(k) for k in config_keys} }), same weights {same_w}, names "
           f"{sorted(exported)[:6]}")
    if i == 0:
        rc, err, losses = finetune.train(dw, d, data, os.path.join(tmp, f"run-{family}"), B, T, steps=2)
        chk.ok(rc == 0 and len(losses) == 2 and finetune.same(losses[0], want),
               f"{family}: first training loss = deepwell eval {want:.6f}", f"rc {rc}, losses {losses}, {err[-300:]}")
        check_sample(dw, chk, family, d, c["max_position_embeddings"])


def check_sample(dw, chk, family, d, positions):
    """Cached decoding (soft-capped scores, windows) gives the recompute's tokens, past the window.
    Token ids in and out (--tokenizer ids): a drawn vocabulary of 256 would otherwise read and write
    raw bytes, not UTF-8 (DW_TEST_SEED=84292147 drew one for gemma2)."""
    cmd = [dw, "sample", d, "--prompt", "3 1 4 1 5", "-n", str(positions - 5), "--temperature", "1", "--seed", "7",
           "--tokenizer", "ids", "--device", "cpu"]
    env = dict(os.environ, DW_LOG="debug")
    kv = subprocess.run(cmd, capture_output=True, text=True, env=env)
    full = subprocess.run(cmd, capture_output=True, text=True, env=dict(env, DW_KV_CACHE="0"))
    chk.ok(kv.returncode == 0 and full.returncode == 0 and kv.stdout == full.stdout and "KV cache up to" in kv.stderr
           and len(kv.stdout.split()) == positions, f"{family}: sampling with the K/V cache = full recompute "
           f"({len(kv.stdout.split())} tokens)", f"rc {kv.returncode}/{full.returncode}: '{kv.stdout.strip()}' vs "
           f"'{full.stdout.strip()}'; {kv.stderr.strip()[-300:]}")


def check_refusals(dw, chk, family, tmp, cases):
    """cases: (what, config, weights, phrase): `deepwell eval` fails with the phrase in its message."""
    data = os.path.join(tmp, "refuse.bin")
    parity.write_shard(data, [1] * 100)
    for i, (what, c, w, needle) in enumerate(cases):
        d = os.path.join(tmp, f"bad-{family}-{i}")
        write_model(d, c, w)
        r = parity.run([dw, "eval", d, "--data", data, "--batch", "1", "--seq", "4"])
        chk.ok(r.returncode != 0 and needle in r.stderr, f"{family}: {what} refused naming \"{needle}\"",
               r.stderr.strip())


def main(family, cases, refusals, n=4):
    """cases(rng, gen) -> (config, weights, forward, description, config keys kept by export);
    refusals(rng, gen) -> the check_refusals cases. Seeded by DW_TEST_SEED."""
    dw = sys.argv[1]
    seed = int(os.environ.get("DW_TEST_SEED", random.randrange(1 << 30)))
    print(f"test seed: DW_TEST_SEED={seed}")
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    chk = finetune.Checks()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n):
            c, w, forward, desc, keys = cases(rng, gen)
            check_case(dw, chk, family, c, w, forward, rng, tmp, i, desc, keys)
        check_refusals(dw, chk, family, tmp, refusals(rng, gen))
    for f in chk.failures:
        print("FAIL:", f)
    print(f"{len(chk.failures)} failed")
    sys.exit(1 if chk.failures else 0)
