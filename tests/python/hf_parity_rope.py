#!/usr/bin/env python3
"""hf_parity_rope.py DEEPWELL — Deepwell against transformers itself for scaled RoPE and for the
start of fine-tuning (issue 26).

Not run by ctest (CI has no transformers): run where transformers is installed (the GPU machine).
1. For Llama with the rope types linear, llama3 and yarn (yarn with and without an explicit
   attention_factor; written as transformers 5's rope_parameters or 4's rope_scaling, whichever the
   installed version reads; yarn-original needs a transformers that reads yarn's
   original_max_position_embeddings, as 5 does: 4.46 ignores it and differs), builds a random transformers model, writes it with save_pretrained,
   runs `deepwell eval --dump` and compares the loss, logits and every parameter's gradient with
   transformers' own float64 forward and backward (tolerances of tests/python/parity.py). Yarn's
   factor is max_position_embeddings / original_max_position_embeddings, where transformers 4.5x
   and 5 agree.
2. Fine-tuning: `deepwell train --model DIR` (the save_pretrained directory, also saved sharded in
   BF16 with an index) logs as its first loss transformers' loss on the same batch: exactly on the
   CPU (1e-5), within BF16 rounding on CUDA when a GPU is usable (2e-2 relative).
Exit status 1 on any mismatch.
"""
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parity import compare, write_shard  # noqa: E402  (the same shard format and tolerances)

V5 = int(transformers.__version__.split(".")[0]) >= 5
THETA, MAXPOS = 10000.0, 64
ROPES = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
    "yarn": {"rope_type": "yarn", "factor": 4.0},  # original positions: max_position_embeddings
    "yarn-original": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "yarn-attention": {"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.3, "beta_fast": 8.0,
                       "beta_slow": 0.5},
}


def llama_config(rope, tied):
    base = dict(vocab_size=97, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=MAXPOS, rms_norm_eps=1e-6,
                tie_word_embeddings=tied, hidden_act="silu")
    if V5:
        return transformers.LlamaConfig(**base, rope_parameters=dict(rope, rope_theta=THETA))
    return transformers.LlamaConfig(**base, rope_theta=THETA, rope_scaling=dict(rope))


def randomise(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                t = 1 + 0.2 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            else:
                t = 0.15 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_(t.float().double())  # representable in FP32, as Deepwell stores them


def run(cmd):
    return subprocess.run([str(x) for x in cmd], capture_output=True, text=True)


def hf_loss(model, tok, tgt):
    logits = model(input_ids=tok).logits
    return logits, torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))


def first_train_loss(dw, d, data, B, T, out, device):
    r = run([dw, "train", "--model", d, "--data", data, "--out", out, "--batch", B, "--seq", T, "--steps", 1,
             "--eval-every", 0, "--warmup", 1, "--device", device])
    if r.returncode:
        return None, r.stderr.strip()[-400:]
    return json.loads(open(os.path.join(out, "metrics.jsonl")).readline())["loss"], r.stderr


def check_eval(dw, name, d, data, B, T, model, cfg, logits, loss, failures, strict=False):
    """`deepwell eval --dump` of directory d on data against transformers' loss, logits and every
    parameter's gradient (parity.py's tolerances; a tied head has none of its own); strict: a
    tensor in the dump that transformers has no gradient for is a failure too. Prints the worst
    errors and returns them, or None when eval failed (recorded in failures)."""
    dump = os.path.join(d, "dump.safetensors")
    r = run([dw, "eval", d, "--data", data, "--batch", B, "--seq", T, "--dump", dump])
    if r.returncode:
        failures.append(f"{name}: deepwell eval failed: {r.stderr.strip()}")
        return None
    got = {n: v.double() for n, v in load_file(dump).items()}
    worst = compare(f"{name} loss", got.pop("loss").reshape(()), loss.detach(), 1e-5, 0, failures)
    compare(f"{name} logits", got.pop("logits"), logits.detach(), 1e-4, 2e-5, failures)
    g_worst = 0.0
    for n, p in model.named_parameters():
        if n == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if n not in got:
            failures.append(f"{name}: no gradient for '{n}'")
            continue
        g_worst = max(g_worst, compare(f"{name} grad {n}", got.pop(n), p.grad, 2e-4, 2e-5, failures))
    if strict:
        failures += [f"{name}: unexpected tensor '{n}' in the dump" for n in got]
    print(f"{name}: loss transformers {float(loss):.8f}, relative error {worst:.2e}; worst gradient "
          f"error {g_worst:.2e}")
    return worst, g_worst


def main():
    dw = sys.argv[1]
    gen = torch.Generator().manual_seed(int(os.environ.get("DW_TEST_SEED", "26")))
    failures = []
    print(f"transformers {transformers.__version__} ({'rope_parameters' if V5 else 'rope_scaling'})")
    gpu = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as tmp:
        for k, (name, rope) in enumerate(ROPES.items()):
            cfg = llama_config(rope, tied=k % 2 == 1)
            cfg._attn_implementation = "eager"
            model = transformers.LlamaForCausalLM(cfg).double()
            randomise(model, gen)
            d = os.path.join(tmp, name)
            model.float().save_pretrained(d)  # F32, as released checkpoints (or BF16, below)
            model.double()
            B, T = 2, 48  # past original_max_position_embeddings: the scaled bands matter
            stream = torch.randint(0, cfg.vocab_size, (B * T + 1,), generator=gen).tolist()
            data = os.path.join(tmp, name + ".bin")
            write_shard(data, stream)
            tok = torch.tensor(stream[:B * T]).view(B, T)
            tgt = torch.tensor(stream[1:B * T + 1]).view(B, T)
            model.zero_grad()
            logits, loss = hf_loss(model, tok, tgt)
            loss.backward()
            if check_eval(dw, name, d, data, B, T, model, cfg, logits, loss, failures) is None:
                continue

            # fine-tuning starts at transformers' loss: the save_pretrained directory and a BF16
            # sharded copy (its values rounded to BF16 first, on both sides)
            sharded = os.path.join(tmp, name + "-bf16")
            rounded = {n: v.to(torch.bfloat16) for n, v in model.state_dict().items()}
            bf = transformers.LlamaForCausalLM(cfg)  # (model.to(bfloat16) would round inv_freq too)
            bf.load_state_dict({n: v.float() for n, v in rounded.items()})
            bf.to(torch.bfloat16).save_pretrained(sharded, max_shard_size="20KB")
            ref = transformers.LlamaForCausalLM(cfg).double()
            ref.load_state_dict({n: v.double() for n, v in rounded.items()})
            with torch.no_grad():
                _, loss_bf = hf_loss(ref, tok, tgt)
            for src, want in ((d, float(loss)), (sharded, float(loss_bf))):
                for device in ["cpu"] + (["cuda"] if gpu else []):
                    got_loss, err = first_train_loss(dw, src, data, B, T, os.path.join(tmp, f"run-{name}-{device}-"
                                                                                      f"{os.path.basename(src)}"),
                                                     device)
                    tol = 1e-5 if device == "cpu" else 2e-2
                    ok = got_loss is not None and abs(got_loss - want) <= tol * abs(want)
                    print(f"{name} fine-tune start ({os.path.basename(src)}, {device}): deepwell {got_loss}, "
                          f"transformers {want:.7f} ({'ok' if ok else 'MISMATCH'})")
                    if not ok:
                        failures.append(f"{name} {os.path.basename(src)} {device}: first loss {got_loss} vs "
                                        f"transformers {want} ({err if got_loss is None else ''})")
    for f in failures:
        print("FAIL:", f)
    print(f"{len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
