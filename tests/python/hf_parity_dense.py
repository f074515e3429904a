#!/usr/bin/env python3
"""hf_parity_dense.py DEEPWELL — Deepwell against transformers itself for the dense families of issue
26: qwen3 (per-head q/k RMSNorm, explicit head_dim, with and without attention_bias) and sliding-window
attention (mistral's sliding_window, qwen2's and qwen3's use_sliding_window + max_window_layers).

Not run by ctest (CI has no transformers): run where transformers is installed (the GPU machine).
1. For each case builds a random transformers model (eager attention, float64), writes it with
   save_pretrained, runs `deepwell eval --dump` (the CPU reference engine) and compares the loss,
   logits and every parameter's gradient with transformers' own forward and backward (tolerances of
   tests/python/parity.py). Windows of 5-6 keys over 48 tokens, so the window matters.
   Qwen2's max_window_layers: transformers before layer_types (< 4.53) windows every layer in its
   eager and sdpa masks whatever max_window_layers says (its flash path alone reads it), so there the
   qwen2/qwen3 windowed cases use max_window_layers 0; with layer_types, 1 (layer 0 full, layer 1
   windowed). qwen3 needs transformers >= 4.51 (skipped, said so, before).
2. Fine-tuning start: `deepwell train --model DIR` logs transformers' loss as its first loss on the
   CPU (1e-5). On CUDA (when a GPU is usable) every case starts within BF16 rounding (2e-2
   relative), windows shorter than the sequence included (the reference attention kernels with the
   window, src/kernels/cuda/ops_attention.cu).
Exit status 1 on any mismatch.
"""
import os
import sys
import tempfile

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parity import write_shard  # noqa: E402  (the same shard format)
from hf_parity_rope import check_eval, first_train_loss, randomise  # noqa: E402  (the same weights and checks)

LAYER_TYPES = hasattr(transformers.Qwen2Config(), "layer_types")  # per-layer windows in eager masks
HAS_QWEN3 = hasattr(transformers, "Qwen3Config")
B, T = 2, 48


def base(**kw):
    c = dict(vocab_size=97, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, hidden_act="silu",
             rope_theta=10000.0, tie_word_embeddings=False)
    c.update(kw)
    return c


def cases():
    """(name, config class name, config kwargs)"""
    first = 1 if LAYER_TYPES else 0
    yield "mistral-window5-pad", "MistralConfig", base(head_dim=16, sliding_window=5, pad_token_id=3)
    yield "mistral-nowindow", "MistralConfig", base(head_dim=16, sliding_window=None, tie_word_embeddings=True)
    yield "qwen2-window6-pad", "Qwen2Config", base(use_sliding_window=True, sliding_window=6,
                                                   max_window_layers=first, pad_token_id=0, tie_word_embeddings=True)
    yield "qwen2-window-long", "Qwen2Config", base(use_sliding_window=True, sliding_window=T,
                                                   max_window_layers=0)
    yield "qwen3", "Qwen3Config", base(head_dim=24, attention_bias=False)  # 4 x 24 != 64
    yield "qwen3-bias-tied-pad", "Qwen3Config", base(head_dim=8, attention_bias=True, tie_word_embeddings=True,
                                                     pad_token_id=96)
    yield "qwen3-window5", "Qwen3Config", base(head_dim=16, use_sliding_window=True, sliding_window=5,
                                               max_window_layers=first)


def hf_case(cls, kw, name, tmp, gen, B, T):
    """A random transformers model of config class cls (eager, float64) written with save_pretrained
    to tmp/name, a shard of exactly B windows of T + 1 tokens, and transformers' forward and backward
    on it: (cfg, model, d, data, tok, logits, loss)."""
    cfg = getattr(transformers, cls)(**kw)
    cfg._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(cfg).double()
    randomise(model, gen)
    d = os.path.join(tmp, name)
    model.float().save_pretrained(d)
    model.double()
    stream = torch.randint(0, cfg.vocab_size, (B * T + 1,), generator=gen).tolist()
    if cfg.pad_token_id is not None:  # every fifth token the padding row (padding_idx: no gradient from the lookup)
        stream = [cfg.pad_token_id if i % 5 == 2 else t for i, t in enumerate(stream)]
    data = os.path.join(tmp, name + ".bin")
    write_shard(data, stream)
    tok = torch.tensor(stream[:B * T]).view(B, T)
    tgt = torch.tensor(stream[1:B * T + 1]).view(B, T)
    model.zero_grad()
    logits = model(input_ids=tok, use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
    loss.backward()
    return cfg, model, d, data, tok, logits, loss


def check_start(dw, name, d, data, tmp, loss, failures, gpu, B, T, cuda_refusal=()):
    """`deepwell train --model d` logs transformers' loss as its first loss on the CPU (1e-5) and, with
    a GPU, on CUDA (2e-2: BF16) — unless cuda_refusal names phrases: then CUDA must refuse the model
    with each of them in its message."""
    for device in ["cpu"] + (["cuda"] if gpu else []):
        got, err = first_train_loss(dw, d, data, B, T, os.path.join(tmp, f"run-{name}-{device}"), device)
        if device == "cuda" and cuda_refusal:
            ok = got is None and all(p in err for p in cuda_refusal)
            print(f"{name} on CUDA: {'refused as expected' if ok else 'NOT REFUSED'}: {err.splitlines()[-1:]}")
            if not ok:
                failures.append(f"{name} cuda: must be refused naming {cuda_refusal}; got {got} {err}")
            continue
        tol = 1e-5 if device == "cpu" else 2e-2
        ok = got is not None and abs(got - float(loss)) <= tol * abs(float(loss))
        print(f"{name} fine-tune start ({device}): deepwell {got}, transformers {float(loss):.7f} "
              f"({'ok' if ok else 'MISMATCH'})")
        if not ok:
            failures.append(f"{name} {device}: first loss {got} vs transformers {float(loss)} "
                            f"({err if got is None else ''})")


def main():
    dw = sys.argv[1]
    gen = torch.Generator().manual_seed(int(os.environ.get("DW_TEST_SEED", "26")))
    failures = []
    print(f"transformers {transformers.__version__} (layer_types: {LAYER_TYPES}, qwen3: {HAS_QWEN3})")
    gpu = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as tmp:
        for name, cls, kw in cases():
            if not hasattr(transformers, cls):
                print(f"SKIP: {name}: this transformers has no {cls}")
                continue
            cfg, model, d, data, _, logits, loss = hf_case(cls, kw, name, tmp, gen, B, T)
            if check_eval(dw, name, d, data, B, T, model, cfg, logits, loss, failures, strict=True) is None:
                continue
            check_start(dw, name, d, data, tmp, loss, failures, gpu, B, T)
    for f in failures:
        print("FAIL:", f)
    print(f"{len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
