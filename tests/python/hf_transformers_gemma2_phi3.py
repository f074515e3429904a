#!/usr/bin/env python3
"""hf_transformers_gemma2_phi3.py DEEPWELL — Gemma 2 and Phi-3 against transformers itself.

Not run by ctest (CI has no transformers; ctest runs the plain-torch references of
hf_parity_gemma2.py and hf_parity_phi3.py): run where transformers is installed.
For each case a random transformers model (eager attention, float64) is written with
save_pretrained, and
  1. `deepwell eval --dump` gives transformers' loss, logits and every parameter's gradient
     (tests/python/parity.py's tolerances, via hf_parity_rope.check_eval);
  2. `deepwell export --format hf --dtype f32` of that directory loads with from_pretrained and gives
     the same logits as the original model;
  3. `deepwell train --model DIR` logs transformers' loss as its first loss on the CPU (1e-5) and, with
     a GPU, on CUDA within BF16 rounding (2e-2), Gemma 2 included.
Gemma 2 cases: soft-capped scores and logits, query_pre_attn_scalar != head_dim, a window of 5 keys
on the even layers, tied embeddings, attention_bias. Phi-3: fused qkv_proj / gate_up_proj, with and
without a window. Exit status 1 on any mismatch.
"""
import os
import sys
import tempfile

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_parity_dense import check_start, hf_case  # noqa: E402  (the random model, the fine-tuning start)
from hf_parity_rope import check_eval, run  # noqa: E402

B, T = 2, 24


def cases():
    """(name, config class, kwargs)"""
    common = dict(vocab_size=97, hidden_size=64, intermediate_size=80, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0)
    yield "gemma2-capped", "Gemma2Config", dict(common, num_hidden_layers=3, head_dim=16, query_pre_attn_scalar=24,
                                                 attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
                                                 sliding_window=5, tie_word_embeddings=True, pad_token_id=None)
    yield "gemma2-bias-untied", "Gemma2Config", dict(common, num_hidden_layers=2, head_dim=8, query_pre_attn_scalar=8,
                                                      attn_logit_softcapping=None, final_logit_softcapping=None,
                                                      sliding_window=7, attention_bias=True, tie_word_embeddings=False,
                                                      pad_token_id=None)
    yield "phi3-window5", "Phi3Config", dict(common, num_hidden_layers=2, original_max_position_embeddings=64,
                                             sliding_window=5, tie_word_embeddings=False, pad_token_id=None)
    yield "phi3-tied", "Phi3Config", dict(common, num_hidden_layers=2, original_max_position_embeddings=64,
                                          sliding_window=None, tie_word_embeddings=True, pad_token_id=None)


def main():
    dw = sys.argv[1]
    gen = torch.Generator().manual_seed(int(os.environ.get("DW_TEST_SEED", "26")))
    failures = []
    print(f"transformers {transformers.__version__}")
    gpu = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as tmp:
        for name, cls, kw in cases():
            cfg, model, d, data, tok, logits, loss = hf_case(cls, kw, name, tmp, gen, B, T)
            if check_eval(dw, name, d, data, B, T, model, cfg, logits, loss, failures, strict=True) is None:
                continue
            out = os.path.join(tmp, name + "-export")
            r = run([dw, "export", d, "--out", out, "--format", "hf", "--dtype", "f32"])
            if r.returncode:
                failures.append(f"{name}: export failed: {r.stderr.strip()}")
            else:
                back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").double()
                with torch.no_grad():
                    err = float((back(input_ids=tok, use_cache=False).logits - logits.detach()).abs().max())
                print(f"{name}: export -> from_pretrained logits within {err:.1e}")
                if not err <= 1e-6 * float(logits.detach().abs().max()):
                    failures.append(f"{name}: the exported model's logits differ by {err}")
            check_start(dw, name, d, data, tmp, loss, failures, gpu, B, T)
    for f in failures:
        print("FAIL:", f)
    print(f"{len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
