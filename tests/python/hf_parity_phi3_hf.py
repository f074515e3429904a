#!/usr/bin/env python3
"""hf_parity_phi3_hf.py DEEPWELL — Deepwell against transformers itself for Phi-3's longrope (issue 26).

Not run by ctest (CI has no transformers): run where transformers is installed (checked with 4.46.3 on
the CPU). For Phi3ForCausalLM with rope_scaling None, longrope and its old name su (original positions
16 of 64, so the attention factor is sqrt(1 + ln 4 / ln 16)), builds a random transformers model,
writes it with save_pretrained, and compares `deepwell eval --dump` with transformers' own float64
forward and backward: the loss, the logits and every parameter's gradient, for a run of T = 12
positions (the short factors) and one of T = 48 (the long ones). transformers computes Phi-3's
rotary angles in FP32 (its inv_freq and t * inv_freq), Deepwell in double, so the tolerances are
hf_parity_rope.py's: loss 1e-5 relative, logits 1e-4 (+2e-5 of the largest), gradients 2e-4. Then
`deepwell export --format hf --dtype f32` of the directory loads in transformers (its config class
validates rope_scaling's three keys) and gives the same logits.
partial_rotary_factor is not checked here: transformers 4.46's Phi-3 rotates the whole head (the
factor came with Phi-4-mini, in later releases); tests/python/hf_parity_phi3.py checks it against the
float64 reference. Exit status 1 on any mismatch.
"""
import os
import sys
import tempfile

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_parity_rope import check_eval, randomise, run  # noqa: E402  (eval --dump against a model)
from parity import compare, write_shard  # noqa: E402

HEADS, HEAD_DIM, MAXPOS, ORIGINAL = 4, 16, 64, 16


def phi3_config(kind, gen):
    n = HEAD_DIM // 2
    scaling = None
    if kind:
        short = (0.8 + 1.2 * torch.rand(n, generator=gen, dtype=torch.float64)).tolist()
        long = (1 + 39 * torch.rand(n, generator=gen, dtype=torch.float64)).tolist()
        scaling = {"type": kind, "short_factor": short, "long_factor": long}
        if int(transformers.__version__.split(".")[0]) >= 5:  # 5 validates it inside rope_parameters
            scaling["original_max_position_embeddings"] = ORIGINAL
    return transformers.Phi3Config(vocab_size=97, hidden_size=HEADS * HEAD_DIM, intermediate_size=80,
                                   num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=2,
                                   max_position_embeddings=MAXPOS, original_max_position_embeddings=ORIGINAL,
                                   rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=scaling,
                                   tie_word_embeddings=False, pad_token_id=None)


def rope_type_of(config):
    """The rope type a loaded config holds: transformers 4 keeps rope_scaling {"type" or "rope_type"},
    transformers 5 rope_parameters {"rope_type"}."""
    for d in (getattr(config, "rope_parameters", None), getattr(config, "rope_scaling", None)):
        if isinstance(d, dict) and (d.get("rope_type") or d.get("type")):
            return d.get("rope_type") or d.get("type")
    return None


def main():
    dw = sys.argv[1]
    gen = torch.Generator().manual_seed(int(os.environ.get("DW_TEST_SEED", "26")))
    failures = []
    print(f"transformers {transformers.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in (None, "longrope", "su"):
            name = kind or "default"
            cfg = phi3_config(kind, gen)
            cfg._attn_implementation = "eager"
            model = transformers.Phi3ForCausalLM(cfg).double()
            randomise(model, gen)
            d = os.path.join(tmp, name)
            model.float().save_pretrained(d)
            model.double()
            for B, T in ((2, 12), (2, 48)):  # T <= 16: the short factors; T > 16: the long ones
                stream = torch.randint(0, cfg.vocab_size, (B * T + 1,), generator=gen).tolist()
                data = os.path.join(tmp, f"{name}-{T}.bin")
                write_shard(data, stream)
                tok = torch.tensor(stream[:B * T]).view(B, T)
                tgt = torch.tensor(stream[1:B * T + 1]).view(B, T)
                model.zero_grad()
                logits = model(input_ids=tok).logits
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
                loss.backward()
                check_eval(dw, f"phi3 {name} T={T}", d, data, B, T, model, cfg, logits, loss, failures)
            out = os.path.join(tmp, name + "-export")
            r = run([dw, "export", d, "--out", out, "--format", "hf", "--dtype", "f32"])
            if r.returncode:
                failures.append(f"{name}: deepwell export: {r.stderr.strip()}")
                continue
            back = transformers.Phi3ForCausalLM.from_pretrained(out, attn_implementation="eager").double()
            with torch.no_grad():
                want, got = model(input_ids=tok).logits, back(input_ids=tok).logits
            worst = compare(f"{name} export logits", got, want, 0, 1e-12, failures)
            print(f"phi3 {name}: export -> transformers from_pretrained, logits relative error {worst:.1e}, "
                  f"rope_scaling {rope_type_of(back.config)}")
    for f in failures:
        print("FAIL:", f)
    print(f"{len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
