#!/usr/bin/python3
"""finetune.py DEEPWELL — `deepwell train --model DIR` starts from DIR's weights (issue 26).

Writes tiny Llama and Qwen2 models in Hugging Face layout (config.json with random shapes, tied or
untied embeddings, sometimes a scaled RoPE; weights as one F32 model.safetensors or as an index
over F32, F16 and BF16 shards) and a token shard of exactly B windows (so that the trainer's
shuffled first batch holds the same tokens as `deepwell eval`'s), then checks on the CPU:
  - the first logged training loss equals `deepwell eval` of the directory on that batch;
  - --init random gives the loss of `deepwell eval` of the config alone with the same --seed, and
    it differs from the directory's;
  - --init-from another directory, a run directory (its newest checkpoint) and a checkpoint give
    their `deepwell eval` losses; the progress output names the source;
  - tied embeddings stay tied: the checkpoint has no lm_head.weight and says tie_word_embeddings;
  - bad sources are refused with the reason: a missing path, a directory without weights, weights
    of another shape (naming the tensor and both shapes), --init random with --init-from, an
    unknown --init, --init-from with --resume;
  - --resume takes the checkpoint's weights: one step, then a resumed second, gives the loss of an
    uninterrupted two-step run at step 2, not a restart from DIR.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity  # noqa: E402  (its random configs, weights and token shards)

ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def st_write(path, tensors, dtype):
    """safetensors with every tensor stored as dtype (F32, F16 or BF16)."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        t = t.detach().to(ST_DTYPES[dtype]).contiguous()
        b = (t.view(torch.int16) if dtype == "BF16" else t).numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(np.uint64(len(h)).tobytes() + h + b"".join(blobs))


def write_model(d, c, w, rng, sharded):
    """config.json and the weights: one F32 file, or an index over shards of mixed dtypes."""
    os.makedirs(d, exist_ok=True)
    json.dump(c, open(os.path.join(d, "config.json"), "w"))
    if not sharded:
        st_write(os.path.join(d, "model.safetensors"), w, "F32")
        return
    names, weight_map = list(w), {}
    cuts = sorted(rng.sample(range(1, len(names)), 2)) if len(names) > 3 else [1, 2]
    parts = [names[:cuts[0]], names[cuts[0]:cuts[1]], names[cuts[1]:]]
    for k, (part, dt) in enumerate(zip(parts, ["BF16", "F16", "F32"])):
        fname = f"model-{k + 1:05d}-of-00003.safetensors"
        st_write(os.path.join(d, fname), {n: w[n] for n in part}, dt)
        weight_map.update({n: fname for n in part})
    json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map},
              open(os.path.join(d, "model.safetensors.index.json"), "w"))


def run(cmd):
    return subprocess.run([str(x) for x in cmd], capture_output=True, text=True)


class Checks:
    def __init__(self):
        self.failures = []

    def ok(self, cond, what, detail=""):
        print(("ok: " if cond else "FAIL: ") + what + (f" ({detail})" if detail and not cond else ""))
        if not cond:
            self.failures.append(what + (f": {detail}" if detail else ""))


def eval_loss(dw, model, data, B, T, extra=()):
    r = run([dw, "eval", model, "--data", data, "--batch", B, "--seq", T, *extra])
    if r.returncode != 0 or not r.stdout.startswith("loss "):
        raise RuntimeError(f"deepwell eval {model} failed ({r.returncode}): {r.stderr.strip()}")
    return float(r.stdout.split()[1])


def train(dw, model, data, out, B, T, steps=1, extra=()):
    """Runs `deepwell train`; (returncode, stderr, [losses from metrics.jsonl])."""
    r = run([dw, "train", "--model", model, "--data", data, "--out", out, "--batch", B, "--seq", T,
             "--steps", steps, "--eval-every", 0, "--warmup", 1, "--device", "cpu", *extra])
    m = os.path.join(out, "metrics.jsonl")
    losses = [json.loads(l)["loss"] for l in open(m)] if r.returncode == 0 and os.path.exists(m) else []
    return r.returncode, r.stderr, losses


def same(a, b):
    """Equal losses: both FP32 CPU forwards of the same weights and tokens."""
    return abs(a - b) <= 1e-5 * max(1.0, abs(b))


def family_case(dw, chk, family, rng, gen, tmp, sharded):
    c = parity.random_config(family, rng)
    c["max_position_embeddings"] = 64
    tag = f"{family} ({'sharded F32/F16/BF16' if sharded else 'F32'}, tied={c['tie_word_embeddings']}, " + \
        f"rope={(c.get('rope_scaling') or c.get('rope_parameters') or {}).get('rope_type', 'default')})"
    w = parity.random_weights(c, gen)
    if c["tie_word_embeddings"] and rng.random() < 0.5:  # some tied checkpoints also store the head
        w["lm_head.weight"] = w["model.embed_tokens.weight"].clone()
    d = os.path.join(tmp, family + ("-sharded" if sharded else ""))
    write_model(d, c, w, rng, sharded)
    B, T = rng.randint(1, 3), rng.randint(4, 32)
    data = os.path.join(tmp, f"{family}-{sharded}.bin")
    parity.write_shard(data, [rng.randrange(c["vocab_size"]) for _ in range(B * T + 1)])  # exactly B windows

    want = eval_loss(dw, d, data, B, T)
    out = os.path.join(tmp, f"run-{family}-{sharded}")
    rc, err, losses = train(dw, d, data, out, B, T, steps=2)
    chk.ok(rc == 0 and len(losses) == 2 and same(losses[0], want),
           f"{tag}: first training loss = deepwell eval {want:.6f}", f"rc {rc}, losses {losses}, {err.strip()[-300:]}")
    chk.ok(f"weights from {d}" in err, f"{tag}: the output names the source", err.strip()[-300:])
    ckpt = os.path.join(out, "ckpt-2")
    saved = parity.st_read(os.path.join(ckpt, "model.safetensors")) if rc == 0 else {}
    cfg = json.load(open(os.path.join(ckpt, "config.json"))) if rc == 0 else {}
    if c["tie_word_embeddings"]:
        chk.ok(rc == 0 and "lm_head.weight" not in saved and cfg.get("tie_word_embeddings") is True,
               f"{tag}: tied embeddings stay tied in the checkpoint")

    # --init random: the config's own initialisation from the seed (eval of the config alone)
    bare = os.path.join(tmp, f"{family}-{sharded}-config")
    os.makedirs(bare)
    json.dump(c, open(os.path.join(bare, "config.json"), "w"))
    seed = rng.randrange(1 << 30)
    want_rand = eval_loss(dw, bare, data, B, T, ["--seed", seed])
    rc, err, losses = train(dw, d, data, os.path.join(tmp, f"rand-{family}-{sharded}"), B, T,
                            extra=["--init", "random", "--seed", seed])
    chk.ok(rc == 0 and losses and same(losses[0], want_rand) and not same(losses[0], want),
           f"{tag}: --init random starts from the seed ({want_rand:.6f}), not the file ({want:.6f})",
           f"rc {rc}, losses {losses}, {err.strip()[-300:]}")

    # --init-from another directory of the same shapes, a run directory and a checkpoint
    other = os.path.join(tmp, f"{family}-{sharded}-other")
    write_model(other, c, parity.random_weights(c, gen), rng, False)
    want_other = eval_loss(dw, other, data, B, T)
    want_ckpt = eval_loss(dw, ckpt, data, B, T)
    for src, want_src, what in [(other, want_other, "another model directory"), (out, want_ckpt, "a run directory"),
                                (ckpt, want_ckpt, "a checkpoint")]:
        o2 = tempfile.mkdtemp(prefix="from-", dir=tmp)
        os.rmdir(o2)
        rc, err, losses = train(dw, d, data, o2, B, T, extra=["--init-from", src])
        chk.ok(rc == 0 and losses and same(losses[0], want_src) and "(--init-from)" in err,
               f"{tag}: --init-from {what} starts at its eval loss {want_src:.6f}",
               f"rc {rc}, losses {losses}, {err.strip()[-300:]}")
    return c, d, data, B, T, want


def refusals(dw, chk, c, d, data, B, T, rng, gen, tmp):
    bad = os.path.join(tmp, "bad-shape")
    c2 = dict(c, intermediate_size=c["intermediate_size"] + 1)
    write_model(bad, c2, parity.random_weights(c2, gen), rng, False)
    empty = os.path.join(tmp, "no-weights")
    os.makedirs(empty)
    json.dump(c, open(os.path.join(empty, "config.json"), "w"))
    F = c["intermediate_size"]
    cases = [
        (["--init-from", os.path.join(tmp, "nowhere")], "no such file or directory"),
        (["--init-from", empty], "without model.safetensors"),
        (["--init-from", bad], f"has shape [{F + 1},"),
        (["--init-from", bad], f"expected [{F},"),
        (["--init", "random", "--init-from", bad], "contradict"),
        (["--init", "zeros"], "--init must be auto or random"),
    ]
    for extra, needle in cases:
        o = tempfile.mkdtemp(prefix="bad-", dir=tmp)
        os.rmdir(o)
        rc, err, _ = train(dw, d, data, o, B, T, extra=extra)
        chk.ok(rc != 0 and needle in err, f"refused {' '.join(extra)}: \"{needle}\"", f"rc {rc}: {err.strip()[-300:]}")
        chk.ok(not os.path.exists(os.path.join(o, "latest")), f"refused {' '.join(extra)}: no checkpoint written")
    # the shape error names the tensor
    rc, err, _ = train(dw, d, data, os.path.join(tmp, "bad-name"), B, T, extra=["--init-from", bad])
    chk.ok(rc != 0 and "tensor 'model.layers.0.mlp." in err, "the shape error names the tensor", err.strip()[-300:])


def resume_case(dw, chk, d, data, B, T, want, tmp):
    """1 step + resume to 2 = 2 uninterrupted steps (weights from the checkpoint, not DIR)."""
    whole, part = os.path.join(tmp, "whole"), os.path.join(tmp, "part")
    rc1, err1, l_whole = train(dw, d, data, whole, B, T, steps=2, extra=["--seed", 7])
    rc2, err2, l_first = train(dw, d, data, part, B, T, steps=1, extra=["--seed", 7])
    r = run([dw, "train", "--resume", part, "--steps", 2])
    l_part = [json.loads(l)["loss"] for l in open(os.path.join(part, "metrics.jsonl"))] if r.returncode == 0 else []
    chk.ok(rc1 == 0 and rc2 == 0 and r.returncode == 0 and len(l_part) == 2 and len(l_whole) == 2 and
           l_part[1] == l_whole[1] and not same(l_part[1], want),
           f"--resume continues from the checkpoint: step 2 loss {l_whole[1] if l_whole else '?'} as uninterrupted",
           f"rc {rc1} {rc2} {r.returncode}; whole {l_whole}, resumed {l_part}; {r.stderr.strip()[-300:]}")
    r = run([dw, "train", "--resume", part, "--steps", 3, "--init-from", d])
    chk.ok(r.returncode != 0 and "takes its weights from its checkpoint" in r.stderr,
           "--init-from with --resume is refused", r.stderr.strip()[-300:])


def main():
    dw = sys.argv[1]
    seed = int(os.environ.get("DW_TEST_SEED", random.randrange(1 << 30)))
    print(f"test seed: DW_TEST_SEED={seed}")
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    chk = Checks()
    with tempfile.TemporaryDirectory() as tmp:
        family_case(dw, chk, "qwen2", rng, gen, tmp, sharded=False)
        c, d, data, B, T, want = family_case(dw, chk, "llama", rng, gen, tmp, sharded=True)
        refusals(dw, chk, c, d, data, B, T, rng, gen, tmp)
        resume_case(dw, chk, d, data, B, T, want, tmp)
    print(f"{len(chk.failures)} failed")
    sys.exit(1 if chk.failures else 0)


if __name__ == "__main__":
    main()
