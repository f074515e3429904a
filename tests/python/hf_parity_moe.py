#!/usr/bin/env python3
"""hf_parity_moe.py DEEPWELL — Deepwell's CPU eval against transformers itself for the MoE families.

Not run by ctest (CI has no transformers): run where transformers 5 is installed (the GPU
machine). For mixtral, olmoe, qwen2_moe and qwen3_moe (the Qwen ones with dense and MoE layers:
mlp_only_layers, decoder_sparse_step; mixtral, olmoe and qwen2_moe trained with the load-balancing
loss, output_router_logits, so the loss is transformers' cross-entropy + coef x its aux_loss),
builds a random transformers model, writes it with save_pretrained (the
layout transformers writes) and again with the experts in the other layout (per-expert 2-D
tensors or the fused 3-D ones, converted here), runs `deepwell eval --dump` on each, and compares
the loss and every parameter's gradient with transformers' own float64 forward and backward. Then
the other way: a checkpoint `deepwell train` writes for each tiny preset (config.json and the fused
layout) loads with transformers' from_pretrained and gives Deepwell's eval loss.
Per-tensor tolerances of tests/python/parity.py (its compare). Exit status 1 on any mismatch.
"""
import os
import subprocess
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parity import compare, write_shard  # noqa: E402  (the same shard format and tolerances)


def tiny_config(family):
    if family in ("mixtral", "olmoe"):
        base = dict(vocab_size=97, hidden_size=48, intermediate_size=40, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                    rope_theta=10000.0, num_experts_per_tok=2, tie_word_embeddings=False, hidden_act="silu",
                    output_router_logits=True, router_aux_loss_coef=0.3, pad_token_id=5)  # padding_idx
        if family == "mixtral":
            return transformers.MixtralConfig(**base, rms_norm_eps=1e-6, num_local_experts=5)
        return transformers.OlmoeConfig(**base, rms_norm_eps=1e-5, num_experts=5, norm_topk_prob=False)
    common = dict(vocab_size=97, hidden_size=48, intermediate_size=40, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=90,
                  rms_norm_eps=1e-6, rope_theta=10000.0, num_experts=5, num_experts_per_tok=2,
                  moe_intermediate_size=24, tie_word_embeddings=False, hidden_act="silu")
    if family == "qwen2_moe":  # layers 0, 2, 3 MoE (1 dense), not renormalised, a shared expert
        return transformers.Qwen2MoeConfig(**common, decoder_sparse_step=1, mlp_only_layers=[1],
                                           norm_topk_prob=False, shared_expert_intermediate_size=20,
                                           output_router_logits=True, router_aux_loss_coef=0.1)
    # layers 1, 3 MoE (sparse step 2), renormalised, explicit head_dim (4 x 16 != 48)
    return transformers.Qwen3MoeConfig(**common, decoder_sparse_step=2, mlp_only_layers=[],
                                       norm_topk_prob=True, head_dim=16)


def randomise(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                t = 1 + 0.2 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            else:
                t = (0.3 if p.dim() == 1 else 0.15) * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_(t.float().double())  # representable in FP32, as Deepwell stores them


def per_expert(tensors, E):
    """Any fused expert tensors of a state dict split into per-expert 2-D ones (gate rows first)."""
    out = {}
    for k, v in tensors.items():
        if k.endswith(".mlp.experts.gate_up_proj"):
            stem, F = k[: -len("gate_up_proj")], v.shape[1] // 2
            for e in range(E):
                out[f"{stem}{e}.gate_proj.weight"] = v[e, :F].contiguous()
                out[f"{stem}{e}.up_proj.weight"] = v[e, F:].contiguous()
        elif k.endswith(".mlp.experts.down_proj"):
            stem = k[: -len("down_proj")]
            for e in range(E):
                out[f"{stem}{e}.down_proj.weight"] = v[e].contiguous()
        else:
            out[k] = v
    return out


def fused(tensors, E):
    """Per-expert expert tensors of a state dict stacked into transformers 5's fused ones."""
    out, stems = {}, set()
    for k, v in tensors.items():
        if ".mlp.experts." in k and k.split(".mlp.experts.")[1].split(".")[0].isdigit():
            stems.add(k.split(".mlp.experts.")[0] + ".mlp.experts.")
        else:
            out[k] = v
    for s in stems:
        g = [tensors[f"{s}{e}.gate_proj.weight"] for e in range(E)]
        u = [tensors[f"{s}{e}.up_proj.weight"] for e in range(E)]
        out[s + "gate_up_proj"] = torch.stack([torch.cat([a, b]) for a, b in zip(g, u)]).contiguous()
        out[s + "down_proj"] = torch.stack([tensors[f"{s}{e}.down_proj.weight"] for e in range(E)]).contiguous()
    return out


def mixtral_names(tensors):
    """Generic per-expert names as Mixtral's own per-expert checkpoints name them."""
    out = {}
    for k, v in tensors.items():
        k = k.replace(".mlp.gate.weight", ".block_sparse_moe.gate.weight")
        for a, b in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
            if ".mlp.experts." in k and k.endswith(f".{a}.weight"):
                k = k.replace(".mlp.experts.", ".block_sparse_moe.experts.").replace(f".{a}.weight", f".{b}.weight")
        out[k] = v
    return out


def generic_names(tensors):
    """The inverse of mixtral_names: Mixtral's own per-expert names (which save_pretrained may write,
    and which Deepwell's dump keeps for a model loaded from them) as the generic ones."""
    out = {}
    for k, v in tensors.items():
        k = k.replace(".block_sparse_moe.gate.weight", ".mlp.gate.weight")
        for a, b in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
            if ".block_sparse_moe.experts." in k and k.endswith(f".{b}.weight"):
                k = k.replace(".block_sparse_moe.experts.", ".mlp.experts.").replace(f".{b}.weight", f".{a}.weight")
        out[k] = v
    return out


def n_experts(cfg):
    return getattr(cfg, "num_local_experts", None) or cfg.num_experts


def hf_loss_of(model, cfg, tok, tgt):
    """Transformers' training loss: cross-entropy, + coef x aux_loss when output_router_logits."""
    out = model(input_ids=tok, output_router_logits=bool(getattr(cfg, "output_router_logits", False)))
    loss = torch.nn.functional.cross_entropy(out.logits.reshape(tgt.numel(), -1), tgt.reshape(-1))
    if getattr(cfg, "output_router_logits", False):
        loss = loss + cfg.router_aux_loss_coef * out.aux_loss
    return out.logits, loss


def main():
    dw = sys.argv[1]
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    failures = []
    gen = torch.Generator().manual_seed(1234)
    with tempfile.TemporaryDirectory() as tmp:
        for family in ("mixtral", "olmoe", "qwen2_moe", "qwen3_moe"):
            cfg = tiny_config(family)
            try:  # the plain loop over experts: grouped_mm takes no float64
                model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager",
                                                                      experts_implementation="eager").double()
            except (TypeError, ValueError):
                model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").double()
            randomise(model, gen)
            E, B, T = n_experts(cfg), 2, 13
            stream = torch.randint(0, cfg.vocab_size, (B * T + 1,), generator=gen).tolist()
            stream = [cfg.pad_token_id if i % 5 == 2 else t for i, t in enumerate(stream)]  # the padding row shows
            tok = torch.tensor(stream[:B * T]).view(B, T)
            tgt = torch.tensor(stream[1:B * T + 1]).view(B, T)
            model.zero_grad()
            logits, loss = hf_loss_of(model, cfg, tok, tgt)
            loss.backward()
            ref = per_expert({n: p.grad if p.grad is not None else torch.zeros_like(p)
                              for n, p in model.named_parameters()}, E)
            d0 = os.path.join(tmp, family)
            model.float().save_pretrained(d0, safe_serialization=True)
            saved = load_file(os.path.join(d0, "model.safetensors"))
            layout = "fused" if any(k.endswith("gate_up_proj") for k in saved) else "per_expert"
            print(f"{family}: save_pretrained wrote the {layout} layout, {len(saved)} tensors")
            other = per_expert(saved, E) if layout == "fused" else fused(generic_names(saved), E)
            if family == "mixtral" and layout == "fused":
                other = mixtral_names(other)
            d1 = d0 + "-other"
            os.makedirs(d1)
            subprocess.run(["cp", os.path.join(d0, "config.json"), d1], check=True)
            save_file({k: v.contiguous() for k, v in other.items()}, os.path.join(d1, "model.safetensors"),
                      metadata={"format": "pt"})
            write_shard(os.path.join(tmp, "tok.bin"), stream)
            for d, lay in ((d0, layout), (d1, "per_expert" if layout == "fused" else "fused")):
                dump = os.path.join(d, "dump.safetensors")
                r = subprocess.run([dw, "eval", d, "--data", os.path.join(tmp, "tok.bin"), "--batch", str(B),
                                    "--seq", str(T), "--dump", dump], capture_output=True, text=True)
                if r.returncode:
                    failures.append(f"{family} {lay}: deepwell eval failed: {r.stderr.strip()}")
                    continue
                got = per_expert(generic_names({k: v.double() for k, v in load_file(dump).items()}), E)
                worst = compare(f"{family} {lay} loss", got.pop("loss").reshape(()), loss.detach(), 1e-5, 0,
                                failures)
                compare(f"{family} {lay} logits", got.pop("logits"), logits.detach(), 1e-4, 2e-5, failures)
                g_worst = 0.0
                for n, g in ref.items():
                    if n not in got:
                        failures.append(f"{family} {lay}: no gradient for '{n}'")
                        continue
                    g_worst = max(g_worst, compare(f"{family} {lay} grad {n}", got.pop(n), g, 2e-4, 2e-5, failures))
                failures += [f"{family} {lay}: unexpected '{n}' in the dump" for n in got]
                print(f"{family} {lay}: loss transformers {float(loss):.8f}, relative error {worst:.2e}; "
                      f"worst gradient error {g_worst:.2e} over {len(ref)} tensors")
        for preset in ("mixtral-tiny", "olmoe-tiny", "qwen2-moe-tiny", "qwen3-moe-tiny"):
            out = os.path.join(tmp, "run-" + preset)
            r = subprocess.run([dw, "train", "--model", preset, "--data", "builtin", "--steps", "3", "--batch", "2",
                                "--seq", "16", "--device", "cpu", "--out", out], capture_output=True, text=True)
            if r.returncode:
                failures.append(f"{preset}: deepwell train failed: {r.stderr.strip()}")
                continue
            ckpt = os.path.join(out, "ckpt-3")
            stream = torch.randint(0, 256, (2 * 16 + 1,), generator=gen).tolist()
            write_shard(os.path.join(tmp, "tok2.bin"), stream)
            r = subprocess.run([dw, "eval", ckpt, "--data", os.path.join(tmp, "tok2.bin"), "--batch", "2", "--seq",
                                "16"], capture_output=True, text=True)
            try:
                dw_loss = float(r.stdout.split("loss")[1].split()[0].strip(":="))
            except (IndexError, ValueError):
                failures.append(f"{preset}: no loss in deepwell eval's output: {r.stdout.strip()} {r.stderr.strip()}")
                continue
            try:
                hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="eager",
                                                                       experts_implementation="eager").double()
            except (TypeError, ValueError):
                hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="eager").double()
            with torch.no_grad():  # the presets train with the load-balancing loss: it is in both losses
                hf_loss = float(hf_loss_of(hf, hf.config, torch.tensor(stream[:32]).view(2, 16),
                                           torch.tensor(stream[1:33]).view(2, 16))[1])
            ok = abs(hf_loss - dw_loss) <= 1e-5 * abs(hf_loss)
            print(f"{preset}: deepwell's checkpoint in transformers: loss {hf_loss:.7f}, deepwell eval {dw_loss:.7f}"
                  f" ({'ok' if ok else 'MISMATCH'})")
            if not ok:
                failures.append(f"{preset}: transformers loss {hf_loss} vs deepwell {dw_loss}")
    for f in failures:
        print("FAIL:", f)
    print(f"{len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
