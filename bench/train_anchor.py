#!/usr/bin/env python3
"""train_anchor.py — the PyTorch anchors for Deepwell's training-speed claims.

Trains the model described by a Hugging Face config.json (or a Deepwell preset exported with
`deepwell capture PRESET --config-out`) with the same batch as Deepwell, in PyTorch eager and
torch.compile: BF16 autocast, fused AdamW, scaled_dot_product_attention (HF "sdpa"). Prints
tokens/s, MFU (dense BF16 peak given by --peak-tflops) and peak memory, one JSON line per mode.

Usage (on the GPU machine, in the same device call as the Deepwell run it anchors):
  python3 bench/train_anchor.py --config CONFIG.json --batch 16 --seq 1024 --modes eager,compile
"""
import argparse
import json
import math
import sys
import time


def flops_per_token(cfg, seq):
    """Training FLOPs per token, PaLM convention: 6 x (matmul params, LM head included) plus
    12 x layers x heads x head_dim x seq for attention (not halved for causality)."""
    d = cfg.get("n_embd", cfg.get("hidden_size"))
    L = cfg.get("n_layer", cfg.get("num_hidden_layers"))
    V = cfg["vocab_size"]
    H = cfg.get("n_head", cfg.get("num_attention_heads"))
    Hkv = cfg.get("num_key_value_heads", H)
    hd = cfg.get("head_dim", d // H)
    ff = cfg.get("n_inner") or cfg.get("intermediate_size") or 4 * d
    glu = cfg.get("model_type", "gpt2") != "gpt2"
    per_layer = d * (H * hd) + 2 * d * (Hkv * hd) + (H * hd) * d + (3 if glu else 2) * d * ff
    matmul_params = L * per_layer + V * d  # LM head
    return 6 * matmul_params + 12 * L * H * hd * seq


def build_model(cfg_path, torch):
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(cfg_path)
    cfg._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", torch_dtype=torch.float32)
    return model


def run(mode, args, torch, cfg_json):
    torch.manual_seed(0)
    model = build_model(args.config, torch).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    fwd = torch.compile(model) if mode == "compile" else model
    V = cfg_json["vocab_size"]
    x = torch.randint(0, V, (args.batch, args.seq), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = fwd(input_ids=x, labels=x)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(args.steps):
        start.record()
        loss = step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    med = times[len(times) // 2]
    tok = args.batch * args.seq
    tps = tok / med
    mfu = tps * flops_per_token(cfg_json, args.seq) / (args.peak_tflops * 1e12)
    return {"impl": "pytorch-" + mode, "batch": args.batch, "seq": args.seq,
            "step_s_median": med, "tokens_per_s": tps, "mfu": mfu,
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30, "loss": float(loss)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="HF config.json (or its directory)")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense BF16 peak (H100/H200 SXM: 989)")
    args = ap.parse_args()
    import torch
    path = args.config if args.config.endswith(".json") else args.config + "/config.json"
    cfg_json = json.load(open(path))
    if args.config.endswith(".json"):
        import os
        args.config = os.path.dirname(os.path.abspath(args.config))
    torch.backends.cuda.matmul.allow_tf32 = True
    for mode in args.modes.split(","):
        try:
            res = run(mode, args, torch, cfg_json)
        except Exception as e:  # report and go on with the other modes
            res = {"impl": "pytorch-" + mode, "error": repr(e)[:500]}
        print(json.dumps(res), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
